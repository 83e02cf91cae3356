"""Tool-call parsers: the model's decoded turn -> the calls in it. Registered by name (MindSpeed-RL's
`tool_parser_format`); `hermes` is the form the Qwen2.5 / Qwen3 chat templates teach:

    <tool_call>
    {"name": "code_interpreter", "arguments": {"code": "print(1+1)"}}
    </tool_call>

possibly several in one turn. A parser never raises on what a model writes: each call it finds is a ToolCall,
and one it cannot read (bad JSON, no name, arguments not an object, an unterminated or nested tag, a body past
`max_call_chars`) is marked malformed with the reason, so the caller can answer the model with that reason.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

from mindrlhf.configs.errors import ConfigError

PARSERS: Dict[str, Type["ToolCallParser"]] = {}


def register_parser(name: str) -> Callable:
    def wrap(cls):
        PARSERS[name] = cls
        cls.name = name
        return cls
    return wrap


def get_parser(name: str, **kwargs) -> "ToolCallParser":
    """The parser registered as `name` (e.g. `hermes`); an unknown name is refused listing the known ones."""
    if name not in PARSERS:
        raise ConfigError(f"tool_parser_format {name!r} is not known; choose one of: "
                          f"{', '.join(sorted(PARSERS))}")
    return PARSERS[name](**kwargs)


@dataclass
class ToolCall:
    """One call as the model wrote it. `error` is None for a well-formed call, else why it is malformed."""
    name: Optional[str]
    arguments: Dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None
    raw: str = ""                    # the text between the tags (cut to 200 characters when malformed)
    span: Tuple[int, int] = (0, 0)   # [start, end) of the whole call, tags included, in the parsed text

    @property
    def malformed(self) -> bool:
        return self.error is not None


class ToolCallParser:
    """parse(text) -> the calls in a decoded assistant turn, in order. `stop_strings`: where decoding may pause
    for the tools (a rollout stops a sample there, runs its calls, and continues)."""
    name = ""
    stop_strings: Tuple[str, ...] = ()

    def parse(self, text: str) -> List[ToolCall]:
        raise NotImplementedError

    def content(self, text: str) -> str:
        """The turn's text without its tool calls (what a chat message's `content` holds)."""
        out, last = [], 0
        for call in self.parse(text):
            out.append(text[last:call.span[0]])
            last = call.span[1]
        out.append(text[last:])
        return "".join(out).strip()


@register_parser("hermes")
class HermesParser(ToolCallParser):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    stop_strings = ("</tool_call>",)

    def __init__(self, max_call_chars: int = 65536, max_calls: int = 64):
        self.max_call_chars = max_call_chars      # a body longer than this is not decoded (malformed: too long)
        self.max_calls = max_calls                # calls past this many in one turn are dropped (bounded work)

    def parse(self, text: str) -> List[ToolCall]:
        if not isinstance(text, str):
            return [ToolCall(None, error=f"turn is {type(text).__name__}, not text")]
        calls: List[ToolCall] = []
        pos = 0
        while len(calls) < self.max_calls:
            start = text.find(self.OPEN, pos)
            if start < 0:
                break
            body_start = start + len(self.OPEN)
            end = text.find(self.CLOSE, body_start)
            nested = text.find(self.OPEN, body_start)
            if end < 0:
                calls.append(self._bad(text[body_start:], "unterminated <tool_call> (no </tool_call>)",
                                       (start, len(text))))
                break
            if 0 <= nested < end:
                # "<tool_call> ... <tool_call> ... </tool_call>": the outer one is malformed; resume at the inner one
                calls.append(self._bad(text[body_start:nested], "nested <tool_call> before </tool_call>",
                                       (start, nested)))
                pos = nested
                continue
            calls.append(self._one(text[body_start:end], (start, end + len(self.CLOSE))))
            pos = end + len(self.CLOSE)
        return calls

    MAX_DEPTH = 64       # JSON nesting a call may have: the verdict must not depend on the interpreter's recursion limit

    def _load(self, text: str):
        """json.loads, refusing nesting deeper than MAX_DEPTH first (MindSpore raises Python's recursion limit,
        so json's own RecursionError comes at a depth that depends on what else is imported)."""
        depth, deepest, in_string, escaped = 0, 0, False, False
        for ch in text:
            if in_string:
                escaped, in_string = (not escaped and ch == "\\"), in_string and (escaped or ch != '"')
            elif ch == '"':
                in_string = True
            elif ch in "[{":
                depth += 1
                deepest = max(deepest, depth)
            elif ch in "]}":
                depth -= 1
        if deepest > self.MAX_DEPTH:
            raise json.JSONDecodeError(f"nested deeper than {self.MAX_DEPTH} levels", text[:50], 0)
        return json.loads(text)

    def _bad(self, raw: str, why: str, span) -> ToolCall:
        return ToolCall(None, {}, why, raw[:200], span)

    def _one(self, body: str, span) -> ToolCall:
        if len(body) > self.max_call_chars:
            return self._bad(body, f"tool call too long ({len(body)} characters > {self.max_call_chars})", span)
        try:
            obj = self._load(body.strip())
        except (json.JSONDecodeError, RecursionError) as err:
            return self._bad(body, f"tool call is not valid JSON: {str(err)[:120]}", span)
        if not isinstance(obj, dict):
            return self._bad(body, f"tool call is JSON {type(obj).__name__}, not an object with name and arguments",
                             span)
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            return self._bad(body, "tool call has no \"name\" string", span)
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):       # OpenAI style: the arguments as a JSON-encoded string
            try:
                args = self._load(args) if args.strip() else {}
            except (json.JSONDecodeError, RecursionError) as err:
                return ToolCall(name, {}, f"\"arguments\" is a string that is not JSON: {str(err)[:120]}",
                                body[:200], span)
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return ToolCall(name, {}, f"\"arguments\" must be an object, got {type(args).__name__}", body[:200], span)
        return ToolCall(name, args, None, body, span)
