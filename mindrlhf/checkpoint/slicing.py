"""Offline checkpoint re-layout: full -> per-rank, per-rank -> per-rank (another strategy), per-rank -> full.

Streams parameter by parameter: read one full tensor's worth of source slices, cut every destination
shard with the same `plan_tensor` the online re-layout uses, append each shard to its rank's output.
Peak memory is about one full parameter plus whatever the output format buffers (.safetensors outputs
are streamed; .ckpt outputs are collected per rank because MindSpore writes them whole). Output goes to a
temp directory renamed onto the destination at the end: a failure leaves no partial files. The destination
is replaced only when it holds nothing but this tool's earlier output (utils/output_dir).
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional, Tuple

import numpy as np

from mindrlhf.checkpoint.model_io import (checkpoint_kind, iter_full_tensors, rank_checkpoint_file,
                                          rank_dir, rank_dir_count, read_checkpoint, save_checkpoint)
from mindrlhf.checkpoint.safetensors_io import SafeTensorsFile, SafeTensorsStreamWriter, dtype_code
from mindrlhf.configs.errors import CheckpointError
from mindrlhf.parallel.layouts import Layout, split_counts
from mindrlhf.parallel.plan import full_layout, plan_tensor
from mindrlhf.parallel.strategy import StrategyEntry, load_strategy
from mindrlhf.utils.atomic import atomic_dir
from mindrlhf.utils.bf16 import BF16, contiguous
from mindrlhf.utils.output_dir import check_output_dir, owned_output_dir, write_marker

TOOL = "transform_checkpoint"


# ---- sources ------------------------------------------------------------------------------------------
class FullSource:
    """One full checkpoint file (our names; HF-named safetensors are renamed on the fly)."""

    def __init__(self, path: str):
        self.path = path
        try:
            kind = checkpoint_kind(path)
        except CheckpointError as err:
            raise CheckpointError(f"--src_checkpoint: {err}") from None
        if kind == "full" and path.endswith(".safetensors"):       # read lazily, one tensor at a time
            f = SafeTensorsFile(path)
            self._iter = lambda: ((n, f.get(n)) for n in f.keys())
            self._shapes = {n: f.shape(n) for n in f.keys()}
        elif kind == "full":
            tensors = read_checkpoint(path)   # MindSpore's .ckpt format cannot be read lazily
            self._iter = lambda: iter(tensors.items())
            self._shapes = {n: a.shape for n, a in tensors.items()}
        else:
            self._iter = lambda: iter_full_tensors(path)
            self._shapes = {n: a.shape for n, a in iter_full_tensors(path)}

    def names_and_shapes(self) -> Dict[str, Tuple[int, ...]]:
        return dict(self._shapes)

    def full_tensors(self) -> Iterator[Tuple[str, np.ndarray]]:
        return self._iter()


class ShardedSource:
    """Per-rank files `dir/rank_N/*.{ckpt,safetensors}` laid out by a source strategy; with `file_name`, that
    file of each rank directory (a training checkpoint's `policy.safetensors` beside its optimizer's)."""

    def __init__(self, path: str, strategy: Dict[str, StrategyEntry], file_name: str = ""):
        self.path = path
        self.strategy = strategy
        self.num_ranks = max((e.stage + 1) * int(np.prod(e.dev_matrix)) for e in strategy.values())
        # under pipeline parallelism each stage's first rank lists that stage's parameters
        self.stage_heads = sorted({e.stage * int(np.prod(e.dev_matrix)) for e in strategy.values()})
        self.files = {}
        for r in range(self.num_ranks):
            what = f"rank {r} of the source strategy ({self.num_ranks} ranks)"
            self.files[r] = os.path.join(rank_dir(path, r), file_name) if file_name else \
                rank_checkpoint_file(path, r, what)
            if not os.path.isfile(self.files[r]):
                raise CheckpointError(f"{self.files[r]}: not found ({what})")
        self._open: Dict[int, object] = {}

    def _reader(self, rank: int):
        if rank not in self._open:
            f = self.files[rank]
            self._open[rank] = SafeTensorsFile(f) if f.endswith(".safetensors") else _DictReader(read_checkpoint(f), f)
        return self._open[rank]

    def names_and_shapes(self) -> Dict[str, Tuple[int, ...]]:
        out = {}
        for head in self.stage_heads:
            out.update(self._names_and_shapes(head))
        return out

    def _names_and_shapes(self, rank: int) -> Dict[str, Tuple[int, ...]]:
        r0 = self._reader(rank)
        out = {}
        for name in r0.keys():
            if name not in self.strategy:
                raise CheckpointError(f"{self.files[rank]}: parameter {name} is not in the source strategy")
            entry = self.strategy[name]
            shard = r0.shape(name)
            counts = split_counts(entry.dev_matrix, entry.tensor_map)
            if len(counts) != len(shard):
                raise CheckpointError(f"parameter {name}: source strategy tensor_map {list(entry.tensor_map)} does "
                                      f"not match the shard shape {tuple(shard)}")
            out[name] = tuple(s * c for s, c in zip(shard, counts))
        return out

    def assemble(self, name: str, layout: Layout) -> np.ndarray:
        """The full tensor from one replica of each distinct source slice."""
        pieces = plan_tensor(layout, full_layout(layout.full_shape))[0]
        full = None
        for p in pieces:
            reader = self._reader(p.src_rank)
            if name not in reader.keys():
                raise CheckpointError(f"{self.files[p.src_rank]}: missing parameter {name}")
            shard = reader.get(name)
            if tuple(shard.shape) != layout.shard_shape:
                raise CheckpointError(f"{self.files[p.src_rank]}: parameter {name} has shape {tuple(shard.shape)}, "
                                      f"the source strategy expects {layout.shard_shape}")
            if full is None:
                full = np.empty(layout.full_shape, dtype=shard.dtype)
                if isinstance(shard, BF16):
                    full = full.view(BF16)
            full[p.dst_slice] = shard[p.src_slice]
        return full


class _DictReader:
    def __init__(self, tensors, path):
        self.tensors, self.path = tensors, path

    def keys(self):
        return list(self.tensors)

    def shape(self, name):
        return self.tensors[name].shape

    def get(self, name):
        return self.tensors[name]


# ---- the transform ------------------------------------------------------------------------------------
@dataclass
class SliceReport:
    params: int = 0
    bytes_in: int = 0
    seconds: float = 0.0
    ranks: int = 0


@dataclass
class _Plan:
    """Everything a writer needs, rebuilt from the arguments in each worker process."""
    source: object
    shapes: Dict[str, Tuple[int, ...]]
    src_layouts: Dict[str, Layout]
    dst_layouts: Dict[str, Layout]
    sharded: bool

    @property
    def num_dst(self) -> int:
        return max(layout.ranks.stop for layout in self.dst_layouts.values())


def _plan(src_checkpoint: str, dst_strategy: Optional[str], src_strategy: Optional[str]) -> _Plan:
    if src_strategy:
        source = ShardedSource(src_checkpoint, load_strategy(src_strategy))
        src_layout_of = lambda n, shape: source.strategy[n].layout(shape, n)  # noqa: E731
    else:
        ranks = rank_dir_count(src_checkpoint)
        if ranks == 1:          # one rank: its file is the whole model
            src_checkpoint = rank_checkpoint_file(src_checkpoint, 0, "the one rank of --src_checkpoint")
        elif ranks:
            raise CheckpointError(f"--src_checkpoint {src_checkpoint} holds the files of {ranks} ranks: give "
                                  f"--src_strategy, the strategy they were saved with (a training step's: "
                                  f"grpo_one_stage.py with the run's layout and --only_save_strategy True writes it)")
        source = FullSource(src_checkpoint)
        src_layout_of = lambda n, shape: full_layout(shape)  # noqa: E731
    shapes = source.names_and_shapes()
    dst = load_strategy(dst_strategy) if dst_strategy else None
    if dst is not None:
        missing = sorted(set(shapes) - set(dst))
        if missing:
            raise CheckpointError(f"--dst_strategy: parameter {missing[0]} of the checkpoint is not in the strategy"
                                  + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        extra = sorted(set(dst) - set(shapes))
        if extra:
            raise CheckpointError(f"--src_checkpoint: parameter {extra[0]} of the destination strategy is not in "
                                  f"the checkpoint" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    dst_layouts = {n: (dst[n].layout(s, n) if dst is not None else full_layout(s)) for n, s in shapes.items()}
    src_layouts = {n: src_layout_of(n, s) for n, s in shapes.items()}
    return _Plan(source, shapes, src_layouts, dst_layouts, bool(src_strategy))


def _write_ranks(plan: _Plan, dirs: Dict[int, str], prefix: str, ext: str, progress=None) -> int:
    """Cut every parameter for the ranks in `dirs` (rank -> existing directory); returns bytes read."""
    outputs = _open_outputs(dirs, prefix, ext, plan)
    items = (plan.source.full_tensors() if not plan.sharded
             else ((n, plan.source.assemble(n, plan.src_layouts[n])) for n in plan.shapes))
    bytes_in = 0
    for i, (name, full) in enumerate(items):
        if name not in plan.dst_layouts:
            continue
        bytes_in += full.nbytes
        cut = plan_tensor(full_layout(full.shape), plan.dst_layouts[name])
        for r in dirs:
            if r in cut:                   # under pipeline parallelism only the parameter's stage holds it
                outputs.put(r, name, contiguous(full[cut[r][0].src_slice]))
        if progress:
            progress(i + 1, len(plan.shapes), name)
    outputs.finish()
    return bytes_in


def _worker(args) -> int:
    src_checkpoint, dst_strategy, src_strategy, dirs, prefix, ext = args
    return _write_ranks(_plan(src_checkpoint, dst_strategy, src_strategy), dirs, prefix, ext)


def transform(src_checkpoint: str, dst_checkpoint: str, dst_strategy: Optional[str] = None,
              src_strategy: Optional[str] = None, out_format: str = "ckpt", prefix: str = "checkpoint_",
              progress: Optional[Callable[[int, int, str], None]] = None, rank_id: int = 0, world_size: int = 1,
              processes: int = 1, overwrite: bool = False) -> SliceReport:
    """Write every destination rank (the destination directory replaced as a whole), or with world_size > 1
    only the ranks r with r % world_size == rank_id (cooperating invocations, as MindRLHF's
    `--rank_id/--world_size`; each rank directory replaced on its own). A destination holding anything but
    our own earlier output is refused unless `overwrite` (utils/output_dir). `processes` > 1 splits this
    invocation's ranks over that many spawned worker processes (each imports MindSpore and reads the source;
    cutting and writing split): worth it for large checkpoints on many cores and disks."""
    t0 = time.time()
    if out_format not in ("ckpt", "safetensors"):
        raise CheckpointError(f"--format: expected ckpt or safetensors, got {out_format!r}")
    if world_size < 1 or not 0 <= rank_id < world_size:
        raise CheckpointError(f"--rank_id/--world_size: expected 0 <= rank_id < world_size, got {rank_id}/{world_size}")
    if processes < 1:
        raise CheckpointError(f"--transform_process_num: expected >= 1, got {processes}")
    plan = _plan(src_checkpoint, dst_strategy, src_strategy)
    mine = [r for r in range(plan.num_dst) if r % world_size == rank_id]
    if not mine:
        raise CheckpointError(f"--rank_id {rank_id}: the destination has only {plan.num_dst} rank(s) for "
                              f"--world_size {world_size}; this invocation has nothing to write")
    report = SliceReport(params=len(plan.shapes), ranks=len(mine))
    ext = "." + out_format
    with contextlib.ExitStack() as stack:
        if world_size == 1:
            root = stack.enter_context(owned_output_dir(dst_checkpoint, TOOL, "--dst_checkpoint", overwrite))
            dirs = {r: rank_dir(root, r) for r in mine}
            for d in dirs.values():
                os.makedirs(d)
        else:
            root = check_output_dir(dst_checkpoint, TOOL, "--dst_checkpoint", overwrite)
            os.makedirs(root, exist_ok=True)
            write_marker(root, TOOL, ["rank_*"])
            dirs = {r: stack.enter_context(atomic_dir(rank_dir(root, r))) for r in mine}
        groups = [dict(list(dirs.items())[k::processes]) for k in range(min(processes, len(mine)))]
        if len(groups) == 1:
            report.bytes_in = _write_ranks(plan, dirs, prefix, ext, progress)
        else:
            # spawned, not forked: MindSpore's threads make a fork after its import deadlock now and then
            # (measured: a forked worker hung in CI). Each worker imports MindSpore and reads the source itself
            import multiprocessing
            with multiprocessing.get_context("spawn").Pool(len(groups)) as pool:
                read = pool.map(_worker, [(src_checkpoint, dst_strategy, src_strategy, g, prefix, ext)
                                          for g in groups])
            report.bytes_in = read[0]
    report.seconds = time.time() - t0
    return report


class _Outputs:
    def __init__(self, paths, writers, collect):
        self.paths, self.writers, self.collect = paths, writers, collect

    def put(self, rank, name, shard):
        if self.writers:
            self.writers[rank].write(name, shard)
        else:
            self.collect[rank][name] = shard

    def finish(self):
        if self.writers:
            for w in self.writers.values():
                w.close()
        else:
            for r, tensors in self.collect.items():
                save_checkpoint(tensors, self.paths[r])
                tensors.clear()


def _open_outputs(dirs: Dict[int, str], prefix, ext, plan: _Plan) -> _Outputs:
    paths = {r: os.path.join(d, f"{prefix}{r}{ext}") for r, d in dirs.items()}
    if ext == ".safetensors":
        codes = _source_dtype_codes(plan.source, plan.shapes)
        writers = {r: SafeTensorsStreamWriter(paths[r], [(n, codes[n], plan.dst_layouts[n].shard_shape)
                                                         for n in plan.shapes if r in plan.dst_layouts[n].ranks])
                   for r in dirs}
        return _Outputs(paths, writers, None)
    return _Outputs(paths, None, {r: dict() for r in dirs})


def _source_dtype_codes(source, shapes) -> Dict[str, str]:
    if isinstance(source, ShardedSource):
        out = {}
        for head in source.stage_heads:
            r0 = source._reader(head)
            out.update({n: (r0.dtype_code(n) if hasattr(r0, "dtype_code") else dtype_code(r0.get(n)))
                        for n in r0.keys() if n in shapes})
        return out
    return {n: dtype_code(a) for n, a in source.full_tensors()}
