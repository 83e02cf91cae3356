"""AdamW (decoupled weight decay, bias-corrected as torch.optim.AdamW), LR schedule and grad clipping.

MindSpore's nn.AdamWeightDecay omits Adam's bias correction, so its first steps are ~3x larger than
torch's AdamW; RL fine-tuning at small learning rates is sensitive to exactly those steps, hence our own.
The learning rate is an input of each step (host computes the schedule), so resuming needs no state
beyond the step count kept in the optimizer.
"""
from __future__ import annotations

import math

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops


def no_decay(name: str) -> bool:
    """Norm weights and biases are not decayed."""
    return name.endswith(".bias") or "norm" in name.rsplit(".", 2)[-2]


class AdamW(nn.Cell):
    def __init__(self, params, weight_decay=0.0, beta1=0.9, beta2=0.999, eps=1e-8):
        super().__init__(auto_prefix=False)
        self.params = ms.ParameterTuple(params)
        self.exp_avg = self.params.clone(prefix="adam_m", init="zeros")
        self.exp_avg_sq = self.params.clone(prefix="adam_v", init="zeros")
        self.decay = tuple(0.0 if no_decay(p.name) else float(weight_decay) for p in params)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.step = Parameter(Tensor(np.array([0], np.int32)), name="adam_step", requires_grad=False)

    def construct(self, grads, lr):
        step = self.step + 1
        ops.assign(self.step, step)
        # a 0-d scalar: a (1,)-shaped factor would make every update below a broadcasting kernel, which on
        # CPU holds several parameter-sized buffers outside the memory pool (see tp_layers.expand_as)
        t = ops.cast(ops.reshape(step, ()), ms.float32)
        inv_bc1 = 1.0 / (1.0 - ops.pow(self.beta1, t))
        inv_bc2 = 1.0 / (1.0 - ops.pow(self.beta2, t))
        for i in range(len(self.params)):
            p, g = self.params[i], ops.cast(grads[i], ms.float32)
            m = self.exp_avg[i] * self.beta1 + g * (1.0 - self.beta1)
            v = self.exp_avg_sq[i] * self.beta2 + ops.square(g) * (1.0 - self.beta2)
            ops.assign(self.exp_avg[i], m)
            ops.assign(self.exp_avg_sq[i], v)
            p32 = ops.cast(p, ms.float32)
            p32 = p32 * (1.0 - lr * self.decay[i])
            # multiply by reciprocals: MindSpore 2.10's CPU Div kernel keeps ~4x its output size in memory
            # outside the pool for the graph's lifetime (2.4 GB for a 32000 x 512 AdamW pair, measured)
            update = (m * inv_bc1) * ops.reciprocal(ops.sqrt(v * inv_bc2) + self.eps)
            ops.assign(p, ops.cast(p32 - lr * update, p.dtype))
        return step

    def state_parameters(self):
        return list(self.exp_avg) + list(self.exp_avg_sq) + [self.step]


def lr_at(step: int, base_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0) -> float:
    """Linear warmup to base_lr, then cosine decay to min_lr at total_steps (step counts from 0)."""
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def clip_by_global_norm(grads, max_norm: float, norm_reduce=None):
    """(clipped grads, total norm). `norm_reduce` sums squared norms across TP ranks for split params."""
    sq = [ops.sum(ops.square(ops.cast(g, ms.float32))) for g in grads]
    total_sq = ops.addn(sq) if norm_reduce is None else norm_reduce(sq)
    norm = ops.sqrt(total_sq)
    if max_norm <= 0:
        return grads, norm
    scale = ops.minimum(max_norm / (norm + 1e-6), 1.0)
    return tuple(g * ops.cast(scale, g.dtype) for g in grads), norm
