"""Supervised fine-tuning: the next-token loss on the tokens a mask trains (assistant turns, or MindRecord's
`loss_mask`), the mean over every trained token of the global batch (as GRPO's token mean: each DP rank's
sum divided by the global count / dp, so the DP gradient mean is the global mean), DP gradient mean, the
global-norm clip over TP ranks and AdamW in one compiled graph. A Qwen3-MoE's load-balancing loss
(router_aux_loss_coef x transformers' aux loss over the step's global batch, every real token) joins the loss as
GRPO's does: its gradient on the router probabilities, from a routing pass first (`aux_loss_gradient`,
trainer/aux_loss.py). `sft_warmup` is the demo's single-process warm-up before GRPO; `python -m mindrlhf.sft`
(mindrlhf/sft.py) is the command."""
from __future__ import annotations

import time
from typing import Callable, List, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindrlhf.models.padding import causal_bias
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.parallel.grad_sync import DPGradMean
from mindrlhf.trainer.aux_loss import router_grad
from mindrlhf.trainer.optim import AdamW, lr_at
from mindrlhf.trainer.update.one_graph import ModelRouting
from mindrlhf.trainer.update.grad_norm import SplitNormSum, clip_scale, split_axes


class SFTLoss(nn.Cell):
    """sum(-log p(label) x mask) / token_norm; `router` (the aux loss's router_grad (N, T, E)) or nothing."""

    def __init__(self, model: CausalLM):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, input_ids, position_ids, bias, labels, mask, token_norm, *router):
        # [0], not unpacking: see update/one_graph.ResponseLogProb
        logp = self.model.token_logprobs(input_ids, position_ids, bias, labels,
                                         router_grad=router[0] if router else None)[0]
        return -ops.sum(logp * mask) / token_norm


class SFTLossValue(nn.Cell):
    """SFTLoss without gradient (eval)."""

    def __init__(self, model: CausalLM):
        super().__init__(auto_prefix=False)
        self.loss = SFTLoss(model)

    @ms.jit
    def construct(self, input_ids, position_ids, bias, labels, mask, token_norm):
        return ops.stop_gradient(self.loss(input_ids, position_ids, bias, labels, mask, token_norm))


class SFTStep(nn.Cell):
    """Loss, gradients, DP mean, clip by the global norm (TP-split parameters summed over TP), AdamW;
    returns (loss on this rank, gradient norm before clipping)."""

    def __init__(self, model: CausalLM, optimizer: AdamW, max_grad_norm: float):
        super().__init__(auto_prefix=False)
        self.loss = SFTLoss(model)
        self.optimizer = optimizer
        self.grad_fn = ms.value_and_grad(self.loss, None, optimizer.params)
        axes = split_axes(model, optimizer.params)
        self.dp_mean = DPGradMean(model.mesh, axes)
        self.norm_sum = SplitNormSum(axes, model.mesh)
        self.max_grad_norm = max_grad_norm

    @ms.jit
    def construct(self, input_ids, position_ids, bias, labels, mask, token_norm, lr, *router):
        loss, grads = self.grad_fn(input_ids, position_ids, bias, labels, mask, token_norm, *router)
        grads = self.dp_mean(grads)
        scale, grad_norm = clip_scale(grads, self.max_grad_norm, self.norm_sum)
        self.optimizer(grads, lr, scale)
        return loss, grad_norm


def sft_inputs(ids: np.ndarray, loss_mask: np.ndarray, lengths: np.ndarray) -> tuple:
    """Right-padded rows (N, W) with `lengths` real tokens -> (input_ids, position_ids, bias, labels, mask) of
    the next-token loss: inputs are tokens [0, W-1), labels [1, W), a label trained where the mask says."""
    present = (np.arange(ids.shape[1])[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    pos = np.maximum(np.cumsum(present[:, :-1], 1) - 1, 0)
    return (Tensor(ids[:, :-1].astype(np.int32)), Tensor(pos.astype(np.int32)), causal_bias(present[:, :-1]),
            Tensor(ids[:, 1:].astype(np.int32)), Tensor((loss_mask[:, 1:] * present[:, 1:]).astype(np.float32)))


def aux_loss_gradient(routing: ModelRouting, inputs: tuple, lengths: np.ndarray, coef: float, mesh) -> tuple:
    """(router_grad Tensor (N, T, E), the aux loss) for the rows of `inputs` (sft_inputs'): the routing pass's
    experts and probabilities over every real input token, counted over the global batch (trainer/aux_loss.py)."""
    ids, prob_sums = (x.asnumpy() for x in routing(*inputs[:4]))
    keep = np.arange(ids.shape[1])[None, :] < np.asarray(lengths)[:, None]
    grad, aux = router_grad(ids, prob_sums, keep, len(ids), prob_sums.shape[-1], coef, mesh)
    return Tensor(grad), aux


def sft_warmup(model: CausalLM, pretrain_ids: np.ndarray, loss_mask: np.ndarray, pad_token_id: int, steps: int,
               batch_size: int = 32, lr: float = 1e-3, seed: int = 0,
               log: Optional[Callable[[str], None]] = print) -> List[float]:
    """Single-process SFT for `steps` updates (no aux loss: the demo's warm-up); returns the loss per step.
    Sequences are trimmed to the longest real length in the table so the compiled graph is as small as the data
    allows."""
    real = (pretrain_ids != pad_token_id) | (loss_mask == 1)
    width = int(real.any(0).nonzero()[0].max()) + 2
    ids, mask = pretrain_ids[:, :width], loss_mask[:, :width]
    lengths = np.maximum(real[:, :width], mask).astype(np.int64).cumsum(1).argmax(1) + 1
    optimizer = AdamW(list(model.trainable_params()), weight_decay=0.0)
    step_fn = SFTStep(model, optimizer, 1.0)
    rng = np.random.default_rng(seed)
    losses, t0 = [], time.time()
    for step in range(steps):
        rows = rng.choice(len(ids), batch_size, replace=len(ids) < batch_size)
        inputs = sft_inputs(ids[rows], mask[rows], lengths[rows])
        token_norm = Tensor(np.float32(max(float(inputs[-1].asnumpy().sum()), 1.0)))
        loss, _ = step_fn(*inputs, token_norm, Tensor(np.float32(lr_at(step, lr, steps // 10, steps))))
        losses.append(float(loss.asnumpy()))
        if log and (step + 1) % max(1, steps // 5) == 0:
            log(f"  sft step {step + 1}/{steps}: loss {np.mean(losses[-20:]):.3f} ({time.time() - t0:.0f} s)")
    return losses
