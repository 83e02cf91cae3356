"""Tensor-parallel communication regions, each a named pair of forward and backward rules.

MindSpore's default gradient of AllReduce is another AllReduce, which is wrong for Megatron-style tensor
parallelism where the forward value is replicated and the backward must not be summed twice. So every
crossing between "replicated across TP" and "split across TP" is one of these cells with an explicit
`bprop`:

    copy_to_tp        forward identity,              backward all-reduce(sum)
    reduce_from_tp    forward all-reduce(sum),       backward identity
    gather_from_tp    forward all-gather(last dim),  backward keep own slice
    scatter_to_tp     forward keep own slice,        backward all-gather(last dim)

With tp == 1 each is the identity and issues no collective.
"""
from __future__ import annotations

from mindspore import nn, ops

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
        return (dout[..., start:start + local],)


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
        return x[..., start:start + local]

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


def copy_to_tp(mesh):
    return CopyToTP(mesh.tp_group) if mesh.tp > 1 else Identity()


def reduce_from_tp(mesh):
    return ReduceFromTP(mesh.tp_group) if mesh.tp > 1 else Identity()


def gather_from_tp(mesh):
    return GatherFromTP(mesh.tp_group, mesh.tp, mesh.tp_index) if mesh.tp > 1 else Identity()


def scatter_to_tp(mesh):
    return ScatterToTP(mesh.tp_group, mesh.tp, mesh.tp_index) if mesh.tp > 1 else Identity()


def max_from_tp(mesh):
    return MaxFromTP(mesh.tp_group, mesh.tp, mesh.tp_index) if mesh.tp > 1 else Identity()
