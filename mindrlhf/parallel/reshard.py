"""Online weight re-layout: policy (train layout) -> rollout model (infer layout), in memory, no disk.

The plan is computed once at start-up from the two layouts (`plan_tensor`, the same plan offline slicing
executes): for each parameter and destination rank, which slice of which source rank's shard lands where.
Execution goes bucket by bucket (flattened, cast to the rollout dtype while packing), over one of two
transports:

- `shm`: ranks on one host. Each rank copies its source shards of the bucket into its own shared-memory
  segment (/dev/shm) once; after a barrier every rank copies exactly the slices its destination shards
  need from its peers' segments. About two memory copies; collectives carry only barriers.
- `collective`: any topology (multi-node, Ascend). One all-reduce per bucket where each source slice is
  contributed once at its place in a zero buffer; every rank then cuts its destination shards.

When the policy object itself serves rollout (same layout and dtype), there is nothing to do.
"""
from __future__ import annotations

import os
import socket
import time
import zlib
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

from mindrlhf.checkpoint.model_io import param_as_f32, write_param
from mindrlhf.configs.errors import ConfigError
from mindrlhf.models.qwen2 import param_specs
from mindrlhf.parallel import comm
from mindrlhf.parallel.layouts import Layout, role_layouts
from mindrlhf.parallel.plan import Piece, plan_tensor

TRANSPORTS = ("auto", "shm", "collective")


@dataclass
class ParamMove:
    name: str
    src: Layout
    dst: Layout
    pieces: Dict[int, List[Piece]]     # destination rank -> pieces
    owners: Tuple[int, ...]            # source ranks read by some destination (one replica per slice)

    @property
    def full_size(self) -> int:
        return int(np.prod(self.src.full_shape))

    @property
    def shard_size(self) -> int:
        return int(np.prod(self.src.shard_shape))


def plan_reshard(cfg, src_dp: int, src_tp: int, dst_dp: int, dst_tp: int) -> List[ParamMove]:
    specs = param_specs(cfg)
    src, dst = role_layouts(specs, src_dp, src_tp), role_layouts(specs, dst_dp, dst_tp)
    moves = []
    for n in specs:
        pieces = plan_tensor(src[n], dst[n])
        owners = tuple(sorted({p.src_rank for ps in pieces.values() for p in ps}))
        moves.append(ParamMove(n, src[n], dst[n], pieces, owners))
    return moves


def same_host(my_rank: int) -> bool:
    """True when every rank of the job runs on this host (hostname hashes agree)."""
    world = comm.world_ranks()
    if len(world) == 1:
        return True
    h = np.array([zlib.crc32(socket.gethostname().encode()) % (1 << 23)], np.int64)
    gathered = comm.all_gather(h, world, my_rank)
    return bool((gathered == gathered[0]).all())


def _segment_layout(rank: int, bucket: List[ParamMove]):
    """(offset of each parameter this rank publishes, total floats) in its segment for `bucket`."""
    offsets, total = {}, 0
    for move in bucket:
        if rank in move.owners:
            offsets[move.name] = total
            total += move.shard_size
    return offsets, total


class WeightSync:
    """Copies the policy's current weights into the rollout model (call after each update)."""

    def __init__(self, policy, rollout_model, transport: str = "auto", bucket_bytes: int = 256 << 20):
        if transport not in TRANSPORTS:
            raise ConfigError(f"reshard_transport: expected one of {TRANSPORTS}, got {transport!r}")
        self.policy, self.rollout = policy, rollout_model
        self.shared = policy is rollout_model
        self.last_seconds = 0.0
        self.transport = "none"
        self._segments: Dict[int, np.memmap] = {}
        if self.shared:
            return
        pm, rm = policy.mesh, rollout_model.mesh
        self.rank = pm.rank
        self.plan = plan_reshard(policy.config, pm.dp, pm.tp, rm.dp, rm.tp)
        self._src = {p.name: p for p in policy.get_parameters()}
        self._dst = {p.name: p for p in rollout_model.get_parameters()}
        self.bucket_elems = max(1, bucket_bytes // 4)
        self.buckets = self._make_buckets()
        # where each source rank's shards sit in its shared-memory segment, per bucket (fixed by the plan)
        self.segment_layouts = [{r: _segment_layout(r, bucket) for r in range(pm.world_size)}
                                for bucket in self.buckets]
        if transport == "auto":
            transport = "shm" if same_host(self.rank) and os.path.isdir("/dev/shm") else "collective"
        self.transport = transport

    def _make_buckets(self) -> List[List[ParamMove]]:
        buckets, bucket, size = [], [], 0
        for move in self.plan:
            if bucket and size + move.full_size > self.bucket_elems:
                buckets.append(bucket)
                bucket, size = [], 0
            bucket.append(move)
            size += move.full_size
        if bucket:
            buckets.append(bucket)
        return buckets

    def sync(self):
        t0 = time.time()
        if not self.shared:
            run = self._sync_shm if self.transport == "shm" else self._sync_collective
            for i, bucket in enumerate(self.buckets):
                run(i, bucket)
        self.last_seconds = time.time() - t0

    def _assign(self, move: ParamMove, shard: np.ndarray):
        write_param(self._dst[move.name], shard)

    # ---- collective transport ----------------------------------------------------------------------
    def _sync_collective(self, _index: int, bucket: List[ParamMove]):
        offsets, total = [], 0
        for move in bucket:
            offsets.append(total)
            total += move.full_size
        flat = np.zeros(total, np.float32)
        for move, off in zip(bucket, offsets):
            if self.rank in move.owners:
                full = flat[off:off + move.full_size].reshape(move.src.full_shape)
                full[move.src.shard_slices(self.rank)] = param_as_f32(self._src[move.name])
        flat = comm.all_reduce_sum(flat, comm.world_ranks())
        for move, off in zip(bucket, offsets):
            full = flat[off:off + move.full_size].reshape(move.src.full_shape)
            self._assign(move, np.ascontiguousarray(full[move.dst.shard_slices(self.rank)]))

    # ---- shared-memory transport -------------------------------------------------------------------
    def _segment_path(self, rank: int, index: int) -> str:
        job = os.environ.get("MS_SCHED_PORT", "local") + "_" + os.environ.get("MS_SCHED_HOST", "")
        return f"/dev/shm/mindrlhf_reshard_{os.getuid()}_{job}_b{index}_r{rank}"

    def _sync_shm(self, index: int, bucket: List[ParamMove]):
        layouts = self.segment_layouts[index]
        offsets, total = layouts[self.rank]
        key = index
        if key not in self._segments and total:
            path = self._segment_path(self.rank, index)
            self._segments[key] = np.memmap(path, dtype=np.float32, mode="w+", shape=(total,))
        seg = self._segments.get(key)
        for move in bucket:                       # copy 1: own shards -> own segment
            if move.name in offsets:
                off = offsets[move.name]
                seg[off:off + move.shard_size] = param_as_f32(self._src[move.name]).reshape(-1)
        comm.barrier()
        peers = {}
        for move in bucket:                       # copy 2: peers' slices -> my destination shard
            shard = np.empty(move.dst.shard_shape, np.float32)
            for piece in move.pieces[self.rank]:
                src_offsets, src_total = layouts[piece.src_rank]
                if piece.src_rank not in peers:
                    peers[piece.src_rank] = np.memmap(self._segment_path(piece.src_rank, index), dtype=np.float32,
                                                      mode="r", shape=(src_total,))
                off = src_offsets[move.name]
                src_shard = peers[piece.src_rank][off:off + move.shard_size].reshape(move.src.shard_shape)
                shard[piece.dst_slice] = src_shard[piece.src_slice]
            self._assign(move, shard)
        del peers
        comm.barrier()                            # nobody rewrites a segment while a peer still reads it

    def close(self):
        for key in list(self._segments):
            path = self._segments[key].filename
            del self._segments[key]
            try:
                os.remove(path)
            except OSError:
                pass

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
