"""Expert parallelism (the mesh's `ep` axis, models/moe.py) under msrun with 2 CPU workers: each rank holds half
of every sparse layer's experts, and the model gives one process's logits, loss and gradients; a GRPO run with
train ep2 / infer dp2 (the experts re-laid out between them) follows the one-process trajectory."""
import os
import subprocess
import sys

import numpy as np
import pytest

from hf_reference import make_qwen3_moe_model, qwen3_moe_model_kwargs
from msrun_util import REPO, run_msrun
from mindrlhf.configs import ModelConfig
from mindrlhf.models.specs import layouts_for

pytestmark = pytest.mark.msrun
WORKERS = os.path.join(os.path.dirname(__file__), "workers")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_ep")
    make_qwen3_moe_model(str(root / "hf"), mlp_only=(0,))
    out = root / "out"
    out.mkdir()
    run_msrun(os.path.join(WORKERS, "moe_ep_worker.py"), [root / "hf", out], workers=2, log_dir=str(root / "log"))
    return [dict(np.load(out / f"rank_{r}.npz")) for r in range(2)]


@pytest.mark.parametrize("tag, ep, tp, over_tp", [("ep", 2, 1, False), ("tp", 1, 2, False), ("ep_sorted", 2, 1, False),
                                                  ("tpx", 1, 2, True)],
                         ids=["ep2", "tp2", "ep2_sorted", "tp2_whole_experts"])
def test_split_experts_equal_one_process(results, tag, ep, tp, over_tp):
    """ep2: each rank holds half of the experts; tp2: half of every expert's intermediate width, the router
    replicated; ep2_sorted: ep2 with each rank's experts sorted by expert (moe_expert_compute "sorted");
    tp2_whole_experts: moe_tp_extend_ep, each TP rank two whole experts (sorted form) while attention stays
    split over tp (with sequence parallelism and ep: the 4-worker test below). Bounds as the TP tests' (1e-5): the
    sums over ranks reorder float32 sums of 2 partial outputs."""
    layouts = layouts_for(ModelConfig(**qwen3_moe_model_kwargs(mlp_only=(0,))), 2 if ep > 1 else 1, tp, ep=ep,
                          experts_over_tp=over_tp)
    experts = "model.layers.1.feed_forward.routed_experts.ffn."
    whole = ep > 1 or over_tp          # each rank two whole experts, else four halves
    for rank, res in enumerate(results):
        shapes = dict(eval(s) for s in res[tag + "_shapes"])        # noqa: S307 - our own repr of (name, shape)
        assert shapes[experts + "w1.weight"] == ((2, 64, 32) if whole else (4, 64, 16))
        assert shapes[experts + "w2.weight"] == ((2, 32, 64) if whole else (4, 16, 64))
        assert shapes["model.layers.1.attention.wq.weight"][0] == (48 if tp > 1 else 96)     # 4 heads of 24
        assert shapes["model.layers.1.feed_forward.routed_experts.router.dense.weight"] == (4, 64)
        assert np.abs(res[tag + "_logits"] - res["ref_logits"]).max() <= 1e-5
        assert abs(float(res[tag + "_loss"]) - float(res["ref_loss"])) <= 1e-5
        grads = [k for k in res if k.startswith((tag + "_grad/", tag + "_jitgrad/"))]
        assert len(grads) == 2 * len(layouts)
        for key in grads:
            name = key.split("/", 1)[1]
            want = layouts[name].shard(res["ref_grad/" + name], rank)      # this rank's share, else the whole
            assert res[key].shape == want.shape, name
            assert np.abs(want).max() > 0, name                           # every gradient carries signal
            assert np.abs(res[key] - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), (key, rank)
        norm = np.sqrt(sum(float((res["ref_grad/" + n] ** 2).sum()) for n in layouts))
        assert abs(float(res[tag + "_grad_norm"]) - norm) <= 1e-5 * norm       # every square counted once
    w2 = f"{tag}_grad/{experts}w2.weight"
    assert not np.allclose(results[0][w2], results[1][w2])             # the two ranks hold different shares


@pytest.mark.parametrize("tag", ["a2a", "a2a_sorted"])
def test_all_to_all_dispatcher_on_distinct_rows_equals_one_process(results, tag):
    """ep2 with the all-to-all dispatcher (Mesh.ep_dispatcher "alltoall"; on CPU its exchange is composed from
    AllReduce): rank r holds rows 2r, 2r + 1 of the batch and experts 2r, 2r + 1, and sends its tokens to the
    other rank's experts and back. Each rank's logits are one process's on its rows, the mean of the ranks' losses
    is one process's (equal token counts), the replicated parameters' gradients averaged over the ranks and each
    rank's expert gradients halved (the exchange's backward already brought the other rank's tokens) are one
    process's gradients, op by op and compiled (1e-5; a2a_sorted: each rank's experts sorted by expert, the peers'
    tokens routed elsewhere holding zero weights)."""
    layouts = layouts_for(ModelConfig(**qwen3_moe_model_kwargs(mlp_only=(0,))), 2, 1, ep=2)
    ref = results[0]
    for rank, res in enumerate(results):
        shapes = dict(eval(s) for s in res[tag + "_shapes"])        # noqa: S307 - our own repr of (name, shape)
        assert shapes["model.layers.1.feed_forward.routed_experts.ffn.w1.weight"] == (2, 64, 32)
        assert np.abs(res[tag + "_logits"] - ref["ref_logits"][2 * rank:2 * rank + 2]).max() <= 1e-5
    assert abs((float(results[0][tag + "_loss"]) + float(results[1][tag + "_loss"])) / 2 - float(ref["ref_loss"])) \
        <= 1e-5
    router = "model.layers.1.feed_forward.routed_experts.router.dense.weight"
    assert not np.allclose(results[0][f"{tag}_grad/{router}"], results[1][f"{tag}_grad/{router}"])   # own rows
    for kind in ("_grad/", "_jitgrad/"):
        for name, lay in layouts.items():
            split = lay.shard_shape != lay.full_shape
            for rank, res in enumerate(results):
                got = res[tag + kind + name] / 2 if split else \
                    (results[0][tag + kind + name] + results[1][tag + kind + name]) / 2
                want = lay.shard(ref["ref_grad/" + name], rank)
                assert np.abs(want).max() > 0, name
                assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), (tag + kind + name, rank)


@pytest.mark.slow       # ~40 s (its own 2-worker run); the experts' adapters against PEFT: tests/test_lora.py
def test_expert_lora_adapters_split_with_their_experts_equal_one_process(tmp_path):
    """LoRA on every linear layer and expert projection: at ep2 each rank holds its experts' A and B, at tp2 the
    factor along the split width (B of gate / up, A of down) is halved and the other whole; logits, loss and every
    adapter's gradient (op by op and compiled) equal one process's (1e-5)."""
    make_qwen3_moe_model(str(tmp_path / "hf"), mlp_only=(0,))
    out = tmp_path / "out"
    out.mkdir()
    run_msrun(os.path.join(WORKERS, "moe_ep_worker.py"), [tmp_path / "hf", out, "lora"], workers=2,
              log_dir=str(tmp_path / "log"))
    results = [dict(np.load(out / f"rank_{r}.npz")) for r in range(2)]
    for tag, ep, tp, over_tp in (("ep_lora", 2, 1, False), ("tp_lora", 1, 2, False), ("tpx_lora", 1, 2, True)):
        _lora_layout_equals_one_process(results, tag, ep, tp, over_tp)


def _lora_layout_equals_one_process(results, tag, ep, tp, over_tp):
    from mindrlhf.configs.lora import LoraSpec, parse_targets
    cfg = ModelConfig(**qwen3_moe_model_kwargs(mlp_only=(0,)))
    layouts = layouts_for(cfg, 2 if ep > 1 else 1, tp, ep=ep, lora=LoraSpec(4, 8.0, parse_targets("all-linear")),
                          experts_over_tp=over_tp)
    experts = "model.layers.1.feed_forward.routed_experts.ffn."
    for rank, res in enumerate(results):
        assert np.abs(res[tag + "_logits"] - res["lora_ref_logits"]).max() <= 1e-5
        assert abs(float(res[tag + "_loss"]) - float(res["lora_ref_loss"])) <= 1e-5
        grads = [k for k in res if k.startswith((tag + "_grad/", tag + "_jitgrad/"))]
        assert len(grads) == 2 * len([n for n in layouts if "mindpet_delta_lora" in n]) == 2 * 28
        for key in grads:
            name = key.split("/", 1)[1]
            want = layouts[name].shard(res["lora_ref_grad/" + name], rank)
            assert res[key].shape == want.shape, name
            assert np.abs(want).max() > 0, name
            assert np.abs(res[key] - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), (key, rank)
        b_up = res[f"{tag}_grad/{experts}w3.mindpet_delta_lora_b"]
        assert b_up.shape == ((2, 32, 4) if ep > 1 or over_tp else (4, 16, 4))


@pytest.mark.slow       # ~60 s on 4 workers; ep2 and tp2 alone are in the default run
def test_ep2_by_tp2_with_sequence_parallel_equals_one_process(tmp_path):
    """4 workers, ep2 x tp2 with sequence parallelism: each rank a quarter of the experts' weights (half of the
    experts, half of each one's width; or, with moe_tp_extend_ep, one whole expert of the four); logits, loss and
    every gradient equal one process's (1e-5), the grad norm's groups (tp-split, expert, replicated) count every
    square once, and router replay works on the sequence padded for the split (11 tokens over 2 ranks)."""
    make_qwen3_moe_model(str(tmp_path / "hf"), mlp_only=(0,))
    out = tmp_path / "out"
    out.mkdir()
    run_msrun(os.path.join(WORKERS, "moe_ep_worker.py"), [tmp_path / "hf", out], workers=4,
              log_dir=str(tmp_path / "log"))
    cfg = ModelConfig(**qwen3_moe_model_kwargs(mlp_only=(0,)))
    for tag, over_tp in (("eptp", False), ("eptpx", True)):
        layouts = layouts_for(cfg, 2, 2, ep=2, experts_over_tp=over_tp)
        w1 = layouts["model.layers.1.feed_forward.routed_experts.ffn.w1.weight"]
        assert w1.shard_shape == ((1, 64, 32) if over_tp else (2, 64, 16))
        for rank in range(4):
            res = dict(np.load(out / f"rank_{rank}.npz"))
            assert np.abs(res[tag + "_logits"] - res["ref_logits"]).max() <= 1e-5
            assert abs(float(res[tag + "_loss"]) - float(res["ref_loss"])) <= 1e-5
            for key in [k for k in res if k.startswith((tag + "_grad/", tag + "_jitgrad/"))]:
                name = key.split("/", 1)[1]
                want = layouts[name].shard(res["ref_grad/" + name], rank)
                assert res[key].shape == want.shape, name
                assert np.abs(res[key] - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), (key, rank)
            norm = np.sqrt(sum(float((res["ref_grad/" + n] ** 2).sum()) for n in layouts))
            assert abs(float(res[tag + "_grad_norm"]) - norm) <= 1e-5 * norm
            assert res[tag + "_routing_equal"] and float(res[tag + "_replay_gap"]) <= 1e-6   # the sequence padded


def _grpo_flags(tmp_path, assets, folder, name, **extra):
    from grpo_helpers import TEST_DEFAULTS, cli_args
    return cli_args({**TEST_DEFAULTS, "sft_path_train": folder, "vocab_path": assets["vocab_path"],
                     "merges_file_path": assets["merges_file_path"], "mind_dataset_dir": assets["mind_dataset_dir"],
                     "save_ckpt_dir": str(tmp_path / name), "use_parallel": name != "single", "total_steps": 2,
                     "seed": 7, "batch_size": 4, "num_generations": 4, "mini_batch_size": 8, "beta": 0.04,
                     "temperature": 0.8,
                     "max_tokens": 8, "lr": 1e-4, "eps": 1e-6, "verifier_function": "response_length_test",
                     "progress": False, "export_hf": True, **extra})


def _grpo_runs(tmp_path, layouts, single=None, aux_coef=0.5, workers=2, layers=2, mlp_only=(0,)):
    """A single process, then each {name: flags} under 2 msrun workers, on one Qwen3-MoE folder whose
    router_aux_loss_coef (0.5) makes the load-balancing loss a large share of every gradient (trainer/aux_loss.py:
    its counts are summed over the train-DP replicas and its gradient scaled by dp). `single`: the one process's
    extra flags; `mlp_only`: the dense layers (engine.layerwise_update needs layers alike: none)."""
    from grpo_helpers import WORKER, make_grpo_assets
    from mindrlhf.trainer.metrics import read_metrics
    assets = make_grpo_assets(str(tmp_path / "assets"), rows=16)
    folder = str(tmp_path / "Qwen3-MoE-tiny")
    make_qwen3_moe_model(folder, layers=layers, vocab=416, mlp_only=mlp_only, aux_coef=aux_coef)
    proc = subprocess.run([sys.executable, WORKER] + _grpo_flags(tmp_path, assets, folder, "single", **(single or {})),
                          env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout.decode(errors="replace")[-4000:]
    for name, extra in layouts.items():
        run_msrun(WORKER, _grpo_flags(tmp_path, assets, folder, name, **extra), workers=workers,
                  log_dir=str(tmp_path / name / "log"))
    return {name: read_metrics(str(tmp_path / name / "metrics.jsonl")) for name in ["single", *layouts]}


def _same_trajectory(single, other):
    assert len(single) == len(other) == 2 and all(r["grad_norm"] > 1e-3 for r in single)
    for a, b in zip(single, other):
        assert a["response_len_mean"] == b["response_len_mean"] and a["reward_mean"] == b["reward_mean"]
        assert b["rollout_train_logprob_gap"] <= 1e-4
        assert ("moe/aux_loss" in a) == ("moe/aux_loss" in b)          # reported where the aux loss is on
        for key, absolute in (("loss", 1e-6), ("pg_loss", 1e-6), ("kl", 1e-7), ("grad_norm", 0), ("entropy", 0),
                              ("moe/aux_loss", 0)):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=absolute), key


def _same_export(tmp_path, name, expert_marker=".experts.") -> dict:
    """Every weight of run `name`'s exported policy within 1e-5 of the single process's, experts among them; the
    single process's weights."""
    ref, got = _exported(str(tmp_path / "single" / "hf_policy")), _exported(str(tmp_path / name / "hf_policy"))
    assert sorted(ref) == sorted(got) and any(expert_marker in n for n in ref)
    for key, w in ref.items():
        assert np.abs(got[key] - w).max() <= 1e-5 * max(1.0, np.abs(w).max()), key
    return ref


def _exported(path):
    from safetensors.numpy import load_file
    out = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, name)))
    return out


@pytest.mark.slow       # ~48 s; ep2's and tp2's logits and gradients are in the default run
def test_grpo_train_ep2_infer_dp2_follows_one_process(tmp_path):
    """Two GRPO steps (KL to the reference, two updates per step): train data_parallel 2 as expert_parallel 2
    (each rank half the experts, the same rows on both) / infer dp2 (every rank all experts, its own rows): the
    same samples, per-step metrics within 1e-5 (loss / KL also 1e-6 / 1e-7 absolute, as the layout-invariance
    tests), and the exported policy within 1e-5 of one process's, every expert included."""
    # infer dp2: 2 prompts per rank; train: the 2 ranks are one row group, so a mini-batch is 8 rows on each
    runs = _grpo_runs(tmp_path, {"ep2": {"train_expert_parallel": 2, "batch_size": 2}})
    _same_trajectory(runs["single"], runs["ep2"])
    _same_export(tmp_path, "ep2")


A2A = {"train_expert_parallel": 2, "train_moe_token_dispatcher_type": "alltoall", "batch_size": 2,
       "mini_batch_size": 4}


# ~65-90 s: -m slow (the default run keeps the dispatcher's logits and gradients at ep2 against one process,
# test_all_to_all_dispatcher_on_distinct_rows_equals_one_process, and its gradient sync, tests/test_grad_sync.py)
@pytest.mark.slow
def test_grpo_train_ep2_all_to_all_follows_one_process(tmp_path):
    """Train data_parallel 2 as expert_parallel 2 with the all-to-all dispatcher (each rank its own 8 rows of a
    step, 4 per update, and half the experts: its tokens go to the experts' rank and come back) / infer dp2: the
    aux loss on (its counts over both ranks' rows, its gradient scaled by the 2 row shares) and KL to a reference
    model on the train layout (its passes exchange tokens too). The same samples and per-step metrics as one
    process, and the exported policy within 1e-5, experts included: the replicated parameters' gradients are
    averaged over both ranks, each expert's, which already holds both ranks' tokens, only divided by 2."""
    runs = _grpo_runs(tmp_path, {"a2a": A2A})
    _same_trajectory(runs["single"], runs["a2a"])
    _same_export(tmp_path, "a2a")
    log = open(tmp_path / "a2a" / "log" / "worker_0.log").read()
    assert "ep=2 (all-to-all: each EP rank its own rows)" in log


@pytest.mark.slow       # ~50 s; the experts' adapters against PEFT and at ep2 / tp2 are tested in tests/test_lora.py
def test_grpo_lora_train_ep2_infer_dp2_follows_one_process(tmp_path):
    """LoRA on every linear layer and expert: train ep2 (each rank its experts' adapters) / infer dp2 (a separate
    rollout model, no adapters, receiving W + scale (B A)^T re-laid out from ep2) against one process whose policy
    rolls out with its adapters: the same samples and metrics (1e-5), the rollout / train gap of a merged model,
    and the merged export within 1e-5, experts included."""
    lora = {"lora_rank": 4, "lora_alpha": 8, "lora_export": "merged", "lr": 1e-2}
    runs = _grpo_runs(tmp_path, {"ep2": {"train_expert_parallel": 2, "batch_size": 2, **lora}}, single=lora)
    _same_trajectory(runs["single"], runs["ep2"])
    ref = _same_export(tmp_path, "ep2")
    gate = "model.layers.1.mlp.experts.0.gate_proj.weight"               # the hub layout, per expert
    assert np.abs(ref[gate] - _exported(str(tmp_path / "Qwen3-MoE-tiny"))[gate]).max() > 1e-4   # the adapters moved it


@pytest.mark.slow       # ~45 s
def test_grpo_train_dp2_infer_ep2_follows_one_process(tmp_path):
    """The other way round: train dp2 (every rank all experts, its own rows) / infer data_parallel 2 as
    expert_parallel 2 (the rollout's experts split; both ranks decode the same 4 prompts in lockstep): the same
    trajectory as one process, and the weights synced into the split rollout model give the train forward's
    log-probs (the rollout-train gap, checked in _same_trajectory)."""
    # infer: the 2 ranks are one row group, so each decodes all 4 prompts; train dp2: 8 rows per rank
    runs = _grpo_runs(tmp_path, {"infer_ep2": {"infer_expert_parallel": 2, "mini_batch_size": 4}})
    _same_trajectory(runs["single"], runs["infer_ep2"])


@pytest.mark.slow       # ~45 s: tp2's logits and gradients are in the default run (test_split_experts_equal_one_process)
def test_grpo_train_tp2_with_router_replay_follows_one_process(tmp_path):
    """Train model_parallel 2 (each rank half of every expert's width) and router replay r3 / infer dp2: the same
    trajectory as one process with r3, and the exported experts, re-assembled from their TP halves, within 1e-5 of
    one process's. (Against one process without replay the step's second update differs: the first one, with the
    aux loss's weight at 0.5, moves the routers enough to flip some tokens' experts, which r3 keeps.)"""
    runs = _grpo_runs(tmp_path, {"tp2": {"train_model_parallel": 2, "batch_size": 2, "router_replay": "r3"}},
                      single={"router_replay": "r3"})
    _same_trajectory(runs["single"], runs["tp2"])
    assert all(r["moe/routing_agreement"] == 1.0 for r in runs["tp2"])
    _same_export(tmp_path, "tp2")


@pytest.mark.slow       # ~50 s: the layout's logits and gradients are in the default run (tp2_whole_experts)
def test_grpo_train_whole_experts_over_tp2_infer_tp2_width_shares_follows_one_process(tmp_path):
    """Train model_parallel 2 with moe_tp_extend_ep (each rank two whole experts) / infer model_parallel 2 without
    it (each rank half of every expert's width): the online re-layout moves every expert between the two forms
    each step; with router replay r3 the same trajectory as one process, the rollout's log-probs the train
    forward's (_same_trajectory's gap), and the export within 1e-5 of one process's."""
    runs = _grpo_runs(tmp_path, {"tpx": {"train_model_parallel": 2, "train_moe_tp_extend_ep": True,
                                         "infer_model_parallel": 2, "router_replay": "r3"}},
                      single={"router_replay": "r3"})
    _same_trajectory(runs["single"], runs["tpx"])
    log = open(tmp_path / "tpx" / "log" / "worker_0.log").read()
    assert "(experts over tp)" in log
    _same_export(tmp_path, "tpx")


# ~55 s: -m slow (the default run keeps the routing inputs of the one-graph update: test_router_replay.py,
# test_aux_loss.py; the pipeline's with the 4-worker pp2 x ep2 run below, also slow)
@pytest.mark.slow
def test_grpo_train_pp2_with_the_aux_loss_and_r3_follows_one_process(tmp_path):
    """Pipeline stages take the routing inputs: train pp2 (stage 0 the dense layer 0, stage 1 the sparse one; 2
    micro-batches, 1F1B) / infer dp2, the aux loss at 0.5 and router replay r3: the routing pass runs through the
    stages, the old-policy pass and each update replay the rollout's experts, and the aux gradient, counted once
    per replica (not once per stage), enters the sparse stage's graphs. The same trajectory as one process with
    r3 (metrics 1e-5, moe/aux_loss included)."""
    runs = _grpo_runs(tmp_path, {"pp2": {"train_pipeline_stage": 2, "train_micro_batch_num": 2, "batch_size": 2,
                                         "router_replay": "r3"}}, single={"router_replay": "r3"})
    _same_trajectory(runs["single"], runs["pp2"])
    assert all(r["moe/routing_agreement"] == 1.0 for r in runs["pp2"])


@pytest.mark.slow       # ~60 s; the split itself, its save and its load are in the default run (test_pipeline.py)
def test_grpo_train_pp2_with_an_offset_follows_one_process(tmp_path):
    """The stages split by parallel.train_offset (what verl's Megatron split counting the embedding gives): 3
    layers (the dense layer 0, sparse 1 and 2) over 2 stages as 1 + 2 ([0, 1]; MindFormers' default is 2 + 1),
    r3 and the aux loss at 0.5: the same trajectory as one process, every exported weight within 1e-5."""
    runs = _grpo_runs(tmp_path, {"pp2_offset": {"train_pipeline_stage": 2, "train_micro_batch_num": 2,
                                                "batch_size": 2, "router_replay": "r3", "train_offset": "0,1"}},
                      single={"router_replay": "r3"}, layers=3)
    _same_trajectory(runs["single"], runs["pp2_offset"])
    log = open(tmp_path / "pp2_offset" / "log" / "worker_0.log").read()
    assert "offset 0 -> [0, 1] (layers per stage [1, 2])" in log
    _same_export(tmp_path, "pp2_offset", "layers.2.mlp.experts")


@pytest.mark.slow       # ~70 s on 4 workers
def test_grpo_train_pp2_by_ep2_with_the_aux_loss_and_r2_follows_one_process(tmp_path):
    """Expert parallelism with pipeline stages: train pp2 x data_parallel 2 as expert_parallel 2 (each stage's two
    ranks hold half of its experts and the same rows; 2 micro-batches, 1F1B) / infer dp4, on 4 workers, the aux
    loss at 0.5 and router replay r2: the routing pass runs through the stages (stage 0 holds only the dense
    layer 0, stage 1 the sparse one) and the replayed experts and aux gradient enter each stage's graphs. The same
    trajectory as one process with r2 and the exported policy within 1e-5, every expert included."""
    runs = _grpo_runs(tmp_path, {"pp2_ep2": {"train_pipeline_stage": 2, "train_expert_parallel": 2,
                                             "train_micro_batch_num": 2, "batch_size": 1, "router_replay": "r2"}},
                      single={"router_replay": "r2"}, workers=4)
    _same_trajectory(runs["single"], runs["pp2_ep2"])
    _same_export(tmp_path, "pp2_ep2")


# ~75 s; the one-graph update's all-to-all run: test_grpo_train_ep2_all_to_all_follows_one_process (also slow)
@pytest.mark.slow
def test_grpo_layerwise_update_with_the_all_to_all_dispatcher_follows_one_process(tmp_path):
    """engine.layerwise_update (a graph per decoder layer, the gradients summed in buffers and averaged from the
    host: update/accumulate.py) under the all-to-all dispatcher: the experts' buffers are averaged apart from the
    others (grad_sync.DPMeanInPlace(experts=True)); the same trajectory and export as one process."""
    runs = _grpo_runs(tmp_path, {"a2a_layerwise": dict(A2A, layerwise_update=True)}, single={"layerwise_update": True},
                      mlp_only=())
    _same_trajectory(runs["single"], runs["a2a_layerwise"])
    _same_export(tmp_path, "a2a_layerwise")
