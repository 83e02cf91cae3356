"""Running parsed tool calls: a worker pool, per-call timeouts, argument checks, response truncation, metrics.

Nothing a model writes crashes the trainer: an unknown tool, a malformed call, wrong or missing arguments, a
tool that raises and a tool that overruns its timeout each become a ToolResult whose `text` is an error message
for the model (status says which). A timed-out plain function keeps its thread (Python cannot kill one) but
frees its pool slot at the deadline, so it never delays the caller past its timeout; the code interpreter's own
sandbox kills its process at its deadline.
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mindrlhf.configs.errors import ConfigError
from mindrlhf.tools.parser import ToolCall
from mindrlhf.tools.registry import CodeResult, Tool

TRUNCATE_SIDES = ("left", "middle", "right")
MARK = "...(truncated)..."
STATUSES = ("ok", "malformed", "unknown_tool", "bad_arguments", "error", "timeout")


def truncate(text: str, limit: int, side: str = "middle",
             count_tokens: Optional[Callable[[str], int]] = None) -> Tuple[str, bool]:
    """Cut `text` to at most `limit` characters, or `limit` tokens when `count_tokens(text) -> int` is given;
    the marker "...(truncated)..." counts inside the limit. `side` names the part that is KEPT, as MindSpeed-RL's
    and verl's `tool_response_truncate_side` do: left keeps the start, right the end, middle both ends (half each).
    Returns (text, whether it was cut)."""
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"tool_response_truncate_side must be one of {TRUNCATE_SIDES}, got {side!r}")
    if limit <= 0:
        return text, False
    size = count_tokens or len
    if size(text) <= limit:
        return text, False

    def cut(keep: int) -> str:
        if side == "left":
            return text[:keep] + MARK
        if side == "right":
            return MARK + text[len(text) - keep:] if keep else MARK
        head = (keep + 1) // 2
        tail = keep - head
        return text[:head] + MARK + (text[len(text) - tail:] if tail else "")

    # the most characters kept whose cut text fits (size is monotone in what we keep: binary search)
    lo, hi = 0, min(len(text), limit if count_tokens is None else len(text))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if size(cut(mid)) <= limit:
            lo = mid
        else:
            hi = mid - 1
    out = cut(lo)
    if size(out) > limit:           # the marker alone does not fit: a hard cut of the text itself
        out = text[:limit] if side != "right" else text[len(text) - limit:]
        while count_tokens is not None and out and size(out) > limit:
            out = out[:len(out) // 2] if side != "right" else out[len(out) // 2:]
    return out, True


@dataclass
class ToolResult:
    """What one call returned. `text` is what the model reads (rendered by the chat template as a `tool`
    message); `status` one of STATUSES; `detail` the sandbox result's dict for code runs."""
    name: Optional[str]
    text: str
    status: str
    seconds: float = 0.0
    truncated: bool = False
    call: Optional[ToolCall] = None
    detail: Dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def message(self) -> Dict[str, str]:
        """The chat message a template renders for it."""
        return {"role": "tool", "name": self.name or "", "content": self.text}


@dataclass
class ToolStats:
    calls: int = 0
    errors: int = 0          # every status but ok (timeouts included)
    timeouts: int = 0
    truncations: int = 0
    seconds: float = 0.0


class ToolRunner:
    """Runs calls against a set of tools in a pool of `max_parallel_calls` worker threads.

    submit(call) -> Future[ToolResult] returns at once (the rollout keeps decoding other samples); run(calls)
    submits a turn's calls and waits for them, in order. `timeout` is the default per-call limit in seconds (a
    tool's own `timeout` wins); responses are cut to `max_tool_response_length` characters (tokens with
    `count_tokens`) keeping `tool_response_truncate_side`. metrics() -> {"tools/<name>/calls": n, ...}."""

    def __init__(self, tools: Sequence[Tool], max_parallel_calls: int = 4, timeout: float = 30.0,
                 max_tool_response_length: int = 256, tool_response_truncate_side: str = "middle",
                 count_tokens: Optional[Callable[[str], int]] = None):
        if max_parallel_calls < 1:
            raise ConfigError(f"max_parallel_calls must be >= 1, got {max_parallel_calls}")
        if tool_response_truncate_side not in TRUNCATE_SIDES:
            raise ConfigError(f"tool_response_truncate_side must be one of {TRUNCATE_SIDES}, "
                              f"got {tool_response_truncate_side!r}")
        self.tools: Dict[str, Tool] = {}
        for t in tools:
            if t.name in self.tools:
                raise ConfigError(f"two tools are named {t.name!r}")
            self.tools[t.name] = t
        self.timeout = timeout
        self.max_len = max_tool_response_length
        self.side = tool_response_truncate_side
        self.count_tokens = count_tokens
        self._pool = ThreadPoolExecutor(max_workers=max_parallel_calls, thread_name_prefix="tool")
        self._lock = threading.Lock()
        self._stats: Dict[str, ToolStats] = {}
        self.abandoned_threads = 0       # timed-out plain functions still running in their own thread

    # ---- what the chat template needs ---------------------------------------------------------------------------
    def schemas(self) -> List[Dict]:
        """The `tools` argument of the chat template (apply_chat_template(messages, tools=...))."""
        return [t.schema for t in self.tools.values()]

    # ---- calls ---------------------------------------------------------------------------------------------------
    def submit(self, call: ToolCall) -> "Future[ToolResult]":
        return self._pool.submit(self.call, call)

    def run(self, calls: Sequence[ToolCall]) -> List[ToolResult]:
        futures = [self.submit(c) for c in calls]
        return [f.result() for f in futures]

    def call(self, call: ToolCall) -> ToolResult:
        """One call, in the calling thread (never raises)."""
        start = time.monotonic()
        try:
            result = self._call(call, start)
        except Exception as err:  # noqa: BLE001 - a bug of ours must not end the episode either
            result = ToolResult(call.name, f"Error: the tool runner failed: {type(err).__name__}: {err}", "error",
                                call=call)
        result.seconds = round(time.monotonic() - start, 4)
        self._count(result)
        return result

    def _call(self, call: ToolCall, start: float) -> ToolResult:
        if call.malformed:
            return ToolResult(call.name, f"Error: malformed tool call: {call.error}", "malformed", call=call)
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(call.name, f"Error: unknown tool {_short(call.name)!r}; the tools are: {known}",
                              "unknown_tool", call=call)
        problem = check_arguments(tool.schema, call.arguments)
        if problem:
            return ToolResult(call.name, f"Error: {tool.name}: {problem}", "bad_arguments", call=call)
        limit = tool.timeout if tool.timeout is not None else self.timeout
        box: Dict[str, Any] = {}
        done = threading.Event()

        def target():
            try:
                box["value"] = tool(**call.arguments)
            except BaseException as err:  # noqa: BLE001 - the tool's failure goes to the model as text
                box["error"] = err
            finally:
                done.set()

        worker = threading.Thread(target=target, name=f"tool-{tool.name}", daemon=True)
        worker.start()
        if not done.wait(limit):
            with self._lock:
                self.abandoned_threads += 1
            return ToolResult(tool.name, f"Error: {tool.name} timed out after {limit:g} s", "timeout", call=call)
        if "error" in box:
            err = box["error"]
            return ToolResult(tool.name, f"Error: {tool.name} raised {type(err).__name__}: {_short(str(err), 500)}",
                              "error", call=call)
        value = box.get("value")
        if isinstance(value, CodeResult):
            res = value.result
            status = {"ok": "ok", "timeout": "timeout"}.get(res.status, "error")
            text, cut = self._cut(str(value))
            return ToolResult(tool.name, text, status, call=call, detail=res.to_dict(), truncated=cut or res.truncated)
        text, cut = self._cut(to_text(value))
        return ToolResult(tool.name, text, "ok", call=call, truncated=cut)

    def _cut(self, text: str):
        """The tool's own output is cut to the response limit; our error messages (short, bounded) are not."""
        return truncate(text, self.max_len, self.side, self.count_tokens)

    def _count(self, r: ToolResult):
        name = r.name if r.name in self.tools else ("(malformed)" if r.status == "malformed" else "(unknown)")
        with self._lock:
            s = self._stats.setdefault(name, ToolStats())
            s.calls += 1
            s.errors += r.status != "ok"
            s.timeouts += r.status == "timeout"
            s.truncations += r.truncated
            s.seconds += r.seconds

    # ---- metrics -------------------------------------------------------------------------------------------------
    def stats(self) -> Dict[str, ToolStats]:
        with self._lock:
            return {k: ToolStats(**vars(v)) for k, v in self._stats.items()}

    def metrics(self, reset: bool = False) -> Dict[str, float]:
        """Per-tool counters since the last reset: tools/<name>/{calls,errors,timeouts,truncations,seconds};
        malformed calls count under "(malformed)", unknown names under "(unknown)". Reset each step for
        per-step metrics. tools/abandoned_threads (not reset): timed-out functions whose threads still run."""
        with self._lock:
            out = {}
            for name, s in sorted(self._stats.items()):
                for k, v in vars(s).items():
                    out[f"tools/{name}/{k}"] = round(v, 4) if isinstance(v, float) else v
            if self.abandoned_threads:
                out["tools/abandoned_threads"] = self.abandoned_threads      # timed-out functions still running
            if reset:
                self._stats.clear()
            return out

    def close(self, wait: bool = True):
        self._pool.shutdown(wait=wait)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_JSON_TYPES = {"integer": int, "number": (int, float), "string": str, "boolean": bool, "array": list,
               "object": dict, "null": type(None)}


def check_arguments(schema: Dict, arguments: Dict[str, Any]) -> Optional[str]:
    """Why `arguments` do not fit the tool's schema (unknown or missing names, wrong JSON types, a value not in
    the enum), or None. Checks the top level and array items; that is what a model gets wrong."""
    params = (schema.get("function") or {}).get("parameters") or {}
    props = params.get("properties") or {}
    unknown = [k for k in arguments if k not in props]
    if unknown:
        return f"unknown argument(s) {', '.join(repr(_short(k)) for k in unknown)}; it takes: {', '.join(props)}"
    missing = [k for k in params.get("required", []) if k not in arguments]
    if missing:
        return f"missing required argument(s) {', '.join(repr(k) for k in missing)}"
    for k, v in arguments.items():
        why = _type_problem(props[k], v)
        if why:
            return f"argument {k!r}: {why}"
    return None


def _type_problem(prop: Dict, v: Any) -> Optional[str]:
    if v is None and prop.get("nullable"):
        return None
    if "enum" in prop and v not in prop["enum"]:
        return f"{_short(repr(v))} is not one of {prop['enum']}"
    if "anyOf" in prop:
        return None if any(_type_problem(p, v) is None for p in prop["anyOf"]) else \
            f"{_short(repr(v))} fits none of its types"
    kinds = prop.get("type")
    if kinds is None:
        return None
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    for kind in kinds:
        py = _JSON_TYPES.get(kind)
        if py is None:
            return None         # a type we do not check (e.g. image)
        if isinstance(v, bool) and kind in ("integer", "number"):
            continue
        if isinstance(v, float) and kind == "integer" and v.is_integer():
            return None
        if isinstance(v, py):
            if kind == "array" and "items" in prop:
                for i, item in enumerate(v):
                    why = _type_problem(prop["items"], item)
                    if why:
                        return f"item {i}: {why}"
            return None
    return f"expected {' or '.join(kinds)}, got {type(v).__name__} {_short(repr(v))}"


def _short(s: Any, n: int = 80) -> str:
    s = str(s)
    return s if len(s) <= n else s[:n] + "..."


def to_text(value: Any) -> str:
    """A tool's return value as the model reads it: a string as is, anything else as JSON (str() if not JSON)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


__all__ = ["ToolRunner", "ToolResult", "ToolStats", "truncate", "check_arguments", "to_text", "TRUNCATE_SIDES",
           "STATUSES"]
