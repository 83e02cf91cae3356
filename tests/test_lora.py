"""LoRA adapters (models/lora.py) against PEFT on Hugging Face's model (torch, fp32), and in the GRPO loop:
the base at step 0, the reference as the adapters switched off, gradients, PEFT's own loading of our export,
merged weights, adapters-only checkpoints and an exact resume."""
import json
import os

import numpy as np
import pytest

from grpo_helpers import grpo_overrides, make_grpo_assets, model_yaml
from hf_reference import (hf_logits, make_hf_model, make_qwen3_moe_model, qwen3_moe_model_kwargs,
                          tiny_model_kwargs)
from model_helpers import load_ours, model_inputs
from mindrlhf.checkpoint.model_io import model_state, read_checkpoint
from mindrlhf.configs import ConfigError, ModelConfig
from mindrlhf.configs.grpo_load import load_grpo_config
from mindrlhf.configs.lora import LoraSpec, parse_targets
from mindrlhf.models.lora import ADAPTER_B, adapter_params, adapters_off, merged_weights
from mindrlhf.utils.params import param_to_numpy, write_param

SPEC = LoraSpec(4, 8.0, parse_targets("all-linear"), seed=3)


def _lora_pair(tmp_path, bias=True, tie=False, kv=2, spec=SPEC):
    """(HF base model, our model with adapters on the same base weights, our model without adapters)."""
    hf = make_hf_model(str(tmp_path), qkv_bias=bias, tie=tie, n_kv_heads=kv)
    cfg = ModelConfig(**tiny_model_kwargs(bias, tie, kv))
    from mindrlhf.checkpoint.hf_interop import iter_hf_as_ms
    from mindrlhf.checkpoint.model_io import load_full_weights
    from mindrlhf.models.qwen2 import CausalLM
    ours = CausalLM(cfg, None, spec)
    load_full_weights(ours, iter_hf_as_ms(str(tmp_path)), str(tmp_path))
    return hf, ours, load_ours(str(tmp_path), cfg)


def _random_b(model, rng, scale=0.05):
    for p in model.get_parameters():
        if p.name.endswith(ADAPTER_B):
            write_param(p, (scale * rng.randn(*p.shape)).astype(np.float32))


_ADAPTERS_OFF_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from hf_reference import tiny_model_kwargs
from mindrlhf.configs import ModelConfig
from mindrlhf.configs.lora import LoraSpec, parse_targets
from mindrlhf.models.lora import adapters_off
from mindrlhf.models.qwen2 import CausalLM
model = CausalLM(ModelConfig(**tiny_model_kwargs()), lora=LoraSpec(4, 8.0, parse_targets("all-linear"), seed=3))
with adapters_off(model):
    print("off")
print("on")
"""


def test_turning_the_adapters_off_logs_no_error(tmp_path):
    """adapters_off waits for running graphs; with ms.runtime.synchronize() that logged "[ERROR] ... CPU device
    is not supported" on a LoRA run's first reference pass (MindSpore 2.10's first call on CPU)."""
    import subprocess
    import sys
    script = tmp_path / "probe.py"
    script.write_text(_ADAPTERS_OFF_PROBE)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, str(script), os.path.dirname(os.path.abspath(__file__))],
                          env=dict(os.environ, PYTHONPATH=repo), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "off\non" in proc.stdout, proc.stdout[-3000:]
    assert "ERROR" not in proc.stdout, proc.stdout[-3000:]


def test_step_zero_is_the_base_and_adapters_off_is_exactly_the_base(tmp_path, rng):
    hf, ours, base = _lora_pair(tmp_path)
    assert {p.name for p in ours.trainable_params()} == {p.name for p in adapter_params(ours)}
    assert len(adapter_params(ours)) == 2 * 7 * 2                      # A and B, 7 layers' worth, 2 layers
    ids = rng.randint(0, 160, (3, 11))
    assert np.abs(ours.full_logits(*model_inputs(ids)).asnumpy() - hf_logits(hf, ids)).max() <= 1e-4
    _random_b(ours, rng)
    saved = model_state(ours)
    with_adapters = ours.full_logits(*model_inputs(ids)).asnumpy()
    plain = base.full_logits(*model_inputs(ids)).asnumpy()
    assert np.abs(with_adapters - plain).max() > 1e-3                  # the adapters change the model
    with adapters_off(ours):
        off = ours.full_logits(*model_inputs(ids)).asnumpy()
    assert np.array_equal(off, plain)                                  # the base, bit for bit
    after = model_state(ours)
    assert all(np.array_equal(saved[k], after[k]) for k in saved)      # and the adapters are back
    assert np.array_equal(ours.full_logits(*model_inputs(ids)).asnumpy(), with_adapters)


def _weighted_logprob_grads(ours, params, peft_model, ids, rng, resp=6, temp=0.7):
    """Response log-probs at temperature `temp`, weighted at random and summed, on our model and on PEFT's: the
    losses agree (1e-5) and PEFT's parameters hold their gradients; returns ours for `params`."""
    import mindspore as ms
    import torch
    from mindspore import Tensor
    weights = rng.randn(ids.shape[0], resp).astype(np.float32)

    def loss_fn(input_ids, pos, bias_, labels):
        logp, _ = ours.token_logprobs(input_ids, pos, bias_, labels, resp, temp)
        return (logp * Tensor(weights)).sum()

    inputs = model_inputs(ids[:, :-1]) + (Tensor(ids[:, 1:].astype(np.int32)),)
    loss, grads = ms.value_and_grad(loss_fn, None, params)(*inputs)
    logits = peft_model(torch.tensor(ids[:, :-1])).logits[:, -resp:]
    ref_logp = torch.log_softmax(logits / temp, -1).gather(-1, torch.tensor(ids[:, -resp:])[..., None])[..., 0]
    ref_loss = (ref_logp * torch.tensor(weights)).sum()
    ref_loss.backward()
    assert abs(float(loss.asnumpy()) - ref_loss.item()) <= 1e-5 * max(1.0, abs(ref_loss.item()))
    return grads


@pytest.mark.parametrize("bias,tie,kv", [(True, False, 2), (False, True, 4)])
def test_adapter_gradients_match_peft(tmp_path, rng, bias, tie, kv):
    """Response log-probs (T 0.7), weighted and summed: the loss and every A and B gradient against PEFT's
    LoRA on transformers, with our A and a random B copied in (B = 0 would make every A gradient 0)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from mindrlhf.checkpoint.hf_interop import peft_adapter_name
    hf, ours, _ = _lora_pair(tmp_path, bias, tie, kv)
    _random_b(ours, rng)
    peft_model = get_peft_model(hf, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    peft_params = dict(peft_model.named_parameters())
    with torch.no_grad():
        for p in adapter_params(ours):
            peft_params[peft_adapter_name(p.name).replace(".weight", ".default.weight")].copy_(
                torch.tensor(param_to_numpy(p)))
    params = adapter_params(ours)
    grads = _weighted_logprob_grads(ours, params, peft_model, rng.randint(0, 160, (3, 10)), rng)
    for p, grad in zip(params, grads):
        ref = peft_params[peft_adapter_name(p.name).replace(".weight", ".default.weight")].grad.numpy()
        assert np.abs(ref).max() > 1e-4, p.name                         # a real gradient, not zeros
        assert np.abs(grad.asnumpy() - ref).max() <= 1e-5 * np.abs(ref).max(), p.name


def test_peft_loads_our_adapter_export_and_merged_weights_give_our_logits(tmp_path, rng):
    """export_peft_adapter's folder, loaded by peft.PeftModel.from_pretrained on the HF base, gives our logits;
    merged_weights (the rollout model's and the merged export's source) in a model without adapters too."""
    import torch
    from peft import PeftModel
    from mindrlhf.checkpoint.hf_interop import export_peft_adapter
    from mindrlhf.checkpoint.model_io import load_full_weights
    from mindrlhf.models.qwen2 import CausalLM
    hf, ours, _ = _lora_pair(tmp_path / "base")
    _random_b(ours, rng)
    ids = rng.randint(0, 160, (2, 9))
    want = ours.full_logits(*model_inputs(ids)).asnumpy()
    out = str(tmp_path / "adapter")
    export_peft_adapter({p.name: param_to_numpy(p) for p in adapter_params(ours)}, out, SPEC, str(tmp_path / "base"))
    config = json.load(open(os.path.join(out, "adapter_config.json")))
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["peft_type"] == "LORA"
    loaded = PeftModel.from_pretrained(hf, out)
    with torch.no_grad():
        got = loaded(torch.tensor(ids)).logits.numpy()
    assert np.abs(got - want).max() <= 1e-4
    merged = CausalLM(ours.config)
    weights = merged_weights(ours)
    load_full_weights(merged, ((n, w.asnumpy()) for n, w in weights.params.items()), "merged")
    assert np.abs(merged.full_logits(*model_inputs(ids)).asnumpy() - want).max() <= 1e-5


MOE_MIXED = dict(layers=3, sparse_step=2, mlp_only=(0,), norm_topk_prob=False)   # layers 0, 1 dense, 2 sparse


def _moe_lora_pair(path, form="auto", spec=SPEC, **kw):
    """(transformers' Qwen3-MoE, ours with adapters on its weights, every B random): experts adapted too."""
    from mindrlhf.checkpoint.hf_interop import iter_hf_as_ms
    from mindrlhf.checkpoint.model_io import load_full_weights
    from mindrlhf.models.qwen2 import CausalLM
    hf = make_qwen3_moe_model(path, **kw)
    ours = CausalLM(ModelConfig(**qwen3_moe_model_kwargs(**kw), moe_expert_compute=form), None, spec)
    load_full_weights(ours, iter_hf_as_ms(path), path)
    _random_b(ours, np.random.RandomState(5))
    return hf, ours


def _dense_mlp(name: str) -> bool:
    return ".feed_forward.w" in name


def _zero_dense_mlp_b(model):
    for p in model.get_parameters():
        if _dense_mlp(p.name) and p.name.endswith(ADAPTER_B):
            write_param(p, np.zeros(p.shape, np.float32))


def _peft_moe(hf, ours, spec=SPEC):
    """PEFT's LoRA on `hf` (target_modules for the linear layers, target_parameters for the stacked experts) holding
    our adapters' values; returns (the PEFT model, its parameters by name)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from mindrlhf.checkpoint.hf_interop import PEFT_EXPERT_PARAMETERS, PEFT_GATE_UP_PATTERN, peft_adapter_tensors
    from mindrlhf.configs.lora import MODULES
    peft_model = get_peft_model(hf, LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=0.0,
                                               target_modules=[MODULES[m] for m in spec.targets
                                                               if m not in ("w1", "w3", "w2")],
                                               target_parameters=list(PEFT_EXPERT_PARAMETERS),
                                               rank_pattern={PEFT_GATE_UP_PATTERN: 2 * spec.rank},
                                               alpha_pattern={PEFT_GATE_UP_PATTERN: 2 * spec.alpha}))
    params = dict(peft_model.named_parameters())
    mapped = peft_adapter_tensors({p.name: param_to_numpy(p) for p in adapter_params(ours)
                                   if not _dense_mlp(p.name)}, spec)
    assert len(mapped) == len([n for n in params if ".lora_" in n])       # every PEFT factor gets ours
    with torch.no_grad():
        for name, value in mapped:
            params[name.replace(".weight", ".default.weight")].copy_(torch.tensor(value))
    return peft_model, params


# side_by_side -m slow: mixed_sorted takes the adapted weights W + s (B A)^T too; batched the low-rank way
@pytest.mark.parametrize("kw, form, rows", [({}, "auto", 3), pytest.param({}, "auto", 8, marks=pytest.mark.slow),
                                            (MOE_MIXED, "sorted", 3)],
                         ids=["batched", "side_by_side", "mixed_sorted"])
def test_moe_expert_adapters_match_peft_target_parameters(tmp_path, rng, kw, form, rows):
    """LoRA on a Qwen3-MoE model adapts every expert's gate, up and down projections as PEFT adapts transformers'
    stacked experts (target_parameters; gate's and up's adapters packed as one of rank 2r on gate_up_proj, as PEFT
    packs per-projection adapters): response log-probs (T 0.7), weighted and summed, and the gradient of every
    A and B (attention, experts) against PEFT's, in each expert form (3 x 9 tokens: batched per expert; 8 x 9:
    side by side; sorted by expert, in a model with dense layers, whose MLPs PEFT leaves unadapted on a MoE
    model: ours stay at B = 0 and out of the comparison)."""
    from mindrlhf.checkpoint.hf_interop import peft_adapter_tensors
    spec = SPEC
    hf, ours = _moe_lora_pair(str(tmp_path), form, spec, **kw)
    if kw:
        _zero_dense_mlp_b(ours)
    params = [p for p in adapter_params(ours) if not (kw and _dense_mlp(p.name))]
    assert sum("routed_experts" in p.name for p in params) == 6 * (1 if kw else 2)
    peft_model, peft_params = _peft_moe(hf, ours, spec)
    grads = _weighted_logprob_grads(ours, params, peft_model, rng.randint(0, 160, (rows, 10)), rng)
    # our gradients in PEFT's layout (the export's reshapes and transposes); of gate_up_proj's rank-2r B only the
    # gate and up blocks are ours (PEFT's off-diagonal blocks hold zeros but get gradients: not parameters of ours)
    ours_as_peft = peft_adapter_tensors({p.name: g.asnumpy() for p, g in zip(params, grads)}, spec)
    held = dict(peft_adapter_tensors({p.name: np.ones(p.shape, np.float32) for p in params}, spec))
    for name, grad in ours_as_peft:
        ref = peft_params[name.replace(".weight", ".default.weight")].grad.numpy() * held[name]
        assert np.abs(ref).max() > 1e-5, name                           # a real gradient, not zeros
        assert np.abs(grad - ref).max() <= 1e-5 * np.abs(ref).max(), name


@pytest.mark.parametrize("spec", [SPEC, pytest.param(LoraSpec(4, 8.0, ("wq", "w1"), seed=3), marks=pytest.mark.slow),
                                  pytest.param(LoraSpec(2, 4.0, ("w3", "w2")), marks=pytest.mark.slow)],
                         ids=["all_linear", "gate_only", "up_and_down"])
def test_peft_loads_our_moe_adapter_export_and_merged_weights_give_our_logits(tmp_path, rng, spec):
    """A Qwen3-MoE LoRA export (experts as target_parameters; a projection left out packs as zeros), loaded by
    peft.PeftModel.from_pretrained on the HF base, gives our logits; merged_weights (experts merged per expert)
    in a model without adapters too."""
    import torch
    from peft import PeftModel
    from mindrlhf.checkpoint.hf_interop import export_peft_adapter
    from mindrlhf.checkpoint.model_io import load_full_weights
    from mindrlhf.models.qwen2 import CausalLM
    hf, ours = _moe_lora_pair(str(tmp_path / "base"), spec=spec)
    ids = rng.randint(0, 160, (2, 9))
    want = ours.full_logits(*model_inputs(ids)).asnumpy()
    assert np.abs(want - hf_logits(hf, ids)).max() > 1e-3                 # the adapters change the model
    out = str(tmp_path / "adapter")
    export_peft_adapter({p.name: param_to_numpy(p) for p in adapter_params(ours)}, out, spec, str(tmp_path / "base"))
    config = json.load(open(os.path.join(out, "adapter_config.json")))
    gate_up, down = "w1" in spec.targets or "w3" in spec.targets, "w2" in spec.targets
    assert config["target_parameters"] == ["mlp.experts.gate_up_proj"] * gate_up + ["mlp.experts.down_proj"] * down
    loaded = PeftModel.from_pretrained(hf, out)
    with torch.no_grad():
        got = loaded(torch.tensor(ids)).logits.numpy()
    assert np.abs(got - want).max() <= 1e-4
    merged = CausalLM(ours.config)
    load_full_weights(merged, ((n, w.asnumpy()) for n, w in merged_weights(ours).params.items()), "merged")
    assert np.abs(merged.full_logits(*model_inputs(ids)).asnumpy() - want).max() <= 1e-5


def test_a_peft_export_that_would_lose_a_dense_mlp_adapter_of_a_moe_model_is_refused(tmp_path):
    """A MoE model with dense layers and MLP targets: refused before the run (resolve) and by the export itself."""
    from mindrlhf.checkpoint.hf_interop import export_peft_adapter, peft_export_refusal
    from mindrlhf.configs.errors import CheckpointError
    from mindrlhf.models.qwen2 import CausalLM
    mixed, sparse = (ModelConfig(**qwen3_moe_model_kwargs(**kw)) for kw in (MOE_MIXED, {}))
    assert "dense layers [0, 2]" in peft_export_refusal(mixed, SPEC)
    assert peft_export_refusal(mixed, LoraSpec(4, 8.0, ("wq", "wo"))) == ""
    assert peft_export_refusal(sparse, SPEC) == ""
    model = CausalLM(mixed, lora=SPEC)
    with pytest.raises(CheckpointError, match="feed_forward.w1.*cannot load from a PEFT folder"):
        export_peft_adapter({p.name: param_to_numpy(p) for p in adapter_params(model)}, str(tmp_path / "a"), SPEC)
    assert not os.path.exists(tmp_path / "a")
    folder = str(tmp_path / "mixed")
    make_qwen3_moe_model(folder, vocab=416, mlp_only=(0,))
    with pytest.raises(ConfigError, match="lora.lora_export: both: PEFT .* dense layers \\[0\\]. Set lora.lora_export: "
                                          "merged"):
        _trainer(make_grpo_assets(str(tmp_path / "assets")), tmp_path / "out", sft_path_train=folder)


@pytest.mark.parametrize("value,expected", [
    ("all-linear", ("wq", "wk", "wv", "wo", "w1", "w3", "w2")),
    (["q_proj", "v_proj"], ("wq", "wv")),
    (".*wq|.*wk|.*wv|.*wo", ("wq", "wk", "wv", "wo")),             # MindFormers' pet_config regex
    ("down_proj, gate_proj", ("w1", "w2")),
])
def test_target_modules_in_every_naming(value, expected):
    assert parse_targets(value) == expected


@pytest.mark.parametrize("extra,pattern", [
    (dict(lora_rank=4, lora_dropout=0.05), "lora_dropout: 0.05; only 0"),
    (dict(lora_rank=4, target_modules="qkv_proj"), "'qkv_proj' is not a linear layer"),
    (dict(lora_rank=4, ref_sync_steps=2, beta=0.1), "ref_sync_steps: 2 with lora.lora_rank 4"),
    (dict(lora_rank=-1), "lora.lora_rank: expected >= 0"),
])
def test_lora_settings_that_cannot_work_are_refused(extra, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_grpo_config(None, extra)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_grpo_assets(str(tmp_path_factory.mktemp("lora")))


def _trainer(assets, save_dir, **extra):
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    flags = dict(lora_rank=4, lora_alpha=8, beta=0.05, verifier_function="digit_fraction_test", mini_batch_size=4)
    flags.update(extra)
    return GRPOTrainer(load_grpo_config(None, grpo_overrides(assets, str(save_dir), **flags)), log=lambda *a: None)


@pytest.mark.slow       # ~41 s; the default run keeps LoRA's rollout sync and its graphs (this file)
def test_lora_run_trains_only_adapters_saves_only_them_and_resumes_exactly(assets, tmp_path):
    """Two mini-batches per step (an old-policy pass and a reference pass, adapters off): 4 steps straight
    against 2 + resume + 2. The base never moves, the KL against it grows from 0, a checkpoint holds the
    adapters and their optimizer state only, and the resumed run ends on the same adapters, bit for bit."""
    common = dict(total_steps=4, save_steps=2)
    full = _trainer(assets, tmp_path / "full", **common)
    base_before = {k: v for k, v in model_state(full.policy).items() if "lora" not in k}
    hist = full.fit()
    state = model_state(full.policy)
    assert all(np.array_equal(state[k], base_before[k]) for k in base_before)
    assert hist[0]["kl"] == 0.0 and hist[-1]["kl"] > 0.0
    assert any(np.abs(state[k]).max() > 0 for k in state if k.endswith(ADAPTER_B))   # the adapters learned
    saved = read_checkpoint(str(tmp_path / "full" / "step_000004" / "rank_0" / "policy.safetensors"))
    assert set(saved) == {p.name for p in adapter_params(full.policy)}
    opt = read_checkpoint(str(tmp_path / "full" / "step_000004" / "rank_0" / "optimizer.safetensors"))
    assert len(opt) == 2 * len(saved) + 1                                # two moments per adapter, the step

    stopped = _trainer(assets, tmp_path / "split", **common)
    for _ in range(2):
        stopped.train_one_step()
    stopped.save()
    resumed = _trainer(assets, tmp_path / "split", resume=True, **common)
    assert resumed.step == 2
    rest = resumed.fit()
    got = model_state(resumed.policy)
    assert all(np.array_equal(got[k], state[k]) for k in state), [k for k in state if not np.array_equal(got[k], state[k])][:3]
    assert [r["loss"] for r in rest] == [r["loss"] for r in hist[2:]]


def test_a_separate_rollout_model_receives_the_merged_weights(assets, tmp_path):
    """An fp16 rollout model (no adapters) after training holds W + scale B A of the policy, rounded to fp16;
    the export writes the merged model and PEFT's adapter folder."""
    import mindspore as ms
    from mindrlhf.utils.params import param_as_f32
    infer = model_yaml(str(tmp_path / "infer_fp16.yaml"), param_init_type="float16")
    trainer = _trainer(assets, tmp_path, sft_path_infer=infer, total_steps=2, export_hf=True)
    assert trainer.rollout_model is not trainer.policy
    assert not any("lora" in p.name for p in trainer.rollout_model.get_parameters())
    trainer.fit()
    merged = merged_weights(trainer.policy).params
    moved = 0
    for p in trainer.rollout_model.get_parameters():
        want = merged[p.name].asnumpy()
        assert np.array_equal(param_as_f32(p), ms.Tensor(want).astype(ms.float16).float().asnumpy()), p.name
        moved += p.name.endswith("wq.weight") and not np.array_equal(want, param_as_f32(trainer.policy.model.layers[
            int(p.name.split(".")[2])].attention.wq.weight))
    assert moved == 2                                                    # both layers' wq carry their update
    assert os.path.isfile(tmp_path / "hf_policy" / "model.safetensors")
    assert os.path.isfile(tmp_path / "hf_adapter" / "adapter_model.safetensors")


@pytest.mark.slow       # ~24 s; the experts' adapters against PEFT stay in the default run
def test_lora_grpo_on_a_qwen3_moe_folder_trains_the_experts_adapters_and_exports_both_ways(assets, tmp_path):
    """Two GRPO steps with LoRA on a Qwen3-MoE folder (every layer sparse): only adapters move, the experts' among
    them; the rollout (the policy with its adapters) matches the train pass; the merged export and PEFT's folder
    loaded on the original base give the same logits in transformers."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    folder = str(tmp_path / "Qwen3-MoE-tiny")
    make_qwen3_moe_model(folder, vocab=416)
    trainer = _trainer(assets, tmp_path / "out", sft_path_train=folder, total_steps=2, export_hf=True)
    before = model_state(trainer.policy)
    rows = trainer.fit()
    after = model_state(trainer.policy)
    moved = {k for k in after if not np.array_equal(after[k], before[k])}
    assert moved and all("mindpet_delta_lora" in k for k in moved)
    ffn = "model.layers.{}.feed_forward.routed_experts.ffn.{}." + ADAPTER_B
    assert {k for k in moved if "routed_experts" in k and k.endswith(ADAPTER_B)} == {
        ffn.format(n, w) for n in range(2) for w in ("w1", "w2", "w3")}
    assert all(r["rollout_train_logprob_gap"] <= 1e-4 for r in rows)
    ids = torch.tensor(np.random.RandomState(0).randint(0, 416, (2, 9)))
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out" / "hf_policy"), dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        want, untrained = merged(ids).logits.numpy(), base(ids).logits.numpy()
        got = PeftModel.from_pretrained(base, str(tmp_path / "out" / "hf_adapter"))(ids).logits.numpy()
    assert np.abs(want - untrained).max() > 1e-2                        # measured 0.20: the adapters carry the update
    assert np.abs(got - want).max() <= 1e-4


def test_mindformers_pet_config_is_refused_naming_the_lora_section(tmp_path):
    from mindrlhf.configs import load_model_yaml
    path = model_yaml(str(tmp_path / "m.yaml"), pet_config={"pet_type": "lora", "lora_rank": 8,
                                                            "target_modules": ".*wq|.*wv"})
    with pytest.raises(ConfigError, match="pet_config.*lora section"):
        load_model_yaml(path)
