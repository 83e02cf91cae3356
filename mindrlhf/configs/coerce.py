"""The one rule for turning a YAML value or a command-line string into a config field's type.

YAML gives `1e-6` as a string and ints where floats are meant; the command line gives strings. Accepted:
numbers (and numeric strings) for floats; integers (and digit strings) for ints, never 2.0 or True; for
bools true/false (any case) or a YAML bool, never 1/0; comma-separated strings or lists for list fields.
Anything else is an error naming the field.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from mindrlhf.configs.errors import ConfigError

_INT_RE = re.compile(r"[+-]?\d+")


def type_name(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def coerce(value: Any, f: dataclasses.Field, where: str) -> Any:
    typ = type_name(f)
    if typ == "float":
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    elif typ == "int":
        if isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
    elif typ == "bool":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
    elif typ.startswith("List"):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list (or comma-separated values), got {value!r}")
        if "int" in typ:          # List[int] (mlp_only_layers): integers or digit strings, never 2.0 or True
            value = [int(v) if isinstance(v, str) and _INT_RE.fullmatch(v.strip()) else v for v in value]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise ConfigError(f"{where}: expected integers, got {value!r}")
            return value
        try:
            value = [float(v) for v in value] if "float" in typ else [str(v) for v in value]
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected numbers, got {value!r}") from None
    elif typ == "str":
        value = "" if value is None else str(value)
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{where}: expected one of {list(choices)}, got {value!r}")
    return value


@dataclasses.dataclass
class _Kinds:
    """The value kinds a foreign config's translation reads (MindSpeed-RL's, verl's); coerce() gives each its one
    rule (YAML's `1e-6` string too)."""
    number: float = 0.0
    integer: int = 0
    flag: bool = False


_KIND = {f.name: f for f in dataclasses.fields(_Kinds)}


def coerce_kind(kind: str, value: Any, where: str) -> Any:
    """`value` as a number, integer or flag, by coerce's rule; errors name `where`."""
    return coerce(value, _KIND[kind], where)
