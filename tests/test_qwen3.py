"""Qwen3 dense against transformers' Qwen3ForCausalLM (random weights, fp32): per-head q/k RMSNorm before RoPE,
a head width apart from hidden / heads, no q/k/v bias; its config.json read key by key, its HF folder in and
out, MindSpeed-RL's model entry, its chat template, and a GRPO run on it."""
import json
import os

import numpy as np
import pytest
import yaml

from hf_reference import QWEN3_HEAD_DIM, hf_logits, make_qwen3_model, qwen3_model_kwargs
from model_helpers import load_ours, model_inputs, shared_prompt_against_hf, token_loss_and_grads
from mindrlhf.checkpoint.hf_interop import export_hf, hf_weight_files, ms_to_hf_name
from mindrlhf.checkpoint.model_io import model_state
from mindrlhf.checkpoint.safetensors_io import SafeTensorsFile
from mindrlhf.configs import ConfigError, ModelConfig, load_model_yaml

TOL = 1e-5


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """(HF folder, transformers' model, ours) for the untied GQA case."""
    d = str(tmp_path_factory.mktemp("qwen3"))
    hf = make_qwen3_model(d)
    return d, hf, load_ours(d, ModelConfig(**qwen3_model_kwargs()))


@pytest.mark.parametrize("tie,kv", [(False, 2), (True, 1), (False, 4)])
def test_qwen3_logits_match_hf(tmp_path, rng, tie, kv):
    hf = make_qwen3_model(str(tmp_path), tie=tie, n_kv_heads=kv)
    ours = load_ours(str(tmp_path), ModelConfig(**qwen3_model_kwargs(tie, kv)))
    assert ours.model.layers[0].attention.wq.weight.shape == (4 * QWEN3_HEAD_DIM, 64)     # hd 24, not 64 / 4
    ids = rng.randint(0, 160, (3, 13))
    ref = hf_logits(hf, ids)
    got = ours.full_logits(*model_inputs(ids)).asnumpy()
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= TOL


def test_qwen3_left_padded_rows_equal_hf_and_their_unpadded_forward(qwen3, rng):
    _, hf, ours = qwen3
    ids = rng.randint(0, 160, (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, :4] = 0                                      # row 1 is left-padded
    got = ours.full_logits(*model_inputs(ids, mask)).asnumpy()
    real = mask.astype(bool)
    assert np.abs(got[real] - hf_logits(hf, ids, mask)[real]).max() <= TOL
    alone = ours.full_logits(*model_inputs(ids[1:, 4:])).asnumpy()
    assert np.abs(got[1, 4:] - alone[0]).max() <= TOL


def test_qwen3_every_gradient_matches_hf(qwen3, rng):
    """The mean next-token NLL and the gradient of every parameter (q/k norms included) against torch."""
    import torch
    _, hf, ours = qwen3
    names = [p.name for p in ours.get_parameters()]
    assert "model.layers.1.attention.q_layernorm.weight" in names and "model.layers.0.attention.k_layernorm.weight" in names
    ids = rng.randint(0, 160, (2, 12))
    loss, grads = token_loss_and_grads(ours, ids, names)
    hf.zero_grad()
    logits = hf(torch.tensor(ids[:, :-1])).logits
    ref_loss = -torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids[:, 1:])[..., None]).mean()
    ref_loss.backward()
    hf_params = dict(hf.named_parameters())
    assert abs(loss - ref_loss.item()) <= TOL
    for name in names:
        ref = hf_params[ms_to_hf_name(name)].grad.numpy()
        assert np.abs(grads[name] - ref).max() <= TOL * max(1.0, np.abs(ref).max()), name


def test_qwen3_shared_prompt_logprobs_and_gradients_match_hf(qwen3, rng):
    """GRPO rows in groups of 3 sharing a left-padded prompt, the prompt run once per group: response
    log-probs at temperature 0.7 and every gradient of a weighted sum of them, against whole rows in torch."""
    from mindrlhf.models.padding import left_pad
    _, hf, ours = qwen3
    g, width, resp, temp = 3, 7, 5, 0.7
    prompt_ids, prompt_mask = left_pad([rng.randint(3, 160, n).tolist() for n in (4, 7)], width, 0)
    prompt_ids, prompt_mask = np.repeat(prompt_ids, g, 0), np.repeat(prompt_mask, g, 0)
    response = rng.randint(3, 160, (len(prompt_ids), resp))
    seq = np.concatenate([prompt_ids, response], 1)
    mask = np.concatenate([prompt_mask, np.ones_like(response)], 1)
    weights = rng.randn(*response.shape).astype(np.float32)
    logp, ref_logp, grads, hf_params = shared_prompt_against_hf(ours, hf, seq, mask, weights, resp, temp, g, width)
    assert np.abs(logp - ref_logp).max() <= TOL
    for name, grad in grads.items():
        ref = hf_params[ms_to_hf_name(name)].grad.numpy()
        assert np.abs(grad - ref).max() <= TOL * max(1.0, np.abs(ref).max()), name


def test_qwen3_greedy_generation_equals_hf_generate(qwen3):
    """Prefill + decode with the KV cache (head width 24) against transformers' generate, prompts of
    different lengths left-padded in one batch."""
    import torch
    from mindrlhf.rollout.engine import GenerationEngine
    from mindrlhf.rollout.sampling import SamplingParams
    _, hf, ours = qwen3
    rs = np.random.RandomState(0)
    prompts = [rs.randint(3, 160, size=n).tolist() for n in (5, 9, 3, 7)]
    out = GenerationEngine(ours, pad_token_id=0, prompt_bucket=8).generate(
        prompts, SamplingParams(temperature=0, max_tokens=14, eos_token_ids=[7]))
    for i, p in enumerate(prompts):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=14, do_sample=False, pad_token_id=0,
                          eos_token_id=7)[0, len(p):].tolist()
        n = int(out.response_mask[i].sum())
        assert out.response_ids[i, :n].tolist() == ref
        # each decode step's log-prob (its q/k norms run per head as positions: Attention.head_norm) = HF's
        # forward over the whole sequence
        logits = hf(torch.tensor([p + ref])).logits[0, len(p) - 1:-1].float()
        ref_logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ref)[:, None])[:, 0].detach().numpy()
        assert np.abs(out.logprobs[i, :n] - ref_logp).max() <= TOL


# ---- the HF folder: config.json key by key, weights in and out ---------------------------------------------
def _tensors(path):
    out = {}
    for f in hf_weight_files(path):
        st = SafeTensorsFile(f)
        out.update({k: np.array(st.get(k)) for k in st.keys()})
    return out


def test_qwen3_hf_folder_loads_as_a_model_and_exports_back_equal(qwen3, tmp_path):
    """The folder transformers wrote (what --sft_path_train DIR reads) gives the model config, its weights
    load, and the export is the same tensors under the same names, with a config.json that transformers
    reads back as a Qwen3 with the same logits."""
    import torch
    from transformers import AutoModelForCausalLM
    folder, hf, ours = qwen3
    spec = load_model_yaml(folder)
    assert spec.model == ModelConfig(**dict(qwen3_model_kwargs(), seq_length=64, max_position_embedding=64,
                                            eos_token_id=2, bos_token_id=1, initializer_range=0.02))
    assert spec.model.head_dim == QWEN3_HEAD_DIM and spec.model.qk_layernorm and not spec.model.qkv_has_bias
    assert ("layer_types" not in dict(spec.ignored)) and ("max_window_layers" in dict(spec.ignored))
    out = tmp_path / "back"
    export_hf(model_state(ours), str(out), spec.model)
    a, b = _tensors(folder), _tensors(str(out))
    assert set(a) == set(b) and any(k.endswith("self_attn.q_norm.weight") for k in b)
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    with open(out / "config.json") as fh:
        written = json.load(fh)
    assert written["architectures"] == ["Qwen3ForCausalLM"] and written["head_dim"] == QWEN3_HEAD_DIM
    assert load_model_yaml(str(out)).model == spec.model
    again = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ids = np.arange(12).reshape(2, 6) % 160
    assert np.abs(hf_logits(again, ids) - hf_logits(hf, ids)).max() == 0.0


def _config_json(folder, **edits):
    path = os.path.join(folder, "config.json")
    with open(path) as fh:
        raw = json.load(fh)
    for k, v in edits.items():
        if v is None:
            raw.pop(k, None)
        else:
            raw[k] = v
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(raw, fh)
    return folder


@pytest.mark.parametrize("key,value,pattern", [
    ("use_sliding_window", True, "use_sliding_window: True is not supported"),
    ("layer_types", ["full_attention", "sliding_attention"], "layer_types: .* is not supported"),
    ("hidden_act", "gelu", "hidden_act: 'gelu' is not supported"),
    ("qk_norm_type", "layer", "qk_norm_type: unknown config.json key"),
    ("model_type", "qwen2", "model_type 'qwen2' does not match Qwen3ForCausalLM"),
    ("head_dim", 25, "head_dim: 25 must be even"),
])
def test_qwen3_config_json_keys_we_cannot_honour_are_refused(qwen3, tmp_path, key, value, pattern):
    from mindrlhf.configs.compat.hf import model_config_from_hf
    folder = str(tmp_path / "m")
    os.makedirs(folder)
    with open(os.path.join(qwen3[0], "config.json")) as src, open(os.path.join(folder, "config.json"), "w") as dst:
        dst.write(src.read())
    _config_json(folder, **{key: value})
    with pytest.raises(ConfigError, match=pattern):
        model_config_from_hf(folder)


def test_qwen3_yaml_written_from_the_folder_reads_back(qwen3, tmp_path):
    """`python -m mindrlhf.configs.hf_config DIR -o f.yaml`: the YAML carries head_dim and qk_layernorm (a
    Qwen2 folder's YAML carries neither) and loads to the same model."""
    from mindrlhf.configs.compat.hf import main
    out = tmp_path / "qwen3.yaml"
    assert main([qwen3[0], "--model_parallel", "2", "-o", str(out)]) == 0
    fields = yaml.safe_load(out.read_text())["model"]["model_config"]
    assert fields["head_dim"] == QWEN3_HEAD_DIM and fields["qk_layernorm"] is True
    spec = load_model_yaml(str(out))
    assert spec.model == load_model_yaml(qwen3[0]).model and spec.parallel.model_parallel == 2


def test_a_transformers_5_folder_without_token_ids_gets_the_default_eos(tmp_path):
    """transformers 5 writes "eos_token_id": null for a config made without one; that was read as an
    eos_token_id of None (no end-of-sequence token at all) instead of the default, 2."""
    from mindrlhf.configs.compat.hf import model_config_from_hf
    from hf_reference import make_hf_model
    folder = str(tmp_path / "m")
    make_hf_model(folder, layers=1)                 # a Qwen2: the bug was older than Qwen3 here
    with open(os.path.join(folder, "config.json")) as fh:
        assert json.load(fh)["eos_token_id"] is None
    assert model_config_from_hf(folder).eos_token_id == 2


# ---- MindSpeed-RL's Qwen3 entries ---------------------------------------------------------------------------
def _mindspeed(tmp_path, model):
    """MindSpeed-RL's tiny GRPO fixture with `model` as the policy's entry (fixtures/upstream/mindspeed/model)."""
    import shutil
    fixture = os.path.join(os.path.dirname(__file__), "fixtures", "upstream", "mindspeed")
    shutil.copytree(os.path.join(fixture, "model"), str(tmp_path / "model"))
    with open(os.path.join(fixture, "grpo_tiny.yaml")) as fh:
        doc = yaml.safe_load(fh)
    doc["defaults"] = [{"model": [model]}]
    for section in ("megatron_training", "actor_config"):
        if "model" in doc.get(section, {}):
            doc[section]["model"] = model
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_mindspeed_qwen3_8b_entry_as_shipped_is_qwen3(tmp_path):
    """qk_layernorm true reaches the model; without kv_channels the head is Megatron's hidden / heads (128)."""
    cfg = load_model_yaml(_mindspeed(tmp_path, "qwen3_8b")).model
    assert cfg.qk_layernorm and cfg.head_dim == 128 and cfg.n_kv_heads == 8 and not cfg.qkv_has_bias
    assert (cfg.hidden_size, cfg.num_layers, cfg.intermediate_size, cfg.theta) == (4096, 36, 12288, 1e6)
    assert not cfg.tie_word_embeddings


def test_mindspeed_kv_channels_is_the_head_width(tmp_path):
    cfg = load_model_yaml(_mindspeed(tmp_path, "tiny_qwen3")).model
    assert cfg == ModelConfig(**dict(qwen3_model_kwargs(vocab=416), seq_length=64, max_position_embedding=64,
                                     eos_token_id=[]))


# ---- the chat template --------------------------------------------------------------------------------------
QWEN3_TEMPLATE = os.path.join(os.path.dirname(__file__), "fixtures", "qwen3_chat_template.jinja")


@pytest.mark.parametrize("thinking", [None, True, False])
def test_qwen3_chat_template_renders_as_transformers(tmp_path, thinking):
    """Qwen3's template (thinking on by default; enable_thinking false closes an empty <think> block in the
    generation prompt; earlier turns' reasoning dropped) rendered by data/chat_template.py and by
    transformers' apply_chat_template give the same text."""
    import shutil
    from transformers import Qwen2Tokenizer
    from data_helpers import make_tokenizer_files
    from mindrlhf.data.chat_template import ChatTemplate
    vocab, merges = make_tokenizer_files(str(tmp_path / "tok"))
    folder = tmp_path / "tok"
    shutil.copy(QWEN3_TEMPLATE, folder / "chat_template.jinja")
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges)
    source = (folder / "chat_template.jinja").read_text()
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    conversations = [
        [{"role": "user", "content": "What is 3 + 4?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3 + 4?"}],
        [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
         {"role": "user", "content": "and 3 + 3?"}],
    ]
    ours = ChatTemplate(str(folder))
    for messages in conversations:
        want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, chat_template=source,
                                       **kwargs)
        assert ours.render(messages, **kwargs) == want
    closed = ours.render(conversations[0], enable_thinking=False)
    assert closed.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "add" not in ours.render(conversations[2])          # the earlier turn's reasoning is dropped


def test_rlhf_data_enable_thinking_reaches_the_prompts(tmp_path):
    """--enable_thinking false with --prompt_template chat: each prompt ends with the closed think block;
    the flag is refused without a chat template."""
    import shutil
    from data_helpers import make_tokenizer_files
    from mindrlhf.data.convert import resolve_template
    make_tokenizer_files(str(tmp_path / "tok"))
    shutil.copy(QWEN3_TEMPLATE, tmp_path / "tok" / "chat_template.jinja")
    off = resolve_template("chat", str(tmp_path / "tok"), enable_thinking=False)("What is 3 + 4?")
    assert off.endswith("<think>\n\n</think>\n\n")
    on = resolve_template("chat", str(tmp_path / "tok"))("What is 3 + 4?")
    assert on.endswith("<|im_start|>assistant\n")
    with pytest.raises(ConfigError, match="--enable_thinking"):
        resolve_template("plain", enable_thinking=False)


# ---- GRPO on Qwen3 ---------------------------------------------------------------------------------------------
@pytest.mark.slow       # ~14 s; Qwen3 attention trains in the default run's Qwen3-MoE GRPO test
def test_grpo_trains_a_qwen3_hf_folder(tmp_path):
    """Two GRPO steps with the Qwen3 folder as --sft_path_train: the trainer builds, rolls out and updates it
    (shared prompt on, layerwise off), the rollout's log-probs equal the train model's, and the exported
    folder is a Qwen3 transformers loads."""
    import torch
    from transformers import AutoModelForCausalLM
    from grpo_helpers import grpo_overrides, make_grpo_assets
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    assets = make_grpo_assets(str(tmp_path / "assets"), rows=16)
    folder = str(tmp_path / "Qwen3-tiny")
    make_qwen3_model(folder, vocab=416)
    cfg = load_grpo_config(None, grpo_overrides(dict(assets, sft_path_train=folder), str(tmp_path / "out"),
                                                share_prompt=True, export_hf=True, save_steps=2))
    rows = GRPOTrainer(cfg, log=lambda *a, **k: None).fit()
    assert len(rows) == 2
    assert all(np.isfinite(r["loss"]) and r["rollout_train_logprob_gap"] <= 1e-4 for r in rows)
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out" / "hf_policy"), dtype=torch.float32)
    assert type(back).__name__ == "Qwen3ForCausalLM"
    assert back.model.layers[0].self_attn.q_norm.weight.shape == (QWEN3_HEAD_DIM,)


@pytest.mark.slow       # ~19 s; the layerwise update of the other models: test_layerwise
def test_qwen3_layerwise_update_equals_the_one_graph_update(tmp_path):
    """engine.layerwise_update copies each layer's weights into a template DecoderLayer by name: the q/k norms
    travel with them, and two GRPO steps give the one-graph update's losses, gradient norms and weights."""
    from grpo_helpers import grpo_overrides, make_grpo_assets, model_yaml
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    from mindrlhf.utils.params import param_as_f32
    assets = make_grpo_assets(str(tmp_path / "assets"), rows=16)
    assets["sft_path_train"] = model_yaml(str(tmp_path / "qwen3.yaml"), qkv_has_bias=False, qk_layernorm=True,
                                          head_dim=QWEN3_HEAD_DIM)
    runs = []
    for layerwise in (False, True):
        cfg = load_grpo_config(None, grpo_overrides(assets, str(tmp_path / str(layerwise)), beta=0.04,
                                                    verifier_function="digit_fraction_test", share_prompt=True,
                                                    micro_batch_size=4, layerwise_update=layerwise))
        trainer = GRPOTrainer(cfg, log=lambda *a: None)
        history = [trainer.train_one_step() for _ in range(2)]
        runs.append((history, {p.name: param_as_f32(p).copy() for p in trainer.policy.get_parameters()}))
    (h1, w1), (h2, w2) = runs
    assert "model.layers.1.attention.k_layernorm.weight" in w1 and all(h["grad_norm"] > 1e-3 for h in h1)
    for a, b in zip(h1, h2):
        for key in ("loss", "kl", "grad_norm", "entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    moved = sum(np.linalg.norm(w1[n] - w2[n]) ** 2 for n in w1) ** 0.5
    assert moved <= 1e-5 * sum(np.linalg.norm(w) ** 2 for w in w1.values()) ** 0.5


def test_mindspeed_qwen3_8b_grpo_file_writes_its_strategy_files(tmp_path):
    """MindSpeed-RL's Qwen3-8B GRPO file as shipped, unchanged (its `finetune: false` beside `load` starts from
    load's weights, as with a Megatron release checkpoint, and says so). --only_save_strategy then writes the
    train layout (tp2 x pp2 x dp4, sequence parallel: 18 layers per stage, the q/k norms replicated) and the
    infer layout (dp16) for its 16 NPUs."""
    import shutil
    import subprocess
    import sys
    from msrun_util import REPO
    from mindrlhf.parallel.strategy import read_strategy
    fixture = os.path.join(os.path.dirname(__file__), "fixtures", "upstream", "mindspeed")
    shutil.copytree(os.path.join(fixture, "model"), str(tmp_path / "model"))
    with open(os.path.join(fixture, "grpo_qwen3_8b_A3.yaml")) as fh:
        doc = yaml.safe_load(fh)
    assert doc["actor_config"]["finetune"] is False
    path = _write_yaml(tmp_path / "grpo.yaml", doc)
    train = load_model_yaml(path)
    assert train.model.qk_layernorm and train.model.head_dim == 128 and train.model.num_layers == 36
    par = train.parallel
    assert (par.data_parallel, par.model_parallel, par.pipeline_stage, par.use_seq_parallel) == (4, 2, 2, True)
    r = subprocess.run([sys.executable, os.path.join(REPO, "examples/grpo/qwen_grpo_tutorial/grpo_one_stage.py"),
                        "--config", path, "--only_save_strategy", "True", "--save_ckpt_dir", str(tmp_path / "out")],
                       env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    strategy = tmp_path / "out" / "strategy"
    assert len([f for f in os.listdir(strategy / "train_strategy") if f.endswith(".ckpt")]) == 16
    assert len([f for f in os.listdir(strategy / "infer_strategy") if f.endswith(".ckpt")]) == 16
    for rank in (0, 15):
        entries = read_strategy(str(strategy / "train_strategy" / f"ckpt_strategy_rank_{rank}.ckpt"))
        layers = {int(n.split(".")[2]) for n in entries if n.startswith("model.layers.")}
        assert layers == set(range(18) if rank < 8 else range(18, 36)), rank
        norm = entries[f"model.layers.{min(layers)}.attention.q_layernorm.weight"]
        assert set(norm.tensor_map) == {-1}                       # replicated over the TP ranks


def _write_yaml(path, doc):
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return str(path)


def test_qwen3_convert_weight_flags_round_trip(qwen3, tmp_path):
    """convert_weight.py --model qwen3: HF -> a MindSpore checkpoint checked against the model YAML (q/k norms
    under our names), and --reversed back to the same HF tensors bit for bit."""
    from mindrlhf.checkpoint.convert import mindformers_main
    from mindrlhf.checkpoint.model_io import read_checkpoint
    from mindrlhf.configs.compat.hf import main as write_yaml
    folder = qwen3[0]
    yaml_path = str(tmp_path / "qwen3.yaml")
    assert write_yaml([folder, "-o", yaml_path]) == 0
    ckpt = str(tmp_path / "w.ckpt")
    assert mindformers_main(["--model", "qwen3", "--input_path", folder, "--output_path", ckpt,
                             "--config_path", yaml_path]) == 0
    assert read_checkpoint(ckpt)["model.layers.1.attention.k_layernorm.weight"].shape == (QWEN3_HEAD_DIM,)
    assert mindformers_main(["--reversed", "--input_path", ckpt, "--output_path", str(tmp_path / "back"),
                             "--config_path", yaml_path]) == 0
    a, b = _tensors(folder), _tensors(str(tmp_path / "back"))
    assert set(a) == set(b) and all(a[k].tobytes() == b[k].tobytes() for k in a)


def test_the_yaml_writer_command_runs_without_warnings(qwen3):
    """`python -m mindrlhf.configs.hf_config DIR` (the README's command) prints the YAML and nothing on stderr:
    running a module the package itself imports makes runpy warn of "unpredictable behaviour"."""
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-m", "mindrlhf.configs.hf_config", qwen3[0]], capture_output=True,
                         text=True, check=True)
    assert yaml.safe_load(run.stdout)["model"]["model_config"]["qk_layernorm"] is True
    assert not run.stderr, run.stderr
