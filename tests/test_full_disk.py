"""A real full disk: each test mounts a small tmpfs (root only; skipped with the reason otherwise) sized so a
first write fits and the next fails mid-file with ENOSPC from the kernel, nothing injected. A training
checkpoint, an HF export and transform_checkpoint.py's output must then leave no half-written result (the
previous complete one intact and loadable, no temp files) and name the error; a checkpointed run resumes to
the uninterrupted run's weights and moments bit for bit once space is freed."""
import contextlib
import errno
import gc
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from grpo_helpers import REPO, grpo_overrides, make_grpo_assets
from hf_reference import tiny_model_kwargs
from mindrlhf.checkpoint import safetensors_io
from mindrlhf.checkpoint.hf_interop import export_hf
from mindrlhf.checkpoint.model_io import read_checkpoint, save_checkpoint
from mindrlhf.configs import ModelConfig
from mindrlhf.configs.grpo_load import load_grpo_config
from mindrlhf.models.specs import param_specs
from mindrlhf.parallel.layouts import Layout
from mindrlhf.parallel.strategy import write_strategy
from mindrlhf.trainer import checkpointing
from mindrlhf.trainer.grpo_trainer import GRPOTrainer
from mindrlhf.trainer.metrics import read_metrics
from mindrlhf.utils.params import param_as_f32


@contextlib.contextmanager
def _tmpfs(kb: int):
    """A tmpfs of `kb` KiB mounted on a fresh directory; unmounted and removed on the way out."""
    path = tempfile.mkdtemp(prefix="mindrlhf_full_disk_")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kb}k", "tmpfs", path], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        os.rmdir(path)
        pytest.skip(f"cannot mount a tmpfs (needs root or CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        # files read back are memory-mapped: the arrays keep the filesystem busy until collected
        gc.collect()
        if subprocess.run(["umount", path], capture_output=True).returncode:
            subprocess.run(["umount", "--lazy", path], check=True)      # detached now, freed once let go of
        os.rmdir(path)


def _resize(path: str, kb: int):
    subprocess.run(["mount", "-o", f"remount,size={kb}k", path], check=True)


def _kb(path: str) -> int:
    """Space `path` takes on disk, in KiB (whole pages, as tmpfs counts them)."""
    return int(subprocess.run(["du", "-sk", path], capture_output=True, text=True, check=True).stdout.split()[0])


def _temp_files(root: str):
    return [os.path.join(d, n) for d, dirs, files in os.walk(root) for n in dirs + files if n.startswith(".tmp_")]


@pytest.fixture
def writes(monkeypatch):
    """Every tensor a stream writer writes: (temp file, tensors already in it, errno or None)."""
    seen, original = [], safetensors_io.SafeTensorsStreamWriter.write

    def write(self, name, arr):
        try:
            original(self, name, arr)
        except OSError as err:
            seen.append((self._tmp, self._next, err.errno))
            raise
        seen.append((self._tmp, self._next, None))
    monkeypatch.setattr(safetensors_io.SafeTensorsStreamWriter, "write", write)
    return seen


def _failed_mid_file(writes):
    """The write that failed met ENOSPC after at least one tensor of its file was on disk."""
    failed = [w for w in writes if w[2] is not None]
    assert len(failed) == 1 and failed[0][2] == errno.ENOSPC, failed
    assert failed[0][1] >= 1, f"{failed[0][0]}: failed before any tensor was written"
    return os.path.basename(failed[0][0])


# ---- a training checkpoint -------------------------------------------------------------------------------
def _trainer(assets, save_dir, **extra):
    flags = dict(verifier_function="digit_fraction_test", total_steps=3, save_steps=1, keep_checkpoints=2,
                 lr_schedule="constant", **extra)        # constant lr: every update moves the weights
    return GRPOTrainer(load_grpo_config(None, grpo_overrides(assets, str(save_dir), **flags)), log=lambda *a: None)


def _computed(row):
    return {k: v for k, v in row.items() if not (k.startswith(("time", "peak_mb")) or k.endswith("_per_s"))}


def _state(trainer):
    return {p.name: param_as_f32(p).tobytes() for p in
            list(trainer.policy.get_parameters()) + list(trainer.optimizer.state_parameters())}


@pytest.mark.slow       # ~30 s; the default run keeps test_trainer's crash inside a save and this file's other cases
def test_a_checkpoint_save_that_fills_the_disk_keeps_the_last_complete_step_and_resume_is_exact(tmp_path, writes):
    assets = make_grpo_assets(str(tmp_path / "assets"))
    full = _trainer(assets, tmp_path / "full")
    full.fit()
    step_kb = _kb(checkpointing.step_dir(str(tmp_path / "full"), 3))
    # step 1's checkpoint and the run's small files fit; step 2's checkpoint (as large again) does not
    with _tmpfs(step_kb + step_kb // 2 + 64) as disk:
        run = _trainer(assets, disk)
        with pytest.raises(OSError) as err:
            run.fit()
        run.metrics.close()
        assert err.value.errno == errno.ENOSPC and "No space left on device" in str(err.value)
        assert run.step == 2
        failed = _failed_mid_file(writes)
        assert failed.startswith((".tmp_optimizer.safetensors", ".tmp_policy.safetensors")), failed
        assert checkpointing.complete_steps(disk) == [1]
        assert not os.path.exists(os.path.join(checkpointing.step_dir(disk, 2), "COMPLETE"))
        assert _temp_files(disk) == []
        # space freed: the resumed run starts from step 1 and ends where the uninterrupted run did
        _resize(disk, 4 * step_kb + 256)
        resumed = _trainer(assets, disk, resume=True)
        assert resumed.step == 1
        resumed.fit()
        got, want = read_metrics(os.path.join(disk, "metrics.jsonl")), read_metrics(str(tmp_path / "full" /
                                                                                       "metrics.jsonl"))
        assert [r["step"] for r in got] == [1, 2, 3]
        assert [_computed(r) for r in got] == [_computed(r) for r in want]
        mine, theirs = _state(resumed), _state(full)
        assert mine.keys() == theirs.keys() and all(mine[k] == theirs[k] for k in theirs)
        assert checkpointing.complete_steps(disk) == [2, 3]


# ---- an HF export ----------------------------------------------------------------------------------------
def _weights(cfg, seed):
    rng = np.random.RandomState(seed)
    return {n: rng.randn(*shape).astype(np.float32) for n, (shape, _) in param_specs(cfg).items()}


def test_an_hf_export_that_fills_the_disk_leaves_the_previous_export_whole(tmp_path, writes):
    cfg = ModelConfig(**tiny_model_kwargs(True, False))
    export_hf(_weights(cfg, 0), str(tmp_path / "sized"), cfg)
    size = _kb(str(tmp_path / "sized"))
    with _tmpfs(size + size // 2 + 16) as disk:
        out = os.path.join(disk, "hf")
        export_hf(_weights(cfg, 0), out, cfg)
        before = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}
        with pytest.raises(OSError) as err:
            export_hf(_weights(cfg, 1), out, cfg)
        assert err.value.errno == errno.ENOSPC and "No space left on device" in str(err.value)
        assert _failed_mid_file(writes).startswith(".tmp_model.safetensors")
        assert {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)} == before
        assert sorted(os.listdir(disk)) == ["hf"] and _temp_files(disk) == []
        first = {n: np.array(a) for n, a in read_checkpoint(os.path.join(out, "model.safetensors")).items()}
        sized = read_checkpoint(os.path.join(str(tmp_path / "sized"), "model.safetensors"))
        assert first.keys() == sized.keys() and all(np.array_equal(a, first[n]) for n, a in sized.items())


# ---- transform_checkpoint.py -----------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [pytest.param("ckpt", marks=pytest.mark.slow), "safetensors"])    # ~7 s each
def test_transform_checkpoint_into_a_full_disk_fails_naming_it_and_keeps_the_previous_output(tmp_path, fmt):
    rng = np.random.RandomState(0)
    params = {"col.weight": ((512, 128), (0, -1)), "row.weight": ((128, 512), (-1, 0)), "norm.weight": ((128,), (-1,))}
    src = str(tmp_path / "full.safetensors")
    save_checkpoint({n: rng.randn(*s).astype(np.float32) for n, (s, _) in params.items()}, src)
    strategy = str(tmp_path / "tp2.ckpt")
    write_strategy(strategy, {n: Layout(s, (1, 2), tm) for n, (s, tm) in params.items()})

    def transform(dst):
        return subprocess.run([sys.executable, os.path.join(REPO, "transform_checkpoint.py"), "--src_checkpoint", src,
                               "--dst_checkpoint", dst, "--dst_strategy", strategy, "--format", fmt, "--no_progress"],
                              capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO), timeout=300)
    proc = transform(str(tmp_path / "sized"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    size = _kb(str(tmp_path / "sized"))
    with _tmpfs(size + size // 2 + 16) as disk:
        out = os.path.join(disk, "sliced")
        assert transform(out).returncode == 0
        before = {os.path.relpath(os.path.join(d, n), out): open(os.path.join(d, n), "rb").read()
                  for d, _, files in os.walk(out) for n in files}
        proc = transform(out)
        assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
        assert f"error: {out}" in proc.stderr and "No space left on device" in proc.stderr, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        after = {os.path.relpath(os.path.join(d, n), out): open(os.path.join(d, n), "rb").read()
                 for d, _, files in os.walk(out) for n in files}
        assert after == before
        assert sorted(os.listdir(disk)) == ["sliced"] and _temp_files(disk) == []


def test_a_stream_writer_that_fills_the_disk_removes_its_temp_file(writes):
    """SafeTensorsStreamWriter on its own (the training checkpoint, export and slicer also remove their whole
    temp folder): after ENOSPC, abort() removes its temp file although closing the file fails again (the
    buffered bytes cannot be flushed either), and the first error is the one raised."""
    with _tmpfs(64) as disk:
        path = os.path.join(disk, "big.safetensors")
        writer = safetensors_io.SafeTensorsStreamWriter(path, [(f"t{i}", "F32", (64, 64)) for i in range(8)])
        with pytest.raises(OSError) as err:
            try:
                for i in range(8):                   # 8 x 16 KiB into 64 KiB
                    writer.write(f"t{i}", np.full((64, 64), i, np.float32))
            except BaseException:
                writer.abort()
                raise
        assert err.value.errno == errno.ENOSPC
        _failed_mid_file(writes)
        assert os.listdir(disk) == []
