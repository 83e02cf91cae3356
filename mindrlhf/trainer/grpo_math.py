"""GRPO math as pure functions: advantages (numpy, on host), KL estimators, clipped policy loss and
loss aggregation (MindSpore ops, usable inside a jit-compiled train step). KL estimators and aggregations
register by name at their definition (`@register_kl`, `@register_aggregation`); the config's choices
(configs/choices.py) must name exactly the registered ones (tests/test_grpo_math.py checks), and tests
check each against hand-computed numpy values.

Shapes: N sequences (prompts x G samples, row i*G + j is sample j of prompt i), R response positions.
"""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import mindspore as ms
from mindspore import ops

from mindrlhf.configs.errors import ConfigError


# ---- advantages (host) --------------------------------------------------------------------------------
def group_advantages(rewards: np.ndarray, group_size: int, norm_std: bool = True, eps: float = 1e-6) -> np.ndarray:
    """rewards (N,) -> advantages (N,): reward minus its group's mean, divided by the group's std (GRPO)
    or not (Dr.GRPO, `norm_std=False`). A group whose rewards are all equal gets advantage 0."""
    r = np.asarray(rewards, np.float64)
    if r.size % group_size:
        raise ConfigError(f"{r.size} rewards do not split into groups of num_generations={group_size}")
    g = r.reshape(-1, group_size)
    centred = g - g.mean(1, keepdims=True)
    if norm_std:
        centred = centred / (g.std(1, ddof=1, keepdims=True) + eps) if group_size > 1 else centred
    return centred.reshape(-1).astype(np.float32)


def informative_groups(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """(groups,) bool: the groups whose rewards are not all equal (DAPO's dynamic sampling keeps these; an
    all-equal group has advantage 0 everywhere and gives no policy gradient)."""
    g = np.asarray(rewards, np.float64).reshape(-1, group_size)
    return g.max(1) > g.min(1)


def overlong_penalty(lengths: np.ndarray, max_tokens: int, buffer_len: int, factor: float = 1.0) -> np.ndarray:
    """DAPO's soft overlong punishment, added to the reward: 0 up to max_tokens - buffer_len tokens, then
    falling linearly to -factor at max_tokens (verl's overlong_buffer)."""
    expected = max_tokens - buffer_len
    exceed = np.asarray(lengths, np.float64) - expected
    return np.minimum(-exceed / buffer_len * factor, 0.0).astype(np.float32)


KL_ESTIMATORS: Dict[str, Callable] = {}
LOSS_AGGREGATIONS: Dict[str, Callable] = {}


def _registrar(registry: Dict[str, Callable], what: str):
    def register(name: str):
        def wrap(fn):
            if name in registry:
                raise ValueError(f"{what} {name!r} is registered twice")
            registry[name] = fn
            return fn
        return wrap
    return register


register_kl = _registrar(KL_ESTIMATORS, "KL estimator")
register_aggregation = _registrar(LOSS_AGGREGATIONS, "loss aggregation")


# ---- KL estimators: KL(pi || ref) per token, from samples of pi ---------------------------------------
@register_kl("k1")
def kl_k1(logp, ref_logp):
    return logp - ref_logp


@register_kl("k2")
def kl_k2(logp, ref_logp):
    return 0.5 * ops.square(logp - ref_logp)


@register_kl("k3")
def kl_k3(logp, ref_logp):
    """Schulman's unbiased, non-negative estimator: r - log r - 1 with r = ref/pi."""
    log_r = ref_logp - logp
    return ops.exp(log_r) - log_r - 1.0


# ---- aggregation of per-token values into one scalar --------------------------------------------------
# Under data parallelism each rank aggregates its share and the gradients are averaged over the DP ranks.
# The sequence means are exact that way (every rank holds as many sequences); the token mean is not, since
# ranks hold different numbers of tokens: `token_norm` = (tokens of the whole mini-batch on all DP ranks) /
# dp makes the DP average equal the global token mean, as DAPO defines it. None = this rank's own count.
@register_aggregation("token-mean")
def agg_token_mean(values, mask, max_len, token_norm=None):
    """Every token in the (global) mini-batch weighs the same (DAPO)."""
    denom = ops.maximum(ops.sum(mask), 1.0) if token_norm is None else token_norm
    return ops.sum(values * mask) / denom


@register_aggregation("seq-mean-token-mean")
def agg_seq_mean_token_mean(values, mask, max_len, token_norm=None):
    """Mean over sequences of each sequence's token mean (original GRPO)."""
    per_seq = ops.sum(values * mask, -1) / ops.maximum(ops.sum(mask, -1), 1.0)
    return ops.mean(per_seq)


@register_aggregation("seq-mean-token-sum-norm")
def agg_seq_mean_token_sum_norm(values, mask, max_len, token_norm=None):
    """Token sum divided by a fixed length, averaged over sequences (Dr.GRPO): no length bias."""
    return ops.mean(ops.sum(values * mask, -1) / max_len)


def clipped_policy_loss(logp, old_logp, advantages, clip_low: float, clip_high: float):
    """Per-token PPO/GRPO surrogate: max(-A r, -A clip(r, 1-low, 1+high)); returns (loss, clipped, ratio).

    logp/old_logp (N, R), advantages (N,). `clipped` is 1 where the clipped branch is the active one.
    """
    ratio = ops.exp(logp - old_logp)
    adv = ops.expand_dims(advantages, -1)
    unclipped = -adv * ratio
    clipped_val = -adv * ops.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = ops.maximum(unclipped, clipped_val)
    clipped = ops.cast(clipped_val > unclipped, ms.float32)
    return loss, clipped, ratio


def tis_weights(old_logp, rollout_logp, cap: float):
    """Truncated importance sampling (TIS) against a rollout/train mismatch: per token
    min(exp(train_old - rollout), cap), no gradient; returns (weight, ratio before the cap)."""
    ratio = ops.exp(ops.stop_gradient(old_logp) - rollout_logp)
    return ops.minimum(ratio, cap), ratio


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_low: float, clip_high: float, beta: float,
              kl_estimator: str, agg: str, max_len: int, token_norm=None, pg_weight=None):
    """Total loss and its parts: (loss, policy_loss, kl, clip_fraction), each a scalar (see agg_token_mean
    for `token_norm`). `pg_weight` (N, R) multiplies the per-token policy-gradient term (TIS), not the KL."""
    mask = ops.cast(mask, ms.float32)
    pg, clipped, _ = clipped_policy_loss(logp, old_logp, advantages, clip_low, clip_high)
    if pg_weight is not None:
        pg = pg * pg_weight
    aggregate = LOSS_AGGREGATIONS[agg]
    pg_loss = aggregate(pg, mask, max_len, token_norm)
    if beta > 0:
        kl = aggregate(KL_ESTIMATORS[kl_estimator](logp, ref_logp), mask, max_len, token_norm)
        loss = pg_loss + beta * kl
    else:
        kl = ops.zeros((), ms.float32)
        loss = pg_loss
    clip_frac = agg_token_mean(clipped, mask, max_len, token_norm)
    return loss, pg_loss, kl, clip_frac
