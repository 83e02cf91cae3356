"""Every host exchange between ranks that the trainer code makes, in one place and the one door to
parallel/comm.py (weights inside the train step and the weight sync excepted): rollout samples, score
tables, training statistics (whose all-reduce is also the "did anyone hit a NaN" vote), eval counts and
completions, votes, barriers and gathers (checkpoints, node checks), pipeline-stage sums, and the exported
policy.
Solutions need none: every rank reads the prompt table and the step's global batch.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from mindrlhf.checkpoint.safetensors_io import TensorStream
from mindrlhf.parallel import comm
from mindrlhf.parallel.mesh import distributed_env
from mindrlhf.parallel.reshard import gather_full
from mindrlhf.trainer.samples import SampleBatch


def gather_samples(local: SampleBatch, infer_mesh) -> SampleBatch:
    """Every rank gets all infer-DP replicas' samples, in DP order (TP and EP peers hold duplicates: take the row
    leader's)."""
    world = comm.world_ranks()
    if len(world) == 1:
        return local
    gathered = {k: comm.all_gather(v, world, infer_mesh.rank) for k, v in local.fields().items()}
    keep = infer_mesh.ranks_where(pp=0, **{a: 0 for a in infer_mesh.row_replica_axes})   # one per DP replica
    return SampleBatch(**{k: np.concatenate([v[r] for r in keep]) for k, v in gathered.items()})


def mean_over_ranks(values: Sequence[float]) -> np.ndarray:
    """Mean of per-rank values over all ranks. TP (and EP) peers hold equal values, so over the world this is the
    mean over DP ranks: with the loss normalised by global counts (grpo_math), the global value. A NaN on
    any rank makes the result NaN on every rank, so one check stops all ranks together."""
    arr = np.asarray(values, np.float64)
    world = comm.world_ranks()
    if len(world) == 1:
        return arr
    return comm.all_reduce_sum(arr.astype(np.float32), world).astype(np.float64) / len(world)


def max_over_ranks(values: Sequence[float]) -> np.ndarray:
    """Element-wise max of per-rank values over all ranks."""
    arr = np.asarray(values, np.float32)
    world = comm.world_ranks()
    if len(world) == 1:
        return arr.astype(np.float64)
    return comm.all_gather(arr, world, distributed_env()[0]).max(0).astype(np.float64)


def sum_over_replicas(values: Sequence[float], mesh) -> np.ndarray:
    """Sum of values every rank of a DP replica holds alike, counted once per replica of `mesh` (its row leader on
    the first pipeline stage contributes: index 0 on tp / ep and pp)."""
    once = mesh.is_row_leader and mesh.is_first_stage
    arr = np.asarray(values, np.float32) if once else np.zeros(len(values), np.float32)
    world = comm.world_ranks()
    return arr if len(world) == 1 else comm.all_reduce_sum(arr, world)


def rows_of_all_ranks(table: np.ndarray) -> np.ndarray:
    """Every rank gets the table whose rows each rank filled its share of (zeros elsewhere): the sum."""
    return sum_over(table, comm.world_ranks())


def rows_of_all_replicas(local: np.ndarray, rows: np.ndarray, total: int, mesh) -> np.ndarray:
    """Every rank gets the (total, ...) array whose `rows` each train-DP replica holds in `local` (its row leader
    rank on the last pipeline stage contributes; the other rows are zero there, so a sum assembles them)."""
    world = comm.world_ranks()
    if len(world) == 1:
        return local
    full = np.zeros((total,) + local.shape[1:], np.float32)
    if mesh.is_row_leader and mesh.is_last_stage:      # pipeline stages hold the same rows too
        full[rows] = local
    return comm.all_reduce_sum(full, world)


def gather_over_world(values: np.ndarray) -> np.ndarray:
    """(world, ...) : every rank's `values` (same shape and dtype on every rank), in rank order."""
    return comm.all_gather(np.asarray(values), comm.world_ranks(), distributed_env()[0])


def rows_over_world(local: np.ndarray) -> np.ndarray:
    """Every rank's rows of `local`, concatenated in rank order, on every rank; row counts may differ between
    ranks, the other dimensions and the dtype may not (an eval's completions: each rank its share of the
    prompts)."""
    world = comm.world_ranks()
    if len(world) == 1:
        return local
    counts = gather_over_world(np.array([len(local)], np.int64))[:, 0]
    padded = np.zeros((int(counts.max()),) + local.shape[1:], local.dtype)
    padded[:len(local)] = local
    every = gather_over_world(padded)
    return np.concatenate([every[r, :counts[r]] for r in range(len(world))])


def sum_over(values: np.ndarray, ranks) -> np.ndarray:
    """The sum of `values` over `ranks` (e.g. a pipeline's stages: each contributes what it computed)."""
    return comm.all_reduce_sum(values, ranks)


def ranks_flagging(flag: bool) -> list:
    """The ranks whose `flag` is set, the same list on every rank (a vote before acting alike)."""
    flags = gather_over_world(np.array([float(flag)], np.float32))
    return [r for r in range(len(flags)) if flags[r, 0] > 0]


def barrier(ranks=None):
    comm.barrier(ranks)


def write_full_policy(model, write: Callable[[TensorStream], None], weights=None):
    """Rank 0 writes the model's full (unsharded) float32 tensors with `write`, given them as a TensorStream:
    each tensor is gathered (a collective every rank joins; the re-layout plan to the full layout, so each
    slice comes from one replica) as the writer reads it, so rank 0 holds one full tensor at a time.
    `weights`: a view of the model's weights other than model.weights() (LoRA: merged, or the adapters
    alone). Every rank returns once the export is written (so anything after this, on any rank, sees it)."""
    weights = weights or model.weights()
    full = gather_full(weights)
    try:
        if model.mesh.rank == 0:
            write(TensorStream([(n, "F32", lay.full_shape) for n, lay in weights.layouts.items()], full))
    finally:
        for _ in full:          # the gathers the writer did not take (all of them on the other ranks)
            pass
    barrier()
