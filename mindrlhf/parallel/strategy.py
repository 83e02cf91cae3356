"""MindSpore strategy files (`ParallelStrategyMap` protobuf): write ours, read ours and MindSpore's.

A strategy file records, per parameter, the device matrix and tensor map (not the full shape: that comes
from the checkpoint being sliced). We write one file per rank of a role (`ckpt_strategy_rank_{r}.ckpt`, as
MindFormers names them) plus a merged file. MindSpore's pipeline conventions: a rank's file holds only its
stage's parameters, with the stage's device matrix ([dp, tp]) and its stage number in the
`parallel_strategy_item`; the merged file (as `mindspore.parallel.merge_pipeline_strategys` writes it)
names each parameter `{stage}-{name}` and has current_stage 1. Without pipeline stages every rank's file is
the same and the merged file equals it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

from mindrlhf.configs.errors import CheckpointError
from mindrlhf.parallel.layouts import Layout
from mindrlhf.utils.atomic import atomic_path
from mindrlhf.utils.output_dir import owned_output_dir


@dataclass(frozen=True)
class StrategyEntry:
    dev_matrix: Tuple[int, ...]
    tensor_map: Tuple[int, ...]
    opt_shard_step: int = 0
    opt_shard_size: int = 0
    stage: int = 0                  # pipeline stage holding the parameter (its ranks start at stage x devices)

    @classmethod
    def of(cls, layout: Layout) -> "StrategyEntry":
        """The entry a strategy file would hold for `layout`."""
        return cls(tuple(layout.dev_matrix), tuple(layout.tensor_map), stage=_stage(layout))

    def layout(self, full_shape, name: str = "") -> Layout:
        if self.opt_shard_size > 1:
            raise CheckpointError(f"parameter {name}: optimizer-sharded strategies (opt_weight_shard_size="
                                  f"{self.opt_shard_size}) are not supported for slicing")
        if len(self.tensor_map) != len(full_shape):
            raise CheckpointError(f"parameter {name}: the strategy's tensor_map {list(self.tensor_map)} has "
                                  f"{len(self.tensor_map)} dims, the checkpoint tensor has shape {tuple(full_shape)}")
        try:
            return Layout(tuple(full_shape), self.dev_matrix, self.tensor_map,
                          self.stage * int(np.prod(self.dev_matrix)))
        except ValueError as err:
            raise CheckpointError(f"parameter {name}: {err}") from None


def _stage(layout: Layout) -> int:
    return layout.rank_offset // layout.num_ranks


def strategy_bytes(layouts: Dict[str, Layout], merged: bool = False) -> bytes:
    """One rank's file (the layouts of its stage's parameters), or with `merged` every stage's in MindSpore's
    merged form."""
    from mindspore.train import node_strategy_pb2 as pb
    smap = pb.ParallelStrategyMap()
    stages = sorted({_stage(layout) for layout in layouts.values()})
    pipelined = merged and stages != [0]
    smap.current_stage = 1 if pipelined else stages[0]
    for stage in stages:                  # MindSpore reads a file's stage from its strategy items
        item = smap.parallel_strategy_item.add()
        item.node_name = "mindrlhf"
        item.parallel_strategys.stage = stage
        item.parallel_strategys.parallel_strategy.add().dim.extend([1])
    for name, layout in layouts.items():
        item = smap.parallel_layout_item.add()
        item.param_name = f"{_stage(layout)}-{name}" if pipelined else name
        lay = item.parallel_layouts
        lay.dev_matrix.add().dim.extend(layout.dev_matrix)
        lay.tensor_map.add().dim.extend(layout.tensor_map)
        lay.param_split_shape.add()
        lay.indices_offset.add()
        lay.field = 0
        lay.opt_weight_shard_step = 0
        lay.opt_weight_shard_size = 0
    return smap.SerializeToString()


def write_strategy(path: str, layouts: Dict[str, Layout], merged: bool = False):
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(strategy_bytes(layouts, merged))


def read_strategy(path: str) -> Dict[str, StrategyEntry]:
    """Parameter -> (device matrix, tensor map, optimizer shard) from a strategy file (ours or MindSpore's)."""
    from google.protobuf.message import DecodeError
    from mindspore.train import node_strategy_pb2 as pb
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: strategy file not found")
    smap = pb.ParallelStrategyMap()
    try:
        with open(path, "rb") as fh:
            smap.ParseFromString(fh.read())
    except (DecodeError, OSError) as err:
        raise CheckpointError(f"{path}: not a MindSpore strategy file ({err})") from None
    file_stage = smap.parallel_strategy_item[0].parallel_strategys.stage if smap.parallel_strategy_item else 0
    out = {}
    for item in smap.parallel_layout_item:
        lay = item.parallel_layouts
        if not lay.dev_matrix or not lay.tensor_map:
            raise CheckpointError(f"{path}: parameter {item.param_name} has no device matrix or tensor map")
        maps = [list(t.dim) for t in lay.tensor_map if list(t.dim)] if len(lay.tensor_map) > 1 else \
            [list(lay.tensor_map[0].dim)]
        if len(maps) != 1:
            raise CheckpointError(f"{path}: parameter {item.param_name} uses a multi-axis tensor map, "
                                  f"which mindrlhf cannot slice yet")
        stage, name = item.param_name.split("-", 1) if "-" in item.param_name else (file_stage, item.param_name)
        out[name] = StrategyEntry(tuple(lay.dev_matrix[0].dim), tuple(maps[0]), int(lay.opt_weight_shard_step),
                                  int(lay.opt_weight_shard_size), int(stage))
    if not out:
        raise CheckpointError(f"{path}: the strategy file lists no parameters")
    return out


def find_strategy_file(path: str) -> str:
    """A strategy file, or a directory holding per-rank files (all ranks' files agree without pipelining)."""
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        files = sorted(f for f in os.listdir(path) if f.endswith(".ckpt"))
        merged = [f for f in files if "merged" in f]
        if merged:
            return os.path.join(path, merged[0])
        if files:
            return os.path.join(path, files[0])
    raise CheckpointError(f"{path}: no strategy file (*.ckpt) found")


def load_strategy(path: str) -> Dict[str, StrategyEntry]:
    """Every parameter's entry from a strategy file, or from a directory: its merged file if it has one, else
    the union of its per-rank files (under pipeline parallelism each holds one stage's parameters)."""
    if os.path.isdir(path) and not any("merged" in f for f in os.listdir(path)):
        out: Dict[str, StrategyEntry] = {}
        for f in sorted(f for f in os.listdir(path) if f.endswith(".ckpt")):
            for name, entry in read_strategy(os.path.join(path, f)).items():
                if out.setdefault(name, entry) != entry:
                    raise CheckpointError(f"{path}: the per-rank strategy files disagree on parameter {name}")
        if out:
            return out
    return read_strategy(find_strategy_file(path))


def role_strategy_paths(out_dir: str, role: str, world: int) -> List[str]:
    return [os.path.join(out_dir, f"{role}_strategy", f"ckpt_strategy_rank_{r}.ckpt") for r in range(world)]


def save_role_strategy(out_dir: str, role: str, layouts: Dict[str, Layout], world: int) -> List[str]:
    """A role's per-rank files, as one folder replaced whole (a larger world's rank files would otherwise stay
    and be read with these), and its merged file."""
    paths = role_strategy_paths(out_dir, role, world)
    os.makedirs(out_dir, exist_ok=True)
    with owned_output_dir(os.path.dirname(paths[0]), "strategy", f"{role} strategy folder") as tmp:
        for rank, p in enumerate(paths):
            write_strategy(os.path.join(tmp, os.path.basename(p)),
                           {n: lay for n, lay in layouts.items() if rank in lay.ranks})
    merged = os.path.join(out_dir, f"{role}_merged_strategy.ckpt")
    write_strategy(merged, layouts, merged=True)
    return paths + [merged]
