"""In-graph collectives of the update: gradient averaging over a role's row shares (its data-parallel replicas,
and its EP ranks under the all-to-all dispatcher), and sums over pipeline stages."""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

_reduce_mean = ops.MultitypeFuncGraph("dp_reduce_mean")


@_reduce_mean.register("Function", "Number", "Tensor")
def _reduce_mean_one(all_reduce, ways, grad):
    return all_reduce(grad) / ways


@_reduce_mean.register("Function", "Function", "Number", "Bool", "Tensor")
def _reduce_mean_split(row_sum, expert_sum, ways, expert, grad):
    if expert:
        return expert_sum(grad) / ways
    return row_sum(grad) / ways


def experts_hold_all_rows(mesh) -> bool:
    """Whether an expert's gradient on this rank already sums the tokens of every EP peer's rows: under the
    all-to-all dispatcher (each EP rank its own rows, sent to the experts' ranks and back). Such a gradient is summed
    over the dp replicas only and divided by every row share, the replicated parameters' over all shares."""
    return "ep" in mesh.row_axes


class DPGradMean(nn.Cell):
    """Average gradients over the row shares (sum all-reduce / mesh.row_ways); identity when the rows do not split.
    `axes` (split_axes of the parameters): which gradients are experts' (experts_hold_all_rows).

    Every share must hold the same number of samples per step so the mean of per-rank means is the full-batch
    mean (the trainer guarantees it by splitting whole prompt groups evenly). The tuple is mapped with HyperMap:
    a generator over it in the graph compiled in more than linear memory in MindSpore 2.10 (docs/BENCHMARKS.md,
    "Measurements behind code choices").
    """

    def __init__(self, mesh, axes=None):
        super().__init__()
        self.ways = mesh.row_ways
        self.split = experts_hold_all_rows(mesh)
        if self.ways > 1:
            self.all_reduce = ops.AllReduce(group=mesh.row_group)
            self.map = ops.HyperMap()
        if self.split:
            if axes is None:
                raise ValueError("DPGradMean under the all-to-all dispatcher needs the parameters' split axes")
            self.experts = tuple("ep" in a for a in axes)
            self.expert_sum = ops.AllReduce(group=mesh.dp_group) if mesh.dp > 1 else ops.Identity()

    def construct(self, grads):
        if self.ways == 1:
            return grads
        if self.split:
            return self.map(ops.partial(_reduce_mean, self.all_reduce, self.expert_sum, self.ways), self.experts,
                            grads)
        return self.map(ops.partial(_reduce_mean, self.all_reduce, self.ways), grads)


class DPMeanInPlace(nn.Cell):
    """Gradient buffers replaced by their mean over the row shares, as a graph of its own compiled once per shapes
    of the buffers (a host-driven update's DPGradMean: the same all-reduce and division). `experts`: the buffers
    are experts' under the all-to-all dispatcher, summed over the dp group only (experts_hold_all_rows; no sum
    at dp 1)."""

    def __init__(self, mesh, experts: bool = False):
        super().__init__()
        self.ways = mesh.row_ways
        group = mesh.dp_group if experts else mesh.row_group
        self.all_reduce = ops.AllReduce(group=group) if group is not None else ops.Identity()

    @ms.jit
    def construct(self, bufs):
        done = self.ways
        for buf in bufs:
            done = ops.assign(buf, self.all_reduce(ops.depend(buf, done)) / self.ways)
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
