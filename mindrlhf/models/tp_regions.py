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


def _gather_last_dim(all_gather, x, tp):
    """All-gather shards along the last dimension (AllGather itself concatenates along dim 0)."""
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
        self.all_gather = ops.AllGather(group=group)
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
        self.all_gather = ops.AllGather(group=group)
        self.tp = tp
        self.tp_index = tp_index

    def construct(self, x):
        local = x.shape[-1] // self.tp
        start = self.tp_index * local
        return x[..., start:start + local]

    def bprop(self, x, out, dout):
        return (_gather_last_dim(self.all_gather, dout, self.tp),)


class MaxFromTP(nn.Cell):
    """All-reduce(max) with no gradient: used only for numerically stabilising shifts."""

    def __init__(self, group):
        super().__init__()
        self.all_reduce = ops.AllReduce(op=ops.ReduceOp.MAX, group=group)

    def construct(self, x):
        return ops.stop_gradient(self.all_reduce(ops.stop_gradient(x)))


def copy_to_tp(mesh):
    return CopyToTP(mesh.tp_group) if mesh.tp > 1 else Identity()


def reduce_from_tp(mesh):
    return ReduceFromTP(mesh.tp_group) if mesh.tp > 1 else Identity()


def gather_from_tp(mesh):
    return GatherFromTP(mesh.tp_group, mesh.tp, mesh.tp_index) if mesh.tp > 1 else Identity()


def scatter_to_tp(mesh):
    return ScatterToTP(mesh.tp_group, mesh.tp, mesh.tp_index) if mesh.tp > 1 else Identity()


def max_from_tp(mesh):
    return MaxFromTP(mesh.tp_group) if mesh.tp > 1 else Identity()
