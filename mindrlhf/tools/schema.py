"""A tool's JSON schema from its Python function: type hints give the types, a Google-style docstring gives the
descriptions. The output is the OpenAI / Hugging Face function-calling form that chat templates take as `tools`:

    {"type": "function", "function": {"name": ..., "description": ..., "parameters":
        {"type": "object", "properties": {arg: {"type": ..., "description": ...}}, "required": [...]}}}

the same dict transformers' `get_json_schema` returns for the same function (tests/test_tools_schema.py compares
the two), written here so transformers stays a test-only dependency. Types: int / float / str / bool / None, Any,
list[T], tuple[T, ...] (fixed length), dict[str, T], Optional / Union, Literal[...] and Enum classes (an `enum`);
an argument's description may end in `(choices: [...])` (JSON), which becomes its `enum`.
"""
from __future__ import annotations

import enum
import inspect
import json
import re
import types
import typing
from typing import Any, Callable, Dict, List, Optional, Tuple


class SchemaError(ValueError):
    """A tool function whose schema cannot be derived: the message names the function and what is missing."""


_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
_BARE = {**{t: {"type": n} for t, n in _SCALARS.items()}, list: {"type": "array"}, tuple: {"type": "array"},
         dict: {"type": "object"}}
_SECTIONS = ("Args:", "Returns:", "Raises:")
_ARG_LINE = re.compile(r"^(\w+)(?:[ \t]*\([^()\n]*\))?:\s*(.*)$")      # "name:" or "name (type):"
_CHOICES = re.compile(r"\(choices:\s*(.*?)\)\s*$", re.IGNORECASE)


def _enum_schema(values: List[Any], where: str) -> Dict:
    bad = [v for v in values if type(v) not in _SCALARS]
    if bad:
        raise SchemaError(f"{where}: enum values must be int, float, str, bool or None, got {bad!r}")
    kinds: List[str] = []
    for v in values:
        if _SCALARS[type(v)] not in kinds:
            kinds.append(_SCALARS[type(v)])
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(values)}


def type_schema(hint: Any, where: str = "type hint") -> Dict:
    """The JSON schema of one type hint."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is None:
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            values = [m.value for m in hint]
            if not values:
                raise SchemaError(f"{where}: the Enum {hint.__name__} has no members")
            return _enum_schema(values, where)
        if hint is Any:
            return {}
        if hint in _BARE:
            return dict(_BARE[hint])
        raise SchemaError(f"{where}: cannot express {hint!r} as JSON schema (use int, float, str, bool, list, "
                          f"tuple, dict, Optional/Union, Literal or an Enum; or write the schema by hand)")
    if origin is typing.Union or origin is getattr(types, "UnionType", ()):
        parts = [type_schema(a, where) for a in args if a is not type(None)]
        if len(parts) == 1:
            out = parts[0]
        elif all(set(p) == {"type"} and isinstance(p["type"], str) for p in parts):
            names = sorted({p["type"] for p in parts})
            out = {"type": names[0] if len(names) == 1 else names}
        else:
            out = {"anyOf": parts}
        if type(None) in args:
            out["nullable"] = True
        return out
    if origin is typing.Literal and args:
        return _enum_schema(list(args), where)
    if origin is list:
        return {"type": "array", "items": type_schema(args[0], where)} if args else {"type": "array"}
    if origin is tuple:
        if not args:
            return {"type": "array"}
        if len(args) == 1 or ... in args:
            raise SchemaError(f"{where}: {hint} is a one-element or variable-length tuple: use list[...] instead")
        return {"type": "array", "prefixItems": [type_schema(a, where) for a in args]}
    if origin is dict:
        return {"type": "object", "additionalProperties": type_schema(args[1], where)} if len(args) == 2 else \
            {"type": "object"}
    raise SchemaError(f"{where}: cannot express {hint!r} as JSON schema")


def parse_google_docstring(doc: str) -> Tuple[str, Dict[str, str], Optional[str]]:
    """(summary, {argument: description}, returns) of a cleaned Google-style docstring. The summary is the text
    before the first section; an argument's continuation lines (indented deeper) join its description."""
    lines = doc.split("\n")
    section, summary, returns = None, [], []
    arg_lines: List[str] = []
    for line in lines:
        head = line.strip()
        if head in _SECTIONS:
            section = head
            continue
        if section is None:
            summary.append(line)
        elif section == "Args:":
            arg_lines.append(line)
        elif section == "Returns:":
            returns.append(line)
    args: Dict[str, str] = {}
    body = [ln for ln in arg_lines if ln.strip()]
    if body:
        base = min(len(ln) - len(ln.lstrip()) for ln in body)
        current = None
        for ln in body:
            indent = len(ln) - len(ln.lstrip())
            m = _ARG_LINE.match(ln.strip())
            if m and indent <= base:
                current = m.group(1)
                args[current] = m.group(2).strip()
            elif current is not None:
                args[current] = (args[current] + " " + ln.strip()).strip()
    ret = "\n".join(returns).strip() or None
    return "\n".join(summary).strip(), args, ret


def function_schema(fn: Callable) -> Dict:
    """The function-calling schema of `fn` (see the module docstring). Raises SchemaError naming the function and
    the argument when a type hint or an argument's description is missing."""
    name = getattr(fn, "__name__", "operation")
    doc = inspect.getdoc(fn)
    if not doc:
        raise SchemaError(f"tool {name}: no docstring (write one: a summary line, then 'Args:' with a line per "
                          f"argument)")
    summary, described, returns = parse_google_docstring(doc.strip())
    try:
        hints = typing.get_type_hints(fn)
    except Exception as err:  # noqa: BLE001 - an unresolvable annotation: say which function
        raise SchemaError(f"tool {name}: cannot resolve its type hints: {err}") from None
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls") and params[0].annotation is inspect.Parameter.empty:
        params = params[1:]
    properties: Dict[str, Dict] = {}
    required: List[str] = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise SchemaError(f"tool {name}: *{p.name} / **{p.name} cannot be described to the model")
        if p.annotation is inspect.Parameter.empty:
            raise SchemaError(f"tool {name}: argument {p.name!r} has no type hint")
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
        prop = type_schema(hints[p.name], f"tool {name}, argument {p.name!r}")
        if p.name not in described:
            raise SchemaError(f"tool {name}: the docstring has no description for argument {p.name!r} (under "
                              f"'Args:', a line '{p.name}: what it is')")
        desc = described[p.name]
        m = _CHOICES.search(desc)
        if m:
            try:
                choices = json.loads(m.group(1))
            except json.JSONDecodeError as err:
                raise SchemaError(f"tool {name}, argument {p.name!r}: (choices: ...) is not a JSON list: {err}") \
                    from None
            prop["enum"] = [c.strip() if isinstance(c, str) else c for c in choices]
            desc = desc[:m.start()].strip()
        prop["description"] = desc
        properties[p.name] = prop
    parameters: Dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    out: Dict[str, Any] = {"name": name, "description": summary, "parameters": parameters}
    if "return" in hints:
        try:
            ret = type_schema(hints["return"], f"tool {name}, return")
        except SchemaError:
            ret = None          # the model never writes the return value: an odd return hint is no error
        if ret is not None:
            if returns is not None:
                ret["description"] = returns
            out["return"] = ret
    return {"type": "function", "function": out}
