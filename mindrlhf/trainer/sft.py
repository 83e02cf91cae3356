"""Supervised warm-up on MindRecord `pretrain_ids`/`loss_mask` (teaches the answer format before GRPO)."""
from __future__ import annotations

import time
from typing import Callable, List, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindrlhf.models.padding import causal_bias

from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.trainer.optim import AdamW, lr_at
from mindrlhf.trainer.update.grad_norm import clip_scale


class _SFTLoss(nn.Cell):
    def __init__(self, model: CausalLM):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, input_ids, position_ids, bias, labels, mask):
        logp, _ = self.model.token_logprobs(input_ids, position_ids, bias, labels)
        return -ops.sum(logp * mask) / ops.maximum(ops.sum(mask), 1.0)


class _SFTStep(nn.Cell):
    def __init__(self, model: CausalLM, optimizer: AdamW, max_grad_norm: float):
        super().__init__(auto_prefix=False)
        self.loss = _SFTLoss(model)
        self.optimizer = optimizer
        self.grad_fn = ms.value_and_grad(self.loss, None, optimizer.params)
        self.max_grad_norm = max_grad_norm

    @ms.jit
    def construct(self, input_ids, position_ids, bias, labels, mask, lr):
        loss, grads = self.grad_fn(input_ids, position_ids, bias, labels, mask)
        scale = clip_scale(grads, self.max_grad_norm)[0]
        self.optimizer(grads, lr, scale)
        return loss


def sft_warmup(model: CausalLM, pretrain_ids: np.ndarray, loss_mask: np.ndarray, pad_token_id: int, steps: int,
               batch_size: int = 32, lr: float = 1e-3, seed: int = 0,
               log: Optional[Callable[[str], None]] = print) -> List[float]:
    """Single-process SFT for `steps` updates; returns the loss per step. Sequences are trimmed to the
    longest real length in the table so the compiled graph is as small as the data allows."""
    real = (pretrain_ids != pad_token_id) | (loss_mask == 1)
    width = int(real.any(0).nonzero()[0].max()) + 2
    ids, mask = pretrain_ids[:, :width], loss_mask[:, :width]
    attn = np.maximum(real[:, :width], mask).astype(np.int32)
    optimizer = AdamW(list(model.trainable_params()), weight_decay=0.0)
    step_fn = _SFTStep(model, optimizer, 1.0)
    rng = np.random.default_rng(seed)
    losses, t0 = [], time.time()
    for step in range(steps):
        rows = rng.choice(len(ids), batch_size, replace=len(ids) < batch_size)
        x, m, a = ids[rows], mask[rows], attn[rows]
        pos = np.maximum(np.cumsum(a[:, :-1], 1) - 1, 0)
        loss = step_fn(Tensor(x[:, :-1].astype(np.int32)), Tensor(pos.astype(np.int32)),
                       causal_bias(a[:, :-1]), Tensor(x[:, 1:].astype(np.int32)),
                       Tensor(m[:, 1:].astype(np.float32)), Tensor(np.float32(lr_at(step, lr, steps // 10, steps))))
        losses.append(float(loss.asnumpy()))
        if log and (step + 1) % max(1, steps // 5) == 0:
            log(f"  sft step {step + 1}/{steps}: loss {np.mean(losses[-20:]):.3f} ({time.time() - t0:.0f} s)")
    return losses
