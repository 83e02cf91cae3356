"""The vocabulary of the foreign-format tables: what each key of another tool's file does here.

  mapped   - same meaning, under our name (given in `ours`)
  inert    - accepted and reported once at start-up with the reason; changes nothing here (the other tool never
             reads it, or it tunes Ascend/graph execution without changing results)
  checked  - accepted only at the value we implement; any other value is an error naming the key
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

from mindrlhf.configs.errors import ConfigError

MAPPED, INERT, CHECKED = "mapped", "inert", "checked"
ABSENT = object()      # a checked key with no default to check when it is absent


@dataclass(frozen=True)
class Key:
    name: str
    status: str
    ours: str          # our field (mapped) or the reason (inert / checked)


# checks' value predicates, as ok(value, the other values): a YAML or command-line value read loosely (verl's Hydra
# overrides give true / "True" / null / "null" alike)
def is_null(v, ns) -> bool:
    return v in (None, "", "null", "None")


def is_false(v, ns) -> bool:
    return v is False or str(v).lower() == "false"


def is_true(v, ns) -> bool:
    return v is True or str(v).lower() == "true"


def is_empty(v, ns) -> bool:
    return v in (None, {}, [], "", "{}")


def inert(names: str, reason: str) -> List[Key]:
    return [Key(n, INERT, reason) for n in names.split()]


def describe_ignored(source: str, ignored: List[Tuple[str, str]]) -> str:
    """One start-up line per file: the inert keys grouped by reason."""
    by_reason: Dict[str, List[str]] = {}
    for key, why in ignored:
        by_reason.setdefault(why, []).append(key)
    parts = [f"{', '.join(keys)} ({why})" for why, keys in by_reason.items()]
    return f"ignored in {source}: " + "; ".join(parts)


def run_checks(values: Dict[str, Any], checks: Dict[str, tuple], context: Dict[str, Any], tool: str,
               where: Callable[[str], str]):
    """checks: key -> (ok(value, context), what we implement, the other tool's default or ABSENT). Each checked
    key's value, or that default when the file leaves the key out, must pass; the first that does not is an
    error at where(key) saying whether the value was given or the default that `tool` would run."""
    for key, (ok, expected, default) in checks.items():
        given = key in values
        if not given and default is ABSENT:
            continue
        value = values[key] if given else default
        try:
            good = ok(value, context)
        except (TypeError, ValueError, KeyError):
            good = False
        if not good:
            what = f"{value!r} is not supported" if given else \
                f"not given, so {tool} would run its default {value!r}, which is not supported"
            raise ConfigError(f"{where(key)}: {what} (we implement {expected})")
