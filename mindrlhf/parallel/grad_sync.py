"""In-graph collectives of the update: data-parallel gradient averaging across a role's DP group, and sums
over pipeline stages."""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

_reduce_mean = ops.MultitypeFuncGraph("dp_reduce_mean")


@_reduce_mean.register("Function", "Number", "Tensor")
def _reduce_mean_one(all_reduce, dp, grad):
    return all_reduce(grad) / dp


class DPGradMean(nn.Cell):
    """Average gradients over the DP group (sum all-reduce / dp); identity when dp == 1.

    Every DP rank must hold the same number of samples per step so the mean of per-rank means is the
    full-batch mean (the trainer guarantees it by splitting whole prompt groups evenly). The tuple is mapped
    with HyperMap: a generator over it in the graph compiled in more than linear memory in MindSpore 2.10
    (docs/BENCHMARKS.md, "Measurements behind code choices").
    """

    def __init__(self, mesh):
        super().__init__()
        self.dp = mesh.dp
        if self.dp > 1:
            self.all_reduce = ops.AllReduce(group=mesh.dp_group)
            self.map = ops.HyperMap()

    def construct(self, grads):
        if self.dp == 1:
            return grads
        return self.map(ops.partial(_reduce_mean, self.all_reduce, self.dp), grads)


class DPMeanInPlace(nn.Cell):
    """Gradient buffers replaced by their mean over the DP group, as a graph of its own compiled once per
    shapes of the buffers (a host-driven update's DPGradMean: the same all-reduce and division)."""

    def __init__(self, mesh):
        super().__init__()
        self.dp = mesh.dp
        self.all_reduce = ops.AllReduce(group=mesh.dp_group)

    @ms.jit
    def construct(self, bufs):
        done = self.dp
        for buf in bufs:
            done = ops.assign(buf, self.all_reduce(ops.depend(buf, done)) / self.dp)
        return done


class StageSum(nn.Cell):
    """A value summed over this rank's counterparts on every pipeline stage (all-reduce over the mesh's pp
    group); identity with one stage."""

    def __init__(self, mesh):
        super().__init__()
        self.pp = mesh.pp
        if self.pp > 1:
            self.all_reduce = ops.AllReduce(group=mesh.pp_group)

    def construct(self, x):
        return self.all_reduce(x) if self.pp > 1 else x
