"""Offline checkpoint re-layout: full -> per-rank, per-rank -> per-rank (another strategy), per-rank -> full.

Streams parameter by parameter: read one full tensor's worth of source slices, cut every destination
shard with the same `plan_tensor` the online re-layout uses, append each shard to its rank's output.
Peak memory is about one full parameter plus whatever the output format buffers (.safetensors outputs
are streamed; .ckpt outputs are collected per rank because MindSpore writes them whole). Output goes to a
temp directory renamed onto the destination at the end: a failure leaves no partial files.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional, Tuple

import numpy as np

from mindrlhf.checkpoint.model_io import (checkpoint_kind, holds_rank_dirs, iter_full_tensors, rank_checkpoint_file,
                                         rank_dir, read_checkpoint, save_checkpoint)
from mindrlhf.checkpoint.safetensors_io import SafeTensorsFile, SafeTensorsStreamWriter, dtype_code
from mindrlhf.configs.errors import CheckpointError
from mindrlhf.parallel.layouts import Layout, split_counts
from mindrlhf.parallel.plan import full_layout, plan_tensor
from mindrlhf.parallel.strategy import StrategyEntry, find_strategy_file, read_strategy
from mindrlhf.utils.atomic import atomic_dir
from mindrlhf.utils.bf16 import BF16, contiguous


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
    """Per-rank files `dir/rank_N/*.{ckpt,safetensors}` laid out by a source strategy."""

    def __init__(self, path: str, strategy: Dict[str, StrategyEntry]):
        self.path = path
        self.strategy = strategy
        any_entry = next(iter(strategy.values()))
        self.num_ranks = int(np.prod(any_entry.dev_matrix))
        self.files = {}
        for r in range(self.num_ranks):
            self.files[r] = rank_checkpoint_file(path, r, f"rank {r} of the source strategy ({self.num_ranks} ranks)")
        self._open: Dict[int, object] = {}

    def _reader(self, rank: int):
        if rank not in self._open:
            f = self.files[rank]
            self._open[rank] = SafeTensorsFile(f) if f.endswith(".safetensors") else _DictReader(read_checkpoint(f), f)
        return self._open[rank]

    def names_and_shapes(self) -> Dict[str, Tuple[int, ...]]:
        r0 = self._reader(0)
        out = {}
        for name in r0.keys():
            if name not in self.strategy:
                raise CheckpointError(f"{self.files[0]}: parameter {name} is not in the source strategy")
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


def transform(src_checkpoint: str, dst_checkpoint: str, dst_strategy: Optional[str] = None,
              src_strategy: Optional[str] = None, out_format: str = "ckpt", prefix: str = "checkpoint_",
              progress: Optional[Callable[[int, int, str], None]] = None) -> SliceReport:
    t0 = time.time()
    if out_format not in ("ckpt", "safetensors"):
        raise CheckpointError(f"--format: expected ckpt or safetensors, got {out_format!r}")
    if src_strategy:
        source = ShardedSource(src_checkpoint, read_strategy(find_strategy_file(src_strategy)))
        src_layout_of = lambda n, shape: source.strategy[n].layout(shape, n)  # noqa: E731
    else:
        if holds_rank_dirs(src_checkpoint):
            raise CheckpointError(f"--src_checkpoint {src_checkpoint} holds per-rank files: give --src_strategy")
        source = FullSource(src_checkpoint)
        src_layout_of = lambda n, shape: full_layout(shape)  # noqa: E731
    shapes = source.names_and_shapes()
    dst = read_strategy(find_strategy_file(dst_strategy)) if dst_strategy else None
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
    num_dst = next(iter(dst_layouts.values())).num_ranks
    src_layouts = {n: src_layout_of(n, s) for n, s in shapes.items()}
    report = SliceReport(params=len(shapes), ranks=num_dst)
    ext = "." + out_format

    with atomic_dir(dst_checkpoint) as tmp:
        outputs = _open_outputs(tmp, num_dst, prefix, ext, shapes, dst_layouts, source)
        items = source.full_tensors() if not src_strategy else ((n, source.assemble(n, src_layouts[n])) for n in shapes)
        for i, (name, full) in enumerate(items):
            if src_strategy is None and name not in dst_layouts:
                continue
            report.bytes_in += full.nbytes
            plan = plan_tensor(full_layout(full.shape), dst_layouts[name])
            for r in range(num_dst):
                piece = plan[r][0]
                outputs.put(r, name, contiguous(full[piece.src_slice]))
            if progress:
                progress(i + 1, len(shapes), name)
        outputs.finish()
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
            for w in self.writers:
                w.close()
        else:
            for r, tensors in enumerate(self.collect):
                save_checkpoint(tensors, self.paths[r])
                tensors.clear()


def _open_outputs(tmp, num_dst, prefix, ext, shapes, dst_layouts, source) -> _Outputs:
    paths = []
    for r in range(num_dst):
        os.makedirs(rank_dir(tmp, r))
        paths.append(os.path.join(rank_dir(tmp, r), f"{prefix}{r}{ext}"))
    if ext == ".safetensors":
        codes = _source_dtype_codes(source, shapes)
        writers = [SafeTensorsStreamWriter(paths[r], [(n, codes[n], dst_layouts[n].shard_shape) for n in shapes])
                   for r in range(num_dst)]
        return _Outputs(paths, writers, None)
    return _Outputs(paths, None, [dict() for _ in range(num_dst)])


def _source_dtype_codes(source, shapes) -> Dict[str, str]:
    if isinstance(source, ShardedSource):
        r0 = source._reader(0)
        return {n: (r0.dtype_code(n) if hasattr(r0, "dtype_code") else dtype_code(r0.get(n))) for n in shapes}
    return {n: dtype_code(a) for n, a in source.full_tensors()}
