"""Data-parallel gradient averaging across a role's DP group."""
from __future__ import annotations

from mindspore import nn, ops


class DPGradMean(nn.Cell):
    """Average gradients over the DP group (sum all-reduce / dp); identity when dp == 1.

    Every DP rank must hold the same number of samples per step so the mean of per-rank means is the
    full-batch mean (the trainer guarantees it by splitting whole prompt groups evenly).
    """

    def __init__(self, mesh):
        super().__init__()
        self.dp = mesh.dp
        if self.dp > 1:
            self.all_reduce = ops.AllReduce(group=mesh.dp_group)

    def construct(self, grads):
        if self.dp == 1:
            return grads
        return tuple(self.all_reduce(g) / self.dp for g in grads)
