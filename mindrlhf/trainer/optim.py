"""AdamW (decoupled weight decay, bias-corrected as torch.optim.AdamW), LR schedule and grad clipping.

MindSpore's nn.AdamWeightDecay omits Adam's bias correction, so its first steps are ~3x larger than
torch's AdamW; RL fine-tuning at small learning rates is sensitive to exactly those steps, hence our own.
The learning rate is an input of each step (host computes the schedule), so resuming needs no state
beyond the step count kept in the optimizer.
"""
from __future__ import annotations

import math
import re

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindrlhf.utils.params import hold_reads
from mindrlhf.utils.subgraph_reuse import new_key, reused


def no_decay(name: str) -> bool:
    """Norm weights and biases are not decayed."""
    return name.endswith(".bias") or "norm" in name.rsplit(".", 2)[-2]


def zeros_like(params, prefix: str) -> ms.ParameterTuple:
    """Zero-filled Parameters shaped like `params`, named prefix.<name> (as ParameterTuple.clone names them),
    filled now: MindSpore's lazy "zeros" initializer fills a Parameter at its first graph call, at ~2.5x the
    cost of filling it here (1.5 vs 0.6 s per GB on CPU, mostly page faults either way), and the optimizer's
    moments and gradient buffers are 3x the model: ~2 s of a 135M model's first update."""
    return ms.ParameterTuple([Parameter(ops.zeros(p.shape, p.dtype), name=f"{prefix}.{p.name}",
                                        requires_grad=p.requires_grad) for p in params])


_CALL_DEPTH = [1000]         # MindSpore's graph call-depth limit (its default), raised, never lowered, by AdamW


def allow_call_depth(params: int):
    """The per-parameter update loop unrolls at compile time into nested calls, about two per parameter (the
    micro-batched apply's buffer loop adds more): a 30-layer model with LoRA on every linear layer (420
    adapter tensors) passed MindSpore 2.10's default limit of 1000 ("Exceed function call depth limit"), as
    would a full model of ~450 tensors. The limit becomes 4 per parameter + 500 when that is more."""
    need = 4 * params + 500
    if need > _CALL_DEPTH[0]:
        ms.set_recursion_limit(need)
        _CALL_DEPTH[0] = need


class _FusedAdam(nn.Cell):
    """One float32 parameter's update (AdamW below), compiled once per (shape, decay) of one optimizer and reused
    by its parameters of that shape (utils/subgraph_reuse.py): a 30-layer model's 272 updates compile as 9."""

    @reused
    def __init__(self, decay: float, beta1: float, beta2: float, reuse_key: str):
        super().__init__(auto_prefix=False)
        self.decay, self.beta1, self.beta2, self.reuse_key = decay, beta1, beta2, reuse_key
        self.adam = ops.Adam()

    def construct(self, param, exp_avg, exp_avg_sq, grad, grad_scale, lr, fused_lr, fused_eps, done):
        g = ops.cast(ops.depend(grad, done), ms.float32) * grad_scale
        if self.decay:
            g = ops.depend(g, ops.assign(param, param * (1.0 - lr * self.decay)))
        return self.adam(param, exp_avg, exp_avg_sq, 0.0, 0.0, fused_lr, self.beta1, self.beta2, fused_eps, g)


class _CompositeAdam(nn.Cell):
    """The update of a parameter that is not float32, in float32 (parameter-free: called with the parameter)."""

    def __init__(self, beta1: float, beta2: float, eps: float):
        super().__init__(auto_prefix=False)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps

    def construct(self, p, exp_avg, exp_avg_sq, g, lr, bc1, sqrt_bc2, decay):
        m = exp_avg * self.beta1 + g * (1.0 - self.beta1)
        v = exp_avg_sq * self.beta2 + ops.square(g) * (1.0 - self.beta2)
        # the moments keep the parameter's dtype (as torch.optim.AdamW's do); the update uses them in float32
        ops.assign(exp_avg, ops.cast(m, exp_avg.dtype))
        ops.assign(exp_avg_sq, ops.cast(v, exp_avg_sq.dtype))
        p32 = ops.cast(p, ms.float32) * (1.0 - lr * decay)
        # multiply by reciprocals: MindSpore 2.10's CPU Div kernel keeps ~4x its output size in memory
        # outside the pool for the graph's lifetime
        update = (m * (1.0 / bc1)) * ops.reciprocal(ops.sqrt(v) * (1.0 / sqrt_bc2) + self.eps)
        return ops.assign(p, ops.cast(p32 - lr * update, p.dtype))


class AdamW(nn.Cell):
    """torch.optim.AdamW's update. float32 parameters go through MindSpore's fused, in-place Adam
    kernel (ApplyAdam) with the bias correction folded into its per-step arguments: beta powers 0 (so it
    applies lr as given), lr' = lr * sqrt(bc2) / bc1 and eps' = eps * sqrt(bc2) (algebraically torch's update;
    matches it to ~1e-6 in tests); decayed parameters are first scaled by 1 - lr * decay, as torch does. That
    avoids ~10 parameter-sized temporaries per parameter in the memory pool, which on CPU never shrinks,
    and the CPU ApplyAdam kernel is vectorized, faster than MindSpore's AdamWeightDecay and torch's AdamW
    (docs/BENCHMARKS.md, "Measurements behind code choices"). Other dtypes take the composite path in float32.
    """

    def __init__(self, params, weight_decay=0.0, beta1=0.9, beta2=0.999, eps=1e-8):
        super().__init__(auto_prefix=False)
        allow_call_depth(len(params))
        self.params = ms.ParameterTuple(params)
        self.exp_avg = zeros_like(self.params, "adam_m")
        self.exp_avg_sq = zeros_like(self.params, "adam_v")
        self.decay = tuple(0.0 if no_decay(p.name) else float(weight_decay) for p in params)
        # which parameters take the fused kernel, fixed here (an `if` per parameter inside the graph's loop
        # would compile into a branch per parameter)
        self.fused_ids = tuple(i for i, p in enumerate(params) if p.dtype == ms.float32)
        self.composite_ids = tuple(i for i, p in enumerate(params) if p.dtype != ms.float32)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        cells = {}      # (shape, decay) -> its update cell; fused[i]: parameter i's (None: composite path)
        for i in self.fused_ids:
            key = (tuple(params[i].shape), self.decay[i])
            if key not in cells:
                cells[key] = _FusedAdam(self.decay[i], beta1, beta2, new_key(f"adamw {key}"))
        fused = tuple(cells.get((tuple(p.shape), d)) if p.dtype == ms.float32 else None
                      for p, d in zip(params, self.decay))
        object.__setattr__(self, "fused", fused)       # parameter-free cells, kept out of the cell tree
        object.__setattr__(self, "composite", _CompositeAdam(beta1, beta2, eps))
        object.__setattr__(self, "_host", None)         # update_each's compiled calls, built on first use
        self.step = Parameter(Tensor(np.array([0], np.int32)), name="adam_step", requires_grad=False)

    def construct(self, grads, lr, grad_scale=1.0):
        """One update inside the caller's graph; gradients are multiplied by `grad_scale` (the clipping factor)
        as they are read."""
        step, fused_lr, fused_eps, bc1, sqrt_bc2 = self.advance(lr)
        # one parameter at a time (control dependency on the previous update): otherwise the graph may run
        # every parameter's update at once and hold all their temporaries in the pool together
        done = step
        for i in self.fused_ids:
            done = self.fused[i](self.params[i], self.exp_avg[i], self.exp_avg_sq[i], grads[i], grad_scale, lr,
                                 fused_lr, fused_eps, done)
        for i in self.composite_ids:
            g = ops.cast(ops.depend(grads[i], done), ms.float32) * grad_scale
            done = self.composite(self.params[i], self.exp_avg[i], self.exp_avg_sq[i], g, lr, bc1, sqrt_bc2,
                                  self.decay[i])
        return step

    def advance(self, lr):
        """The step counter moved on by one; (step, the fused kernel's lr and eps, bias corrections)."""
        step = self.step + 1
        ops.assign(self.step, step)
        # 0-d scalars: a (1,)-shaped factor would make every update below a broadcasting kernel, which on
        # CPU holds several parameter-sized buffers outside the memory pool (see tp_layers.expand_as)
        t = ops.cast(ops.reshape(step, ()), ms.float32)
        bc1 = 1.0 - ops.pow(self.beta1, t)
        sqrt_bc2 = ops.sqrt(1.0 - ops.pow(self.beta2, t))
        return step, lr * sqrt_bc2 / bc1, self.eps * sqrt_bc2, bc1, sqrt_bc2

    def update_each(self, grads, lr, grad_scale):
        """The same update driven from the host, one call per block of parameters (block_runs): each block's
        graph takes the parameters, moments and gradients as inputs, so the 30 layers of a model share one
        compiled graph, where one graph holding all the updates compiles in time proportional to the parameter
        count (docs/BENCHMARKS.md, "Measurements behind code choices"). `grads` are gradient buffers
        (Parameters), each zeroed once used."""
        if self._host is None:
            self._host = _HostCalls(self)
        scalars = self._host.advance(lr)
        for ids, call in self._host.calls:
            call(aliases(self.params, ids), aliases(self.exp_avg, ids), aliases(self.exp_avg_sq, ids),
                 aliases(grads, ids), grad_scale, lr, *scalars)

    def state_parameters(self):
        return list(self.exp_avg) + list(self.exp_avg_sq) + [self.step]


def aliases(params, ids) -> tuple:
    """Tensors on the memory of params[i] for i in ids, to pass them to a graph that updates them in place:
    MindSpore compiles a jit graph again for every distinct Parameter among its inputs, but once per
    combination of shapes for Tensors (docs/BENCHMARKS.md, "Measurements behind code choices"). Taken at each
    call, so a buffer the swap schedule has replaced is never written through a stale alias. Mutable: a plain
    tuple of Tensors is taken as a constant (a graph per value)."""
    return ms.mutable(tuple(params[i].view(params[i].shape) for i in ids))


_BLOCK = re.compile(r"^(.*?\.\d+\.)")       # "model.layers.7." of "model.layers.7.attention.wq.weight"


def block_runs(names, ids) -> list:
    """`ids` (in order) cut into runs of successive ids whose names are in the same numbered block (a decoder
    layer); any other name is a run of its own. The blocks of a model have the same shapes, so a
    graph called per run compiles once for all of them."""
    runs, block = [], None
    for i in ids:
        m = _BLOCK.match(names[i])
        b = m.group(1) if m else None
        if runs and b is not None and b == block:
            runs[-1].append(i)
        else:
            runs.append([i])
        block = b
    return [tuple(r) for r in runs]


class _Advance(nn.Cell):
    def __init__(self, optimizer):
        super().__init__(auto_prefix=False)
        object.__setattr__(self, "optimizer", optimizer)
        hold_reads(self, [optimizer.step])

    @ms.jit
    def construct(self, lr):
        # a slice, not `_, ... =`: unpacking made MindSpore 2.10 warn that "side effect nodes were eliminated by
        # mistake" at compile time (the step's assign is kept either way: tests/test_optim.py)
        return self.optimizer.advance(lr)[1:]


class _BlockUpdate(nn.Cell):
    """The updates of one run of parameters (their moments and gradients given as inputs), each gradient buffer
    zeroed once used: one graph per run's (shape, decay, dtype)s."""

    def __init__(self, cells, decays, composite: _CompositeAdam):
        super().__init__(auto_prefix=False)
        object.__setattr__(self, "cells", cells)        # _FusedAdam, or None: the composite path
        object.__setattr__(self, "composite", composite)
        self.decays = decays

    @ms.jit
    def construct(self, params, exp_avg, exp_avg_sq, grads, grad_scale, lr, fused_lr, fused_eps, bc1, sqrt_bc2):
        done = lr
        for j in range(len(params)):
            if self.cells[j] is None:
                g = ops.cast(ops.depend(grads[j], done), ms.float32) * grad_scale
                done = self.composite(params[j], exp_avg[j], exp_avg_sq[j], g, lr, bc1, sqrt_bc2, self.decays[j])
            else:
                done = self.cells[j](params[j], exp_avg[j], exp_avg_sq[j], grads[j], grad_scale, lr, fused_lr,
                                     fused_eps, done)
            done = ops.assign(grads[j], ops.depend(ops.zeros_like(grads[j]), done))
        return done


class _HostCalls:
    """AdamW.update_each's graphs: the step advance, and one update graph per distinct run of parameters."""

    def __init__(self, o: AdamW):
        self.advance = _Advance(o)
        self.update = {}            # (shape, dtype, decay) of each parameter of a run -> its graph
        self.calls = []             # (ids of a run, its graph), in parameter order
        for ids in block_runs([p.name for p in o.params], range(len(o.params))):
            key = tuple((tuple(o.params[i].shape), o.params[i].dtype, o.decay[i]) for i in ids)
            if key not in self.update:
                self.update[key] = _BlockUpdate(tuple(o.fused[i] for i in ids), tuple(o.decay[i] for i in ids),
                                                o.composite)
            self.calls.append((ids, self.update[key]))


def lr_at(step: int, base_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0) -> float:
    """Linear warmup to base_lr, then cosine decay to min_lr at total_steps (step counts from 0)."""
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def mindrlhf_lr(step: int, lr: float, end_lr: float, warmup_steps: int, decay_steps: int,
                style: str = "cosine") -> float:
    """MindRLHF's `LearningRate` (MindSpore's WarmUpLR, then CosineDecayLR or PolynomialDecayLR, power 1):
    update t counts from 0; lr x t / warmup_steps while t < warmup_steps (so the first update has lr 0),
    else end_lr + (lr - end_lr) x d(p), p = min(t, decay_steps) / decay_steps, d = (1 + cos(pi p)) / 2 for
    cosine or 1 - p for polynomial. The decay is measured from t = 0, not from the end of the warmup."""
    if warmup_steps > 0 and step < warmup_steps:
        return lr * step / warmup_steps
    p = min(step, decay_steps) / decay_steps
    d = 0.5 * (1.0 + math.cos(math.pi * p)) if style == "cosine" else 1.0 - p
    return end_lr + (lr - end_lr) * d


def megatron_lr(step: int, lr: float, min_lr: float, warmup_steps: int, decay_steps: int,
                style: str = "linear") -> float:
    """Megatron's OptimizerParamScheduler (MindSpeed-RL's schedule), counted in updates from 0: lr x t /
    warmup_steps while t <= warmup_steps (so the first update has lr 0 when there is a warmup); then lr for
    constant, else min_lr + (lr - min_lr) x d(p) with p = (t - warmup_steps) / (decay_steps - warmup_steps),
    d = 1 - p (linear) or (1 + cos(pi p)) / 2 (cosine), and min_lr once t > decay_steps. Unlike
    mindrlhf_lr, the decay starts at the end of the warmup."""
    if warmup_steps > 0 and step <= warmup_steps:
        return lr * step / warmup_steps
    if style == "constant":
        return lr
    if step > decay_steps:
        return min_lr
    p = (step - warmup_steps) / (decay_steps - warmup_steps)
    d = 0.5 * (1.0 + math.cos(math.pi * p)) if style == "cosine" else 1.0 - p
    return min_lr + (lr - min_lr) * d


def scheduled_lr(step: int, optim, total_updates: int) -> float:
    """The learning rate of update `step` under OptimConfig `optim` (its lr_schedule decides)."""
    if optim.lr_schedule == "constant":      # transformers' constant_with_warmup: lr x t / warmup, then lr
        return optim.lr * step / optim.warmup_steps if step < optim.warmup_steps else optim.lr
    if optim.lr_schedule.startswith("megatron_"):
        return megatron_lr(step, optim.lr, optim.min_lr, optim.warmup_steps, optim.decay_steps or total_updates,
                           optim.lr_schedule[len("megatron_"):])
    if optim.lr_schedule.startswith("mindrlhf_"):
        return mindrlhf_lr(step, optim.lr, optim.min_lr, optim.warmup_steps, optim.decay_steps or total_updates,
                           optim.lr_schedule[len("mindrlhf_"):])
    return lr_at(step, optim.lr, optim.warmup_steps, total_updates, optim.min_lr)
