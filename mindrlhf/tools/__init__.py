"""Tools for multi-turn episodes: tool schemas from plain functions, tool-call parsing, running calls in a pool,
and the built-in code interpreter's sandbox. Imports configs only and never MindSpore (tests/test_structure.py,
tests/test_tools_sandbox.py).

What a rollout integration calls (one runner per job; the episode loop, KV-cache continuation and loss masks
are the rollout's and trainer's, not this package's):

    from mindrlhf.tools import (ToolRunner, get_parser, load_tool_module, load_tool_config, CodeInterpreter,
                                sandbox_status)

    tools = load_tool_module(cfg.tool_module)                 # --tool_module my_tools.py: plain functions
    tools += load_tool_config(cfg.tool_config_path)           # MindSpeed-RL / verl tool config file
    tools += [CodeInterpreter()]                              # or the built-in alone
    for line in sandbox_status(tools): log(line)              # says which sandbox protections are off
    runner = ToolRunner(tools, max_parallel_calls=..., timeout=...,
                        max_tool_response_length=..., tool_response_truncate_side="middle",   # left/middle/right
                        count_tokens=lambda s: len(tok.encode(s)))                            # optional: tokens
    parser = get_parser(cfg.tool_parser_format)               # "hermes"
    prompt = apply_chat_template(messages, tools=runner.schemas())

    # per sample, per turn: decode until EOS or one of parser.stop_strings ("</tool_call>"), then
    calls = parser.parse(turn_text)[:max_parallel_calls]      # ToolCall(name, arguments, error, raw, span)
    futures = [runner.submit(c) for c in calls]               # returns at once: other samples keep decoding
    ...
    results = [f.result() for f in futures]                   # ToolResult(name, text, status, seconds,
                                                              #            truncated, call, detail)
    # render [r.message() for r in results] as the chat template renders role "tool" messages, tokenize only
    # those appended tokens (mask 0), prefill them on the KV cache, continue decoding; stop at max_tool_calls
    # or max_total_response_length.
    step_metrics.update(runner.metrics(reset=True))           # tools/<name>/{calls,errors,timeouts,truncations,seconds}

Guarantees: nothing the model writes raises (a malformed call, an unknown tool, bad arguments, a tool that
raises or overruns its timeout are ToolResults with an "Error: ..." text and a status); `runner.submit` never
blocks on a tool; a call never delays its caller past its timeout (plus ~0.2 s for the code interpreter).
"""
import importlib

# names -> their module, imported on first use (so `python -m mindrlhf.tools.sandbox` runs the module once)
_WHERE = {
    "parser": ("PARSERS", "HermesParser", "ToolCall", "ToolCallParser", "get_parser", "register_parser"),
    "registry": ("CODE_INTERPRETER_SCHEMA", "CodeInterpreter", "Tool", "load_tool_config", "load_tool_module", "load_tools",
                 "register_tool", "sandbox_status"),
    "runner": ("ToolResult", "ToolRunner", "ToolStats", "check_arguments", "truncate"),
    "sandbox": ("LocalSandbox", "SandboxFusionClient", "SandboxLimits", "SandboxResult"),
    "schema": ("SchemaError", "function_schema"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name):
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(f"mindrlhf.tools.{_MODULE_OF[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mindrlhf.tools' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
