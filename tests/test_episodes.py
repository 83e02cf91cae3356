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
def models(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("hf"))
    hf = make_hf_model(d, qkv_bias=True, tie=False, n_kv_heads=2)
    kw = dict(tiny_model_kwargs(True, False, 2), seq_length=256)
    return hf, load_ours(d, ModelConfig(**kw))


@pytest.fixture(scope="module")
def model(models):
    return models[1]


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


def test_two_turn_episode_tokens_masks_and_kv_continuation(models, template):
    hf, model = models
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
    # and transformers on the same weights, the whole episode re-encoded as one sequence
    from hf_reference import hf_logits
    seq = np.array([out.prompt_ids[0] + out.response_ids[0, :n].tolist()])
    logits = hf_logits(hf, seq)[0, len(out.prompt_ids[0]) - 1:-1].astype(np.float64)
    ref = logits[np.arange(n), seq[0, len(out.prompt_ids[0]):]] - np.log(np.exp(logits).sum(-1))
    assert np.abs(ref[m[0, :n]] - out.logprobs[0, :n][m[0, :n]]).max() <= 1e-5


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


# ---- training on episodes ---------------------------------------------------------------------------------
def test_tool_tokens_get_no_gradient_and_change_no_loss_term():
    """The loss, KL, entropy, TIS and gap terms read the trained-token mask only: perturbing every input at the
    tool tokens (present, loss mask 0) changes nothing, and their log-probs get zero gradient."""
    import mindspore as ms
    from mindspore import Tensor
    from mindrlhf.configs.grpo_config import RLConfig
    from mindrlhf.trainer.update.loss import GRPOLossCell
    from mindrlhf.trainer.update.loss_inputs import LossInputs

    rs = np.random.RandomState(0)
    n, r = 4, 12
    present = (np.arange(r)[None] < np.array([[12], [9], [7], [12]])).astype(np.float32)
    trained = present.copy()
    trained[0, 3:7] = 0                  # a tool result inside the episode
    trained[3, 5:12] = 0                 # cut inside a tool result
    tool = (present - trained).astype(bool)
    rl = RLConfig(beta=0.1, tis=True, loss_agg="token-mean")
    for on_policy in (False, True):
        cell = GRPOLossCell(None, rl, r, on_policy=on_policy)
        logp, old, roll, ref, ent = (rs.uniform(-3, -0.1, (n, r)).astype(np.float32) for _ in range(5))

        def terms(logp, old, roll, ref, ent):
            inputs = LossInputs(trained, old, roll, ref, np.array([1.0, -0.5, 0.3, 2.0], np.float32),
                                np.float32(trained.sum())).tensors()
            return cell.terms(Tensor(logp), Tensor(ent), inputs.args())

        base = terms(logp, old, roll, ref, ent)
        bumped = [np.where(tool, x + 1.7, x).astype(np.float32) for x in (logp, old, roll, ref, ent)]
        other = terms(*bumped)
        assert float(base[0].asnumpy()) == float(other[0].asnumpy())
        assert [float(s.asnumpy()) for s in base[1]] == [float(s.asnumpy()) for s in other[1]]

        def loss_of(x):
            inputs = LossInputs(trained, old, roll, ref, np.array([1.0, -0.5, 0.3, 2.0], np.float32),
                                np.float32(trained.sum())).tensors()
            return cell.terms(x, Tensor(ent), inputs.args())[0]
        grad = ms.grad(loss_of)(Tensor(logp)).asnumpy()
        assert (grad[tool] == 0).all() and np.abs(grad[trained == 1]).sum() > 0


INC_TOOL = ("def inc(x: int) -> int:\n    \"\"\"Add 4.\n\n    Args:\n        x: a number\n    \"\"\"\n"
            "    return x + 4\n\nTOOLS = [inc]\n")     # a --tool_module file


def force_a_call_on_even_rows(monkeypatch, call_ids):
    """The engine's draws on even rows forced to `call_ids` at the episode's first positions (their log-probs
    the model's own), so a tiny random model calls a tool."""
    original = GenerationEngine._draw

    def draw(self, logits, params, seen, suppress_eos, u, seqs, positions):
        tokens, logp = original(self, logits, params, seen, suppress_eos, u, seqs, positions)
        forced = (seqs % 2 == 0) & (positions < len(call_ids))
        if forced.any():
            tokens = tokens.copy()
            tokens[forced] = np.array(call_ids)[positions[forced]]
            logp = token_logprobs(logits, tokens, params.logprob_temperature)
        return tokens, logp

    monkeypatch.setattr(GenerationEngine, "_draw", draw)


def _tool_run(root, monkeypatch, **extra):
    """A GRPO run with --tool_module in one process: half the samples' first turn is a call to `inc` (the model's
    draws forced there, with its own log-probs), the tool answers, the model continues."""
    from grpo_helpers import grpo_overrides, make_grpo_assets
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.data.tokenizer import load_tokenizer
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer

    assets = make_grpo_assets(str(root / "assets"))
    with open(os.path.join(os.path.dirname(assets["vocab_path"]), "chat_template.jinja"), "w") as fh:
        fh.write(CHATML_TOOLS)
    tool_file = root / "my_tools.py"
    tool_file.write_text(INC_TOOL)
    tok = load_tokenizer(assets["vocab_path"], assets["merges_file_path"])
    force_a_call_on_even_rows(monkeypatch, tok.encode(call("inc", x=1)))
    logs = []
    if extra.pop("evaluate", False):
        extra.update(eval_dataset=assets["mind_dataset_dir"], eval_steps=1, eval_prompts=4)
    extra.setdefault("verifier_function", "digit_fraction_test")
    cfg = load_grpo_config(None, grpo_overrides(
        assets, str(root / "run"), max_tokens=112, max_tool_calls=2, tool_module=str(tool_file),
        save_data_file=str(root / "exp.mindrecord"),
        rollout_log_file=str(root / "rollouts.mindrecord"), **extra))
    trainer = GRPOTrainer(cfg, log=logs.append)
    return trainer, logs


def test_grpo_run_with_a_tool(tmp_path, monkeypatch):
    """Two GRPO steps with a tool (_tool_run): the trained mask excludes the tool tokens, the experience file and
    rollout log keep mask and turns, metrics count the calls."""
    import json as _json
    import mindspore.dataset as ds
    trainer, logs = _tool_run(tmp_path, monkeypatch, evaluate=True)
    assert any(line.startswith("tools: 1 (inc; schemas inc)") for line in logs)
    history = trainer.fit()
    assert len(history) == 2
    for m in history:
        # 8 samples, the even ones call once (the evaluations' calls, also forced, are not counted)
        assert m["tools/inc/calls"] == 4 and m["tools/inc/errors"] == 0 and "eval_accuracy" in m
        assert m["episode/tool_calls_mean"] >= 0.5 and m["episode/tool_tokens_mean"] > 0
        assert np.isfinite(m["loss"]) and m["rollout_train_logprob_gap"] <= 1e-4
    trained = [r["responses_mask"] for r in ds.MindDataset(str(tmp_path / "exp.mindrecord"), shuffle=False)
               .create_dict_iterator(output_numpy=True, num_epochs=1)]
    rows = [r for r in ds.MindDataset(str(tmp_path / "rollouts.mindrecord"), shuffle=False).create_dict_iterator(
        output_numpy=True, num_epochs=1)]
    turns = [_json.loads(str(r["turns"])) for r in rows]
    with_tool = [t for t in turns if any(x["kind"] == "tool" for x in t)]
    assert with_tool and all(t[0]["kind"] == "model" and "<tool_call>" in t[0]["text"] for t in with_tool)
    assert all("<tool_response>\n5\n</tool_response>" in t[1]["text"] for t in with_tool)
    # the experience file's (trained) mask has holes exactly where the tools answered
    holes = [(row[:-1] > row[1:]).sum() for row in trained]
    assert sum(h > 0 for h in holes) >= len(with_tool) // 2




@pytest.mark.slow       # ~8 s; a GRPO run with a tool stays in the default run
def test_retool_reward_reads_each_episodes_tool_calls(tmp_path, monkeypatch):
    """MindSpeed-RL's multi-turn verifier in a GRPO run: each sample's reward is -1 raised by 0.1 per tool call
    of its own episode (none of the tiny model's answers is right), so the even samples, forced to call once,
    score -0.9 and the others -1: the trainer hands every verifier that asks for it the episode's count."""
    import mindspore.dataset as ds
    trainer, _ = _tool_run(tmp_path, monkeypatch, verifier_function="retool_reward", total_steps=1)
    trainer.fit()
    rows = list(ds.MindDataset(str(tmp_path / "rollouts.mindrecord"), shuffle=False).create_dict_iterator(
        output_numpy=True, num_epochs=1))
    calls = np.array([int(r["tool_calls"]) for r in rows])
    rewards = np.array([float(r["reward"]) for r in rows])
    assert (calls > 0).any() and (calls == 0).any()
    np.testing.assert_allclose(rewards, np.minimum(0.0, -1.0 + 0.1 * calls), atol=1e-6)


@pytest.mark.slow      # ~16 s; packed rows (test_packing) and episodes (here) each stay in the default run
def test_packed_rows_train_an_episode_as_padded_rows(tmp_path, monkeypatch):
    """Sequence packing reads the present mask for the rows and the trained mask for the loss: with tool tokens
    inside the responses the packed run's losses equal the padded run's."""
    runs = {}
    for packing in (False, True):
        trainer, _ = _tool_run(tmp_path / str(packing), monkeypatch, sequence_packing=packing, beta=0.04,
                               mini_batch_size=4)
        assert (trainer.run.packing is not None) == packing
        runs[packing] = trainer.fit()
    for a, b in zip(runs[False], runs[True]):
        assert a["episode/tool_tokens_mean"] == b["episode/tool_tokens_mean"] > 0
        for key in ("loss", "pg_loss", "kl", "grad_norm", "entropy", "reward_mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key


@pytest.mark.slow       # ~12 s
def test_lora_trains_an_episode_with_the_rollout_matching_the_train_forward(tmp_path, monkeypatch):
    """LoRA (adapters on q and v, base frozen) on tool-using episodes: the rollout's KV-continued log-probs across
    the tool tokens equal the adapted policy's train forward (gap <= 1e-4 as without tools), tool tokens stay
    out of the trained mask, the adapters move and the base does not."""
    from mindrlhf.models.lora import is_adapter
    trainer, _ = _tool_run(tmp_path, monkeypatch, lora_rank=4, lora_alpha=8, target_modules="wq,wv", lr=1e-3)
    params = {p.name: p for p in trainer.policy.get_parameters()}
    before = {n: p.asnumpy().copy() for n, p in params.items()}
    history = trainer.fit()
    assert len(history) == 2
    for m in history:
        assert m["tools/inc/calls"] == 4 and m["episode/tool_tokens_mean"] > 0
        assert np.isfinite(m["loss"]) and m["rollout_train_logprob_gap"] <= 1e-4 and m["grad_norm"] > 0
    moved = {n for n, p in params.items() if not np.array_equal(p.asnumpy(), before[n])}
    assert moved and all(is_adapter(n) for n in moved)


@pytest.mark.slow
def test_the_layerwise_update_trains_an_episode_as_the_one_graph_update(tmp_path, monkeypatch):
    """engine.layerwise_update reads the same present and trained masks: with tool tokens inside the responses,
    its losses, KL and gradient norms equal the one-graph update's step by step."""
    runs = {}
    for layerwise in (False, True):
        trainer, _ = _tool_run(tmp_path / str(layerwise), monkeypatch, layerwise_update=layerwise, beta=0.04,
                               mini_batch_size=4)
        assert trainer.run.update_graphs == ("layerwise" if layerwise else "one")
        runs[layerwise] = trainer.fit()
    for a, b in zip(runs[False], runs[True]):
        assert a["episode/tool_tokens_mean"] == b["episode/tool_tokens_mean"] > 0
        for key in ("loss", "pg_loss", "kl", "grad_norm", "entropy", "reward_mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key


def test_mindspeed_multi_turn_keys_map_onto_the_tools_section(tmp_path):
    from test_upstream_mindspeed import _edited, _write
    from mindrlhf.configs import ConfigError
    from mindrlhf.configs.grpo_load import load_grpo_config
    tool_cfg = tmp_path / "tools.yaml"
    tool_cfg.write_text("tools: []\n")
    keys = {"rl_config.multi_turn_enable": True, "rl_config.tool_config_path": str(tool_cfg),
            "rl_config.max_tool_calls": 3, "rl_config.max_parallel_calls": 2, "rl_config.max_tool_response_length": 50,
            "rl_config.tool_response_truncate_side": "left", "rl_config.tool_parser_format": "hermes",
            "rl_config.max_total_response_length": 40}
    cfg = load_grpo_config(_write(tmp_path, _edited(**keys)))
    t = cfg.tools
    assert (t.tool_config_path, t.max_tool_calls, t.max_parallel_calls, t.max_tool_response_length,
            t.tool_response_truncate_side, t.tool_parser_format, t.max_total_response_length) == \
        (str(tool_cfg), 3, 2, 50, "left", "hermes", 40)
    assert cfg.sampling.max_tokens == 40 and any(d.startswith("sampling.max_tokens: 40") for d in cfg.derived)
    # off: each tool key is reported inert, nothing enabled
    cfg = load_grpo_config(_write(tmp_path / "off", _edited(**dict(keys, **{"rl_config.multi_turn_enable": False}))))
    assert not cfg.tools.enabled
    assert ("rl_config.max_tool_calls", "multi-turn tool setting; multi_turn_enable is false") in \
        [(k, why) for _, k, why in cfg.ignored]
    with pytest.raises(ConfigError, match="rl_config.max_tool_calls is not given"):
        load_grpo_config(_write(tmp_path / "b", _edited(**dict(keys, **{"rl_config.max_tool_calls": None}))))


@pytest.mark.parametrize("edit,pattern", [
    (dict(max_tool_calls=-1), "tools.max_tool_calls: expected >= 0"),
    (dict(max_tool_calls=2), "tools.max_tool_calls: 2 but no tools"),
    (dict(tool_module="x.py"), r"tools.max_tool_calls: 0 \(single-turn\) but tools are given"),
    (dict(max_tool_calls=1, tool_module="x.py", max_parallel_calls=0), "tools.max_parallel_calls: expected >= 1"),
    (dict(max_tool_calls=1, tool_module="x.py", tool_timeout=0.0), "tools.tool_timeout: expected > 0"),
    (dict(max_tool_calls=1, tool_module="x.py", max_total_response_length=999),
     "tools.max_total_response_length: 999 exceeds sampling.max_tokens"),
    (dict(max_tool_calls=1, tool_module="x.py", tool_response_truncate_side="up"),
     "tools.tool_response_truncate_side: expected one of"),
])
def test_bad_tool_settings_are_named(edit, pattern):
    from mindrlhf.configs import ConfigError
    from mindrlhf.configs.grpo_config import GRPOConfig
    cfg = GRPOConfig()
    for k, v in edit.items():
        setattr(cfg.tools, k, v)
    with pytest.raises(ConfigError, match=pattern):
        cfg.validate()


def test_start_up_names_the_tools_and_refuses_a_folder_without_a_chat_template(tmp_path):
    from grpo_helpers import grpo_overrides, make_grpo_assets
    from mindrlhf.configs import ConfigError
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer.resolve import resolve
    assets = make_grpo_assets(str(tmp_path / "assets"))
    tool_file = tmp_path / "t.py"
    tool_file.write_text("def inc(x: int) -> int:\n    \"\"\"Add 4.\n\n    Args:\n        x: a number\n    \"\"\"\n"
                         "    return x + 4\n\nTOOLS = [inc]\n")
    conf = tmp_path / "tools.yaml"
    conf.write_text("tools:\n  - class_name: mindrlhf.tools.CodeInterpreter\n")

    def cfg():
        return load_grpo_config(None, grpo_overrides(assets, str(tmp_path / "run"), max_tokens=64, max_tool_calls=2,
                                                     tool_module=str(tool_file), tool_config_path=str(conf)))
    with pytest.raises(ConfigError, match="tools.max_tool_calls: 2: tool results are rendered with the model "
                                          "folder's chat template"):
        resolve(cfg(), 0, 1, lambda *a: None)
    with open(os.path.join(os.path.dirname(assets["vocab_path"]), "chat_template.jinja"), "w") as fh:
        fh.write(CHATML_TOOLS)
    lines = []
    run = resolve(cfg(), 0, 1, lambda *a: lines.extend(" ".join(map(str, a)).split("\n")))
    head = next(line for line in lines if line.startswith("tools: 2 ("))
    assert "inc, code_interpreter; schemas inc, code_interpreter" in head and "max_tool_calls 2" in head
    assert any(line.startswith("tools: tool code_interpreter: ") for line in lines)     # its sandbox back end
    assert run.episodes.max_tool_calls == 2 and sorted(run.episodes.runner.tools) == ["code_interpreter", "inc"]


def test_a_row_waiting_for_its_tool_does_not_stop_the_others(model, template):
    """While one row's call runs in the pool, the other rows keep decoding (the decode counter moves during
    the call); then the loop waits for the result alone and the episode completes."""
    import time as _time
    engine_box, moved = [], []

    def slow(x: int) -> int:
        """Sleeps, then echoes.

        Args:
            x: a number
        """
        before = engine_box[0].decoded_rows
        _time.sleep(0.5)
        moved.append(engine_box[0].decoded_rows - before)
        return x

    tools = episode_tools(template, tools=(slow,))
    tok = CharTokenizer()
    engine = ScriptedEngine(model, pad_token_id=0, prompt_bucket=8, tools=tools,
                            scripts=[[call("slow", x=7), "done"], ["9" * 150]])
    engine_box.append(engine)
    out = engine.generate([[5, 9, 11, 20, 7]], SamplingParams(temperature=1.0, max_tokens=240, n=2, seed=1,
                                                              eos_token_ids=[EOS]))
    assert moved and moved[0] > 0
    assert out.finish_reason == ["stop", "stop"] and out.tool_calls.tolist() == [1, 0]
    assert tok.decode(out.response_ids[0][out.response_mask[0] == 1]).endswith("done" + SPECIAL[2])
    # the waiting row's cache slots stay untouched while it idles: what it decodes after the tool's answer
    # equals a full forward over its episode (a decode step whose idle rows wrote into their next slot fails)
    full, m = full_forward_logprobs(model, out), out.loss_mask.astype(bool)
    assert np.abs(full[m] - out.logprobs[m]).max() <= 1e-5
