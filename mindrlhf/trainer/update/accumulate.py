"""The update of the engines that sum gradients into buffers from several graph calls (pipeline stages and
micro-batches: update/pipelined.py; a graph per decoder layer: update/layerwise.py), then apply them: DP
mean, global-norm clip and AdamW driven from the host one decoder layer's buffers at a time, with the one-graph
step's operations in its order. Their calls and outputs are the one-graph step's."""
from __future__ import annotations

import numpy as np
from mindspore import Tensor

from mindrlhf.parallel.grad_sync import DPMeanInPlace, experts_hold_all_rows
from mindrlhf.trainer import exchange
from mindrlhf.trainer.optim import aliases, block_runs
from mindrlhf.trainer.update.grad_norm import AddSquares, ClipScale, SplitNormSum
from mindrlhf.trainer.update.loss import LOSS_STATS
from mindrlhf.trainer.update.loss_inputs import LossInputs

TIS_MAX = LOSS_STATS.index("tis_ratio_max")      # the statistic reduced by max over micro-batches


class ApplyAccumulated:
    """DP mean, global-norm clip (over TP ranks and pipeline stages) and AdamW on the summed gradients, the
    buffers cleared after. Driven from the host one decoder layer's buffers at a time, through small graphs
    that all layers share (AdamW.update_each says why), with the operations and their order of the one-graph
    train step."""

    def __init__(self, optimizer, acc, mesh, axes, max_grad_norm: float):
        self.optimizer, self.acc = optimizer, acc
        names = [p.name for p in optimizer.params]
        # (mean graph, its buffers' runs): every buffer over the row shares, or under the all-to-all dispatcher
        # the experts' apart (grad_sync.experts_hold_all_rows)
        self.means = []
        if mesh.row_ways > 1:
            split = experts_hold_all_rows(mesh)
            for experts in ((False, True) if split else (False,)):
                ids = [i for i, a in enumerate(axes) if not split or ("ep" in a) == experts]
                if ids:
                    self.means.append((DPMeanInPlace(mesh, experts), block_runs(names, ids)))
        norm_sum = SplitNormSum(axes, mesh)
        self.norm_runs = tuple(block_runs(names, ids) for ids in norm_sum.id_groups)
        self.add_squares = AddSquares()
        self.clip = ClipScale(norm_sum, max_grad_norm)

    def __call__(self, lr):
        """One update; returns the global gradient norm (before clipping)."""
        for mean, runs in self.means:
            for ids in runs:
                mean(aliases(self.acc, ids))
        totals = []
        for runs in self.norm_runs:
            total = Tensor(np.float32(0.0))
            for ids in runs:
                total = self.add_squares(total, aliases(self.acc, ids))
            totals.append(total)
        scale, grad_norm = self.clip(*totals)
        self.optimizer.update_each(self.acc, lr, scale)
        return grad_norm


class AccumulatedUpdate:
    """An update whose gradients a subclass's `accumulate` sums into buffers, then `self.apply`
    (ApplyAccumulated) uses and clears: PolicyTrainStep's call and outputs."""

    def __call__(self, input_ids, position_ids, bias, labels, lr, *loss_inputs):
        stats = self.accumulate(input_ids, position_ids, bias, labels, LossInputs(*loss_inputs))
        return update_outputs(stats, float(self.apply(lr).asnumpy()))


def micro_batch_stats(per_micro, mesh) -> np.ndarray:
    """(loss, LOSS_STATS) of an update from its micro-batches' (this stage's list; empty
    on the others): summed (each is normalised by the mini-batch), tis_ratio_max by max. They live on the
    last stage, and every stage reports them (the others contribute zeros)."""
    stats = np.zeros(1 + len(LOSS_STATS), np.float32)
    if per_micro:
        arr = np.array(per_micro, np.float64)
        stats[:] = arr.sum(0)
        stats[1 + TIS_MAX] = arr[:, 1 + TIS_MAX].max()
    return exchange.sum_over(stats, mesh.pp_ranks())


def update_outputs(stats: np.ndarray, grad_norm: float) -> tuple:
    """PolicyTrainStep's outputs (loss.UPDATE_STATS without lr) from micro_batch_stats and the norm."""
    loss, pg_loss, kl, clip_frac, entropy, gap, tis_mean, tis_max, tis_clipped = stats.tolist()
    return tuple(Tensor(np.float32(v)) for v in (loss, pg_loss, kl, clip_frac, entropy, grad_norm, gap, tis_mean,
                                                 tis_max, tis_clipped))
