"""Online weight re-layout: policy (train layout) -> rollout model (infer layout), in memory, no disk.

The plan is computed once at start-up from the two layouts (`plan_tensor`, the same plan offline slicing
executes): for each parameter and destination rank, which slice of which source rank's shard lands where.
Execution goes bucket by bucket (flattened, cast to the rollout dtype while packing), over one of two
transports:

- `shm`: ranks on one host. Each rank copies its source shards into its own shared-memory segments
  (/dev/shm, one per bucket, mapped once and reused); after one barrier every rank copies exactly the
  slices its destination shards need from the owners' segments straight into its rollout parameters'
  buffers. Two memory copies and two barriers per sync.
- `collective`: any topology (multi-node, Ascend). One all-reduce per bucket where each source slice is
  contributed once at its place in a zero buffer; every rank then cuts its destination shards.

When the policy object itself serves rollout (same layout and dtype), there is nothing to do.

/dev/shm is a size-capped tmpfs (64 MB under Docker's default), and writing past its cap through a mapping
kills the process with SIGBUS. So the segments (float32 shards of every rank's weights) are sized and
created at start-up, after a collective check that gives every rank the same answer: `auto` falls back to
`collective` with a note, an explicit `shm` is an error naming both sizes. Segment names carry this user's
uid and a token rank 0 draws per WeightSync; they are created exclusively (a name that exists is an error,
never a shared segment), and each owner holds a lock on its segments for as long as it lives. At start-up
this user's segments that are older than this process and unlocked (their owner died: the kernel drops a
dead process's locks) are removed; other users' files, and segments a live process holds, are never touched.
"""
from __future__ import annotations

import fcntl
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from mindrlhf.configs import choices
from mindrlhf.configs.errors import ConfigError
from mindrlhf.parallel import comm
from mindrlhf.parallel.layouts import Layout, RoleWeights
from mindrlhf.parallel.plan import Piece, full_layout, plan_tensor
from mindrlhf.parallel.topology import shares_host_memory
from mindrlhf.utils.params import param_as_f32, param_f32_view, wait_for_graphs, write_param

TRANSPORTS = choices.RESHARD_TRANSPORTS
SHM_DIR = "/dev/shm"
SHM_MARGIN = 16 << 20           # bytes of /dev/shm left over besides our segments (+10% of them), for other users
PROCESS_START = time.time()     # (import time) every segment this process creates is younger
_MB = 1 << 20


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


def plan_reshard(src: Dict[str, Layout], dst: Dict[str, Layout]) -> List[ParamMove]:
    if set(src) != set(dst):
        raise ConfigError(f"re-layout: the two roles have different parameters "
                          f"({sorted(set(src) ^ set(dst))[:3]}...)")
    moves = []
    for n in src:
        pieces = plan_tensor(src[n], dst[n])
        owners = tuple(sorted({p.src_rank for ps in pieces.values() for p in ps}))
        moves.append(ParamMove(n, src[n], dst[n], pieces, owners))
    return moves


def gather_full(weights: RoleWeights) -> Iterator[Tuple[str, np.ndarray]]:
    """(name, full float32 tensor) for every parameter of a role, on every rank (collective, in layout order).

    The plan to the full layout, executed over an all-reduce: each slice is contributed once, by the owner
    `plan_tensor` picks (one replica of replicated slices), which is what export needs. Contributing every
    rank's shard instead multiplies replicated parameters by their replica count."""
    world = comm.world_ranks()
    for name, layout in weights.layouts.items():
        pieces = plan_tensor(layout, full_layout(layout.full_shape))[0]
        full = np.zeros(layout.full_shape, np.float32)
        mine = [p for p in pieces if p.src_rank == weights.rank]
        if mine:
            shard = param_as_f32(weights.params[name])
            for piece in mine:
                full[piece.dst_slice] = shard[piece.src_slice]
        yield name, (comm.all_reduce_sum(full, world) if len(world) > 1 else full)


def _segment_layout(rank: int, bucket: List[ParamMove]):
    """(offset of each parameter this rank publishes, total floats) in its segment for `bucket`."""
    offsets, total = {}, 0
    for move in bucket:
        if rank in move.owners:
            offsets[move.name] = total
            total += move.shard_size
    return offsets, total


def _segment_prefix() -> str:
    return f"mindrlhf_reshard_{os.getuid()}_"


def shm_free_bytes() -> int:
    """Free bytes on SHM_DIR for an unprivileged writer (0 when it cannot be read)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def remove_stale_segments() -> List[str]:
    """Remove this user's segments whose job is gone; returns their paths.

    Stale means: our prefix (this uid), last modified before this process started, and no process holds
    the lock every owner takes for its segment's whole life (the kernel releases a dead process's locks,
    whatever its PID namespace, so a killed job's segments are unlocked and a running job's are not). The
    age test covers the moment between a live owner creating its segment and locking it."""
    removed = []
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(_segment_prefix())]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue                              # gone meanwhile (another rank swept it)
        try:
            if os.fstat(fd).st_mtime >= PROCESS_START:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass                                  # locked: its owner is alive
        finally:
            os.close(fd)
    return removed


def _draw_token() -> int:
    """A random id below 2**23 (it travels exactly as float32 in the host all-reduce)."""
    return int(np.random.default_rng().integers(1, 1 << 23))


class WeightSync:
    """Copies the source role's current weights into the destination role's (call after each update).
    `dst=None`: one set of parameters serves both roles, so there is nothing to copy. Collective: every rank
    builds its WeightSync at the same point. `log` receives the start-up note of a fallback to collective."""

    def __init__(self, src: RoleWeights, dst: Optional[RoleWeights], transport: str = "auto",
                 bucket_bytes: int = 256 << 20, log: Callable[[str], None] = print):
        if transport not in TRANSPORTS:
            raise ConfigError(f"reshard_transport: expected one of {TRANSPORTS}, got {transport!r}")
        self.shared = dst is None
        self.last_seconds = 0.0
        self.transport = "none"
        self.token = 0
        self._segments: Dict[int, np.memmap] = {}
        self._files: Dict[int, Tuple[str, object]] = {}    # bucket -> (path, open file holding the owner's lock)
        self._peer_maps: Dict[Tuple[int, int], np.memmap] = {}    # (peer rank, bucket) -> its segment, mapped once
        if self.shared:
            return
        self.rank = src.rank
        self.plan = plan_reshard(src.layouts, dst.layouts)
        self._src, self._dst = src.params, dst.params
        self.bucket_elems = max(1, bucket_bytes // 4)
        self.buckets = self._make_buckets()
        world = max(layout.ranks.stop for layout in src.layouts.values())
        # where each source rank's shards sit in its shared-memory segment, per bucket (fixed by the plan)
        self.segment_layouts = [{r: _segment_layout(r, bucket) for r in range(world)}
                                for bucket in self.buckets]
        asked = transport
        if transport == "auto":
            transport = "shm" if shares_host_memory() else "collective"
        if transport == "shm":
            transport = self._open_shm(asked, log)
        self.transport = transport

    def _open_shm(self, asked: str, log: Callable[[str], None]) -> str:
        """'shm' with this rank's segments created, or 'collective' (asked 'auto') when /dev/shm is too small
        on some rank. Every rank reaches the same answer: free space and creation failures go through
        all-gathers, and nothing is created before all ranks know the space suffices."""
        # every rank's segments, as ranks on one host share its /dev/shm
        need = 4 * sum(total for layouts in self.segment_layouts for _, total in layouts.values())
        need_mb = math.ceil((need + need // 10 + SHM_MARGIN) / _MB)
        remove_stale_segments()
        ranks = comm.world_ranks()
        mine = [shm_free_bytes() // _MB, _draw_token() if self.rank == 0 else 0]
        seen = comm.all_gather(np.array(mine, np.float32), ranks, self.rank)
        free_mb, self.token = int(seen[:, 0].min()), int(seen[0, 1])
        if free_mb < need_mb:
            sizes = (f"{SHM_DIR} has {free_mb} MB free, the weight sync's segments need {need_mb} MB (float32 "
                     f"copies of the source weights, with a margin)")
            if asked == "shm":
                raise ConfigError(f"reshard_transport: shm: {sizes}. Give the container more shared memory "
                                  f"(docker run --shm-size={math.ceil(need_mb / 1024)}g) or set "
                                  f"reshard_transport: collective")
            log(f"note: reshard_transport auto: using collective, not shm: {sizes} (a larger docker "
                f"--shm-size enables the faster shm transport)")
            return "collective"
        error = ""
        try:
            self._create_segments()
        except OSError as err:
            error = f"{err.filename}: {err.strerror or err}"
            if isinstance(err, FileExistsError):
                error = (f"{err.filename} already exists (another job's segment, or a leftover its owner "
                         f"still locks or that is younger than this process); it is not reused: remove it if "
                         f"no job of yours uses it, or set reshard_transport: collective")
        failed = comm.all_gather(np.array([1.0 if error else 0.0], np.float32), ranks, self.rank)[:, 0]
        if failed.any():
            self.close()
            bad = [r for r, f in enumerate(failed) if f]
            raise ConfigError(f"reshard_transport: shm: rank {self.rank}: {error}" if error else
                              f"reshard_transport: shm: rank {', '.join(map(str, bad))} could not create "
                              f"its {SHM_DIR} segments (see that rank's error)")
        return "shm"

    def _create_segments(self):
        """This rank's segments, one per bucket it publishes into, created exclusively and locked (how
        `remove_stale_segments` tells them from a dead job's)."""
        for index, layouts in enumerate(self.segment_layouts):
            total = layouts[self.rank][1]
            if not total:
                continue
            path = self._segment_path(self.rank, index)
            fh = open(path, "x+b", opener=lambda p, flags: os.open(p, flags, 0o600))
            self._files[index] = (path, fh)
            fcntl.flock(fh, fcntl.LOCK_SH)
            os.ftruncate(fh.fileno(), total * 4)
            self._segments[index] = np.memmap(fh, dtype=np.float32, mode="r+", shape=(total,))

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
            wait_for_graphs()             # destinations are written in place: no graph may be running
            if self.transport == "shm":
                self._sync_shm()
            else:
                for bucket in self.buckets:
                    self._sync_collective(bucket)
        self.last_seconds = time.time() - t0

    def _destination(self, move: ParamMove) -> Tuple[np.ndarray, bool]:
        """(where `move`'s destination shard is written, whether that is the parameter itself): the rollout
        parameter's own buffer when it is a float32 CPU parameter (no temporary, no extra copy), else a
        scratch array that `_finish` casts into the parameter."""
        view = param_f32_view(self._dst[move.name])
        return (view, True) if view is not None else (np.empty(move.dst.shard_shape, np.float32), False)

    def _finish(self, move: ParamMove, shard: np.ndarray, in_place: bool):
        if not in_place:
            write_param(self._dst[move.name], shard)

    # ---- collective transport ----------------------------------------------------------------------
    def _sync_collective(self, bucket: List[ParamMove]):
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
            shard, in_place = self._destination(move)
            shard[...] = full[move.dst.shard_slices(self.rank)]
            self._finish(move, shard, in_place)

    # ---- shared-memory transport -------------------------------------------------------------------
    def _segment_path(self, rank: int, index: int) -> str:
        return os.path.join(SHM_DIR, f"{_segment_prefix()}j{self.token}_b{index}_r{rank}")

    def _sync_shm(self):
        """Every rank publishes all its buckets, one barrier, every rank reads what it needs, one barrier.

        The segments stay mapped between syncs (one per bucket and rank), so bucketing here only bounds
        segment sizes; with two barriers per sync instead of two per bucket, the CPU's slow collectives
        are off the critical path."""
        for index, bucket in enumerate(self.buckets):
            self._publish(index, bucket)
        comm.barrier()
        for index, bucket in enumerate(self.buckets):
            self._gather(index, bucket)
        comm.barrier()                            # nobody rewrites a segment while a peer still reads it

    def _publish(self, index: int, bucket: List[ParamMove]):
        """Copy 1: this rank's source shards -> its own segment for `bucket`."""
        offsets, total = self.segment_layouts[index][self.rank]
        if not total:
            return
        seg = self._segments[index]
        for move in bucket:
            if move.name in offsets:
                off = offsets[move.name]
                seg[off:off + move.shard_size] = param_as_f32(self._src[move.name]).reshape(-1)

    def _gather(self, index: int, bucket: List[ParamMove]):
        """Copy 2: the slices this rank's destination shards need, from the owners' segments, in place."""
        layouts = self.segment_layouts[index]
        for move in bucket:
            shard, in_place = self._destination(move)
            for piece in move.pieces[self.rank]:
                src_offsets, src_total = layouts[piece.src_rank]
                off = src_offsets[move.name]
                src_shard = self._peer_segment(piece.src_rank, index, src_total)[off:off + move.shard_size]
                shard[piece.dst_slice] = src_shard.reshape(move.src.shard_shape)[piece.src_slice]
            self._finish(move, shard, in_place)

    def _peer_segment(self, rank: int, index: int, total: int) -> np.memmap:
        """A peer's segment, mapped on first use and kept: segments are rewritten in place each sync, so the
        mapping (and its page tables) stays valid, and later syncs take no page faults on it."""
        key = (rank, index)
        if key not in self._peer_maps:
            self._peer_maps[key] = np.memmap(self._segment_path(rank, index), dtype=np.float32, mode="r",
                                             shape=(total,))
        return self._peer_maps[key]

    def close(self):
        self._peer_maps.clear()
        self._segments.clear()
        for key in list(self._files):
            path, fh = self._files.pop(key)
            try:
                os.remove(path)                   # before unlocking: no sweeper sees it unlocked
            except OSError:
                pass
            fh.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
