"""The update as one compiled graph (loss, gradients, DP mean, global-norm clip, AdamW) and the no-grad
log-probs as one graph: the engine for a whole model on each rank with whole mini-batches."""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from mindrlhf.models.layer_graphs import routed_forward
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.parallel.grad_sync import DPGradMean
from mindrlhf.trainer.optim import AdamW
from mindrlhf.trainer.update.grad_norm import SplitNormSum, clip_scale, split_axes
from mindrlhf.trainer.update.loss import GRPOLossCell, response_logprobs


class ResponseLogProb(nn.Cell):
    """No-grad log-probs (old policy, reference, rollout-vs-train check), (N, R). The entropy is the train
    step's statistic: left out here, the compiler drops its two passes over the logits."""

    def __init__(self, model: CausalLM, response_len: int, temperature: float = 1.0, shared_prompt=(0, 0)):
        super().__init__(auto_prefix=False)
        self.model = model
        self.response_len = response_len
        self.temperature = temperature
        self.shared_prompt = tuple(shared_prompt)

    @ms.jit
    def construct(self, input_ids, position_ids, bias, labels, routing=None):
        # [0], not `logp, _ =`: with a Qwen3-MoE model the unpacking made MindSpore 2.10 warn that "side effect
        # nodes were eliminated by mistake" at compile time (the values are the same either way)
        logp = response_logprobs(self.model, input_ids, position_ids, bias, labels, self.response_len,
                                 self.temperature, self.shared_prompt, routing)[0]
        return ops.stop_gradient(logp)


class ModelRouting(nn.Cell):
    """No-grad: the experts a Qwen3-MoE model's own routers choose for each input token, (N, T, sparse layers,
    k) int32 in no particular order per token, and its router probabilities summed over the sparse layers,
    (N, T, E) float32 (the aux loss's report). Called like ResponseLogProb (labels unused), always on padded rows
    (`per_input_token`: packing.PackedRowLayout runs it so)."""
    per_input_token = True

    def __init__(self, model: CausalLM):
        super().__init__(auto_prefix=False)
        self.model = model

    @ms.jit
    def construct(self, input_ids, position_ids, bias, labels):
        experts, logits = routed_forward(self.model.model, input_ids, position_ids, bias)
        probs = ops.softmax(logits, -1).sum(0)
        return ops.stop_gradient(ops.transpose(experts, (1, 2, 0, 3))), ops.stop_gradient(probs)


class PolicyTrainStep(nn.Cell):
    """Loss, gradients, DP mean, global-norm clip and AdamW in one compiled graph."""

    def __init__(self, loss_cell: GRPOLossCell, optimizer: AdamW, mesh, max_grad_norm: float):
        super().__init__(auto_prefix=False)
        self.loss_cell = loss_cell
        self.optimizer = optimizer
        self.grad_fn = ms.value_and_grad(loss_cell, None, optimizer.params, has_aux=True)
        axes = split_axes(loss_cell.model, optimizer.params)
        self.dp_mean = DPGradMean(mesh, axes)
        self.norm_sum = SplitNormSum(axes, mesh)
        self.max_grad_norm = max_grad_norm

    @ms.jit
    def construct(self, input_ids, position_ids, bias, labels, lr, *loss_inputs):
        (loss, aux), grads = self.grad_fn(input_ids, position_ids, bias, labels, *loss_inputs)
        grads = self.dp_mean(grads)
        scale, grad_norm = clip_scale(grads, self.max_grad_norm, self.norm_sum)
        self.optimizer(grads, lr, scale)
        pg_loss, kl, clip_frac, entropy, gap, tis_mean, tis_max, tis_clipped = aux
        return loss, pg_loss, kl, clip_frac, entropy, grad_norm, gap, tis_mean, tis_max, tis_clipped
