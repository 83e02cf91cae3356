"""Output directories: a tool replaces only what it wrote (sliced checkpoints, HF exports, strategy folders),
an export is swapped in whole, and a failed check leaves the previous output untouched."""
import os

import numpy as np
import pytest

from hf_reference import make_hf_model, tiny_model_kwargs
from mindrlhf.checkpoint.hf_interop import export_hf, hf_weight_files
from mindrlhf.checkpoint.model_io import read_checkpoint, save_checkpoint
from mindrlhf.checkpoint.slicing import transform
from mindrlhf.configs import ConfigError, ModelConfig
from mindrlhf.models.specs import param_specs
from mindrlhf.parallel.layouts import Layout
from mindrlhf.parallel.strategy import save_role_strategy, write_strategy

PARAMS = {"col.weight": ((8, 6), (0, -1)), "norm.weight": ((6,), (-1,))}


def _sliceable(tmp_path, tp=2):
    rng = np.random.RandomState(0)
    src = str(tmp_path / "full.safetensors")
    save_checkpoint({n: rng.randn(*s).astype(np.float32) for n, (s, _) in PARAMS.items()}, src)
    strat = str(tmp_path / f"s{tp}.ckpt")
    write_strategy(strat, {n: Layout(s, (1, tp), tm if tp > 1 else (-1,) * len(s)) for n, (s, tm) in PARAMS.items()})
    return src, strat


def _foreign(dst):
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, "notes.txt"), "w") as fh:
        fh.write("mine")
    with open(os.path.join(dst, "full.safetensors"), "wb") as fh:
        fh.write(b"not yours")


@pytest.mark.parametrize("world_size", [1, 2])
def test_transform_refuses_a_destination_holding_other_files(tmp_path, world_size):
    src, strat = _sliceable(tmp_path)
    dst = str(tmp_path / "out")
    _foreign(dst)
    with pytest.raises(ConfigError, match=r"--dst_checkpoint .*out: holds 'full.safetensors' and 1 more entry"):
        for rank_id in range(world_size):
            transform(src, dst, dst_strategy=strat, rank_id=rank_id, world_size=world_size)
    assert sorted(os.listdir(dst)) == ["full.safetensors", "notes.txt"]
    assert open(os.path.join(dst, "notes.txt")).read() == "mine"


def test_transform_rewrites_its_own_output_and_overwrite_replaces_the_rest(tmp_path):
    src, strat2 = _sliceable(tmp_path, tp=2)
    _, strat1 = _sliceable(tmp_path, tp=1)
    dst = str(tmp_path / "out")
    transform(src, dst, dst_strategy=strat2)
    assert {"rank_0", "rank_1"} <= set(os.listdir(dst))
    transform(src, dst, dst_strategy=strat1)           # our own output: replaced as a whole (no stale rank_1)
    assert sorted(n for n in os.listdir(dst) if not n.startswith(".")) == ["rank_0"]
    for rank_id in range(2):                           # cooperating invocations into our own output
        transform(src, dst, dst_strategy=strat2, rank_id=rank_id, world_size=2)
    assert {"rank_0", "rank_1"} <= set(os.listdir(dst))
    with open(os.path.join(dst, "notes.txt"), "w") as fh:
        fh.write("x")
    with pytest.raises(ConfigError, match="holds 'notes.txt'"):
        transform(src, dst, dst_strategy=strat1)
    transform(src, dst, dst_strategy=strat1, overwrite=True)
    assert sorted(n for n in os.listdir(dst) if not n.startswith(".")) == ["rank_0"]


def test_a_symlinked_destination_stays_a_symlink(tmp_path):
    src, strat = _sliceable(tmp_path)
    os.makedirs(tmp_path / "real")
    os.symlink(tmp_path / "real", tmp_path / "link")
    transform(src, str(tmp_path / "link"), dst_strategy=strat)
    assert os.path.islink(tmp_path / "link")
    assert os.path.isfile(tmp_path / "real" / "rank_1" / "checkpoint_1.ckpt")
    transform(src, str(tmp_path / "link"), dst_strategy=strat)      # again: still a link, still ours
    assert os.path.islink(tmp_path / "link") and os.path.isdir(tmp_path / "real" / "rank_0")


def test_transform_cli_names_the_foreign_entry_and_accepts_overwrite(tmp_path, capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "transform_checkpoint", os.path.join(os.path.dirname(__file__), "..", "transform_checkpoint.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    src, strat = _sliceable(tmp_path)
    dst = str(tmp_path / "out")
    _foreign(dst)
    args = ["--src_checkpoint", src, "--dst_checkpoint", dst, "--dst_strategy", strat, "--no_progress"]
    assert tool.main(args) == 2
    assert "holds 'full.safetensors'" in capsys.readouterr().err
    assert os.path.isfile(os.path.join(dst, "notes.txt"))
    assert tool.main(args + ["--overwrite"]) == 0
    assert not os.path.exists(os.path.join(dst, "notes.txt"))


def _cfg():
    return ModelConfig(**tiny_model_kwargs(True, False))


def _weights(cfg, seed):
    rng = np.random.RandomState(seed)
    return {n: rng.randn(*shape).astype(np.float32) for n, (shape, _) in param_specs(cfg).items()}


def test_an_export_replaces_a_sharded_export_whole(tmp_path):
    cfg, out = _cfg(), str(tmp_path / "hf")
    export_hf(_weights(cfg, 0), out, cfg, max_shard_bytes=20_000)
    assert os.path.isfile(os.path.join(out, "model.safetensors.index.json"))
    export_hf(_weights(cfg, 1), out, cfg)
    assert not os.path.exists(os.path.join(out, "model.safetensors.index.json"))
    assert [os.path.basename(f) for f in hf_weight_files(out)] == ["model.safetensors"]


def test_a_crash_mid_export_keeps_the_previous_export(tmp_path, monkeypatch):
    from mindrlhf.checkpoint import hf_interop
    cfg, out = _cfg(), str(tmp_path / "hf")
    export_hf(_weights(cfg, 0), out, cfg, max_shard_bytes=20_000)
    before = {f: open(f, "rb").read() for f in hf_weight_files(out)}
    real = hf_interop.SafeTensorsStreamWriter

    class DiesInTheSecondShard(real):
        opened = 0

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            DiesInTheSecondShard.opened += 1

        def write(self, name, arr):
            super().write(name, arr)
            if DiesInTheSecondShard.opened == 2:
                raise KeyboardInterrupt("killed")

    monkeypatch.setattr(hf_interop, "SafeTensorsStreamWriter", DiesInTheSecondShard)
    with pytest.raises(KeyboardInterrupt):
        export_hf(_weights(cfg, 1), out, cfg, max_shard_bytes=20_000)
    assert {f: open(f, "rb").read() for f in hf_weight_files(out)} == before
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]


def test_an_export_refuses_a_folder_holding_other_files(tmp_path):
    cfg, out = _cfg(), tmp_path / "hf"
    out.mkdir()
    (out / "README.md").write_text("my model card")
    with pytest.raises(ConfigError, match="holds 'README.md'"):
        export_hf(_weights(cfg, 0), str(out), cfg)
    assert (out / "README.md").read_text() == "my model card"


def test_convert_weight_checks_the_yaml_before_it_replaces_the_output(tmp_path):
    import yaml
    from mindrlhf.checkpoint.convert import mindformers_main
    src = tmp_path / "hf"
    make_hf_model(str(src), qkv_bias=True, tie=False)
    out = str(tmp_path / "w.ckpt")
    save_checkpoint({"keep": np.ones(3, np.float32)}, out)
    before = open(out, "rb").read()
    other = dict(tiny_model_kwargs(True, False), intermediate_size=128)
    yaml_path = tmp_path / "other.yaml"
    yaml_path.write_text(yaml.safe_dump({"model": {"model_config": other, "arch": {"type": "LlamaForCausalLM"}}}))
    assert mindformers_main(["--input_path", str(src), "--output_path", out, "--config_path", str(yaml_path)]) == 2
    assert open(out, "rb").read() == before
    assert list(read_checkpoint(out)) == ["keep"]


def test_strategy_folders_hold_only_this_layouts_ranks(tmp_path):
    layouts = {n: Layout(s, (4, 1), (-1,) * len(s)) for n, (s, _) in PARAMS.items()}
    save_role_strategy(str(tmp_path), "train", layouts, 4)
    layouts = {n: Layout(s, (2, 1), (-1,) * len(s)) for n, (s, _) in PARAMS.items()}
    save_role_strategy(str(tmp_path), "train", layouts, 2)
    assert sorted(n for n in os.listdir(tmp_path / "train_strategy") if not n.startswith(".")) == [
        "ckpt_strategy_rank_0.ckpt", "ckpt_strategy_rank_1.ckpt"]


def test_a_fresh_run_creates_its_checkpoint_directory(tmp_path):
    """Node-local checkpoint storage: a node's save_ckpt_dir may not exist when the run claims it (the slow
    two-node test failed there with FileNotFoundError)."""
    from mindrlhf.trainer import run_dir
    d = str(tmp_path / "node0_disk" / "ckpt")
    run_id = run_dir.new_run(d)
    assert run_dir.run_id_of(d) == run_id
