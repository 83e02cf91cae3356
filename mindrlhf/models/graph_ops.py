"""How our graphs write common operations so that MindSpore 2.10 compiles and runs them well on CPU:
broadcasting (`expand_as`), last-axis reductions (`sum_last`, `mean_last`), slicing (`take`) and moving the
heads axis (`swap_middle`). Measured reasons in each docstring."""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops


_MATMUL = ops.MatMul()
_SUM_ROWS = ops.ReduceSum(keep_dims=True)
_MEAN_ROWS = ops.ReduceMean(keep_dims=True)


def expand_as(small, like):
    """`small` broadcast to `like`'s shape, as its own op, except in a decode step.

    MindSpore 2.10's CPU kernels for broadcasting element-wise arithmetic (x * y[..., :1], x + bias, ...)
    each keep about four times their output size in memory outside the memory pool, for as long as the
    compiled graph lives. An explicit BroadcastTo followed
    by a same-shape op stays inside the pool, whose blocks are reused. So every broadcast in the model
    goes through here. A decode step (one position per sequence: `like.shape[-2] == 1` for hidden states,
    q/k and scores alike) keeps the implicit broadcast: its tensors are tiny, and the extra kernel costs a
    noticeable share of a decode step.

    Along the last axis alone ((..., 1) -> (..., n): a row statistic over its row) BroadcastTo is slow on
    CPU; float32 takes it as the product with a row of ones there instead, exact (one product per element)
    (docs/BENCHMARKS.md, "Measurements behind code choices").
    """
    if like.shape[-2] == 1:
        return small
    width = like.shape[-1]
    if width > 1 and small.dtype == ms.float32 and small.shape == like.shape[:-1] + (1,):
        ones = ops.ones((1, width), ms.float32)
        return ops.reshape(_MATMUL(ops.reshape(small, (-1, 1)), ones), like.shape)
    return ops.broadcast_to(small, like.shape)


def _reduce_last(reduce, x):
    """`reduce` (a keep-dims ReduceSum/ReduceMean) over x's last axis, as 2-D rows. Without a branch on the
    shape: MindSpore 2.10 cannot compile one here inside the backward of a single layer's graph ("func graph
    is empty"; trainer/update/layerwise.py), and a reshape of what already is rows costs nothing."""
    return ops.reshape(reduce(ops.reshape(x, (-1, x.shape[-1])), 1), x.shape[:-1] + (1,))


def sum_last(x):
    """x summed over its last axis, kept as size 1. Reduced as a 2-D (rows, n) tensor: MindSpore 2.10's CPU
    reduction over the last axis of a 3-D or 4-D tensor is about ten times slower than over the same data as
    2-D."""
    return _reduce_last(_SUM_ROWS, x)


def mean_last(x):
    """x averaged over its last axis, kept as size 1 (2-D, as sum_last)."""
    return _reduce_last(_MEAN_ROWS, x)


def take(x, axis: int, start: int, stop: int, step: int = 1):
    """x's entries start, start + step, ... < stop along `axis` (static bounds), as a gather with a constant
    index: what every slice of a tensor in our graphs goes through. MindSpore 2.10 spends tens of
    milliseconds of type inference on each tensor slice site per compiled graph, a constant-index gather
    next to nothing (docs/BENCHMARKS.md, "Measurements behind code choices")."""
    return ops.gather(x, Tensor(np.arange(start, stop, step, dtype=np.int32)), axis)


def swap_middle(x):
    """x (A, B, C, D) -> (A, C, B, D), the heads transpose of attention ((N, T, heads, hd) <-> (N, heads, T,
    hd)), as a gather of whole D-vectors with a constant row index.

    MindSpore 2.10's CPU Transpose kernel, given a constant permutation, precomputes the source offset of
    every output element (a size_t each) and keeps that table for as long as the compiled graph lives,
    outside the memory pool: twice the output's float32 size per Transpose node, and the backward of each
    is another one. The gather keeps one int32 per D-vector (docs/BENCHMARKS.md, "Measurements behind code choices").

    When B or C is 1 (a decode step: one position per sequence) the swap leaves the memory order as it is,
    and is a reshape: no kernel to launch (4 per layer in every decode step)."""
    a, b, c, d = x.shape
    if b == 1 or c == 1:
        return ops.reshape(x, (a, c, b, d))
    rows = np.arange(a * b * c, dtype=np.int32).reshape(a, b, c).transpose(0, 2, 1).reshape(-1)
    return ops.reshape(ops.gather(ops.reshape(x, (a * b * c, d)), Tensor(rows), 0), (a, c, b, d))
