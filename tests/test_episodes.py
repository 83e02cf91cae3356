"""Multi-turn tool-use episodes in the rollout engine (rollout/episodes.py, engine._generate_episodes): a scripted
two-turn episode's tokens, masks and log-probs against a full forward of the whole sequence (KV continuation ==
re-encode), errors in the episode instead of crashes, the limits, and one turn equal to the single-turn engine."""
import os

import numpy as np
import pytest

from hf_reference import make_hf_model, tiny_model_kwargs
from model_helpers import load_ours
from mindrlhf.configs import ModelConfig
from mindrlhf.data.chat_template import ChatTemplate
from mindrlhf.models.padding import left_pad
from mindrlhf.rollout.engine import GenerationEngine
from mindrlhf.rollout.episodes import EpisodeTools
from mindrlhf.rollout.sampling import SamplingParams, token_logprobs
from mindrlhf.tools import ToolRunner, get_parser
from mindrlhf.tools.registry import Tool
from mindrlhf.trainer.samples import SampleBatch, training_tensors
from mindrlhf.trainer.update.one_graph import ResponseLogProb

# ChatML with tools, as Qwen2.5's template renders tool results (several in one user turn)
CHATML_TOOLS = (
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n<tool_response>\\n' }}{{ m.content }}{{ '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<tool_call>", "</tool_call>", "<|im_end|>", "<|im_start|>", "<tool_response>", "</tool_response>"]
EOS = 100 + SPECIAL.index("<|im_end|>")


class CharTokenizer:
    """Printable ASCII and newline one id each (3..98), the chat's special strings 100..105."""

    def encode(self, text):
        out, i = [], 0
        while i < len(text):
            hit = next((s for s in SPECIAL if text.startswith(s, i)), None)
            if hit:
                out.append(100 + SPECIAL.index(hit))
                i += len(hit)
            else:
                out.append(3 if text[i] == "\n" else ord(text[i]) - 32 + 4)
                i += 1
        return out

    def decode(self, ids, skip_special_tokens=False):
        out = []
        for t in ids:
            t = int(t)
            out.append(SPECIAL[t - 100] if 100 <= t < 106 else "\n" if t == 3 else
                       chr(t - 4 + 32) if 4 <= t < 99 else "")
        return "".join(out)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def boom(x: int) -> int:
    """Always raises.

    Args:
        x: anything
    """
    raise ValueError("the tool broke")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("hf"))
    make_hf_model(d, qkv_bias=True, tie=False, n_kv_heads=2)
    kw = dict(tiny_model_kwargs(True, False, 2), seq_length=256)
    return load_ours(d, ModelConfig(**kw))


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tpl"))
    with open(os.path.join(d, "chat_template.jinja"), "w") as fh:
        fh.write(CHATML_TOOLS)
    return ChatTemplate(d)


def episode_tools(template, max_tool_calls=4, max_total=0, tools=(add, boom), max_len=64):
    tok = CharTokenizer()
    runner = ToolRunner([Tool(f) for f in tools], max_parallel_calls=2, timeout=5.0,
                        max_tool_response_length=max_len)
    return EpisodeTools(runner, get_parser("hermes"), tok.encode, tok.decode, template.tool_delta, max_tool_calls,
                        2, max_total)


class ScriptedEngine(GenerationEngine):
    """The model's tokens are scripted per row (the text it 'writes', then EOS); log-probs are the model's own
    for those tokens, so they can be checked against a full forward."""

    def __init__(self, *a, scripts=(), **kw):
        super().__init__(*a, **kw)
        tok = CharTokenizer()
        self.scripts = [[tok.encode(turn) for turn in row] for row in scripts]
        self.turn_of = {}

    def _draw(self, logits, params, seen, suppress_eos, u, seqs, positions):
        out = []
        for seq, pos in zip(seqs.tolist(), positions.tolist()):
            turn, k = self.turn_of.get(seq, (0, 0))
            script = self.scripts[seq][turn] if turn < len(self.scripts[seq]) else []
            out.append(script[k] if k < len(script) else EOS)
            self.turn_of[seq] = (turn, k + 1) if k + 1 < len(script) else (turn + 1, 0)
        tokens = np.array(out, np.int64)
        return tokens, token_logprobs(logits, tokens, params.logprob_temperature)


def call(name, **args):
    import json
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def run(model, template, scripts, tools=None, max_tokens=240, prompts=None, **kw):
    tools = tools or episode_tools(template, **kw)
    prompts = prompts or [[5, 9, 11, 20, 7]]
    engine = ScriptedEngine(model, pad_token_id=0, prompt_bucket=8, scripts=scripts, tools=tools)
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, n=len(scripts) // len(prompts), seed=1,
                            eos_token_ids=[EOS])
    return engine.generate(prompts, params), tools


def full_forward_logprobs(model, out):
    ids, mask = left_pad(out.prompt_ids, 8, 0)
    batch = SampleBatch(ids, mask, out.response_ids, out.response_mask, out.logprobs, out.prompt_index,
                        np.zeros(len(ids), np.int64))
    t = training_tensors(batch)
    return ResponseLogProb(model, out.response_ids.shape[1])(t["input_ids"], t["position_ids"], t["bias"],
                                                            t["labels"]).asnumpy()


def test_two_turn_episode_tokens_masks_and_kv_continuation(model, template):
    tok = CharTokenizer()
    scripts = [[call("add", a=2, b=3), "5"], ["7"]]
    out, _ = run(model, template, scripts)
    delta = template.tool_delta([{"role": "tool", "name": "add", "content": "5"}])
    assert delta == "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n" \
                    "<|im_start|>assistant\n"
    t1, d, t2 = tok.encode(call("add", a=2, b=3)), tok.encode(delta), tok.encode("5") + [EOS]
    n = len(t1) + len(d) + len(t2)
    assert out.response_ids[0, :n].tolist() == t1 + d + t2
    assert out.response_mask[0].tolist() == [1] * n + [0] * (240 - n)
    assert out.loss_mask[0].tolist() == [1] * len(t1) + [0] * len(d) + [1] * len(t2) + [0] * (240 - n)
    assert out.turns[0] == [(0, len(t1), "model"), (len(t1), len(t1) + len(d), "tool"), (len(t1) + len(d), n, "model")]
    assert out.tool_calls.tolist() == [1, 0] and out.finish_reason == ["stop", "stop"]
    assert out.response_ids[1, :2].tolist() == tok.encode("7") + [EOS] and out.loss_mask[1].sum() == 2
    assert (out.logprobs[out.response_mask == 1][out.loss_mask[out.response_mask == 1] == 0] == 0).all()
    # the engine's log-probs of the model's tokens (KV cache, tool tokens fed as forced tokens) equal a full
    # forward over the whole episode
    full = full_forward_logprobs(model, out)
    m = out.loss_mask.astype(bool)
    assert np.abs(full[m] - out.logprobs[m]).max() <= 1e-5


def test_errors_become_messages_never_crashes(model, template):
    scripts = [["<tool_call>{not json</tool_call>", "a"], [call("nope", q=1), "b"], [call("boom", x=1), "c"],
               [call("add", a="two", b=3), "d"], ["</tool_call>", "e"]]
    out, tools = run(model, template, scripts, max_tokens=240)
    tok = CharTokenizer()
    texts = [tok.decode(r[m == 1]) for r, m in zip(out.response_ids, out.response_mask)]
    assert "Error: malformed tool call: tool call is not valid JSON" in texts[0]
    assert "Error: unknown tool 'nope'" in texts[1]
    assert "Error: boom raised ValueError: the tool broke" in texts[2]
    assert "Error: add: argument 'a'" in texts[3]
    assert "without a tool call before it" in texts[4]
    assert out.finish_reason == ["stop"] * 5 and out.tool_calls.tolist() == [1] * 5
    metrics = tools.runner.metrics()
    assert metrics["tools/boom/errors"] == 1 and metrics["tools/add/errors"] == 1
    assert metrics["tools/(malformed)/calls"] == 2 and metrics["tools/(unknown)/calls"] == 1


def test_max_tool_calls_ends_the_episode(model, template):
    scripts = [[call("add", a=1, b=1), call("add", a=2, b=2), "never"]]
    out, _ = run(model, template, scripts, max_tool_calls=1)
    tok = CharTokenizer()
    text = tok.decode(out.response_ids[0][out.response_mask[0] == 1])
    assert out.finish_reason == ["tool_calls"] and out.tool_calls.tolist() == [1]
    assert text.endswith(call("add", a=2, b=2)) and "never" not in text and text.count("<tool_response>") == 1


def test_max_total_response_length_cuts_the_episode(model, template):
    tok = CharTokenizer()
    first = tok.encode(call("add", a=2, b=3))
    for limit in (len(first) + 10, len(first) - 5):           # cut inside the tool tokens, and inside the turn
        out, _ = run(model, template, [[call("add", a=2, b=3), "5"]], max_total=limit)
        assert out.response_mask[0].sum() == limit and out.finish_reason == ["length"]
        assert out.loss_mask[0].sum() == min(limit, len(first))


def test_no_tool_call_equals_the_single_turn_engine(model, template):
    """Episodes that never call a tool draw exactly the single-turn engine's tokens and log-probs."""
    prompts = [[5, 9, 11, 20, 7], [30, 31, 2, 4, 4, 4, 4, 4, 4]]
    params = SamplingParams(temperature=1.0, max_tokens=10, n=3, seed=4, eos_token_ids=[7])
    single = GenerationEngine(model, pad_token_id=0, prompt_bucket=8).generate(prompts, params)
    multi = GenerationEngine(model, pad_token_id=0, prompt_bucket=8,
                             tools=episode_tools(template)).generate(prompts, params)
    assert np.array_equal(single.response_ids, multi.response_ids)
    assert np.array_equal(single.response_mask, multi.loss_mask)
    assert np.abs(single.logprobs - multi.logprobs).max() <= 1e-6
    assert single.finish_reason == multi.finish_reason
