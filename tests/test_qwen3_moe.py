"""Qwen3-MoE against transformers' Qwen3MoeForCausalLM (random weights, fp32): router (fp32 logits, softmax,
top-k, norm_topk_prob), stacked SwiGLU experts, sparse layers by decoder_sparse_step / mlp_only_layers, the
load-balancing loss; its config.json key by key, both HF weight layouts in, the hub layout out, and a GRPO run."""
import json
import os

import numpy as np
import pytest

from hf_reference import hf_grad, hf_logits, make_qwen3_moe_model, qwen3_moe_model_kwargs
from model_helpers import load_ours, model_inputs, shared_prompt_against_hf, token_loss_and_grads
from mindrlhf.checkpoint.hf_interop import export_hf, hf_weight_files
from mindrlhf.checkpoint.model_io import model_state
from mindrlhf.checkpoint.safetensors_io import SafeTensorsFile
from mindrlhf.configs import ConfigError, ModelConfig, load_model_yaml

TOL = 1e-4
# a 3-layer model: layer 0 dense (mlp_only_layers), layer 1 dense (decoder_sparse_step 2), layer 2 sparse
MIXED = dict(layers=3, sparse_step=2, mlp_only=(0,), norm_topk_prob=False)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """(HF folder, transformers' model, ours): every layer sparse, top-2 of 4 renormalised."""
    d = str(tmp_path_factory.mktemp("qwen3moe"))
    hf = make_qwen3_moe_model(d)
    return d, hf, load_ours(d, ModelConfig(**qwen3_moe_model_kwargs()))


@pytest.mark.parametrize("kw, form", [({}, "auto"), (MIXED, "auto"), (dict(top_k=1, norm_topk_prob=False), "auto"),
                                      ({}, "sorted"), (dict(top_k=1, norm_topk_prob=False), "sorted")],
                         ids=["sparse", "mixed", "top1", "sparse_sorted", "top1_sorted"])
def test_qwen3_moe_logits_match_hf(tmp_path, rng, kw, form):
    """auto: these tiny shapes run the dense forms; sorted: the experts sorted by expert into blocks."""
    hf = make_qwen3_moe_model(str(tmp_path), **kw)
    cfg = ModelConfig(**qwen3_moe_model_kwargs(**kw), moe_expert_compute=form)
    ours = load_ours(str(tmp_path), cfg)
    sparse = [layer.is_moe for layer in ours.model.layers]
    assert sparse == [cfg.is_moe_layer(n) for n in range(cfg.num_layers)]
    assert sparse == ([False, True, False] if kw is MIXED else [True, True])
    for rows in (3, 6):          # 39 tokens: the experts' batched form; 78 >= 2 x moe_intermediate_size: side by side
        ids = rng.randint(0, 160, (rows, 13))
        ref = hf_logits(hf, ids)
        got = ours.full_logits(*model_inputs(ids)).asnumpy()
        assert np.abs(got - ref).max() <= TOL, rows


@pytest.mark.parametrize("kw, rows, form", [({}, 2, "auto"), (MIXED, 2, "auto"), ({}, 8, "auto"), ({}, 8, "sorted"),
                                            (MIXED, 2, "sorted")],
                         ids=["sparse", "mixed", "sparse_many_tokens", "sparse_sorted", "mixed_sorted"])
def test_qwen3_moe_every_gradient_matches_hf(tmp_path, rng, kw, rows, form):
    """The mean next-token NLL and the gradient of every parameter (router and stacked experts included); 2 x 11
    tokens run the experts' batched form, 8 x 11 (>= 2 x moe_intermediate_size) their side-by-side form, both
    under "auto" at these shapes; "sorted" the sorted-by-expert blocks."""
    import torch
    hf = make_qwen3_moe_model(str(tmp_path), **kw)
    cfg = ModelConfig(**qwen3_moe_model_kwargs(**kw), moe_expert_compute=form)
    ours = load_ours(str(tmp_path), cfg)
    names = [p.name for p in ours.get_parameters()]
    assert "model.layers.1.feed_forward.routed_experts.router.dense.weight" in names
    ids = rng.randint(0, 160, (rows, 12))
    loss, grads = token_loss_and_grads(ours, ids, names)
    hf.zero_grad()
    logits = hf(torch.tensor(ids[:, :-1])).logits
    ref_loss = -torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids[:, 1:])[..., None]).mean()
    ref_loss.backward()
    hf_params = dict(hf.named_parameters())
    assert abs(loss - ref_loss.item()) <= TOL
    for name in names:
        ref = hf_grad(hf_params, name, cfg)
        assert grads[name].shape == ref.shape, name
        assert np.abs(grads[name] - ref).max() <= TOL * max(1.0, np.abs(ref).max()), name


def test_qwen3_moe_shared_prompt_logprobs_and_gradients_match_hf(moe, rng):
    """GRPO's shared-prompt pass (the MoE on the (M, H) token matrix): response log-probs at temperature 0.7
    and every gradient of a weighted sum of them, against whole left-padded rows in torch."""
    from mindrlhf.models.padding import left_pad
    _, hf, ours = moe
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
        ref = hf_grad(hf_params, name, ours.config)
        assert np.abs(grad - ref).max() <= TOL * max(1.0, np.abs(ref).max()), name


def test_qwen3_moe_left_padded_rows_equal_hf_and_their_unpadded_forward(moe, rng):
    _, hf, ours = moe
    ids = rng.randint(0, 160, (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, :4] = 0
    got = ours.full_logits(*model_inputs(ids, mask)).asnumpy()
    real = mask.astype(bool)
    assert np.abs(got[real] - hf_logits(hf, ids, mask)[real]).max() <= TOL
    alone = ours.full_logits(*model_inputs(ids[1:, 4:])).asnumpy()
    assert np.abs(got[1, 4:] - alone[0]).max() <= TOL


@pytest.mark.parametrize("form", ["auto", "sorted"])
def test_qwen3_moe_greedy_generation_equals_hf_generate(moe, form):
    """auto runs the dense forms at these shapes; sorted the sorted blocks in prefill and every decode step."""
    import torch
    from mindrlhf.rollout.engine import GenerationEngine
    from mindrlhf.rollout.sampling import SamplingParams
    d, hf, ours = moe
    if form == "sorted":
        ours = load_ours(d, ModelConfig(**qwen3_moe_model_kwargs(), moe_expert_compute=form))
    rs = np.random.RandomState(0)
    prompts = [rs.randint(3, 160, size=n).tolist() for n in (5, 9, 3, 7)]
    out = GenerationEngine(ours, pad_token_id=0, prompt_bucket=8).generate(
        prompts, SamplingParams(temperature=0, max_tokens=12, eos_token_ids=[7]))
    for i, p in enumerate(prompts):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, pad_token_id=0,
                          eos_token_id=7)[0, len(p):].tolist()
        n = int(out.response_mask[i].sum())
        assert out.response_ids[i, :n].tolist() == ref


@pytest.mark.parametrize("padded", [False, True])
def test_qwen3_moe_aux_loss_equals_transformers(moe, rng, padded):
    """CausalLM.moe_aux_loss = transformers' aux_loss (output_router_logits=True), padding masked out."""
    import torch
    _, hf, ours = moe
    ids = rng.randint(0, 160, (3, 10))
    mask = np.ones(ids.shape, np.int64)
    if padded:
        mask[0, :3] = 0
        mask[2, :6] = 0
    with torch.no_grad():
        ref = hf(torch.tensor(ids), attention_mask=torch.tensor(mask) if padded else None,
                 output_router_logits=True).aux_loss.item()
    from mindspore import Tensor
    got = ours.moe_aux_loss(*model_inputs(ids, mask), mask=Tensor(mask.astype(np.float32)) if padded else None)
    assert abs(float(got.asnumpy()) - ref) <= 1e-5
    assert ref > 0.5          # about top_k for balanced routing: a real value, not 0


def test_expert_load_counts_what_transformers_routes(moe, rng):
    """moe.expert_load (the demo's load report) from our router logits = the top-k counts of transformers' own
    router logits (output_router_logits), real tokens only; each token counted top_k times."""
    import torch
    from mindspore import Tensor
    from mindrlhf.models.moe import expert_load
    _, hf, ours = moe
    ids = rng.randint(0, 160, (3, 10))
    mask = np.ones(ids.shape, np.int64)
    mask[1, :4] = 0
    with torch.no_grad():
        router = hf(torch.tensor(ids), attention_mask=torch.tensor(mask), output_router_logits=True).router_logits
    want = []
    for logits in router:
        top = torch.topk(torch.softmax(logits.float(), -1), 2, dim=-1).indices.numpy()[mask.reshape(-1) == 1]
        want.append(np.bincount(top.reshape(-1), minlength=4))
    got = expert_load(ours.router_logits(*model_inputs(ids, mask)), 2, Tensor(mask).asnumpy())
    assert got.tolist() == np.asarray(want).tolist()
    assert got.sum() == 2 * 2 * mask.sum()            # 2 layers x top-2 per real token
    assert len(set(got[0].tolist())) > 1               # the counts differ: a real routing, not a constant


def test_dense_model_aux_loss_is_zero(tmp_path):
    from mindrlhf.models.qwen2 import CausalLM
    from hf_reference import tiny_model_kwargs
    ours = CausalLM(ModelConfig(**tiny_model_kwargs()))
    assert float(ours.moe_aux_loss(*model_inputs(np.ones((1, 4), np.int64))).asnumpy()) == 0.0


# ---- the HF folder: config.json key by key, both weight layouts in, the hub layout out ----------------------
def _tensors(path):
    out = {}
    for f in hf_weight_files(path):
        st = SafeTensorsFile(f)
        out.update({k: np.array(st.get(k)) for k in st.keys()})
    return out


def test_qwen3_moe_hf_folder_loads_and_exports_back_in_the_hub_layout(moe, tmp_path):
    """save_pretrained's folder (transformers 5.24 writes one tensor per expert, as the hub does, and
    num_local_experts for num_experts) gives the config and weights; the export is the same tensors under the
    same names, and transformers reloads it with equal logits."""
    import torch
    from transformers import AutoModelForCausalLM
    folder, hf, ours = moe
    a = _tensors(folder)
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in a and "model.layers.0.mlp.gate.weight" in a
    spec = load_model_yaml(folder)
    assert spec.model == ModelConfig(**dict(qwen3_moe_model_kwargs(), seq_length=64, max_position_embedding=64,
                                            eos_token_id=2, bos_token_id=1, initializer_range=0.02))
    assert "output_router_logits" in dict(spec.ignored)
    out = tmp_path / "back"
    export_hf(model_state(ours), str(out), spec.model)
    b = _tensors(str(out))
    assert set(a) == set(b)
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    with open(out / "config.json") as fh:
        written = json.load(fh)
    assert written["architectures"] == ["Qwen3MoeForCausalLM"] and written["num_experts"] == 4
    assert load_model_yaml(str(out)).model == spec.model
    # both loaded by from_pretrained: it picks its experts kernel (transformers 5.25: grouped_mm), which sums in
    # another order than the eager experts of the model built in memory (4.8e-7 apart on AMD EPYC Zen 3)
    again = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    original = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = np.arange(12).reshape(2, 6) % 160
    assert np.abs(hf_logits(again, ids) - hf_logits(original, ids)).max() == 0.0
    assert np.abs(hf_logits(again, ids) - hf_logits(hf, ids)).max() <= 1e-5


def test_qwen3_moe_fused_expert_layout_loads(moe, tmp_path, rng):
    """transformers' in-memory layout (mlp.experts.gate_up_proj / down_proj, a state_dict saved as it is)
    loads to the same model as the per-expert folder."""
    import shutil
    from safetensors.torch import save_file
    folder, hf, ours = moe
    fused = tmp_path / "fused"
    fused.mkdir()
    shutil.copyfile(os.path.join(folder, "config.json"), fused / "config.json")
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert "model.layers.1.mlp.experts.gate_up_proj" in state
    save_file(state, str(fused / "model.safetensors"), metadata={"format": "pt"})
    again = load_ours(str(fused), load_model_yaml(str(fused)).model)
    ids = rng.randint(0, 160, (2, 7))
    assert np.abs(again.full_logits(*model_inputs(ids)).asnumpy()
                  - ours.full_logits(*model_inputs(ids)).asnumpy()).max() == 0.0


def test_qwen3_moe_per_expert_renamed_state_dict_loads(moe, tmp_path):
    """A hub-layout file written by hand (the fused tensors split and renamed per expert) loads too; a missing
    expert is named."""
    from safetensors.torch import save_file
    from mindrlhf.checkpoint.hf_interop import iter_hf_as_ms
    from mindrlhf.configs import CheckpointError
    folder, hf, ours = moe
    state = {}
    for k, v in hf.state_dict().items():
        if k.endswith("experts.gate_up_proj"):
            i = v.shape[1] // 2
            for e in range(v.shape[0]):
                state[k.replace("gate_up_proj", f"{e}.gate_proj.weight")] = v[e, :i].contiguous()
                state[k.replace("gate_up_proj", f"{e}.up_proj.weight")] = v[e, i:].contiguous()
        elif k.endswith("experts.down_proj"):
            for e in range(v.shape[0]):
                state[k.replace("down_proj", f"{e}.down_proj.weight")] = v[e].contiguous()
        else:
            state[k] = v.contiguous()
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    got = dict(iter_hf_as_ms(str(tmp_path / "model.safetensors")))
    want = model_state(ours)
    assert set(got) == set(want)
    for k in want:
        assert np.array_equal(got[k], np.asarray(want[k])), k
    del state["model.layers.0.mlp.experts.1.up_proj.weight"]
    save_file(state, str(tmp_path / "bad.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"experts \[0, 2, 3\] are not 0..2"):
        dict(iter_hf_as_ms(str(tmp_path / "bad.safetensors")))


def _edited(src, folder, **edits):
    with open(os.path.join(src, "config.json")) as fh:
        raw = json.load(fh)
    for k, v in edits.items():
        if v is None:
            raw.pop(k, None)
        else:
            raw[k] = v
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(raw, fh)
    return folder


@pytest.mark.parametrize("edits,pattern", [
    (dict(num_experts_per_tok=5), "num_experts_per_tok: expected 1..num_experts=4"),
    (dict(num_local_experts=None, num_experts=None), "num_experts_per_tok given without num_experts"),
    (dict(num_experts=8), "num_experts 4 and num_local_experts 8 differ|num_experts 8 and num_local_experts 4"),
    (dict(mlp_only_layers="0"), "mlp_only_layers: expected a list"),
    (dict(router_aux_loss_coef=-1), "router_aux_loss_coef: expected a number >= 0"),
    (dict(moe_router_type="sigmoid"), "moe_router_type: unknown config.json key"),
])
def test_qwen3_moe_config_json_keys_we_cannot_honour_are_refused(moe, tmp_path, edits, pattern):
    from mindrlhf.configs.compat.hf import model_config_from_hf
    folder = _edited(moe[0], str(tmp_path / "m"), **edits)
    with pytest.raises(ConfigError, match=pattern):
        model_config_from_hf(folder)


def test_qwen3_moe_aux_coef_zero_is_allowed_and_tp_must_divide_the_expert_width(moe, tmp_path):
    from mindrlhf.configs.compat.hf import main, model_config_from_hf
    from mindrlhf.configs.model_config import ParallelConfig
    assert model_config_from_hf(_edited(moe[0], str(tmp_path / "z"), router_aux_loss_coef=0)).router_aux_loss_coef \
        == 0.0
    assert main([moe[0], "--model_parallel", "2", "-o", str(tmp_path / "f.yaml")]) == 0
    assert load_model_yaml(str(tmp_path / "f.yaml")).parallel.model_parallel == 2
    cfg = load_model_yaml(moe[0]).model
    with pytest.raises(ConfigError, match="model_parallel=3 does not divide model.model_config.moe_intermediate_size=32"):
        ParallelConfig(model_parallel=3).check_model(cfg)
    # whole experts over the TP ranks: the experts, not their width, must divide (4 experts: tp2 x ep2 yes, tp3 no)
    ParallelConfig(data_parallel=2, model_parallel=2, expert_parallel=2, moe_tp_extend_ep=True).check_model(cfg)
    with pytest.raises(ConfigError, match=r"parallel_config.moe_tp_extend_ep: expert_parallel x model_parallel = 1 x 3 "
                                          r"does not divide model.model_config.num_experts=4"):
        ParallelConfig(model_parallel=3, moe_tp_extend_ep=True).check_model(cfg)


def test_qwen3_moe_yaml_written_from_the_folder_reads_back(tmp_path):
    """The YAML of a model with dense layers reads back to the same model: mlp_only_layers came back as
    strings (['0']: the list fields were strings or floats) and was refused."""
    import yaml
    from mindrlhf.configs.compat.hf import main
    folder = str(tmp_path / "hf")
    make_qwen3_moe_model(folder, **MIXED)
    out = tmp_path / "moe.yaml"
    assert main([folder, "--data_parallel", "2", "-o", str(out)]) == 0
    fields = yaml.safe_load(out.read_text())["model"]["model_config"]
    assert fields["num_experts"] == 4 and fields["moe_intermediate_size"] == 32 and fields["mlp_only_layers"] == [0]
    assert load_model_yaml(str(out)).model == load_model_yaml(folder).model
    assert load_model_yaml(str(out)).model.mlp_only_layers == [0]


def test_qwen3_moe_specs_describe_the_built_model(moe):
    from mindrlhf.models.specs import param_specs
    _, _, ours = moe
    specs = param_specs(ours.config)
    built = {p.name: tuple(p.shape) for p in ours.get_parameters()}
    assert {k: tuple(v[0]) for k, v in specs.items()} == built
    assert specs["model.layers.0.feed_forward.routed_experts.ffn.w1.weight"] == ((4, 64, 32), {0: "ep", 2: "tp"})
    assert specs["model.layers.0.feed_forward.routed_experts.ffn.w2.weight"] == ((4, 32, 64), {0: "ep", 1: "tp"})


def test_expert_parallel_layouts_split_the_experts_and_nothing_else(moe):
    """ep2 (taken from data_parallel 2, as MindFormers does): the stacked experts split on their first dimension,
    the router and every dense parameter replicated; the strategy file's device matrix is [dp, ep, tp]."""
    from mindrlhf.models.specs import layouts_for
    _, _, ours = moe
    ep2, dp2 = layouts_for(ours.config, 2, 1, ep=2), layouts_for(ours.config, 2, 1)
    w1 = "model.layers.1.feed_forward.routed_experts.ffn.w2.weight"
    assert ep2[w1].dev_matrix == (1, 2, 1) and ep2[w1].shard_shape == (2, 32, 64)
    assert ep2[w1].shard_slices(1)[0] == slice(2, 4) and ep2[w1].shard_slices(0)[0] == slice(0, 2)
    split = sorted(n for n, lay in ep2.items() if lay.shard_shape != lay.full_shape)
    assert split and all(".routed_experts.ffn.w" in n for n in split)
    assert len(split) == 3 * sum(ours.config.is_moe_layer(n) for n in range(ours.config.num_layers))
    assert all(lay.shard_shape == lay.full_shape for lay in dp2.values())


# ---- GRPO on Qwen3-MoE ---------------------------------------------------------------------------------------
def test_grpo_trains_a_qwen3_moe_hf_folder(tmp_path):
    """Two GRPO steps with a Qwen3-MoE folder as --sft_path_train (one dense layer, one sparse): the trainer
    builds, rolls out and updates it (shared prompt on: the dense and the sparse layer each compiled once as
their own reused subgraph, layer_graphs.LayerGraphs), the rollout's log-probs equal the train model's, and the export is a
    Qwen3-MoE transformers loads. The folder's router_aux_loss_coef joins the update (said at start-up) and the
    aux loss is reported (transformers' form: top_k = 2 when the routing is balanced, more when not: the random
    routers are not)."""
    import torch
    from transformers import AutoModelForCausalLM
    from grpo_helpers import grpo_overrides, make_grpo_assets
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    assets = make_grpo_assets(str(tmp_path / "assets"), rows=16)
    folder = str(tmp_path / "Qwen3-MoE-tiny")
    make_qwen3_moe_model(folder, vocab=416, mlp_only=(0,))
    cfg = load_grpo_config(None, grpo_overrides(dict(assets, sft_path_train=folder), str(tmp_path / "out"),
                                                share_prompt=True, export_hf=True, save_steps=2))
    logs = []
    rows = GRPOTrainer(cfg, log=lambda *a, **k: logs.append(" ".join(map(str, a)))).fit()
    assert any("router_aux_loss_coef 0.01 x the load-balancing loss" in line for line in logs)  # config.json's
    assert not any("is not applied" in line for line in logs)
    assert all(2.0 < r["moe/aux_loss"] < 3.0 for r in rows)        # measured 2.64, 2.39
    assert len(rows) == 2
    assert all(np.isfinite(r["loss"]) and r["rollout_train_logprob_gap"] <= 1e-4 for r in rows)
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out" / "hf_policy"), dtype=torch.float32)
    assert type(back).__name__ == "Qwen3MoeForCausalLM"
    assert back.model.layers[1].mlp.experts.gate_up_proj.shape == (4, 64, 64)


# ---- MindSpeed-RL's MoE keys, routing ties -------------------------------------------------------------------
def test_mindspeed_moe_entry_is_qwen3_moe(tmp_path):
    """num_experts, moe_router_topk, moe_ffn_hidden_size, norm_topk_prob and moe_aux_loss_coeff reach the model
    (the dispatcher / grouped-gemm keys are inert); the model equals the HF folder's of the same sizes."""
    from test_qwen3 import _mindspeed
    spec = load_model_yaml(_mindspeed(tmp_path, "tiny_qwen3_moe"))
    assert spec.model == ModelConfig(**dict(qwen3_moe_model_kwargs(vocab=416), seq_length=64,
                                            max_position_embedding=64, eos_token_id=[]))
    assert any("moe_token_dispatcher_type" in k for k, _ in spec.ignored)


@pytest.mark.parametrize("key,value,pattern", [
    ("n_shared_experts", 2, "n_shared_experts: 2 is not supported"),
    ("moe_router_score_function", "sigmoid", "moe_router_score_function: 'sigmoid' is not supported"),
    ("first_k_dense_replace", 1, "first_k_dense_replace: 1 is not supported"),
])
def test_mindspeed_moe_keys_we_do_not_implement_are_refused(tmp_path, key, value, pattern):
    import yaml
    from test_qwen3 import _mindspeed
    path = _mindspeed(tmp_path, "tiny_qwen3_moe")
    entry = tmp_path / "model" / "tiny_qwen3_moe.yaml"
    doc = yaml.safe_load(entry.read_text())
    doc["tiny_qwen3_moe"][key] = value
    entry.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=pattern):
        load_model_yaml(path)


def test_routing_ties_go_to_the_lower_expert_id():
    from mindspore import Tensor
    from mindrlhf.models.moe import top_k_mask
    probs = np.array([[0.25, 0.25, 0.25, 0.25], [0.1, 0.4, 0.1, 0.4], [0.3, 0.2, 0.3, 0.2]], np.float32)
    got = top_k_mask(Tensor(probs), 2).asnumpy()
    assert got.tolist() == [[1, 1, 0, 0], [0, 1, 0, 1], [1, 0, 1, 0]]
    assert top_k_mask(Tensor(probs), 1).asnumpy().tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0]]


def test_sorted_slots_group_the_pairs_by_expert_in_token_order():
    """Each expert's (token, expert) pairs in token order, its group padded to whole blocks, blocks past the
    last group padding, and each token's rows (the combine's map and the dispatch's backward); the buffer holds
    the worst case (every token on the same experts)."""
    from mindspore import Tensor
    from mindrlhf.models.moe import expert_block, sorted_capacity, sorted_slots
    chosen = np.array([[1, 0, 1], [0, 1, 1], [1, 0, 1], [0, 0, 0], [1, 1, 0]], np.float32)    # 5 tokens, 3 experts
    slots, block_expert, token_rows = (t.asnumpy() for t in sorted_slots(Tensor(chosen), 4, 2))
    pad = 15                                                              # E * N: a padding row
    assert len(slots) == sorted_capacity(5, 2, 3, 4) == 20
    assert slots.tolist() == [0, 2, 4, pad, 6, 9, pad, pad, 10, 11, 12, pad] + [pad] * 8
    assert block_expert.tolist() == [0, 1, 2, 2, 2]
    assert token_rows.tolist() == [[0, 4, 1, 20, 2], [8, 9, 10, 20, 5]]   # 20: past the buffer (token 3 has none)
    crowded = np.zeros((9, 4), np.float32)
    crowded[:, :2] = 1                                                    # every token on experts 0 and 1
    slots, block_expert, token_rows = (t.asnumpy() for t in sorted_slots(Tensor(crowded), 4, 2))
    assert sorted(slots[slots < 36].tolist()) == list(range(18))          # no pair lost
    assert (slots[token_rows] == np.arange(9) + np.array([[0], [9]])).all()   # each token's rows hold its pairs
    assert block_expert.tolist()[:6] == [0, 0, 0, 1, 1, 1]
    # the cost model: many tokens over many experts sort; top-k = E, few tokens, or forced dense stay dense
    assert expert_block(2048, 2, 8) == 256 and expert_block(2048, 2, 8, "dense") == 0
    assert expert_block(16, 2, 8) == 0 and expert_block(2048, 4, 4) == 0 and expert_block(16, 2, 8, "sorted") > 0


def test_convert_weight_qwen3_moe_round_trips(moe, tmp_path):
    """convert_weight.py --model qwen3_moe: the HF folder -> our stacked names (checked against the YAML) -> HF
    again, the per-expert tensors bit-equal."""
    from mindrlhf.checkpoint.convert import mindformers_main
    from mindrlhf.configs.compat.hf import main as yaml_main
    folder = moe[0]
    model_yaml = str(tmp_path / "moe.yaml")
    assert yaml_main([folder, "-o", model_yaml]) == 0
    ms_file = str(tmp_path / "moe.safetensors")
    assert mindformers_main(["--model", "qwen3_moe", "--input_path", folder, "--output_path", ms_file,
                             "--config_path", model_yaml]) == 0
    st = SafeTensorsFile(ms_file)
    assert st.get("model.layers.0.feed_forward.routed_experts.ffn.w2.weight").shape == (4, 32, 64)
    back = str(tmp_path / "hf")
    assert mindformers_main(["--model", "qwen3_moe", "--reversed", "--input_path", ms_file, "--output_path", back,
                             "--config_path", model_yaml]) == 0
    a, b = _tensors(folder), _tensors(back)
    assert set(a) == set(b) and all(a[k].tobytes() == b[k].tobytes() for k in a)


def test_lora_on_a_moe_model_adapts_the_experts_the_dense_layers_and_attention():
    """LoRA targets w1/w2/w3 meet the dense layers' MLP and every sparse layer's stacked experts (A (E, r, in),
    B (E, out, r) per projection; tests/test_lora.py checks them against PEFT); specs agree with the built model."""
    from mindrlhf.configs.lora import LoraSpec
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.models.specs import param_specs
    cfg = ModelConfig(**qwen3_moe_model_kwargs(**MIXED))
    lora = LoraSpec(4, 8.0, ("wq", "w1", "w2"))
    model = CausalLM(cfg, lora=lora)
    built = {p.name: tuple(p.shape) for p in model.get_parameters()}
    assert built == {k: tuple(v[0]) for k, v in param_specs(cfg, lora).items()}
    trainable = {p.name: tuple(p.shape) for p in model.trainable_params()}
    assert any(n.startswith("model.layers.0.feed_forward.w1.") for n in trainable)
    assert any(n.startswith("model.layers.2.attention.wq.") for n in trainable)
    experts = {n: s for n, s in trainable.items() if "routed_experts" in n}
    ffn = "model.layers.1.feed_forward.routed_experts.ffn."
    assert experts == {ffn + "w1.mindpet_delta_lora_a": (4, 4, 64), ffn + "w1.mindpet_delta_lora_b": (4, 32, 4),
                       ffn + "w2.mindpet_delta_lora_a": (4, 4, 32), ffn + "w2.mindpet_delta_lora_b": (4, 64, 4)}


def test_qwen3_moe_strategy_file_slices_and_merges_the_experts(moe, tmp_path):
    """The specs' layouts for dp2 (experts replicated: 3-D tensors, whole on every rank) as a strategy file:
    transform_checkpoint's slicing gives each rank the whole experts and merges back bit-exact."""
    from mindrlhf.checkpoint.model_io import read_checkpoint, save_checkpoint
    from mindrlhf.checkpoint.slicing import transform
    from mindrlhf.models.specs import layouts_for
    from mindrlhf.parallel.strategy import read_strategy, write_strategy
    _, _, ours = moe
    full = {k: np.asarray(v) for k, v in model_state(ours).items()}
    save_checkpoint(full, str(tmp_path / "full.safetensors"))
    strat = str(tmp_path / "s.ckpt")
    write_strategy(strat, layouts_for(ours.config, dp=2, tp=1))
    name = "model.layers.1.feed_forward.routed_experts.ffn.w1.weight"
    assert name in read_strategy(strat)
    transform(str(tmp_path / "full.safetensors"), str(tmp_path / "sliced"), dst_strategy=strat,
              out_format="safetensors")
    rank1 = read_checkpoint(str(tmp_path / "sliced" / "rank_1" / "checkpoint_1.safetensors"))
    assert rank1[name].tobytes() == full[name].tobytes()
    _check_merges_back(str(tmp_path / "sliced"), strat, str(tmp_path / "merged"), full)


def _check_merges_back(sliced: str, strategy: str, out: str, full: dict):
    """transform_checkpoint's merge of `sliced` (in `strategy`'s layout) into one file equals `full` bit for bit."""
    from mindrlhf.checkpoint.model_io import read_checkpoint
    from mindrlhf.checkpoint.slicing import transform
    transform(sliced, out, src_strategy=strategy, out_format="safetensors")
    merged = read_checkpoint(os.path.join(out, "rank_0", "checkpoint_0.safetensors"))
    assert set(merged) == set(full) and all(merged[k].tobytes() == full[k].tobytes() for k in full)


def test_expert_parallel_strategy_files_slice_the_experts_and_re_lay_them_out(moe, tmp_path):
    """ep2 strategy files (the grpo_one_stage.py --only_save_strategy files of a YAML with expert_parallel 2):
    transform_checkpoint gives rank r experts [2r, 2r+2) and whole dense tensors; ep2 -> dp2 (every rank all
    experts, the online re-layout's offline twin) and back to one file are bit-exact."""
    from mindrlhf.checkpoint.model_io import read_checkpoint, save_checkpoint
    from mindrlhf.checkpoint.slicing import transform
    from mindrlhf.configs.compat.hf import main as hf_main
    from mindrlhf.configs.grpo_load import config_from_argv
    from mindrlhf.cli import save_role_strategies
    from mindrlhf.parallel.strategy import read_strategy
    folder, _, ours = moe
    yaml_path = str(tmp_path / "ep2.yaml")
    assert hf_main([folder, "--expert_parallel", "2", "-o", yaml_path]) == 0
    assert load_model_yaml(yaml_path).parallel.expert_parallel == 2
    assert load_model_yaml(yaml_path).parallel.data_parallel == 2           # taken from data_parallel
    written = save_role_strategies(config_from_argv(["--sft_path_train", yaml_path, "--save_strategy_dir",
                                                     str(tmp_path / "strategy")]))
    ep_strat = [p for p in written if "train" in os.path.basename(p)][0]
    name = "model.layers.1.feed_forward.routed_experts.ffn.w2.weight"
    entry = read_strategy(ep_strat)[name]
    assert tuple(entry.dev_matrix) == (1, 2, 1) and tuple(entry.tensor_map) == (1, -1, -1)
    full = {k: np.asarray(v) for k, v in model_state(ours).items()}
    save_checkpoint(full, str(tmp_path / "full.safetensors"))
    transform(str(tmp_path / "full.safetensors"), str(tmp_path / "ep"), dst_strategy=ep_strat,
              out_format="safetensors")
    for r in range(2):
        shard = read_checkpoint(str(tmp_path / "ep" / f"rank_{r}" / f"checkpoint_{r}.safetensors"))
        assert shard[name].tobytes() == full[name][2 * r:2 * r + 2].tobytes()
        router = "model.layers.1.feed_forward.routed_experts.router.dense.weight"
        assert shard[router].tobytes() == full[router].tobytes()
    from mindrlhf.models.specs import layouts_for
    from mindrlhf.parallel.strategy import write_strategy
    dp_strat = str(tmp_path / "dp2.ckpt")
    write_strategy(dp_strat, layouts_for(ours.config, dp=2, tp=1))
    transform(str(tmp_path / "ep"), str(tmp_path / "dp"), src_strategy=ep_strat, dst_strategy=dp_strat,
              out_format="safetensors")
    rank1 = read_checkpoint(str(tmp_path / "dp" / "rank_1" / "checkpoint_1.safetensors"))
    assert rank1[name].tobytes() == full[name].tobytes()
    _check_merges_back(str(tmp_path / "ep"), ep_strat, str(tmp_path / "merged"), full)


def test_whole_experts_over_tp_strategy_files_slice_and_re_lay_them_out(moe, tmp_path):
    """moe_tp_extend_ep (hf_config --model_parallel 2 --moe_tp_extend_ep, as MindSpeed-RL's Qwen3-MoE files set
    it): the strategy file splits the experts' first dimension over the TP ranks (whole experts, rank r experts
    [2r, 2r+2)) and attention's rows as tp2 does; transform_checkpoint slices so, re-lays it out into tp2's
    width shares (the online re-layout's offline twin) and merges back bit-exact."""
    from mindrlhf.checkpoint.model_io import read_checkpoint, save_checkpoint
    from mindrlhf.checkpoint.slicing import transform
    from mindrlhf.configs.compat.hf import main as hf_main
    from mindrlhf.configs.grpo_load import config_from_argv
    from mindrlhf.cli import save_role_strategies
    from mindrlhf.models.specs import layouts_for
    from mindrlhf.parallel.strategy import read_strategy, write_strategy
    folder, _, ours = moe
    yaml_path = str(tmp_path / "tpx.yaml")
    assert hf_main([folder, "--model_parallel", "2", "--moe_tp_extend_ep", "-o", yaml_path]) == 0
    assert load_model_yaml(yaml_path).parallel.moe_tp_extend_ep
    written = save_role_strategies(config_from_argv(["--sft_path_train", yaml_path, "--save_strategy_dir",
                                                     str(tmp_path / "strategy")]))
    tpx_strat = [p for p in written if "train" in os.path.basename(p)][0]
    experts, wq = "model.layers.1.feed_forward.routed_experts.ffn.w2.weight", "model.layers.1.attention.wq.weight"
    entry = read_strategy(tpx_strat)[experts]
    assert tuple(entry.dev_matrix) == (1, 2) and tuple(entry.tensor_map) == (0, -1, -1)
    full = {k: np.asarray(v) for k, v in model_state(ours).items()}
    save_checkpoint(full, str(tmp_path / "full.safetensors"))
    transform(str(tmp_path / "full.safetensors"), str(tmp_path / "tpx"), dst_strategy=tpx_strat,
              out_format="safetensors")
    half = full[wq].shape[0] // 2
    for r in range(2):
        shard = read_checkpoint(str(tmp_path / "tpx" / f"rank_{r}" / f"checkpoint_{r}.safetensors"))
        assert shard[experts].tobytes() == full[experts][2 * r:2 * r + 2].tobytes()
        assert shard[wq].tobytes() == full[wq][r * half:(r + 1) * half].tobytes()
    tp_strat = str(tmp_path / "tp2.ckpt")
    write_strategy(tp_strat, layouts_for(ours.config, dp=1, tp=2))
    transform(str(tmp_path / "tpx"), str(tmp_path / "tp"), src_strategy=tpx_strat, dst_strategy=tp_strat,
              out_format="safetensors")
    rank1 = read_checkpoint(str(tmp_path / "tp" / "rank_1" / "checkpoint_1.safetensors"))
    width = full[experts].shape[1] // 2
    assert rank1[experts].tobytes() == np.ascontiguousarray(full[experts][:, width:]).tobytes()
    _check_merges_back(str(tmp_path / "tpx"), tpx_strat, str(tmp_path / "merged"), full)


# a Qwen3-MoE's no-grad log-prob graph, its SFT loss and the host-driven AdamW update (the layerwise engine's), compiled with
# MindSpore's warnings on; prints the lines MindSpore's graph analyzer warns with
_COMPILE_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from mindspore import Parameter, Tensor
from hf_reference import qwen3_moe_model_kwargs
from model_helpers import model_inputs
from mindrlhf.configs import ModelConfig
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.trainer.optim import AdamW
from mindrlhf.trainer.sft import SFTLossValue
from mindrlhf.trainer.update.one_graph import ResponseLogProb
model = CausalLM(ModelConfig(**qwen3_moe_model_kwargs()))
ids = np.random.RandomState(0).randint(0, 150, (2, 10))
labels = Tensor(ids.astype(np.int32))
print("logp", ResponseLogProb(model, 4)(*model_inputs(ids), labels).shape)
mask = Tensor(np.ones(ids.shape, np.float32))
print("sft", SFTLossValue(model)(*model_inputs(ids), labels, mask, Tensor(np.float32(20))).shape)
params = list(model.get_parameters())[:3]
opt = AdamW(params)
grads = [Parameter(Tensor(np.ones(p.shape, np.float32)), name="g." + p.name) for p in params]
opt.update_each(grads, Tensor(np.float32(1e-3)), Tensor(np.float32(1.0)))
print("step", int(opt.step.asnumpy()[0]))
"""


def test_a_moe_models_graphs_compile_without_analyzer_warnings(tmp_path):
    """MindSpore 2.10 warned "Some side effect nodes were eliminated by mistake" while compiling a Qwen3-MoE's
    old-policy / reference log-probs and SFT loss (ResponseLogProb, SFTLoss unpacked (logp, entropy)) and the host-driven AdamW's step
    advance (_Advance unpacked (step, ...)), on every MoE run: harmless (values unchanged) but alarming."""
    import subprocess
    import sys
    script = tmp_path / "probe.py"      # MindSpore compiles graphs from source files only
    script.write_text(_COMPILE_PROBE)
    env = dict(os.environ, GLOG_v="2", PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, str(script), os.path.dirname(os.path.abspath(__file__))], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "logp (2, 4)" in proc.stdout and "sft ()" in proc.stdout and "step 1" in proc.stdout
    warned = [line for line in proc.stdout.splitlines() if "ANALYZER" in line and "WARNING" in line]
    assert not warned, warned


def test_the_all_to_all_dispatcher_is_refused_where_the_ep_ranks_could_not_keep_in_step(moe, tmp_path):
    """parallel_config.moe_token_dispatcher_type alltoall (each EP rank its own rows, exchanged in every MoE
    layer's pass): refused with pipeline stages or sequence parallelism (written for whole rows of one stage) and
    with sequence packing (packed rows, and so forwards, differ in number from rank to rank); a name that is not a
    dispatcher is refused by its field, naming the choices; a separate rollout YAML's alltoall is reported as
    not applying to the rollout."""
    import yaml
    from grpo_helpers import grpo_overrides, make_grpo_assets
    from mindrlhf.configs.compat.hf import main
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.configs.model_config import ParallelConfig
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    folder = moe[0]
    cfg = load_model_yaml(folder).model
    a2a = dict(data_parallel=2, expert_parallel=2, moe_token_dispatcher_type="alltoall")
    ParallelConfig(**a2a).check_model(cfg)
    with pytest.raises(ConfigError, match=r"moe_token_dispatcher_type: alltoall with parallel_config.pipeline_stage 2"):
        ParallelConfig(**a2a, pipeline_stage=2).check_model(cfg)
    with pytest.raises(ConfigError, match=r"alltoall with parallel_config.use_seq_parallel True"):
        ParallelConfig(**a2a, model_parallel=2, use_seq_parallel=True).check_model(cfg)
    out = tmp_path / "moe.yaml"
    assert main([folder, "--data_parallel", "2", "--expert_parallel", "2", "-o", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    doc["parallel_config"]["moe_token_dispatcher_type"] = "all_to_all"
    out.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"moe.yaml: parallel_config.moe_token_dispatcher_type: expected one of "
                                          r"\['allgather', 'alltoall'\], got 'all_to_all'"):
        load_model_yaml(str(out))
    doc["parallel_config"]["moe_token_dispatcher_type"] = "alltoall"
    out.write_text(yaml.safe_dump(doc))
    assert load_model_yaml(str(out)).parallel.moe_token_dispatcher_type == "alltoall"
    assets = make_grpo_assets(str(tmp_path / "assets"))
    overrides = grpo_overrides(dict(assets, sft_path_train=folder), str(tmp_path / "run"), sequence_packing=True,
                               train_data_parallel=2, train_expert_parallel=2,
                               train_moe_token_dispatcher_type="alltoall")
    with pytest.raises(ConfigError, match=r"engine.sequence_packing: the train layout's moe_token_dispatcher_type "
                                          r"is alltoall"):
        GRPOTrainer(load_grpo_config(None, overrides), log=lambda *a: None)
    logs = []
    overrides = grpo_overrides(dict(assets, sft_path_train=folder, sft_path_infer=str(out)), str(tmp_path / "run2"),
                               use_parallel=False)
    with pytest.raises(ConfigError):            # the infer YAML asks for 2 ranks; its alltoall is said first
        GRPOTrainer(load_grpo_config(None, overrides), log=lambda *a, **k: logs.append(" ".join(map(str, a))))
    assert any("parallel_config.moe_token_dispatcher_type" in line and "applies to the train layout" in line
               for line in logs), logs
