"""Layouts, strategy files and offline slicing (transform_checkpoint.py), against numpy and MindSpore."""
import os
import subprocess
import sys

import numpy as np
import pytest

from mindrlhf.checkpoint.model_io import read_checkpoint, save_checkpoint
from mindrlhf.utils.bf16 import f32_to_bf16
from mindrlhf.checkpoint.slicing import transform
from mindrlhf.configs import CheckpointError
from mindrlhf.parallel.layouts import Layout
from mindrlhf.parallel.plan import plan_tensor
from mindrlhf.parallel.strategy import read_strategy, write_strategy

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# (name, full shape, tensor map) under a [dp, tp] device matrix: TP over rows, TP over columns, replicated
PARAMS = [("col.weight", (8, 6), (0, -1)), ("row.weight", (6, 8), (-1, 0)), ("norm.weight", (6,), (-1,)),
          ("emb.embedding_weight", (16, 6), (0, -1))]


def _layouts(dp, tp):
    return {n: Layout(s, (dp, tp), tuple(m if tp > 1 else -1 for m in tm)) for n, s, tm in PARAMS}


def _full(seed=0):
    rng = np.random.RandomState(seed)
    return {n: rng.randn(*s).astype(np.float32) for n, s, _ in PARAMS}


def _expected_slice(arr, tmap, dp, tp, rank):
    out = arr
    tp_i = rank % tp
    for d, m in enumerate(tmap):
        if m == 0 and tp > 1:
            step = arr.shape[d] // tp
            out = np.take(out, range(tp_i * step, (tp_i + 1) * step), axis=d)
    return out


@pytest.mark.parametrize("dp,tp", [(1, 2), (2, 1), (1, 4), (2, 2)])
@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_slice_then_merge_is_bit_exact(tmp_path, dp, tp, fmt):
    full = _full()
    src = str(tmp_path / f"full.{fmt}")
    save_checkpoint(full, src)
    strat = str(tmp_path / "s.ckpt")
    write_strategy(strat, _layouts(dp, tp))
    transform(src, str(tmp_path / "sliced"), dst_strategy=strat, out_format=fmt)
    for r in range(dp * tp):
        got = read_checkpoint(str(tmp_path / "sliced" / f"rank_{r}" / f"checkpoint_{r}.{fmt}"))
        for n, s, tm in PARAMS:
            assert np.array_equal(got[n], _expected_slice(full[n], tm, dp, tp, r)), (n, r)
    transform(str(tmp_path / "sliced"), str(tmp_path / "merged"), src_strategy=strat, out_format=fmt)
    merged = read_checkpoint(str(tmp_path / "merged" / "rank_0" / f"checkpoint_0.{fmt}"))
    for n in full:
        assert merged[n].tobytes() == full[n].tobytes()


def _training_step(root, shards):
    """A training step's directory as the trainer writes it: rank_N/ holds policy.safetensors (the shard given)
    beside the optimizer's and the reference's files, COMPLETE last."""
    for r, shard in enumerate(shards):
        d = root / f"rank_{r}"
        d.mkdir(parents=True)
        save_checkpoint(shard, str(d / "policy.safetensors"))
        save_checkpoint({k + ".exp_avg": v * 0 for k, v in shard.items()}, str(d / "optimizer.safetensors"))
        save_checkpoint({k: v + 1 for k, v in shard.items()}, str(d / "ref.safetensors"))
    (root / "COMPLETE").write_text("")
    return str(root)


def test_a_training_steps_shards_are_its_policy(tmp_path):
    """transform_checkpoint.py on save_ckpt_dir/step_N (the error of policy_tensors tells users to do so): each
    rank's policy.safetensors is the source (it refused the three files of a rank); a one-rank step needs no
    --src_strategy; a several-rank one without it says where the strategy comes from."""
    full = _full()
    strat = str(tmp_path / "tp2.ckpt")
    write_strategy(strat, _layouts(1, 2))
    shards = [{n: _expected_slice(full[n], tm, 1, 2, r) for n, _, tm in PARAMS} for r in range(2)]
    step = _training_step(tmp_path / "run" / "step_000002", shards)
    transform(step, str(tmp_path / "merged"), src_strategy=strat)
    merged = read_checkpoint(str(tmp_path / "merged" / "rank_0" / "checkpoint_0.ckpt"))
    assert all(merged[n].tobytes() == full[n].tobytes() for n in full)
    with pytest.raises(CheckpointError, match=r"holds the files of 2 ranks: give --src_strategy.*--only_save_strategy"):
        transform(step, str(tmp_path / "out"))
    single = _training_step(tmp_path / "run1" / "step_000002", [full])
    transform(single, str(tmp_path / "sliced"), dst_strategy=strat)
    for r in range(2):
        got = read_checkpoint(str(tmp_path / "sliced" / f"rank_{r}" / f"checkpoint_{r}.ckpt"))
        assert all(np.array_equal(got[n], shards[r][n]) for n in full)


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_rank_shares_and_worker_processes_write_the_same_files(tmp_path, fmt):
    """MindRLHF's --rank_id/--world_size (cooperating invocations) and --transform_process_num give the
    same bytes as one invocation writing every rank."""
    full = _full()
    src = str(tmp_path / f"full.{fmt}")
    save_checkpoint(full, src)
    strat = str(tmp_path / "s.ckpt")
    write_strategy(strat, _layouts(2, 2))
    transform(src, str(tmp_path / "whole"), dst_strategy=strat, out_format=fmt)
    for rank_id in range(3):                       # 3 invocations over 4 ranks: 0 and 3, 1, 2
        report = transform(src, str(tmp_path / "shared"), dst_strategy=strat, out_format=fmt, rank_id=rank_id,
                           world_size=3)
        assert report.ranks == (2 if rank_id == 0 else 1)
    transform(src, str(tmp_path / "procs"), dst_strategy=strat, out_format=fmt, processes=2)
    for r in range(4):
        name = f"rank_{r}/checkpoint_{r}.{fmt}"
        want = read_checkpoint(str(tmp_path / "whole" / name))
        for other in ("shared", "procs"):
            got = read_checkpoint(str(tmp_path / other / name))
            assert set(got) == set(want) and all(got[n].tobytes() == want[n].tobytes() for n in want), (other, r)
    assert sorted(os.listdir(tmp_path / "shared")) == [".mindrlhf_output.json"] + [f"rank_{r}" for r in range(4)]
    with pytest.raises(CheckpointError, match="--rank_id 4: the destination has only 4 rank"):
        transform(src, str(tmp_path / "x"), dst_strategy=strat, rank_id=4, world_size=5)


def test_reslice_between_strategies_and_bf16(tmp_path):
    full = {n: f32_to_bf16(a) for n, a in _full(1).items()}
    save_checkpoint(full, str(tmp_path / "full.safetensors"))
    write_strategy(str(tmp_path / "a.ckpt"), _layouts(1, 2))
    write_strategy(str(tmp_path / "b.ckpt"), _layouts(1, 4))
    transform(str(tmp_path / "full.safetensors"), str(tmp_path / "tp2"), dst_strategy=str(tmp_path / "a.ckpt"),
              out_format="safetensors")
    transform(str(tmp_path / "tp2"), str(tmp_path / "tp4"), src_strategy=str(tmp_path / "a.ckpt"),
              dst_strategy=str(tmp_path / "b.ckpt"), out_format="safetensors")
    for r in range(4):
        got = read_checkpoint(str(tmp_path / "tp4" / f"rank_{r}" / f"checkpoint_{r}.safetensors"))
        for n, s, tm in PARAMS:
            assert got[n].tobytes() == np.ascontiguousarray(_expected_slice(full[n], tm, 1, 4, r)).tobytes()


def test_plan_pieces_cover_each_destination_once():
    src, dst = Layout((8, 12), (2, 2), (0, -1)), Layout((8, 12), (4,), (-1, 0))
    plan = plan_tensor(src, dst)
    for d, pieces in plan.items():
        covered = np.zeros(dst.shard_shape, int)
        for p in pieces:
            covered[p.dst_slice] += 1
        assert (covered == 1).all()


def test_strategy_roundtrip_and_conventions(tmp_path):
    path = str(tmp_path / "s.ckpt")
    write_strategy(path, _layouts(2, 2))
    back = read_strategy(path)
    assert back["col.weight"].dev_matrix == (2, 2) and back["col.weight"].tensor_map == (0, -1)
    assert back["row.weight"].tensor_map == (-1, 0) and back["norm.weight"].tensor_map == (-1,)
    # tensor_map counts device-matrix axes from the right: axis 0 = tp (fastest-varying rank digit)
    lay = back["col.weight"].layout((8, 6))
    assert [lay.shard_slices(r)[0].start for r in range(4)] == [0, 4, 0, 4]


def _ms_transform(tmp_path, full, strategy, fmt):
    import mindspore as ms
    src_dir = tmp_path / "ms_src" / "rank_0"
    src_dir.mkdir(parents=True)
    save_checkpoint(full, str(src_dir / f"full.{fmt}"))
    dst_dir = tmp_path / f"ms_dst_{fmt}"
    kwargs = {"output_format": fmt} if fmt == "safetensors" else {}
    ms.transform_checkpoints(str(tmp_path / "ms_src"), str(dst_dir), "checkpoint_", src_strategy_file=None,
                             dst_strategy_file=strategy, **kwargs)
    return dst_dir


def test_mindspore_transform_checkpoints_agrees_with_ours_ckpt(tmp_path):
    full = _full(2)
    strategy = str(tmp_path / "s.ckpt")
    write_strategy(strategy, _layouts(1, 2))
    dst = _ms_transform(tmp_path, full, strategy, "ckpt")
    save_checkpoint(full, str(tmp_path / "full.ckpt"))
    transform(str(tmp_path / "full.ckpt"), str(tmp_path / "ours"), dst_strategy=strategy)
    for r in range(2):
        theirs_files = [f for f in os.listdir(dst / f"rank_{r}") if f.endswith(".ckpt")]
        theirs = read_checkpoint(str(dst / f"rank_{r}" / theirs_files[0]))
        ours = read_checkpoint(str(tmp_path / "ours" / f"rank_{r}" / f"checkpoint_{r}.ckpt"))
        assert set(theirs) == set(ours)
        for n in ours:
            assert theirs[n].tobytes() == ours[n].tobytes(), (n, r)


def test_row_parallel_safetensors_slices_are_right(tmp_path):
    """Parameters split along their last dimension (row-parallel) through the .safetensors path."""
    full = _full(3)
    strategy = str(tmp_path / "s.ckpt")
    write_strategy(strategy, _layouts(1, 2))
    save_checkpoint(full, str(tmp_path / "full.safetensors"))
    transform(str(tmp_path / "full.safetensors"), str(tmp_path / "ours"), dst_strategy=strategy,
              out_format="safetensors")
    for r in range(2):
        ours = read_checkpoint(str(tmp_path / "ours" / f"rank_{r}" / f"checkpoint_{r}.safetensors"))
        assert np.array_equal(ours["row.weight"], full["row.weight"][:, 4 * r:4 * r + 4])


def test_strategy_lacking_a_parameter(tmp_path):
    full = _full()
    save_checkpoint(full, str(tmp_path / "full.ckpt"))
    lay = _layouts(1, 2)
    del lay["row.weight"]
    write_strategy(str(tmp_path / "s.ckpt"), lay)
    with pytest.raises(CheckpointError, match=r"parameter row\.weight of the checkpoint is not in the strategy"):
        transform(str(tmp_path / "full.ckpt"), str(tmp_path / "out"), dst_strategy=str(tmp_path / "s.ckpt"))
    assert not os.path.exists(tmp_path / "out")
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]


def test_strategy_with_extra_parameter(tmp_path):
    full = _full()
    del full["norm.weight"]
    save_checkpoint(full, str(tmp_path / "full.ckpt"))
    write_strategy(str(tmp_path / "s.ckpt"), _layouts(1, 2))
    with pytest.raises(CheckpointError, match=r"norm\.weight of the destination strategy is not in the checkpoint"):
        transform(str(tmp_path / "full.ckpt"), str(tmp_path / "out"), dst_strategy=str(tmp_path / "s.ckpt"))


def test_indivisible_shape_names_parameter(tmp_path):
    full = _full()
    full["col.weight"] = np.zeros((7, 6), np.float32)
    save_checkpoint(full, str(tmp_path / "full.ckpt"))
    write_strategy(str(tmp_path / "s.ckpt"), _layouts(1, 2))
    with pytest.raises(CheckpointError, match=r"parameter col\.weight: dimension 0 of shape \(7, 6\) does not divide"):
        transform(str(tmp_path / "full.ckpt"), str(tmp_path / "out"), dst_strategy=str(tmp_path / "s.ckpt"))


def test_missing_rank_file_and_corrupt_strategy(tmp_path):
    full = _full()
    save_checkpoint(full, str(tmp_path / "full.ckpt"))
    strat = str(tmp_path / "s.ckpt")
    write_strategy(strat, _layouts(1, 2))
    transform(str(tmp_path / "full.ckpt"), str(tmp_path / "sliced"), dst_strategy=strat)
    os.remove(tmp_path / "sliced" / "rank_1" / "checkpoint_1.ckpt")
    with pytest.raises(CheckpointError, match=r"rank_1: expected one checkpoint file for rank 1"):
        transform(str(tmp_path / "sliced"), str(tmp_path / "merged"), src_strategy=strat)
    (tmp_path / "bad.ckpt").write_bytes(b"\x00\xffnot a protobuf" * 3)
    with pytest.raises(CheckpointError, match=r"bad\.ckpt: not a MindSpore strategy file|bad\.ckpt: the strategy"):
        transform(str(tmp_path / "full.ckpt"), str(tmp_path / "o2"), dst_strategy=str(tmp_path / "bad.ckpt"))


def test_cli_and_only_save_strategy(tmp_path):
    """grpo_one_stage.py --only_save_strategy writes both roles' files (no msrun); the CLI slices with them."""
    env = dict(os.environ, PYTHONPATH=REPO)
    cfg = os.path.join(REPO, "model_configs", "qwen_grpo")
    r = subprocess.run([sys.executable, os.path.join(REPO, "examples/grpo/qwen_grpo_tutorial/grpo_one_stage.py"),
                        "--only_save_strategy", "True", "--sft_path_train", os.path.join(cfg, "finetune_qwen2_tiny.yaml"),
                        "--sft_path_infer", os.path.join(cfg, "predict_qwen2_tiny.yaml"),
                        "--save_ckpt_dir", str(tmp_path)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    train = read_strategy(str(tmp_path / "strategy" / "train_strategy" / "ckpt_strategy_rank_1.ckpt"))
    assert train["model.layers.0.attention.wo.weight"].tensor_map == (-1, 0)
    infer = read_strategy(str(tmp_path / "strategy" / "infer_merged_strategy.ckpt"))
    assert infer["model.layers.0.attention.wq.weight"].dev_matrix == (2, 1)
    from mindrlhf.configs import load_model_yaml
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.checkpoint.model_io import model_state
    model = CausalLM(load_model_yaml(os.path.join(cfg, "finetune_qwen2_tiny.yaml")).model)
    state = model_state(model)
    save_checkpoint(state, str(tmp_path / "full.ckpt"))
    r = subprocess.run([sys.executable, os.path.join(REPO, "transform_checkpoint.py"), "--src_checkpoint",
                        str(tmp_path / "full.ckpt"), "--dst_checkpoint", str(tmp_path / "out"), "--dst_strategy",
                        str(tmp_path / "strategy" / "train_strategy"), "--no_progress"], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    shard = read_checkpoint(str(tmp_path / "out" / "rank_1" / "checkpoint_1.ckpt"))
    name = "model.layers.1.feed_forward.w2.weight"
    assert np.array_equal(shard[name], state[name][:, state[name].shape[1] // 2:])


def test_mindspore_transform_checkpoint_by_rank_accepts_our_strategy(tmp_path):
    import mindspore as ms
    full = _full(4)
    strategy = str(tmp_path / "s.ckpt")
    write_strategy(strategy, _layouts(2, 2))
    save_checkpoint(full, str(tmp_path / "full.ckpt"))
    transform(str(tmp_path / "full.ckpt"), str(tmp_path / "ours"), dst_strategy=strategy)
    for rank in range(4):
        assert ms.rank_list_for_transform(rank, None, strategy) == [0]
        out = str(tmp_path / f"ms_rank_{rank}.ckpt")
        ms.transform_checkpoint_by_rank(rank, {0: str(tmp_path / "full.ckpt")}, out, None, strategy)
        theirs = read_checkpoint(out)
        ours = read_checkpoint(str(tmp_path / "ours" / f"rank_{rank}" / f"checkpoint_{rank}.ckpt"))
        assert set(theirs) == set(ours)
        for n in ours:
            assert theirs[n].tobytes() == ours[n].tobytes(), (n, rank)
