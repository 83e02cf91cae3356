"""Tool calls: the hermes parser on well-formed and hostile turns, response truncation, the runner (errors as
messages, timeouts, the pool, metrics), tool modules and MindSpeed-RL / verl tool config files."""
import json
import os
import textwrap
import threading
import time

import pytest

from mindrlhf.configs.errors import ConfigError
from mindrlhf.tools import (CodeInterpreter, Tool, ToolCall, ToolRunner, get_parser, load_tool_config,
                            load_tool_module, truncate)
from mindrlhf.tools.parser import PARSERS
from mindrlhf.tools.registry import retool_code
from mindrlhf.tools.runner import MARK, check_arguments
from mindrlhf.tools.sandbox import SandboxLimits, shared_sandbox


def hermes_call(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# ---- parser ------------------------------------------------------------------------------------------------------
def test_hermes_is_registered_first_and_unknown_names_are_refused():
    assert list(PARSERS)[0] == "hermes"
    with pytest.raises(ValueError, match="hermes"):
        get_parser("mistral_v9")


def test_hermes_parses_qwen_style_calls():
    p = get_parser("hermes")
    text = ("Let me compute it.\n" + hermes_call("code_interpreter", {"code": "print(123 * 45)"}) + "\n"
            + hermes_call("add", {"a": 1, "b": [2, 3]}))
    calls = p.parse(text)
    assert [(c.name, c.arguments, c.malformed) for c in calls] == [
        ("code_interpreter", {"code": "print(123 * 45)"}, False), ("add", {"a": 1, "b": [2, 3]}, False)]
    assert p.content(text) == "Let me compute it."
    assert text[calls[0].span[0]:calls[0].span[1]].startswith("<tool_call>")
    assert p.stop_strings == ("</tool_call>",)
    assert p.parse("no calls here") == []
    # OpenAI style: arguments as a JSON string; no arguments at all
    assert p.parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')[0].arguments == {"x": 1}
    assert p.parse('<tool_call>{"name": "f"}</tool_call>')[0].arguments == {}


# How the Qwen2.5 / Qwen3 chat templates write an assistant's tool calls (the loop over message.tool_calls)
QWEN_TOOL_CALLS = ("{%- for tool_call in tool_calls %}{%- if tool_call.function is defined %}"
                   "{%- set tool_call = tool_call.function %}{%- endif %}"
                   "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
                   "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}")


def test_hermes_reads_what_the_qwen_template_writes():
    jinja2 = pytest.importorskip("jinja2")
    env = jinja2.Environment()
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    code = "print('\u00e9', 1)"
    calls = [{"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}},
             {"name": "add", "arguments": {"a": 1, "b": [2.5, None], "c": {"d": "}</tool_call>"}}},
             {"function": {"name": "f", "arguments": "{\"x\": 3}"}}]      # arguments already a JSON string
    text = "I will call tools." + env.from_string(QWEN_TOOL_CALLS).render(tool_calls=calls)
    got = get_parser("hermes").parse(text)
    assert (got[0].name, got[0].arguments, got[0].error) == ("code_interpreter", {"code": code}, None)
    # a "</tool_call>" inside an argument string ends the tag early: the call is malformed, never misread
    assert got[1].malformed and got[1].name is None
    assert (got[-1].name, got[-1].arguments) == ("f", {"x": 3})


@pytest.mark.parametrize("text,reason", [
    ('<tool_call>{"name": "f", "arguments": {"x": 1}</tool_call>', "not valid JSON"),
    ('<tool_call>{"arguments": {"x": 1}}</tool_call>', "no \"name\""),
    ('<tool_call>{"name": 7, "arguments": {}}</tool_call>', "no \"name\""),
    ('<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>', "must be an object"),
    ('<tool_call>{"name": "f", "arguments": "not json"}</tool_call>', "not JSON"),
    ('<tool_call>["f", {}]</tool_call>', "not an object"),
    ('<tool_call>{"name": "f", "arguments": {"x": 1}}', "unterminated"),
    ('<tool_call>' + "[" * 100000 + '</tool_call>', "too long"),
    ('<tool_call>' + '{"name": "f", "arguments": {"x": "' + "a" * 70000 + '"}}</tool_call>', "too long"),
    ('<tool_call>' + "[" * 5000 + "]" * 5000 + '</tool_call>', "not valid JSON"),      # recursion depth
], ids=["bad_json", "no_name", "name_not_string", "arguments_list", "arguments_bad_string", "not_object",
        "unterminated", "huge_garbage", "huge_argument", "deep_nesting"])
def test_hermes_marks_hostile_calls_malformed_with_the_reason(text, reason):
    calls = get_parser("hermes").parse(text)
    assert len(calls) == 1 and calls[0].malformed and reason in calls[0].error, calls
    assert len(calls[0].raw) <= 200


def test_hermes_nested_tags_and_mixed_turns_never_raise():
    p = get_parser("hermes")
    calls = p.parse("<tool_call>{\"name\": \"f\", <tool_call>" + hermes_call("g", {"y": 2})[len("<tool_call>"):])
    assert calls[0].malformed and "nested" in calls[0].error
    assert calls[1].name == "g" and calls[1].arguments == {"y": 2} and not calls[1].malformed
    calls = p.parse(hermes_call("f", {}) + "</tool_call>" + "<tool_call>oops</tool_call>" + hermes_call("h", {}))
    assert [c.name for c in calls] == ["f", None, "h"] and calls[1].malformed
    for junk in ["<tool_call>", "</tool_call>", "<tool_call></tool_call>", "\x00<tool_call>\ud800</tool_call>",
                 "<tool_call>" * 1000, None, 12]:
        for c in p.parse(junk):
            assert c.malformed
    assert len(p.parse(hermes_call("f", {}) * 500)) == 64      # bounded work per turn


# ---- truncation --------------------------------------------------------------------------------------------------
TEXT = "".join(chr(ord("a") + i % 26) for i in range(100))


@pytest.mark.parametrize("side", ["left", "middle", "right"])
def test_truncate_sides_keep_the_named_part_within_the_limit(side):
    out, cut = truncate(TEXT, 40, side)
    assert cut and len(out) == 40 and MARK in out
    keep = 40 - len(MARK)
    if side == "left":
        assert out == TEXT[:keep] + MARK
    elif side == "right":
        assert out == MARK + TEXT[-keep:]
    else:
        assert out == TEXT[:(keep + 1) // 2] + MARK + TEXT[-(keep // 2):]
    assert truncate(TEXT, 100, side) == (TEXT, False)
    assert truncate(TEXT, 5, side)[0] in (TEXT[:5], TEXT[-5:])     # the marker alone does not fit
    with pytest.raises(ValueError):
        truncate(TEXT, 10, "top")


def test_truncate_by_tokens():
    count = lambda s: len(s.split())          # noqa: E731 - a whitespace "tokenizer"
    text = " ".join(f"w{i}" for i in range(100))
    for side in ("left", "middle", "right"):
        out, cut = truncate(text, 20, side, count_tokens=count)
        assert cut and count(out) <= 20 and count(out) >= 18
    assert truncate(text, 100, "left", count_tokens=count) == (text, False)


# ---- the runner ------------------------------------------------------------------------------------------------
def add(a: int, b: int = 0) -> int:
    """Adds.

    Args:
        a: first
        b: second
    """
    return a + b


def shout(text: str, times: int = 1, mode: str = "upper"):
    """Repeats loudly.

    Args:
        text: what to say
        times: how often
        mode: how (choices: ["upper", "lower"])
    """
    return (text.upper() if mode == "upper" else text.lower()) * times


def explode(msg: str):
    """Raises.

    Args:
        msg: the message
    """
    raise RuntimeError(msg)


def hang(seconds: float):
    """Sleeps.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "woke"


@pytest.fixture
def runner():
    r = ToolRunner([Tool(add), Tool(shout), Tool(explode), Tool(hang, timeout=0.3)], max_parallel_calls=2,
                   timeout=5, max_tool_response_length=50, tool_response_truncate_side="left")
    yield r
    r.close(wait=False)


def test_runner_turns_every_failure_into_a_message(runner):
    p = get_parser("hermes")
    turn = "".join([hermes_call("add", {"a": 2, "b": 3}), hermes_call("nope", {}), hermes_call("add", {"b": 1}),
                    hermes_call("add", {"a": "x"}), hermes_call("add", {"a": 1, "c": 2}),
                    hermes_call("shout", {"text": "hi", "mode": "sideways"}), hermes_call("explode", {"msg": "boom"}),
                    "<tool_call>{bad json}</tool_call>", hermes_call("shout", {"text": "abc", "times": 40})])
    results = runner.run(p.parse(turn))
    got = [(r.status, r.text) for r in results]
    assert got[0] == ("ok", "5")
    assert got[1][0] == "unknown_tool" and "'nope'" in got[1][1] and "add" in got[1][1]
    assert got[2][0] == "bad_arguments" and "missing" in got[2][1] and "'a'" in got[2][1]
    assert got[3][0] == "bad_arguments" and "expected integer" in got[3][1]
    assert got[4][0] == "bad_arguments" and "unknown argument" in got[4][1] and "'c'" in got[4][1]
    assert got[5][0] == "bad_arguments" and "sideways" in got[5][1]
    assert got[6][0] == "error" and "RuntimeError: boom" in got[6][1]
    assert got[7][0] == "malformed" and "not valid JSON" in got[7][1]
    assert got[8][0] == "ok" and results[8].truncated and len(got[8][1]) == 50 and got[8][1].startswith("ABCABC")
    assert all(r.text.startswith("Error") for r in results[1:8])
    assert results[0].message() == {"role": "tool", "name": "add", "content": "5"}
    m = runner.metrics(reset=True)
    assert m["tools/add/calls"] == 4 and m["tools/add/errors"] == 3
    assert m["tools/shout/calls"] == 2 and m["tools/shout/truncations"] == 1 and m["tools/shout/errors"] == 1
    assert m["tools/explode/errors"] == 1 and m["tools/(unknown)/calls"] == 1 and m["tools/(malformed)/calls"] == 1
    assert runner.metrics() == {}           # counters reset (nothing timed out here)


def test_runner_timeout_frees_the_caller_at_the_deadline(runner):
    start = time.monotonic()
    r = runner.call(ToolCall("hang", {"seconds": 5}))
    took = time.monotonic() - start
    assert r.status == "timeout" and "timed out after 0.3 s" in r.text
    assert took < 0.3 + 0.5, took
    m = runner.metrics()
    assert m["tools/hang/timeouts"] == 1 and m["tools/hang/errors"] == 1 and m["tools/abandoned_threads"] == 1


def test_runner_submit_returns_at_once_and_runs_in_parallel(runner):
    gate = threading.Event()

    def wait_gate(tag: str):
        """Waits for the gate.

        Args:
            tag: returned
        """
        gate.wait(5)
        return tag
    r = ToolRunner([Tool(wait_gate)], max_parallel_calls=2, timeout=10)
    start = time.monotonic()
    futures = [r.submit(ToolCall("wait_gate", {"tag": t})) for t in "ab"]
    assert time.monotonic() - start < 0.5 and not any(f.done() for f in futures)
    gate.set()
    assert [f.result(5).text for f in futures] == ["a", "b"]
    r.close()


def test_check_arguments_against_a_schema():
    s = Tool(add).schema
    assert check_arguments(s, {"a": 1}) is None
    assert check_arguments(s, {"a": 1.0}) is None               # JSON has no integer type of its own
    assert "expected integer" in check_arguments(s, {"a": True})
    assert "expected integer" in check_arguments(s, {"a": 1.5})


# ---- tool modules ------------------------------------------------------------------------------------------------
def test_tool_module_by_decorator_and_by_list(tmp_path):
    deco = tmp_path / "deco_tools.py"
    deco.write_text(textwrap.dedent('''
        from mindrlhf.tools import register_tool

        @register_tool
        def mul(a: int, b: int) -> int:
            """Multiplies.

            Args:
                a: first
                b: second
            """
            return a * b

        @register_tool(name="negate", timeout=1.5)
        def neg(x: float) -> float:
            """Negates.

            Args:
                x: the number
            """
            return -x
    '''))
    tools = {t.name: t for t in load_tool_module(str(deco))}
    assert set(tools) == {"mul", "negate"} and tools["negate"].timeout == 1.5
    assert tools["negate"].schema["function"]["name"] == "negate"
    plain = tmp_path / "plain_tools.py"
    plain.write_text(textwrap.dedent('''
        def upper(s: str) -> str:
            """Upper-cases.

            Args:
                s: the text
            """
            return s.upper()

        TOOLS = [upper]
    '''))
    (t,) = load_tool_module(str(plain))
    r = ToolRunner([t] + list(tools.values()))
    assert [x.text for x in r.run([ToolCall("upper", {"s": "ab"}), ToolCall("mul", {"a": 6, "b": 7})])] == ["AB", "42"]
    r.close()


@pytest.mark.parametrize("body,words", [("x = 1\n", ["defines no tool"]),
                                        ("raise ImportError('nope')\n", ["importing it failed", "nope"]),
                                        ("def f(x):\n    return x\nTOOLS = [f]\n", ["'f'", "no docstring"])])
def test_tool_module_errors_name_the_module(tmp_path, body, words):
    path = tmp_path / "bad_tools.py"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load_tool_module(str(path))
    for w in words:
        assert w in str(err.value)
    with pytest.raises(ConfigError, match="no such file"):
        load_tool_module(str(tmp_path / "missing.py"))


# ---- MindSpeed-RL / verl tool config files ---------------------------------------------------------------------------
MINDSPEED_RETOOL = """\
tools:
  - class_name: "mindspeed_rl.tools.retool.ReTool"
    config:
      sandbox_fusion_url: "http://localhost:8080/run_code"
      num_workers: 128
      enable_global_rate_limit: true
      rate_limit: 128
      default_timeout: 30
      default_language: "python"
      memory_limit_mb: 1024
      type: native

    tool_schema:
      type: "function"
      function:
        name: "code_interpreter"
        description: "A tool for executing code."
        parameters:
          type: "object"
          properties:
            code:
              type: "string"
              description: "The code to execute."
          required: ["code"]
"""

VERL_SANDBOX_FUSION = """\
tools:
  - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
    config: {
      "sandbox_fusion_url": "https://example.invalid/run_code"
    }
    tool_schema:
      type: "function"
      function:
        name: "code_interpreter"
        description: "A tool for executing code."
        parameters:
          type: "object"
          properties:
            code:
              type: "string"
              description: "The code to execute."
          required: ["code"]
"""


def test_mindspeed_retool_config_maps_to_our_code_interpreter(tmp_path):
    path = tmp_path / "retool_config.yaml"
    path.write_text(MINDSPEED_RETOOL)
    notes = []
    (tool,) = load_tool_config(str(path), notes=notes)
    assert isinstance(tool, CodeInterpreter) and tool.name == "code_interpreter" and tool.retool_style
    assert tool.backend.backend == "sandbox_fusion" and tool.backend.url == "http://localhost:8080/run_code"
    assert tool.limits.timeout == 30 and tool.limits.memory_mb == 1024
    assert tool.schema["function"]["description"] == "A tool for executing code."
    assert sorted(n.split(": config.")[1].split(" ")[0] for n in notes) == ["enable_global_rate_limit", "num_workers",
                                                                          "rate_limit"]
    (local,) = load_tool_config(str(path), use_local_sandbox=True, notes=notes)
    assert local.backend.backend in ("bwrap", "rlimits-only") and "ignored" in notes[-1]
    path = tmp_path / "verl.yaml"
    path.write_text(VERL_SANDBOX_FUSION)
    (tool,) = load_tool_config(str(path))
    assert not tool.retool_style and tool.backend.url == "https://example.invalid/run_code"


@pytest.mark.parametrize("edit,words", [
    (lambda s: s.replace("mindspeed_rl.tools.retool.ReTool", "mindspeed_rl.tools.search_tool.SearchTool"),
     ["mindspeed_rl.tools.search_tool.SearchTool", "not supported"]),
    (lambda s: s.replace("type: native", "type: mcp"), ["config.type", "mcp"]),
    (lambda s: s.replace('default_language: "python"', 'default_language: "cpp"'), ["default_language", "cpp"]),
    (lambda s: s.replace("rate_limit: 128", "rate_limit: 128\n      retries: 3"), ["'retries'", "not known"]),
    (lambda s: s.replace("            code:\n", "            source:\n"), ["'code' parameter"]),
    (lambda s: "tools: 3\n", ["'tools:' list"]),
])
def test_tool_config_refusals_name_the_key(tmp_path, edit, words):
    path = tmp_path / "cfg.yaml"
    path.write_text(edit(MINDSPEED_RETOOL))
    with pytest.raises(ConfigError) as err:
        load_tool_config(str(path))
    for w in words:
        assert w in str(err.value)


def test_retool_style_code():
    assert retool_code("```python\nx = 6 * 7\nx\n```") == "x = 6 * 7\nprint(x)"
    assert retool_code("print(1)") == "print(1)"
    assert retool_code("for i in range(2):\n    i") == "for i in range(2):\n    i"
    assert retool_code("a = 1\n(a +\n 1)") == "a = 1\nprint((a +\n 1))"
    assert retool_code("def (:") == "def (:"


def test_code_interpreter_through_the_runner():
    """The built-in behind the runner: its output, an error's traceback, a timeout (status timeout), metrics."""
    tool = CodeInterpreter()
    r = ToolRunner([tool], max_parallel_calls=2, max_tool_response_length=500)
    ok, err = r.run([ToolCall("code_interpreter", {"code": "print(123 * 45)"}),
                     ToolCall("code_interpreter", {"code": "1/0"})])
    assert (ok.status, ok.text) == ("ok", "5535\n") and ok.detail["status"] == "ok"
    assert err.status == "error" and "ZeroDivisionError" in err.text and "[exit code 1]" in err.text
    tool.limits.timeout = 0.5
    slow = r.call(ToolCall("code_interpreter", {"code": "import time\nprint('start', flush=True)\ntime.sleep(30)"}))
    assert slow.status == "timeout" and "start" in slow.text and slow.seconds < 1.5
    assert shared_sandbox().limits.timeout == SandboxLimits().timeout      # the shared sandbox kept its own
    m = r.metrics()
    assert m["tools/code_interpreter/calls"] == 3 and m["tools/code_interpreter/timeouts"] == 1
    r.close()
    assert os.environ.get("PATH")          # the trainer's environment is untouched


def test_sandbox_status_lines_for_start_up():
    from mindrlhf.tools import LocalSandbox, sandbox_status
    lines = sandbox_status([Tool(add), CodeInterpreter()])
    assert len(lines) == 1 and lines[0].startswith("tool code_interpreter: ")
    weak = CodeInterpreter(backend=LocalSandbox(use_bwrap=False, warn=False))
    (line,) = sandbox_status([weak])
    assert "rlimits-only; protections OFF: filesystem view" in line and "network" in line
