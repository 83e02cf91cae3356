"""Tensor-parallel communication regions, each a named pair of forward and backward rules.

MindSpore's default gradient of AllReduce is another AllReduce, which is wrong for Megatron-style tensor
parallelism where the forward value is replicated and the backward must not be summed twice. So every
crossing between "replicated across TP" and "split across TP" is one of these cells with an explicit
`bprop`:

    copy_to_tp        forward identity,              backward all-reduce(sum)
    reduce_from_tp    forward all-reduce(sum),       backward identity
    gather_from_tp    forward all-gather(last dim),  backward keep own slice
    scatter_to_tp     forward keep own slice,        backward all-gather(last dim)

and, under sequence parallelism (Megatron's; activations outside attention/MLP split along the sequence):

    gather_seq        forward all-gather(sequence),  backward reduce-scatter(sequence)
    reduce_scatter_seq forward reduce-scatter(sequence), backward all-gather(sequence)

With tp == 1 each is the identity and issues no collective. MindSpore's CPU backend has neither AllGather on
a subgroup nor ReduceScatter, so both sequence regions are composed from AllReduce(sum): a gather places the
local part in a zero buffer and sums, a reduce-scatter sums and keeps this rank's part. Same values, more
traffic (Ascend would use AllGather / ReduceScatter; not done here).

One crossing between expert-parallel ranks that hold distinct rows (models/moe.AllToAllDispatcher):

    exchange_dim0     forward all-to-all along dim 0, backward the same all-to-all of the gradient
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from mindrlhf.models.graph_ops import take
from mindrlhf.parallel.mesh import is_world_group


class Identity(nn.Cell):
    def construct(self, x):
        return x


class CopyToTP(nn.Cell):
    """Enter a TP region: replicated input feeds split weights; partial input-gradients are summed."""

    def __init__(self, group):
        super().__init__()
        self.all_reduce = ops.AllReduce(group=group)

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (self.all_reduce(dout),)


class ReduceFromTP(nn.Cell):
    """Leave a TP region: sum partial results; the replicated gradient passes through unchanged."""

    def __init__(self, group):
        super().__init__()
        self.all_reduce = ops.AllReduce(group=group)

    def construct(self, x):
        return self.all_reduce(x)

    def bprop(self, x, out, dout):
        return (dout,)


class ScaleGradient(nn.Cell):
    """Forward identity, backward the gradient times `factor`: a replicated computation inside a TP region whose
    input gradient every TP rank holds in full, before the region's entry sums the ranks' input gradients (a MoE
    router under TP: models/moe.py)."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (dout * self.factor,)


class GatherDim0(nn.Cell):
    """Concatenate each rank's tensor along dim 0 in rank order.

    MindSpore's CPU AllGather kernel accepts only the world group, so on a subgroup we place the local
    block in a zero buffer and all-reduce (twice the traffic, same result; Ascend uses AllGather).
    """

    def __init__(self, group, size, index):
        super().__init__()
        self.size, self.index = size, index
        self.use_all_gather = is_world_group(group)
        self.all_gather = ops.AllGather(group=group)
        self.all_reduce = ops.AllReduce(group=group)

    def construct(self, x):
        if self.use_all_gather:
            return self.all_gather(x)
        n = x.shape[0]
        pad_before = ops.zeros((self.index * n,) + x.shape[1:], x.dtype)
        pad_after = ops.zeros(((self.size - 1 - self.index) * n,) + x.shape[1:], x.dtype)
        return self.all_reduce(ops.concat((pad_before, x, pad_after), 0))


def _gather_last_dim(all_gather, x, tp):
    """All-gather shards along the last dimension (the gather itself concatenates along dim 0)."""
    shape = x.shape
    local = shape[-1]
    flat = ops.reshape(x, (-1, local))                    # (N, d)
    gathered = all_gather(ops.transpose(flat, (1, 0)))    # (tp*d, N)
    full = ops.transpose(gathered, (1, 0))                # (N, tp*d)
    return ops.reshape(full, shape[:-1] + (local * tp,))


class GatherFromTP(nn.Cell):
    """Concatenate last-dim shards from all TP ranks; backward keeps this rank's slice of the gradient."""

    def __init__(self, group, tp, tp_index):
        super().__init__()
        self.all_gather = GatherDim0(group, tp, tp_index)
        self.tp = tp
        self.tp_index = tp_index

    def construct(self, x):
        return _gather_last_dim(self.all_gather, x, self.tp)

    def bprop(self, x, out, dout):
        local = x.shape[-1]
        start = self.tp_index * local
        return (take(dout, dout.ndim - 1, start, start + local),)


class ScatterToTP(nn.Cell):
    """Keep this rank's last-dim slice of a replicated tensor; backward gathers the slices' gradients."""

    def __init__(self, group, tp, tp_index):
        super().__init__()
        self.all_gather = GatherDim0(group, tp, tp_index)
        self.tp = tp
        self.tp_index = tp_index

    def construct(self, x):
        local = x.shape[-1] // self.tp
        start = self.tp_index * local
        return take(x, x.ndim - 1, start, start + local)

    def bprop(self, x, out, dout):
        return (_gather_last_dim(self.all_gather, dout, self.tp),)


class MaxFromTP(nn.Cell):
    """Element-wise max across TP ranks, with no gradient: only for numerically stabilising shifts.

    Built on a gather (CPU's AllReduce implements only sum) of the small per-row maxima.
    """

    def __init__(self, group, tp, tp_index):
        super().__init__()
        self.gather = GatherDim0(group, tp, tp_index)
        self.tp = tp

    def construct(self, x):
        x = ops.stop_gradient(x)
        stacked = self.gather(ops.expand_dims(x, 0))          # (tp, ...)
        return ops.stop_gradient(ops.max(stacked, axis=0)[0])


def _gather_seq(all_reduce, x, tp, index):
    """Concatenate each TP rank's x along dim 1 (the sequence) in rank order, through a sum all-reduce."""
    t = x.shape[1]
    before = ops.zeros((x.shape[0], index * t) + x.shape[2:], x.dtype)
    after = ops.zeros((x.shape[0], (tp - 1 - index) * t) + x.shape[2:], x.dtype)
    return all_reduce(ops.concat((before, x, after), 1))


class GatherSeq(nn.Cell):
    """Enter a TP region under sequence parallelism: the sequence parts of all TP ranks, concatenated; the
    gradient of this rank's part is the sum of every rank's gradient for it (reduce-scatter)."""

    def __init__(self, group, tp, tp_index):
        super().__init__()
        self.all_reduce = ops.AllReduce(group=group)
        self.tp, self.index = tp, tp_index

    def construct(self, x):
        return _gather_seq(self.all_reduce, x, self.tp, self.index)

    def bprop(self, x, out, dout):
        t = x.shape[1]
        return (take(self.all_reduce(dout), 1, self.index * t, (self.index + 1) * t),)


class ReduceScatterSeq(nn.Cell):
    """Leave a TP region under sequence parallelism: sum the partial results, keep this rank's sequence part;
    the gradient of the partial result is every rank's part, gathered."""

    def __init__(self, group, tp, tp_index):
        super().__init__()
        self.all_reduce = ops.AllReduce(group=group)
        self.tp, self.index = tp, tp_index

    def construct(self, x):
        t = x.shape[1] // self.tp
        return take(self.all_reduce(x), 1, self.index * t, (self.index + 1) * t)

    def bprop(self, x, out, dout):
        return (_gather_seq(self.all_reduce, dout, self.tp, self.index),)


class ExchangeDim0(nn.Cell):
    """All-to-all over a group of `size` ranks: x (size, ...) whose part [j] goes to rank j -> (size, ...) whose
    part [j] came from rank j. The exchange is its own transpose, so its backward is the same exchange of the
    gradient. On Ascend MindSpore's AlltoAll (written, unverified: this CPU backend has no all-to-all kernel); on
    CPU composed from AllReduce(sum): each rank puts its buffer in row `index` of a (size, size, ...) zero block
    and keeps column `index` of the sum (size times the traffic, the same values)."""

    def __init__(self, group, size, index):
        super().__init__()
        self.size, self.index = size, index
        self.use_all_to_all = ms.get_context("device_target") == "Ascend"
        if self.use_all_to_all:
            self.all_to_all = ops.AlltoAll(split_count=size, split_dim=0, concat_dim=0, group=group)
        else:
            self.all_reduce = ops.AllReduce(group=group)

    def construct(self, x):
        return self.exchange(x)

    def bprop(self, x, out, dout):
        return (self.exchange(dout),)

    def exchange(self, x):
        if self.use_all_to_all:
            return self.all_to_all(x)
        before = ops.zeros((self.index,) + x.shape, x.dtype)
        after = ops.zeros((self.size - 1 - self.index,) + x.shape, x.dtype)
        block = self.all_reduce(ops.concat((before, ops.expand_dims(x, 0), after), 0))      # [source, dest, ...]
        return ops.reshape(take(block, 1, self.index, self.index + 1), x.shape)


def copy_to_tp(mesh):
    return CopyToTP(mesh.tp_group) if mesh.tp > 1 else Identity()


def reduce_from_tp(mesh):
    return ReduceFromTP(mesh.tp_group) if mesh.tp > 1 else Identity()


def enter_tp(mesh):
    """Into a TP region: the sequence gathered under sequence parallelism, else copy_to_tp."""
    if mesh.seq_parallel:
        return GatherSeq(mesh.tp_group, mesh.tp, mesh.tp_index)
    return copy_to_tp(mesh)


def leave_tp(mesh):
    """Out of a TP region: reduce-scattered along the sequence under sequence parallelism, else reduce_from_tp."""
    if mesh.seq_parallel:
        return ReduceScatterSeq(mesh.tp_group, mesh.tp, mesh.tp_index)
    return reduce_from_tp(mesh)


def gather_from_tp(mesh):
    return GatherFromTP(mesh.tp_group, mesh.tp, mesh.tp_index) if mesh.tp > 1 else Identity()


def scatter_to_tp(mesh):
    return ScatterToTP(mesh.tp_group, mesh.tp, mesh.tp_index) if mesh.tp > 1 else Identity()


def max_from_tp(mesh):
    return MaxFromTP(mesh.tp_group, mesh.tp, mesh.tp_index) if mesh.tp > 1 else Identity()
