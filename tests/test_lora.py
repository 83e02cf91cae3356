"""LoRA adapters (models/lora.py) against PEFT on Hugging Face's model (torch, fp32), and in the GRPO loop:
the base at step 0, the reference as the adapters switched off, gradients, PEFT's own loading of our export,
merged weights, adapters-only checkpoints and an exact resume."""
import json
import os

import numpy as np
import pytest

from grpo_helpers import grpo_overrides, make_grpo_assets, model_yaml
from hf_reference import hf_logits, make_hf_model, tiny_model_kwargs
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


@pytest.mark.parametrize("bias,tie,kv", [(True, False, 2), (False, True, 4)])
def test_adapter_gradients_match_peft(tmp_path, rng, bias, tie, kv):
    """Response log-probs (T 0.7), weighted and summed: the loss and every A and B gradient against PEFT's
    LoRA on transformers, with our A and a random B copied in (B = 0 would make every A gradient 0)."""
    import mindspore as ms
    import torch
    from mindspore import Tensor
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
    ids = rng.randint(0, 160, (3, 10))
    resp, temp = 6, 0.7
    weights = rng.randn(3, resp).astype(np.float32)
    params = adapter_params(ours)

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


def test_mindformers_pet_config_is_refused_naming_the_lora_section(tmp_path):
    from mindrlhf.configs import load_model_yaml
    path = model_yaml(str(tmp_path / "m.yaml"), pet_config={"pet_type": "lora", "lora_rank": 8,
                                                            "target_modules": ".*wq|.*wv"})
    with pytest.raises(ConfigError, match="pet_config.*lora section"):
        load_model_yaml(path)
