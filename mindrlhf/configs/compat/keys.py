"""The vocabulary of the foreign-format tables: what each key of another tool's file does here.

  mapped   - same meaning, under our name (given in `ours`)
  inert    - accepted and reported once at start-up with the reason; changes nothing here (the other tool never
             reads it, or it tunes Ascend/graph execution without changing results)
  checked  - accepted only at the value we implement; any other value is an error naming the key
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

MAPPED, INERT, CHECKED = "mapped", "inert", "checked"


@dataclass(frozen=True)
class Key:
    name: str
    status: str
    ours: str          # our field (mapped) or the reason (inert / checked)


def inert(names: str, reason: str) -> List[Key]:
    return [Key(n, INERT, reason) for n in names.split()]


def describe_ignored(source: str, ignored: List[Tuple[str, str]]) -> str:
    """One start-up line per file: the inert keys grouped by reason."""
    by_reason: Dict[str, List[str]] = {}
    for key, why in ignored:
        by_reason.setdefault(why, []).append(key)
    parts = [f"{', '.join(keys)} ({why})" for why, keys in by_reason.items()]
    return f"ignored in {source}: " + "; ".join(parts)
