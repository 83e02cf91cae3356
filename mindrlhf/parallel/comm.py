"""Host-level collectives over numpy arrays (rollout samples, metrics, barriers) for a process group.

All ranks of `ranks` must call with arrays of the same shape and dtype. Implemented with AllReduce(sum),
which MindSpore's CPU backend supports on any subgroup, so it works on CPU and Ascend alike; these move
kilobytes per step, never weights.
"""
from __future__ import annotations

from typing import Dict, Sequence, Tuple

import numpy as np
from mindspore import Tensor, ops

from mindrlhf.parallel import watchdog
from mindrlhf.parallel.mesh import distributed_env, group_for

_REDUCERS: Dict[Tuple[int, ...], ops.AllReduce] = {}


def _reducer(ranks: Tuple[int, ...]):
    ranks = tuple(sorted(ranks))
    if ranks not in _REDUCERS:
        _REDUCERS[ranks] = ops.AllReduce(group=group_for(ranks))
    return _REDUCERS[ranks]


def world_ranks() -> Tuple[int, ...]:
    return tuple(range(distributed_env()[1]))


def all_reduce_sum(array: np.ndarray, ranks: Sequence[int]) -> np.ndarray:
    if len(ranks) == 1:
        return np.array(array, copy=True)
    watchdog.beat(in_collective=True)
    try:
        return _all_reduce_sum(array, ranks)
    finally:
        watchdog.beat(in_collective=False)


def _all_reduce_sum(array: np.ndarray, ranks: Sequence[int]) -> np.ndarray:
    arr = np.asarray(array)
    if arr.dtype.kind in "iub":
        # exact through float32 while |values| < 2**24 (token ids and counts are)
        if arr.size and np.abs(arr).max() >= 2 ** 24:
            raise ValueError("all_reduce_sum: integer values beyond 2**24 cannot travel exactly")
        carrier = arr.astype(np.float32)
        return np.rint(_reducer(tuple(ranks))(Tensor(carrier)).asnumpy()).astype(arr.dtype)
    return _reducer(tuple(ranks))(Tensor(arr.astype(np.float32))).asnumpy().astype(arr.dtype)


def all_gather(array: np.ndarray, ranks: Sequence[int], my_rank: int) -> np.ndarray:
    """Stack every rank's array along a new axis 0, in the order of `ranks`."""
    ranks = tuple(sorted(ranks))
    arr = np.asarray(array)
    if len(ranks) == 1:
        return arr[None].copy()
    buf = np.zeros((len(ranks),) + arr.shape, dtype=arr.dtype)
    buf[ranks.index(my_rank)] = arr
    return all_reduce_sum(buf, ranks)


def barrier(ranks: Sequence[int] = None):
    ranks = world_ranks() if ranks is None else ranks
    if len(ranks) > 1:
        all_reduce_sum(np.ones(1, np.float32), ranks)
