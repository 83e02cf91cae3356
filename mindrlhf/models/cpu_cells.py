"""Ops the decoder uses in a form MindSpore 2.10's CPU backend runs well: the same math, a backward written out
or a primitive chosen so that autodiff does not bring in kernels that are slow or hold memory outside the
pool for the graph's lifetime (broadcasting arithmetic, Transpose). Each says its reason in a line; the
measurements: docs/BENCHMARKS.md, "Measurements behind code choices", and docs/ARCHITECTURE.md, "CPU facts
the design rests on". tests/test_model_parity.py checks values and gradients against Hugging Face's.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import Tensor, nn, ops

from mindrlhf.models.graph_ops import expand_as, mean_last, sum_last

# q @ k^T with the transpose as a flag: no transposed copy of a cache-sized k.
BMM_NT = ops.BatchMatMul(transpose_b=True)
# probs @ v as the primitive: its backward is two flagged BatchMatMuls, the functional matmul's two Transposes.
BMM = ops.BatchMatMul()
# a^T @ b^T per batch: a stacked expert's LoRA update (B A)^T in its x @ W layout (models/moe.py).
BMM_TT = ops.BatchMatMul(transpose_a=True, transpose_b=True)


class RMSNormFunction(nn.Cell):
    """weight * x / sqrt(mean(x^2) + eps), statistics in `compute_dtype`. Backward by hand (autodiff's tiles,
    divides and reduces each broadcast, about twice the cost): with n = x * r, r = rsqrt(mean(x^2) + eps),
    g = dy * w: dx = r * (g - n * mean(g * n)), dw = sum over tokens of dy * n."""

    def __init__(self, eps, compute_dtype=ms.float32):
        super().__init__()
        self.eps = eps
        self.compute_dtype = compute_dtype
        self.sum_rows = ops.ReduceSum()

    def _normed(self, x32):
        """(x * r, r broadcast to x), in compute_dtype."""
        rstd = expand_as(ops.rsqrt(mean_last(ops.square(x32)) + self.eps), x32)
        return x32 * rstd, rstd

    def construct(self, x, weight):
        normed = ops.cast(self._normed(ops.cast(x, self.compute_dtype))[0], x.dtype)
        return expand_as(ops.cast(weight, x.dtype), normed) * normed

    def bprop(self, x, weight, out, dout):
        normed, rstd = self._normed(ops.cast(x, self.compute_dtype))
        dy = ops.cast(dout, self.compute_dtype)
        dw = self.sum_rows(ops.reshape(dy * normed, (-1, x.shape[-1])), 0)
        g = dy * expand_as(ops.cast(weight, self.compute_dtype), dy)
        dx = (g - normed * expand_as(mean_last(g * normed), normed)) * rstd
        return ops.cast(dx, x.dtype), ops.cast(dw, weight.dtype)


class HalfRotation(nn.Cell):
    """x (..., hd) -> x[..., index] for a permutation that is its own inverse (RoPE's swapped halves), so the
    gradient is the same gather; autodiff's own backward of a last-axis gather is Transpose, UnsortedSegmentSum,
    Transpose."""

    def __init__(self, index):
        super().__init__()
        self.index = Tensor(index)

    def construct(self, x):
        return ops.gather(x, self.index, x.ndim - 1)

    def bprop(self, x, out, dout):
        return (ops.gather(dout, self.index, dout.ndim - 1),)


class LastAxisSoftmax(nn.Cell):
    """softmax over the last axis; backward dx = y * (dy - sum(dy * y)) with the row sums broadcast by
    expand_as (autodiff's subtracts them with a broadcasting Sub)."""

    def construct(self, x):
        return ops.softmax(x, -1)

    def bprop(self, x, out, dout):
        row_dot = sum_last(dout * out)
        return ((dout - expand_as(row_dot, out)) * out,)
