"""Slicing plan between two layouts of one tensor: which part of which source shard lands where in each
destination shard. Offline slicing (transform_checkpoint.py, source = files) and online re-layout
(reshard.py, source = other ranks' memory) execute the same plan.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from mindrlhf.parallel.layouts import Layout

Box = Tuple[Tuple[int, int], ...]   # per dimension [start, stop) in full-tensor coordinates


@dataclass(frozen=True)
class Piece:
    src_rank: int
    src_slice: Tuple[slice, ...]    # inside the source shard
    dst_slice: Tuple[slice, ...]    # inside the destination shard


def full_layout(shape) -> Layout:
    """A tensor held whole by a single 'rank' (a full checkpoint file)."""
    return Layout(tuple(shape), (1,), tuple(-1 for _ in shape))


def _box(layout: Layout, rank: int) -> Box:
    return tuple((s.start, s.stop) for s in layout.shard_slices(rank))


def plan_tensor(src: Layout, dst: Layout) -> Dict[int, List[Piece]]:
    """For every destination rank, the pieces that compose its shard, reading each source element once.

    Among source replicas of the same slice, the one with the lowest rank is read (on the same host any
    replica is as good; across hosts the executor may prefer a local one).
    """
    if src.full_shape != dst.full_shape:
        raise ValueError(f"layouts disagree on the full shape: {src.full_shape} vs {dst.full_shape}")
    distinct: Dict[Box, int] = {}
    for r in src.ranks:
        distinct.setdefault(_box(src, r), r)
    plan: Dict[int, List[Piece]] = {}
    for d in dst.ranks:
        dbox = _box(dst, d)
        pieces = []
        for sbox, s in distinct.items():
            inter = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(sbox, dbox))
            if any(lo >= hi for lo, hi in inter):
                continue
            pieces.append(Piece(s, tuple(slice(lo - so, hi - so) for (lo, hi), (so, _) in zip(inter, sbox)),
                                tuple(slice(lo - do, hi - do) for (lo, hi), (do, _) in zip(inter, dbox))))
        plan[d] = pieces
    return plan
