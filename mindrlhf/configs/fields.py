"""Config fields with their help text, and a command's flags, parsing and reference table generated from a
dataclass of them: every command (GRPO training, eval) declares its settings once, as TRL's configs do."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, List

from mindrlhf.configs.coerce import coerce, type_name
from mindrlhf.errors import ConfigError


def help_field(default, help_text: str, **kw):
    """A dataclass field with its help text (metadata: help, choices, required)."""
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda d=default: list(d), metadata={"help": help_text, **kw})
    return dataclasses.field(default=default, metadata={"help": help_text, **kw})


def default_of(f: dataclasses.Field):
    """A field's default value (a fresh one for list fields)."""
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def default(cls, name: str):
    """The default of `cls.name`: another command shares it by reference instead of copying the literal."""
    return default_of(next(f for f in dataclasses.fields(cls) if f.name == name))


def flag_parser(cls, prog: str, description: str) -> argparse.ArgumentParser:
    """--name per field of `cls`, with its help and default; values stay text until `from_flags` checks them."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    for f in dataclasses.fields(cls):
        required = f.metadata.get("required", False)
        typ = type_name(f)
        p.add_argument(f"--{f.name}", required=required, nargs="+" if typ.startswith("List") else None,
                       default=None, metavar=typ.upper().replace("LIST[", "").rstrip("]"),
                       help=(f"{f.metadata['help']}" + ("" if required else f" (default: {default_of(f)!r})"))
                       .replace("%", "%%"))      # argparse reads help as a %-format
    return p


def from_flags(cls, ns: argparse.Namespace):
    """An instance of `cls` from parsed flags: each given value coerced to its field's type (lists space- or
    comma-separated), the rest defaults; errors name the flag."""
    values = {}
    for f in dataclasses.fields(cls):
        given: Any = getattr(ns, f.name, None)
        if given is None:
            continue
        if isinstance(given, list):
            given = ",".join(given)
        values[f.name] = coerce(given, f, f"--{f.name}")
    try:
        return cls(**values)
    except TypeError as err:
        raise ConfigError(str(err)) from None


def reference_markdown(cls, prefix: str = "--") -> str:
    """A command's flag reference (or, with another `prefix`, a YAML section's): name, default, meaning."""
    lines: List[str] = [f"| {'flag' if prefix == '--' else 'field'} | default | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        shown = "required" if f.metadata.get("required") else f"`{default_of(f)!r}`"
        lines.append(f"| `{prefix}{f.name}` | {shown} | {f.metadata['help']} |")
    return "\n".join(lines)
