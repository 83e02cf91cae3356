"""Where tools come from: a user's module of plain functions (`--tool_module`), MindSpeed-RL's / verl's tool
config file (`tool_config_path`), and the built-in `code_interpreter`.

A tool module is as plain as a reward module: decorate functions with `@register_tool` (from mindrlhf.tools),
or, with no import of ours at all, list them in a module-level `TOOLS = [fn, ...]`. Each function needs type
hints and a Google-style docstring (its schema is derived: mindrlhf.tools.schema).

A tool config file (MindSpeed-RL's `configs/tools/retool_config.yaml`, verl's
`examples/sglang_multiturn/config/tool_config/sandbox_fusion_tool_config.yaml`):

    tools:
      - class_name: "mindspeed_rl.tools.retool.ReTool"
        config: {sandbox_fusion_url: "http://localhost:8080/run_code", default_timeout: 30, memory_limit_mb: 1024, ...}
        tool_schema: {type: function, function: {name: code_interpreter, description: ..., parameters: {...}}}

Their code-interpreter classes map to our built-in (CODE_INTERPRETER_CLASSES); any other class is refused by
name. Config keys are each mapped, inert (said why) or refused (CONFIG_KEYS).
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
from typing import Any, Callable, Dict, List, Optional, Sequence

from mindrlhf.configs.errors import ConfigError
from mindrlhf.tools.sandbox import LocalSandbox, SandboxFusionClient, SandboxLimits, shared_sandbox
from mindrlhf.tools.schema import SchemaError, function_schema


class Tool:
    """A callable the model may call by `name`: `tool(**arguments)` returns the text the model reads.
    `timeout`: seconds a call may take (None: the runner's default); `schema`: the function-calling schema."""

    def __init__(self, fn: Callable, name: Optional[str] = None, schema: Optional[Dict] = None,
                 timeout: Optional[float] = None):
        if schema is None:
            try:
                schema = function_schema(fn)
            except SchemaError as err:
                raise ConfigError(f"tool {getattr(fn, '__name__', fn)!r}: {err}") from None
        self.fn = fn
        self.schema = schema
        self.name = name or schema["function"]["name"]
        if name and schema["function"].get("name") != name:
            self.schema = {**schema, "function": {**schema["function"], "name": name}}
        self.timeout = timeout

    def __call__(self, **arguments) -> Any:
        return self.fn(**arguments)

    def __repr__(self):
        return f"Tool({self.name!r})"


_REGISTERED: Dict[str, Tool] = {}
_LOADING: List[List[Tool]] = []


def register_tool(fn: Optional[Callable] = None, *, name: Optional[str] = None, timeout: Optional[float] = None):
    """`@register_tool` or `@register_tool(name=..., timeout=...)`: the function becomes a tool when its module
    is loaded by load_tool_module. The function itself is returned unchanged."""
    def wrap(f):
        tool = Tool(f, name=name, timeout=timeout)
        _REGISTERED[tool.name] = tool
        for added in _LOADING:
            added.append(tool)
        return f
    return wrap(fn) if fn is not None else wrap


def load_tool_module(spec: str) -> List[Tool]:
    """A user's tools: `spec` is a .py file or an importable dotted module. Its `@register_tool` functions and
    its `TOOLS` list (functions or Tool objects) are the tools; a module with neither is refused."""
    if not spec:
        return []
    added: List[Tool] = []
    _LOADING.append(added)
    try:
        if spec.endswith(".py") or os.sep in spec:
            if not os.path.isfile(spec):
                raise ConfigError(f"tool_module: no such file: {spec}")
            mod_name = "mindrlhf_tool_module_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(spec))[0])
            module_spec = importlib.util.spec_from_file_location(mod_name, spec)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(spec)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's module: any failure is a set-up error naming it
        raise ConfigError(f"tool_module {spec}: importing it failed: {type(err).__name__}: {err}") from None
    finally:
        _LOADING.remove(added)
    if not added and not spec.endswith(".py"):     # imported before: its registered tools
        added = [t for t in _REGISTERED.values() if getattr(t.fn, "__module__", "") == module.__name__]
    listed = getattr(module, "TOOLS", None)
    if listed is not None:
        if not isinstance(listed, (list, tuple)):
            raise ConfigError(f"tool_module {spec}: TOOLS must be a list of functions, got {type(listed).__name__}")
        for item in listed:
            if not callable(item):
                raise ConfigError(f"tool_module {spec}: TOOLS holds {item!r}, which is not a function")
            added.append(item if isinstance(item, Tool) else Tool(item))
    if not added:
        raise ConfigError(f"tool_module {spec}: defines no tool (decorate functions with @register_tool from "
                          f"mindrlhf.tools, or list them in TOOLS = [...])")
    return _unique(added, f"tool_module {spec}")


def _unique(tools: Sequence[Tool], where: str) -> List[Tool]:
    seen: Dict[str, Tool] = {}
    for t in tools:
        if t.name in seen and seen[t.name].fn is not t.fn:
            raise ConfigError(f"{where}: two tools are named {t.name!r}")
        seen[t.name] = t
    return list(seen.values())


# ---- the built-in code interpreter ----------------------------------------------------------------------------
CODE_INTERPRETER_SCHEMA = {"type": "function", "function": {
    "name": "code_interpreter",
    "description": "Runs Python code and returns what it prints (stdout, then stderr). Print the values you need.",
    "parameters": {"type": "object", "properties": {
        "code": {"type": "string", "description": "The Python code to run."}}, "required": ["code"]}}}


class CodeInterpreter(Tool):
    """Runs the model's Python code in the local sandbox (or on SandboxFusion when `sandbox_fusion_url` is
    set) and answers with its stdout, then stderr, then a status line when it did not finish normally.

    `retool_style`: as MindSpeed-RL's ReTool, take the code out of a ```python fence when there is one, and
    print the last line's value when it is a bare expression (ours decides that with `ast`, not by prefix)."""

    def __init__(self, limits: Optional[SandboxLimits] = None, sandbox_fusion_url: str = "",
                 schema: Optional[Dict] = None, retool_style: bool = False, backend=None):
        self.limits = limits or SandboxLimits()
        if backend is not None:
            self.backend = backend
        elif sandbox_fusion_url:
            self.backend = SandboxFusionClient(sandbox_fusion_url, self.limits)
        else:
            self.backend = shared_sandbox(self.limits)
        self.retool_style = retool_style
        # the sandbox's own wall clock bounds the run; the runner's timeout only backs it up
        super().__init__(self._run, schema=schema or CODE_INTERPRETER_SCHEMA,
                         timeout=self.limits.timeout + (20.0 if sandbox_fusion_url else 2.0))

    @property
    def protections_off(self) -> List[str]:
        return list(getattr(self.backend, "protections_off", []))

    def _run(self, code: str) -> str:
        if not isinstance(code, str):
            code = str(code)
        if self.retool_style:
            code = retool_code(code)
        res = self.backend.run(code, timeout=self.limits.timeout, memory_mb=self.limits.memory_mb)
        text = res.stdout
        if res.stderr:
            text += ("" if not text or text.endswith("\n") else "\n") + res.stderr
        if res.status != "ok":
            note = {"timeout": f"timed out after {self.limits.timeout:g} s", "killed": "killed",
                    "error": f"exit code {res.exit_code}" if res.exit_code is not None else "error"}[res.status]
            if note not in text:
                text += ("" if not text or text.endswith("\n") else "\n") + f"[{note}]"
        return CodeResult(text, res)


class CodeResult(str):
    """The model's text, carrying the sandbox's full result (status, seconds, ...) for the runner's metrics."""

    def __new__(cls, text, result):
        obj = super().__new__(cls, text)
        obj.result = result
        return obj


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def retool_code(code: str) -> str:
    m = _FENCE.search(code)
    if m:
        code = m.group(1)
    code = code.strip("\n")
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code                     # let the interpreter report it
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        call = last.value
        is_print = isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print"
        if not is_print:
            lines = code.split("\n")
            head = "\n".join(lines[:last.lineno - 1])
            expr = "\n".join(lines[last.lineno - 1:last.end_lineno])
            prefix = expr[:last.col_offset]
            code = (head + "\n" if head else "") + prefix + "print(" + expr[last.col_offset:] + ")"
    return code


# ---- MindSpeed-RL's / verl's tool config file ------------------------------------------------------------------
CODE_INTERPRETER_CLASSES = {
    "mindspeed_rl.tools.retool.ReTool": "retool",            # fenced code, prints the last expression
    "mindspeed_rl.tools.sandbox_fusion_tools.SandboxFusionTool": "plain",
    "mindspeed_rl.tools.sandbox_fusion_tool.SandboxFusionTool": "plain",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "plain",
    "mindrlhf.tools.CodeInterpreter": "plain",
}
# config key -> ("mapped", our field) / ("inert", why) / ("checked", the values we accept)
CONFIG_KEYS = {
    "sandbox_fusion_url": ("mapped", "the SandboxFusion client's URL; empty: the local sandbox"),
    "default_timeout": ("mapped", "SandboxLimits.timeout"),
    "timeout": ("mapped", "SandboxLimits.timeout"),
    "memory_limit_mb": ("mapped", "SandboxLimits.memory_mb"),
    "default_language": ("checked", ("python",)),
    "type": ("checked", ("native",)),
    "num_workers": ("inert", "calls run in the runner's pool of max_parallel_calls workers"),
    "rate_limit": ("inert", "no global rate limiter: max_parallel_calls bounds concurrent calls"),
    "enable_global_rate_limit": ("inert", "no Ray rate-limiter actor here; max_parallel_calls bounds calls"),
}


def load_tools(tool_module: str = "", tool_config_path: str = "", notes: Optional[List[str]] = None) -> List[Tool]:
    """The tools a run (or rlhf_data.py's prompts) offers: `tool_module`'s functions and `tool_config_path`'s
    entries, one name each. The one loader for the trainer and the data command, so the prompts offer exactly
    the tools the episodes run."""
    tools = load_tool_module(tool_module) if tool_module else []
    if tool_config_path:
        tools += load_tool_config(tool_config_path, notes=notes)
    names = [tool.name for tool in tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"tools: {', '.join(dupes)} defined twice (tool_module {tool_module!r} and "
                          f"tool_config_path {tool_config_path!r})")
    return tools


def load_tool_config(path: str, use_local_sandbox: bool = False, notes: Optional[List[str]] = None) -> List[Tool]:
    """Tools from a MindSpeed-RL / verl tool config file. `use_local_sandbox`: ignore a `sandbox_fusion_url`
    and run code in the local sandbox (said in `notes`). Inert keys are listed in `notes` with the reason."""
    import yaml
    notes = notes if notes is not None else []
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except OSError as err:
        raise ConfigError(f"tool_config_path {path}: cannot read it: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"tool_config_path {path}: not valid YAML: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tools"), list):
        raise ConfigError(f"tool_config_path {path}: expected a mapping with a 'tools:' list")
    tools = []
    for i, entry in enumerate(doc["tools"]):
        where = f"tool_config_path {path}, tools[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a mapping with class_name, config, tool_schema")
        unknown = set(entry) - {"class_name", "config", "tool_schema"}
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)} (expected class_name, config, tool_schema)")
        cls = entry.get("class_name")
        if cls not in CODE_INTERPRETER_CLASSES:
            raise ConfigError(f"{where}: class_name {cls!r} is not supported; the tools we can run from a config "
                              f"file are the code interpreter ({', '.join(sorted(CODE_INTERPRETER_CLASSES))}); "
                              f"write other tools as Python functions in a --tool_module")
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ConfigError(f"{where}: config must be a mapping")
        limits = {}
        url = ""
        for key, value in config.items():
            kind, what = CONFIG_KEYS.get(key, (None, None))
            if kind is None:
                raise ConfigError(f"{where}: config key {key!r} is not known (known: {', '.join(sorted(CONFIG_KEYS))})")
            if kind == "inert":
                notes.append(f"{where}: config.{key} = {value!r} is inert: {what}")
            elif kind == "checked" and value not in what:
                raise ConfigError(f"{where}: config.{key} = {value!r} is not supported (only {', '.join(what)})")
            elif key == "sandbox_fusion_url":
                url = str(value or "")
            elif key in ("default_timeout", "timeout"):
                limits["timeout"] = float(value)
            elif key == "memory_limit_mb":
                limits["memory_mb"] = int(value)
        if url and use_local_sandbox:
            notes.append(f"{where}: sandbox_fusion_url {url} ignored: code runs in the local sandbox")
            url = ""
        schema = entry.get("tool_schema") or CODE_INTERPRETER_SCHEMA
        _check_code_schema(schema, where)
        try:
            lim = SandboxLimits(**limits)
        except ValueError as err:
            raise ConfigError(f"{where}: {err}") from None
        tools.append(CodeInterpreter(lim, sandbox_fusion_url=url, schema=schema,
                                     retool_style=CODE_INTERPRETER_CLASSES[cls] == "retool"))
    return _unique(tools, f"tool_config_path {path}")


def _check_code_schema(schema, where):
    fn = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ConfigError(f"{where}: tool_schema must be {{type: function, function: {{name, description, "
                          f"parameters}}}}")
    props = (fn.get("parameters") or {}).get("properties") or {}
    if "code" not in props:
        raise ConfigError(f"{where}: the code interpreter's tool_schema must have a 'code' parameter "
                          f"(has {sorted(props)})")


def sandbox_status(tools: Sequence[Tool]) -> List[str]:
    """Start-up lines: each code interpreter's back end and the protections it lacks."""
    lines = []
    for t in tools:
        if isinstance(t, CodeInterpreter):
            off = t.protections_off
            lines.append(f"tool {t.name}: {t.backend.backend}" + (f"; protections OFF: {'; '.join(off)}" if off
                                                                  else ""))
    return lines


__all__ = ["Tool", "register_tool", "load_tool_module", "load_tool_config", "CodeInterpreter", "CodeResult",
           "CODE_INTERPRETER_SCHEMA", "CODE_INTERPRETER_CLASSES", "CONFIG_KEYS", "retool_code", "sandbox_status",
           "LocalSandbox", "SandboxFusionClient"]
