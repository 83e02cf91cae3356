"""Pipeline parallelism: the 1F1B schedule (simulated), layer splits and pipelined layouts (single process),
and pipelined training against the whole model under msrun (4 CPU workers).
"""
import json
import os

import numpy as np
import pytest

from msrun_util import run_msrun
from mindrlhf.configs import ModelConfig
from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.model_config import ParallelConfig, layer_split
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.models.specs import layouts_for, param_specs
from mindrlhf.parallel.mesh import Mesh
from mindrlhf.parallel.pipeline import StageIO, bubble_fraction, run_1f1b
from mindrlhf.parallel.plan import plan_tensor


# ---- the schedule, simulated: every link call is a rendezvous of its two ranks -------------------------
class _Recorder:
    """A link end that records its calls: (payload sent forward, payload sent backward, wants fwd, wants bwd)."""

    def __init__(self):
        self.calls = []

    def exchange(self, shape, send_fwd=None, send_bwd=None, want_fwd=False, want_bwd=False):
        self.calls.append((send_fwd, send_bwd, want_fwd, want_bwd))
        return ("fwd?", "bwd?")


def _programs(pp, m):
    """Each stage's sequence of (compute op, link calls) from run_1f1b with recording links."""
    links = {s: (_Recorder() if s > 0 else None, _Recorder() if s < pp - 1 else None) for s in range(pp)}
    computed = {}
    for s in range(pp):
        ops = []

        def forward(i, x, s=s, ops=ops):
            ops.append(("F", i))
            return f"act{s}.{i}"

        def backward(i, dy, s=s, ops=ops):
            ops.append(("B", i))
            return f"grad{s}.{i}"

        run_1f1b(s, pp, m, StageIO(*links[s], (1,)), forward, backward)
        computed[s] = ops
    return links, computed


def _pairs_match(pp, m):
    """Both ends of every link make the same number of calls; in each paired call what one end wants the
    other sends, and what is sent is the right micro-batch's tensor; and the calls can all complete
    (simulated as rendezvous: no deadlock)."""
    links, computed = _programs(pp, m)
    for s in range(pp - 1):
        early, late = links[s][1].calls, links[s + 1][0].calls
        assert len(early) == len(late), (pp, m, s)
        fwd_sent = [c[0] for c in early if c[0] is not None]
        bwd_sent = [c[1] for c in late if c[1] is not None]
        assert fwd_sent == [f"act{s}.{i}" for i in range(m)], (pp, m, s)
        assert bwd_sent == [f"grad{s + 1}.{i}" for i in range(m)], (pp, m, s)
        for (f, _, _, want_b), (_, b, want_f, _) in zip(early, late):
            assert (f is not None) == want_f and (b is not None) == want_b, (pp, m, s)
    for s in range(pp):
        assert [op for op in computed[s] if op[0] == "F"] == [("F", i) for i in range(m)]
        assert [op for op in computed[s] if op[0] == "B"] == [("B", i) for i in range(m)]
        in_flight = peak = 0
        for kind, _ in computed[s]:
            in_flight += 1 if kind == "F" else -1
            peak = max(peak, in_flight)
        assert peak <= min(pp - s, m), (pp, m, s)      # 1F1B's memory bound (GPipe would hold all m)
    # rendezvous simulation: each stage makes its link calls in program order; a call completes when the
    # other end of its link is at its matching call
    log = {s: [] for s in range(pp)}

    class Tagged(_Recorder):
        def __init__(self, stage, side):
            super().__init__()
            self.stage, self.side = stage, side

        def exchange(self, *a, **k):
            log[self.stage].append(self.side)
            return super().exchange(*a, **k)

    for s in range(pp):
        run_1f1b(s, pp, m, StageIO(Tagged(s, "prev") if s else None, Tagged(s, "next") if s < pp - 1 else None, (1,)),
                 lambda i, x: "y", lambda i, dy: "dx")
    pos = {s: 0 for s in range(pp)}
    progressed = True
    while progressed:
        progressed = False
        for s in range(pp - 1):
            if pos[s] < len(log[s]) and pos[s + 1] < len(log[s + 1]) and log[s][pos[s]] == "next" and \
                    log[s + 1][pos[s + 1]] == "prev":
                pos[s] += 1
                pos[s + 1] += 1
                progressed = True
    assert all(pos[s] == len(log[s]) for s in range(pp)), ("deadlock", pp, m, pos)


@pytest.mark.parametrize("pp", [2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8])
def test_1f1b_schedule_pairs_every_transfer_and_never_deadlocks(pp, m):
    _pairs_match(pp, m)


def test_bubble_theory():
    assert bubble_fraction(2, 8) == pytest.approx(1 / 9)
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)


# ---- layer splits, as MindFormers assigns them ---------------------------------------------------------
def test_layer_split_follows_mindformers():
    assert layer_split(4, 2) == [range(0, 2), range(2, 4)]
    assert layer_split(5, 2) == [range(0, 3), range(3, 5)]          # floor(l / 2.5): 3 + 2
    assert layer_split(28, 2, [1, -1]) == [range(0, 15), range(15, 28)]
    assert layer_split(7, 3, 0) == [range(0, 3), range(3, 5), range(5, 7)]
    with pytest.raises(ConfigError, match="add up to num_layers"):
        layer_split(8, 2, [1, 0])
    with pytest.raises(ConfigError, match="expected 2 integers"):
        layer_split(8, 2, [1, -1, 0])
    with pytest.raises(ConfigError, match="without decoder layers"):
        layer_split(4, 2, [-2, 2])
    with pytest.raises(ConfigError, match="without decoder layers"):
        layer_split(1, 2)


def test_pipeline_config_errors_name_the_field():
    cfg = ModelConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, vocab_size=64,
                      tie_word_embeddings=True)
    with pytest.raises(ConfigError, match="pipeline_stage.*tie_word_embeddings"):
        ParallelConfig(pipeline_stage=2).check_model(cfg)
    with pytest.raises(ConfigError, match="micro_batch_num"):
        ParallelConfig(micro_batch_num=0)


# ---- pipelined layouts: each stage holds its parameters, names stay global ------------------------------
def _cfg(layers=3):
    return ModelConfig(hidden_size=32, num_layers=layers, num_heads=4, n_kv_heads=2, intermediate_size=64,
                       vocab_size=64, seq_length=32)


def test_stage_models_hold_their_parameters_under_global_names():
    cfg = _cfg(3)
    layouts = layouts_for(cfg, 2, 1, 2)        # dp2 x pp2 (TP would need communication groups)
    held = {}
    for rank in range(4):
        model = CausalLM(cfg, Mesh(2, 1, rank, pp=2))
        names = {p.name for p in model.get_parameters()}
        assert names == {n for n, lay in layouts.items() if rank in lay.ranks}, rank
        for p in model.get_parameters():
            assert tuple(p.shape) == layouts[p.name].shard_shape, p.name
        held[rank] = names
    assert held[0] == held[1] and held[2] == held[3]
    assert held[0] | held[2] == set(param_specs(cfg)) and not held[0] & held[2]
    assert "model.tok_embeddings.embedding_weight" in held[0] and "lm_head.weight" in held[2]
    assert "model.layers.1.attention.wq.weight" in held[0] and "model.layers.2.attention.wq.weight" in held[2]


def test_a_step_saved_with_an_offset_assembles_from_its_recorded_split(tmp_path):
    """A pipelined run whose split comes from parallel.train_offset (not in the model YAML a loader is given)
    records its stages' layer counts in trainer_state.json; the eval command's loader assembles the step from
    them (3 layers as 1 + 2, where the YAML's offset 0 says 2 + 1); an even split records nothing, and a
    resume under another split is refused naming both."""
    import dataclasses
    from mindrlhf.checkpoint.model_io import POLICY_FILE, rank_dir, save_params
    from mindrlhf.configs.errors import CheckpointError
    from mindrlhf.trainer import checkpointing
    from mindrlhf.utils.atomic import write_json
    plain = dataclasses.replace(_cfg(3), tie_word_embeddings=False)
    shifted = dataclasses.replace(plain, offset=[0, 1])
    meshes = [Mesh(1, 1, rank, pp=2) for rank in range(2)]
    layout = checkpointing.layout_record(2, meshes[0], Mesh(2, 1, 0), shifted)
    assert layout[checkpointing.STAGE_LAYERS] == [1, 2]
    assert checkpointing.STAGE_LAYERS not in checkpointing.layout_record(2, meshes[0], Mesh(2, 1, 0), plain)
    step = checkpointing.step_dir(str(tmp_path), 1)
    want = {}
    for rank, mesh in enumerate(meshes):
        params = list(CausalLM(shifted, mesh).get_parameters())
        want.update({p.name: p.asnumpy() for p in params})
        os.makedirs(rank_dir(step, rank))
        save_params(params, os.path.join(rank_dir(step, rank), POLICY_FILE))
    write_json(os.path.join(step, "trainer_state.json"), {"step": 1, "layout": layout})
    write_json(os.path.join(step, "COMPLETE"), {"step": 1})
    got = dict(checkpointing.policy_tensors(step, plain))
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    with pytest.raises(CheckpointError, match=r"x pp2 \(layers per stage \[1, 2\]\).* but this run has .* x pp2, "):
        checkpointing.load_training_checkpoint(str(tmp_path), 0, None, None, step=1, expect_layout=dict(
            checkpointing.layout_record(2, meshes[0], Mesh(2, 1, 0), plain)))


def test_plan_from_pipelined_layout_reads_each_stage():
    cfg = _cfg(3)
    src, dst = layouts_for(cfg, 1, 2, 2), layouts_for(cfg, 2, 2, 1)
    name = "model.layers.2.feed_forward.w1.weight"            # on stage 1: ranks 2 and 3
    plan = plan_tensor(src[name], dst[name])
    assert sorted(plan) == [0, 1, 2, 3]
    assert {p.src_rank for ps in plan.values() for p in ps} == {2, 3}
    full = np.arange(np.prod(src[name].full_shape), dtype=np.float32).reshape(src[name].full_shape)
    for d, pieces in plan.items():
        out = np.zeros(dst[name].shard_shape, np.float32)
        for p in pieces:
            out[p.dst_slice] = src[name].shard(full, p.src_rank)[p.src_slice]
        np.testing.assert_array_equal(out, dst[name].shard(full, d))


# ---- pipelined training against the whole model (msrun, 4 CPU workers) ---------------------------------
WORKER = os.path.join(os.path.dirname(__file__), "workers", "pipeline_worker.py")
# pp, dp, tp, micro-batches[, sequence parallel]
CASES = ["2,1,2,1", "2,1,2,2", "2,1,2,4", "2,2,1,2", "1,2,2,1,sp", "2,1,2,2,sp"]


@pytest.mark.msrun
@pytest.mark.slow
def test_pipelined_gradients_equal_the_whole_model(tmp_path):
    """pp2 x tp2 with 1, 2 and 4 micro-batches, pp2 x dp2, dp2 x tp2 with sequence parallelism and pp2 x tp2
    with it (11-token sequences, padded to 12 under it): the gradients summed over the 1F1B schedule (and
    averaged over DP) equal the whole model's to 1e-5 relative per tensor, and so do the loss, the
    global gradient norm (over stages and TP ranks) and the log-probs; after one AdamW update the weights
    agree to 1e-5 relative in norm over the rank's tensors (1e-4 per tensor: Adam's first step turns float noise
    in near-zero gradients into ~lr-sized moves); the gradient buffers are cleared."""
    out = str(tmp_path)
    run_msrun(WORKER, [out] + CASES, 4, os.path.join(out, "log"))
    for case in CASES:
        rows = [json.load(open(os.path.join(out, f"{case.replace(',', '_')}_rank{r}.json"))) for r in range(4)]
        pp, dp, tp, m = (int(x) for x in case.split(",")[:4])
        assert [r["stage"] for r in rows] == [r // (dp * tp) for r in range(4)]
        for r in rows:
            loss, ref_loss, norm, ref_norm = r["values"]
            assert abs(ref_loss) > 0.1 and ref_norm > 0.1, r            # far from zero: a real signal
            assert r["grad"] <= 1e-5 and r["loss"] <= 1e-5 and r["norm"] <= 1e-5, r
            assert r["weights"] <= 1e-5 and r["weights_tensor"] <= 1e-4, r
            assert r["logp"] <= 1e-5 and r["cleared"] == 0.0, r
            if pp > 1:
                assert r["params"] < r["ref_params"]                    # each stage holds part of the model
                assert sum(r["links"]) == m + min(pp - 1, m), r          # m transfers each way, paired by 1F1B


# ---- strategy files of a pipelined layout, checked with MindSpore's own tools ---------------------------
def test_pipelined_strategy_files_merge_and_transform_like_mindspore(tmp_path):
    """pp2 x tp2: each rank's file holds its stage's parameters; MindSpore's merge_pipeline_strategys accepts
    the per-rank files and its result reads as ours does; MindSpore's transform_checkpoints, given either
    merged file, writes .ckpt shards bit-identical to ours; and our shards merge back to the full tensors."""
    import mindspore as ms
    from mindrlhf.checkpoint.model_io import read_checkpoint, save_checkpoint
    from mindrlhf.checkpoint.slicing import transform
    from mindrlhf.parallel.strategy import load_strategy, read_strategy, save_role_strategy
    cfg = _cfg(3)
    layouts = layouts_for(cfg, 1, 2, 2)
    save_role_strategy(str(tmp_path), "train", layouts, 4)
    rank_dir = tmp_path / "train_strategy"
    stage0 = read_strategy(str(rank_dir / "ckpt_strategy_rank_1.ckpt"))
    stage1 = read_strategy(str(rank_dir / "ckpt_strategy_rank_2.ckpt"))
    assert set(stage0) | set(stage1) == set(layouts) and not set(stage0) & set(stage1)
    assert {e.stage for e in stage0.values()} == {0} and {e.stage for e in stage1.values()} == {1}
    assert all(e.dev_matrix == (1, 2) for e in stage1.values())          # the stage's device matrix
    ms_merged = str(tmp_path / "ms_merged.ckpt")
    ms.parallel.merge_pipeline_strategys(str(rank_dir), ms_merged)
    ours_merged = str(tmp_path / "train_merged_strategy.ckpt")
    assert read_strategy(ms_merged) == read_strategy(ours_merged) == load_strategy(str(rank_dir))

    rng = np.random.RandomState(0)
    full = {n: rng.randn(*lay.full_shape).astype(np.float32) for n, lay in layouts.items()}
    save_checkpoint(full, str(tmp_path / "full.ckpt"))
    transform(str(tmp_path / "full.ckpt"), str(tmp_path / "ours"), dst_strategy=ours_merged)
    src = tmp_path / "ms_src" / "rank_0"
    src.mkdir(parents=True)
    save_checkpoint(full, str(src / "full.ckpt"))
    for which, strategy in (("ms", ms_merged), ("ours", ours_merged)):
        dst = tmp_path / f"ms_dst_{which}"
        ms.transform_checkpoints(str(tmp_path / "ms_src"), str(dst), "checkpoint_", src_strategy_file=None,
                                 dst_strategy_file=strategy)
        for r in range(4):
            theirs = read_checkpoint(str(dst / f"rank_{r}" / f"checkpoint_{r}.ckpt"))
            ours = read_checkpoint(str(tmp_path / "ours" / f"rank_{r}" / f"checkpoint_{r}.ckpt"))
            assert set(theirs) == set(ours) == {n for n, lay in layouts.items() if r in lay.ranks}, (which, r)
            for n in ours:
                assert theirs[n].tobytes() == ours[n].tobytes(), (which, n, r)
    transform(str(tmp_path / "ours"), str(tmp_path / "back"), src_strategy=str(rank_dir))
    back = read_checkpoint(str(tmp_path / "back" / "rank_0" / "checkpoint_0.ckpt"))
    assert set(back) == set(full) and all(back[n].tobytes() == full[n].tobytes() for n in full)


def test_shipped_tutorial_layout_writes_its_strategy_files(tmp_path):
    """The shipped finetune_qwen2_5_7b.yaml is the tutorial's layout (dp1 x mp4 x pp2, sequence parallel, 2
    micro-batches): --only_save_strategy writes 8 per-rank files, each with its stage's 14 layers, and a
    merged file that MindSpore reads as a two-stage strategy."""
    import subprocess
    import sys
    from mindrlhf.configs import load_model_yaml
    from mindrlhf.parallel.strategy import read_strategy
    from msrun_util import REPO
    cfg_dir = os.path.join(REPO, "model_configs", "qwen_grpo")
    y = load_model_yaml(os.path.join(cfg_dir, "finetune_qwen2_5_7b.yaml"))
    par = y.parallel
    assert (par.data_parallel, par.model_parallel, par.pipeline_stage, par.use_seq_parallel, par.micro_batch_num) == \
        (1, 4, 2, True, 2)
    r = subprocess.run([sys.executable, os.path.join(REPO, "examples/grpo/qwen_grpo_tutorial/grpo_one_stage.py"),
                        "--only_save_strategy", "True", "--sft_path_train", os.path.join(cfg_dir, "finetune_qwen2_5_7b.yaml"),
                        "--sft_path_infer", os.path.join(cfg_dir, "predict_qwen2_5_7b_instruct.yaml"),
                        "--save_ckpt_dir", str(tmp_path)], env=dict(os.environ, PYTHONPATH=REPO), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    files = sorted(f for f in os.listdir(tmp_path / "strategy" / "train_strategy") if not f.startswith("."))
    assert files == sorted(f"ckpt_strategy_rank_{i}.ckpt" for i in range(8))
    for rank in range(8):
        entries = read_strategy(str(tmp_path / "strategy" / "train_strategy" / f"ckpt_strategy_rank_{rank}.ckpt"))
        layers = {int(n.split(".")[2]) for n in entries if n.startswith("model.layers.")}
        assert layers == set(range(14) if rank < 4 else range(14, 28)), rank
        assert all(e.stage == rank // 4 and e.dev_matrix == (1, 4) for e in entries.values())
        assert ("lm_head.weight" in entries) == (rank >= 4)
    from mindspore.parallel._parallel_serialization import _extract_pipeline_stage_num
    assert _extract_pipeline_stage_num(str(tmp_path / "strategy" / "train_merged_strategy.ckpt")) == 2


# ---- micro_batch_interleave_num: the same update in parts -------------------------------------------------
@pytest.mark.parametrize("agg, cuts", [pytest.param("token-mean", ("parts", "micro_batch_size"),   # ~55 s
                                                    marks=pytest.mark.slow),
                                       # the sequence mean's parts weigh 1/m (~16 s each: -m slow)
                                       pytest.param("seq-mean-token-mean", ("micro_batch_size",),
                                                    marks=pytest.mark.slow),
                                       pytest.param("seq-mean-token-mean", ("parts", "micro_batch_size"),
                                                    marks=pytest.mark.slow)],
                         ids=["token-mean", "seq-mean-micro_batch_size", "seq-mean-both-cuts"])
def test_micro_batch_interleave_gives_the_same_updates(tmp_path, agg, cuts):
    """micro_batch_interleave_num 2 (MindFormers' top-level key) cuts each update's mini-batch in two parts run
    one after another: 2 GRPO steps give the same losses, gradient norms and weights as whole mini-batches
    (<= 1e-5), for the token mean and for a sequence mean (whose parts weigh 1/2 each: summed, the loss and
    gradient double); each part runs its group's prompt once (engine.share_prompt), the whole mini-batch its two
    groups'."""
    import yaml
    from grpo_helpers import grpo_overrides, make_grpo_assets, model_yaml
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    from mindrlhf.utils.params import param_as_f32
    assets = make_grpo_assets(str(tmp_path / "assets"), rows=16)
    path = model_yaml(str(tmp_path / "interleave.yaml"))
    with open(path) as fh:
        doc = yaml.safe_load(fh)
    doc["parallel_config"]["model_parallel"] = 1
    doc["micro_batch_interleave_num"] = 2
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh)
    init = str(tmp_path / "init.safetensors")
    from mindrlhf.checkpoint.model_io import model_state, save_checkpoint
    from mindrlhf.configs import load_model_yaml
    save_checkpoint(model_state(CausalLM(load_model_yaml(path).model)), init)
    results = {}
    # the same cut asked for by the GRPO config: engine.micro_batch_size 4 rows of the mini-batch's 8
    variants = (("whole", assets["sft_path_train"], {}), ("parts", path, {}),
                ("micro_batch_size", assets["sft_path_train"], {"micro_batch_size": 4}))
    for name, yaml_path, extra in (v for v in variants if v[0] == "whole" or v[0] in cuts):
        cfg = load_grpo_config(None, grpo_overrides(dict(assets, sft_path_train=yaml_path), str(tmp_path / name),
                                                    loss_agg=agg, beta=0.04, load_sft_checkpoint_train=init,
                                                    verifier_function="digit_fraction_test", share_prompt=True,
                                                    **extra))
        trainer = GRPOTrainer(cfg, log=lambda *a: None)
        assert trainer.run.micro_batches == (1 if name == "whole" else 2)
        assert trainer.run.shared_prompt == (4, trainer.run.prompt_width)     # one group per micro-batch
        history = [trainer.train_one_step() for _ in range(2)]
        results[name] = (history, {p.name: param_as_f32(p).copy() for p in trainer.policy.get_parameters()})
    h1, w1 = results["whole"]
    assert all(h["grad_norm"] > 1e-3 for h in h1)          # a real gradient in every step
    for name in cuts:
        h2, w2 = results[name]
        for a, b in zip(h1, h2):
            for key in ("loss", "pg_loss", "kl", "grad_norm", "entropy", "reward_mean"):
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (name, key)
        diff = sum(np.linalg.norm(w2[n] - w) ** 2 for n, w in w1.items()) ** 0.5
        assert diff <= 1e-5 * sum(np.linalg.norm(w) ** 2 for w in w1.values()) ** 0.5, name
    with pytest.raises(ConfigError, match="micro_batch_size: set, and .* both cut the mini-batch"):
        GRPOTrainer(load_grpo_config(None, grpo_overrides(dict(assets, sft_path_train=path), str(tmp_path / "both"),
                                                          micro_batch_size=4)), log=lambda *a: None)
    with pytest.raises(ConfigError, match="micro_batch_size: 3 does not divide the 8 sequences"):
        GRPOTrainer(load_grpo_config(None, grpo_overrides(assets, str(tmp_path / "three"), micro_batch_size=3)),
                    log=lambda *a: None)
