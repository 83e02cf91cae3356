"""The policy update and the no-grad log-probs under pipeline parallelism (train layout pipeline_stage > 1), and
the update in parts without stages (micro_batch_interleave_num > 1: one stage that is first and last).

Same calls and outputs as one_graph.PolicyTrainStep / ResponseLogProb, so the trainer does not care which
it holds. A mini-batch is cut into `micro_batch_num` micro-batches that go through the stages on the 1F1B
schedule (parallel/pipeline.py). Each stage compiles three graphs: its forward (no grad), its backward
(the forward recomputed under GradOperation with the incoming activation gradient as sensitivity - full
activation recomputation, so a stage keeps only its micro-batches' inputs between forward and backward)
and, on the last stage, loss + backward in one. Gradients are summed into per-stage buffers in those
graphs; once the mini-batch is through, one graph averages over DP, clips by the norm over all stages and
TP ranks, runs AdamW and clears the buffers. Losses are normalised per mini-batch (token_norm, or 1/m for
the sequence-mean aggregations, see GRPOLossCell), so the summed micro-batch gradients are the mini-batch's.
"""
from __future__ import annotations

import time
from typing import List, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindrlhf.models.layer_graphs import routed_stage
from mindrlhf.models.tp_layers import MS_DTYPES
from mindrlhf.parallel.pipeline import StageIO, make_links, run_1f1b, run_forward_only
from mindrlhf.parallel.swap import on_ascend
from mindrlhf.trainer import exchange
from mindrlhf.trainer.optim import zeros_like
from mindrlhf.trainer.update.accumulate import AccumulatedUpdate, ApplyAccumulated, micro_batch_stats
from mindrlhf.trainer.update.grad_norm import split_axes
from mindrlhf.trainer.update.loss import GRPOLossCell
from mindrlhf.trainer.update.loss_inputs import LossInputs
from mindrlhf.utils.params import wait_for_graphs


class _StageFn(nn.Cell):
    """A stage's forward; `routing_inputs`: none, (routing,) or (routing, router_grad) (stage_forward)."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, x, position_ids, bias, *routing_inputs):
        return self.model.model.stage_forward(x, position_ids, bias, *routing_inputs)


class StageForward(nn.Cell):
    """A stage that is not the last: its forward, no gradient."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.fn = _StageFn(model)

    @ms.jit
    def construct(self, x, position_ids, bias, *routing_inputs):
        return ops.stop_gradient(self.fn(x, position_ids, bias, *routing_inputs))


class StageBackward(nn.Cell):
    """A stage that is not the last: recompute the forward, back-propagate `dy`, add the parameter gradients
    into `acc`; returns the input gradient (zeros on the first stage, whose input is token ids). The routing
    inputs, when given, come after `dy`."""

    def __init__(self, model, params, acc, first: bool):
        super().__init__(auto_prefix=False)
        self.fn = _StageFn(model)
        self.params = ms.ParameterTuple(params)
        self.acc = acc
        self.first = first
        self.grad = ops.GradOperation(get_all=not first, get_by_list=True, sens_param=True)

    @ms.jit
    def construct(self, x, position_ids, bias, dy, *routing_inputs):
        if self.first:
            grads = self.grad(self.fn, self.params)(x, position_ids, bias, *routing_inputs, dy)
            dx = ops.zeros((), ms.float32)
        else:
            inputs, grads = self.grad(self.fn, self.params)(x, position_ids, bias, *routing_inputs, dy)
            dx = inputs[0]
        for i in range(len(self.acc)):
            ops.assign_add(self.acc[i], grads[i])
        return dx


class LastStageStep(nn.Cell):
    """The last stage: loss of one micro-batch and its backward; parameter gradients added into `acc`;
    returns (loss, aux, gradient of the incoming activation; zeros when it is also the first stage, whose
    input is token ids)."""

    def __init__(self, loss_cell: GRPOLossCell, params, acc, first: bool):
        super().__init__(auto_prefix=False)
        self.loss_cell = loss_cell
        self.acc = acc
        self.first = first
        self.grad_fn = ms.value_and_grad(loss_cell, None if first else 0, ms.ParameterTuple(params), has_aux=True)

    @ms.jit
    def construct(self, x, position_ids, bias, labels, *loss_inputs):
        if self.first:
            (loss, aux), grads = self.grad_fn(x, position_ids, bias, labels, *loss_inputs)
            dx = ops.zeros((), ms.float32)
        else:
            (loss, aux), (dx, grads) = self.grad_fn(x, position_ids, bias, labels, *loss_inputs)
        for i in range(len(self.acc)):
            ops.assign_add(self.acc[i], grads[i])
        return loss, aux, dx


class PipelineTrainStep(AccumulatedUpdate):
    """PolicyTrainStep for a pipelined train layout, or for micro-batches without stages
    (micro_batch_interleave_num): one optimizer update per call (one mini-batch). `micro_rows` > 0: micro-batches
    of that many rows each, as many as the call brings (packed rows: their count varies by update and rank)."""

    def __init__(self, loss_cell: GRPOLossCell, optimizer, mesh, max_grad_norm: float, micro_batches: int,
                 micro_rows: int = 0):
        self.mesh, self.micro_batches, self.micro_rows = mesh, micro_batches, micro_rows
        self.model = model = loss_cell.model
        params = list(optimizer.params)
        self.acc = zeros_like(optimizer.params, "grad_acc")
        self.links = make_links(mesh, MS_DTYPES[model.config.compute_dtype], on_ascend())
        if mesh.is_last_stage:
            self.last = LastStageStep(loss_cell, params, self.acc, mesh.is_first_stage)
        else:
            self.forward_cell = StageForward(model)
            self.backward_cell = StageBackward(model, params, self.acc, mesh.is_first_stage)
        self.apply = ApplyAccumulated(optimizer, self.acc, mesh, split_axes(model, params), max_grad_norm)
        # benchmarks: time inside this stage's compute graphs (synchronised) vs the whole schedule
        self.profile, self.busy_seconds, self.schedule_seconds = False, 0.0, 0.0

    def _timed(self, fn, *args):
        if not self.profile:
            return fn(*args)
        t0 = time.perf_counter()
        out = fn(*args)
        wait_for_graphs()
        self.busy_seconds += time.perf_counter() - t0
        return out

    def accumulate(self, input_ids, position_ids, bias, labels, loss_inputs: LossInputs) -> np.ndarray:
        """The mini-batch's micro-batches through the 1F1B schedule: this stage's gradients summed into
        `self.acc`; returns (loss, LOSS_STATS) on every stage."""
        n = self.micro_rows or input_ids.shape[0] // self.micro_batches
        m = input_ids.shape[0] // n
        cut = [slice(i * n, (i + 1) * n) for i in range(m)]
        io = StageIO(*self.links, self.model.activation_shape(n, input_ids.shape[1]))
        stash: List = [None] * m
        per_micro = []

        def forward(i, x):
            stash[i] = input_ids[cut[i]] if self.mesh.is_first_stage else x
            if self.mesh.is_last_stage:
                return None
            return self._timed(self.forward_cell, stash[i], position_ids[cut[i]], bias[cut[i]],
                               *loss_inputs.rows(cut[i]).routing_args())

        def backward(i, dy):
            c, x = cut[i], stash[i]
            stash[i] = None
            if not self.mesh.is_last_stage:
                dx = self._timed(self.backward_cell, x, position_ids[c], bias[c], dy,
                                 *loss_inputs.rows(c).routing_args())
                return None if self.mesh.is_first_stage else dx
            loss, aux, dx = self._timed(self.last, x, position_ids[c], bias[c], labels[c],
                                        *loss_inputs.rows(c).args())
            per_micro.append([float(loss.asnumpy())] + [float(a.asnumpy()) for a in aux])
            return dx

        t0 = time.perf_counter()
        run_1f1b(self.mesh.stage, self.mesh.pp, m, io, forward, backward)
        self.schedule_seconds += time.perf_counter() - t0
        return micro_batch_stats(per_micro, self.mesh)


def micro_cuts(rows: int, micro_batches: int, micro_rows: int = 0) -> Tuple[int, List[slice]]:
    """A no-grad pass's micro-batches: (rows each, their slices), `micro_rows` rows each when given (packed rows),
    else `micro_batches` equal parts, or one part when they do not divide `rows`."""
    if micro_rows:
        n = micro_rows
    else:
        n = rows // (micro_batches if rows % micro_batches == 0 else 1)
    return n, [slice(i * n, (i + 1) * n) for i in range(rows // n)]


class LastStageLogProb(nn.Cell):
    def __init__(self, model, response_len: int, temperature: float):
        super().__init__(auto_prefix=False)
        self.model, self.response_len, self.temperature = model, response_len, temperature

    @ms.jit
    def construct(self, x, position_ids, bias, labels, *routing):
        hidden = self.model.model.stage_forward(x, position_ids, bias, *routing)
        logp, _ = self.model.logprobs_of_hidden(hidden, labels, self.response_len, self.temperature)
        return ops.stop_gradient(logp)


class PipelineLogProb:
    """ResponseLogProb for a pipelined layout: micro-batches flow forward through the stages; every stage
    gets the last stage's log-probs. `micro_rows` > 0: micro-batches of that many rows (packed rows)."""

    def __init__(self, model, response_len: int, temperature: float, micro_batches: int, micro_rows: int = 0):
        self.mesh, self.micro_batches, self.model = model.mesh, micro_batches, model
        self.micro_rows = micro_rows
        self.links = make_links(self.mesh, MS_DTYPES[model.config.compute_dtype], on_ascend())
        self.cell = LastStageLogProb(model, response_len, temperature) if self.mesh.is_last_stage \
            else StageForward(model)
        self.response_len = response_len

    def __call__(self, input_ids, position_ids, bias, labels, routing=None):
        """`routing` (N, T, sparse layers, k): the experts to replay (router replay), None: each routes itself."""
        rows = input_ids.shape[0]
        n, cut = micro_cuts(rows, self.micro_batches, self.micro_rows)
        out = np.zeros((rows, self.response_len), np.float32)

        def forward(i, x):
            c = cut[i]
            x = input_ids[c] if self.mesh.is_first_stage else x
            replay = () if routing is None else (routing[c],)
            if not self.mesh.is_last_stage:
                return self.cell(x, position_ids[c], bias[c], *replay)
            out[c] = self.cell(x, position_ids[c], bias[c], labels[c], *replay).asnumpy()
            return None

        run_forward_only(len(cut), StageIO(*self.links, self.model.activation_shape(n, input_ids.shape[1])), forward)
        out = exchange.sum_over(out, self.mesh.pp_ranks())
        return Tensor(out)


class StageRouting(nn.Cell):
    """A stage's routing pass (layer_graphs.routed_stage): the stream out for the next stage (a stage that is not
    the last), and its sparse layers' experts (sparse layers here, N, T, k) and router probabilities summed over
    them (N, T, E)."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.decoder = model.model

    @ms.jit
    def construct(self, x, position_ids, bias):
        out, experts, logits = routed_stage(self.decoder, x, position_ids, bias, not self.decoder.last)
        return (ops.stop_gradient(out), ops.stop_gradient(experts),
                ops.stop_gradient(ops.softmax(logits, -1).sum(0)))


class PipelineRouting:
    """one_graph.ModelRouting for a pipelined layout: micro-batches forward through the stages, each stage
    routing its own sparse layers; every stage gets the whole model's (experts (N, T, sparse layers, k) int32,
    router probabilities summed over the sparse layers (N, T, E)), summed over the stages (each fills its layers).
    A stage without sparse layers only passes the stream on."""
    per_input_token = True

    def __init__(self, model, micro_batches: int):
        self.mesh, self.model, self.micro_batches = model.mesh, model, micro_batches
        decoder = model.model
        self.mine = [decoder.sparse_index[i] for i in range(len(decoder.layers)) if decoder.sparse_index[i] >= 0]
        self.links = make_links(self.mesh, MS_DTYPES[model.config.compute_dtype], on_ascend())
        self.cell = StageRouting(model) if self.mine else StageForward(model)

    def __call__(self, input_ids, position_ids, bias, labels):
        rows, length = input_ids.shape
        n, cut = micro_cuts(rows, self.micro_batches)
        cfg = self.model.config
        experts = np.zeros((rows, length, len(cfg.sparse_layers), cfg.num_experts_per_tok), np.int32)
        probs = np.zeros((rows, length, cfg.num_experts), np.float32)

        def forward(i, x):
            c = cut[i]
            x = input_ids[c] if self.mesh.is_first_stage else x
            if not self.mine:
                return None if self.mesh.is_last_stage else self.cell(x, position_ids[c], bias[c])
            out, chosen, prob_sum = self.cell(x, position_ids[c], bias[c])
            experts[c][:, :, self.mine] = chosen.asnumpy().transpose(1, 2, 0, 3)
            probs[c] = prob_sum.asnumpy()
            return None if self.mesh.is_last_stage else out

        run_forward_only(len(cut), StageIO(*self.links, self.model.activation_shape(n, length)), forward)
        ranks = self.mesh.pp_ranks()
        return Tensor(exchange.sum_over(experts, ranks)), Tensor(exchange.sum_over(probs, ranks))
