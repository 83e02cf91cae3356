"""GRPO math as pure functions: advantages (numpy, on host), KL estimators, policy losses and loss
aggregation (MindSpore ops, usable inside a jit-compiled train step). Advantage estimators, KL estimators,
policy losses and aggregations register by name at their definition (`@register_advantage`, `@register_kl`,
`@register_policy_loss`, `@register_aggregation`); the config's choices (configs/choices.py) must name exactly
the registered ones (tests/test_grpo_math.py checks), and tests check each against hand-computed numpy values
(tests/test_loss_variants.py for the GRPO-family variants).

Shapes: N sequences (prompts x G samples, row i*G + j is sample j of prompt i), R response positions.
"""
from __future__ import annotations

from typing import Callable, Dict, NamedTuple

import numpy as np
import mindspore as ms
from mindspore import ops

from mindrlhf.configs.errors import ConfigError


ADVANTAGE_ESTIMATORS: Dict[str, Callable] = {}
KL_ESTIMATORS: Dict[str, Callable] = {}
POLICY_LOSSES: Dict[str, Callable] = {}
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


register_advantage = _registrar(ADVANTAGE_ESTIMATORS, "advantage estimator")
register_kl = _registrar(KL_ESTIMATORS, "KL estimator")
register_policy_loss = _registrar(POLICY_LOSSES, "policy loss")
register_aggregation = _registrar(LOSS_AGGREGATIONS, "loss aggregation")


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


def _check_groups(rewards: np.ndarray, group_size: int) -> np.ndarray:
    r = np.asarray(rewards, np.float64).reshape(-1)
    if group_size < 1 or r.size % group_size:
        raise ConfigError(f"{r.size} rewards do not split into groups of num_generations={group_size}")
    return r


def _whiten(values: np.ndarray, weights: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """(values - mean) / sqrt(var + eps), mean and (Bessel-corrected) variance weighted by `weights`: with a
    sequence's token count as its weight this is verl's masked_whiten of the per-token copies of a
    per-sequence value. No weight at all: zeros."""
    total = weights.sum()
    if total <= 0:
        return np.zeros_like(values)
    mean = (weights * values).sum() / total
    var = (weights * (values - mean) ** 2).sum() / max(total - 1.0, 1.0)
    return (values - mean) / np.sqrt(var + eps)


def _batch_weights(n: int, response_mask) -> np.ndarray:
    """Whitening weights over the batch: each sequence's token count (every token one sample, as verl), or 1 per
    sequence without a mask."""
    if response_mask is None:
        return np.ones(n)
    m = np.asarray(response_mask, np.float64)
    if m.shape[0] != n:
        raise ValueError(f"response_mask has {m.shape[0]} rows for {n} rewards")
    return m.reshape(n, -1).sum(1)


@register_advantage("grpo")
def grpo_advantage(rewards, group_size, norm_std, response_mask):
    """GRPO (Shao et al. 2024) / Dr.GRPO: reward minus the group mean, over the group std if norm_std."""
    return group_advantages(rewards, group_size, norm_std)


@register_advantage("rloo")
def rloo_advantage(rewards, group_size, norm_std, response_mask):
    """RLOO (Ahmadian et al. 2024, arXiv 2402.14740): the baseline of a sample is the mean reward of the other
    G - 1 samples of its prompt, r_i - mean_{j!=i} r_j = G / (G - 1) x (r_i - group mean) (the scaling of verl's
    rloo). An unbiased baseline, so no std division (norm_std is not used); a group of 1 keeps its reward."""
    r = rewards.reshape(-1, group_size)
    if group_size == 1:
        return r.reshape(-1)
    return (group_size / (group_size - 1.0) * (r - r.mean(1, keepdims=True))).reshape(-1)


@register_advantage("reinforce_plus_plus")
def reinforce_pp_advantage(rewards, group_size, norm_std, response_mask):
    """REINFORCE++ (Hu 2025, arXiv 2501.03262) for an outcome reward: every token's return is the sequence's
    reward (gamma 1), whitened over the whole batch, no per-prompt baseline. The paper and verl (use_kl_in_reward)
    also fold a per-token KL penalty into that return; here the KL to the reference stays in the loss (rl.beta,
    rl.kl_estimator), so this is verl's reinforce_plus_plus with use_kl_in_reward=False and gamma=1."""
    return _whiten(rewards, _batch_weights(rewards.size, response_mask))


@register_advantage("reinforce_plus_plus_baseline")
def reinforce_pp_baseline_advantage(rewards, group_size, norm_std, response_mask):
    """REINFORCE++-baseline (Hu 2025, arXiv 2501.03262; verl's reinforce_plus_plus_baseline): reward minus its
    group's mean, then whitened over the whole batch (the batch std, not each group's, scales it)."""
    r = rewards.reshape(-1, group_size)
    centred = (r - r.mean(1, keepdims=True)).reshape(-1)
    return _whiten(centred, _batch_weights(rewards.size, response_mask))


def compute_advantages(name: str, rewards: np.ndarray, group_size: int, norm_std: bool = True,
                       response_mask=None) -> np.ndarray:
    """The trainer's one call: rewards (N,) of the whole step, rows i*G + j -> advantages (N,) float32 by the
    estimator `name` (rl.adv_estimator). `response_mask` (N, R), the tokens that train: the batch-whitening
    estimators weight each sequence by its token count, as verl's token-level whitening does (None: every
    sequence once; a row with no token then still counts). `norm_std` is rl.adv_norm_std (grpo only)."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ConfigError(f"rl.adv_estimator: expected one of {list(ADVANTAGE_ESTIMATORS)}, got {name!r}")
    r = _check_groups(rewards, group_size)
    out = ADVANTAGE_ESTIMATORS[name](r, group_size, norm_std, response_mask)
    return np.asarray(out, np.float64).astype(np.float32)




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


# ---- policy losses: per-token surrogate of the policy-gradient term -----------------------------------
# Each takes logp/old_logp/mask (N, R), advantages (N, 1), the clip ranges and CovOptions, and returns
# (per-token loss, flag): `flag` is 1 on the tokens the variant's clip (or selection) acted on, reported as
# clip_frac. They run inside the compiled train step: no host work, static shapes.
class CovOptions(NamedTuple):
    """KL-Cov / Clip-Cov knobs (Cui et al. 2025, arXiv 2505.22617), verl's actor.policy_loss names and defaults."""
    kl_cov_ratio: float = 2e-4
    ppo_kl_coef: float = 1.0
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0


def _ppo_clip(ratio, adv, clip_low: float, clip_high: float):
    """max(-A r, -A clip(r, 1-low, 1+high)) and where the clipped branch is the active one."""
    unclipped = -adv * ratio
    clipped_val = -adv * ops.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return ops.maximum(unclipped, clipped_val), ops.cast(clipped_val > unclipped, ms.float32)


def clipped_policy_loss(logp, old_logp, advantages, clip_low: float, clip_high: float):
    """Per-token PPO/GRPO surrogate: max(-A r, -A clip(r, 1-low, 1+high)); returns (loss, clipped, ratio).

    logp/old_logp (N, R), advantages (N,). `clipped` is 1 where the clipped branch is the active one.
    """
    ratio = ops.exp(logp - old_logp)
    loss, clipped = _ppo_clip(ratio, ops.expand_dims(advantages, -1), clip_low, clip_high)
    return loss, clipped, ratio


@register_policy_loss("vanilla")
def vanilla_policy_loss(logp, old_logp, adv, mask, clip_low, clip_high, cov):
    """PPO's clipped surrogate on per-token ratios (GRPO, DAPO's clip-higher when clip_high > clip_low)."""
    return _ppo_clip(ops.exp(logp - old_logp), adv, clip_low, clip_high)


def sequence_log_ratio(logp, old_logp, mask):
    """(N, 1): the mean over a response's tokens of log pi - log pi_old, the log of GSPO's s_i (the geometric
    mean of the token ratios)."""
    lengths = ops.maximum(ops.sum(mask, -1, keepdim=True), 1.0)
    return ops.sum((logp - old_logp) * mask, -1, keepdim=True) / lengths


@register_policy_loss("gspo")
def gspo_policy_loss(logp, old_logp, adv, mask, clip_low, clip_high, cov):
    """GSPO (Zheng et al. 2025, arXiv 2507.18071): one ratio per sequence, s_i = exp(mean_t log pi/pi_old), and
    the PPO clip on it, so a sequence is clipped whole (the paper's ranges are tiny, 3e-4 / 4e-4). Written as
    the paper's GSPO-token, s_i,t = sg[s_i] pi(y_t) / sg[pi(y_t)]: the value is s_i on every token, the
    gradient of token t is s_i dlog pi(y_t); under seq-mean-token-mean (the paper's sequence mean) that is
    GSPO's gradient exactly, since A is per sequence."""
    log_s = ops.stop_gradient(sequence_log_ratio(logp, old_logp, mask))
    ratio = ops.exp(log_s + logp - ops.stop_gradient(logp))
    return _ppo_clip(ratio, adv, clip_low, clip_high)


@register_policy_loss("cispo")
def cispo_policy_loss(logp, old_logp, adv, mask, clip_low, clip_high, cov):
    """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(min(r, 1 + clip_high)) A log pi on every token. The IS weight is
    clipped, not the update, so no token loses its gradient (PPO's clip drops the tokens past the range).
    Upper bound only, as TRL's cispo (whose epsilon_high is the cap itself: TRL 5.0 = clip_high 4.0 here) and
    verl's CISPO example (its clip at 1 - clip_ratio_low is off there: clip_ratio_low 10); the paper's formula
    has a lower bound 1 - eps_low too, not offered here.
    The loss value is A-weighted log-likelihood, not a ratio; only its gradient compares with the others."""
    ratio = ops.exp(logp - old_logp)
    cap = 1.0 + clip_high
    weight = ops.stop_gradient(ops.minimum(ratio, cap))
    return -weight * adv * logp, ops.cast(ratio > cap, ms.float32)


def _token_covariance(adv, logp, mask):
    """Per token (A - mean A)(log pi - mean log pi) over the masked tokens, no gradient: how much a token
    moves the policy's entropy (Cui et al. 2025)."""
    a = ops.broadcast_to(adv, logp.shape)
    lp = ops.stop_gradient(logp)
    n = ops.maximum(ops.sum(mask), 1.0)
    return (a - ops.sum(a * mask) / n) * (lp - ops.sum(lp * mask) / n)


def _top_share(score, eligible, share: float, count):
    """(N, R) 0/1 on the max(1, floor(share x count)) eligible entries of largest score (all eligible ones if
    fewer): exactly that many, ties broken by position. Sorting keeps the count a tensor (static shapes)."""
    flat = ops.reshape(ops.where(eligible > 0, score, ops.full_like(score, -3.0e38)), (-1,))
    _, order = ops.sort(flat, descending=True)
    rank = ops.argsort(ops.cast(order, ms.float32))        # each entry's place in the descending order
    k = ops.maximum(ops.floor(share * count), 1.0)
    chosen = ops.cast(ops.cast(rank, ms.float32) < k, ms.float32)
    return ops.reshape(chosen, score.shape) * eligible


@register_policy_loss("kl_cov")
def kl_cov_policy_loss(logp, old_logp, adv, mask, clip_low, clip_high, cov):
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617; verl's kl_cov): no ratio clip; the kl_cov_ratio share of the
    tokens with the largest covariance of log pi and A get ppo_kl_coef |log pi - log pi_old| added, which holds
    back the tokens that collapse entropy fastest."""
    log_ratio = logp - old_logp
    chosen = _top_share(_token_covariance(adv, logp, mask), mask, cov.kl_cov_ratio, ops.sum(mask))
    return -adv * ops.exp(log_ratio) + chosen * cov.ppo_kl_coef * ops.abs(log_ratio), chosen


@register_policy_loss("clip_cov")
def clip_cov_policy_loss(logp, old_logp, adv, mask, clip_low, clip_high, cov):
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617; verl's clip_cov): the PPO clip, and a random clip_cov_ratio
    share of the tokens (of all masked ones) chosen among those not clipped already whose covariance of log pi
    and A lies in (clip_cov_lb, clip_cov_ub) loses its gradient."""
    loss, clipped = _ppo_clip(ops.exp(logp - old_logp), adv, clip_low, clip_high)
    c = _token_covariance(adv, logp, mask)
    eligible = mask * (1.0 - clipped) * ops.cast(c > cov.clip_cov_lb, ms.float32) * \
        ops.cast(c < cov.clip_cov_ub, ms.float32)
    chosen = _top_share(ops.rand(logp.shape), eligible, cov.clip_cov_ratio, ops.sum(mask))
    return loss * (1.0 - chosen), chosen


def top_entropy_mask(entropy, mask, quantile: float):
    """80/20 rule (Wang et al. 2025, arXiv 2506.01939; TRL's top_entropy_quantile): 1 on the masked tokens whose
    entropy is at least the (1 - quantile) quantile of the masked tokens' entropies (linear interpolation, as
    numpy and torch), else 0. quantile 0 keeps the highest-entropy token(s). The quantile is over the tokens
    given: in the train step, one micro-batch on one rank."""
    m = ops.cast(mask, ms.float32)
    ent = ops.stop_gradient(entropy)
    flat = ops.reshape(ops.where(m > 0, ent, ops.full_like(ent, 3.0e38)), (-1,))
    ascending, _ = ops.sort(flat)
    last = ops.maximum(ops.sum(m) - 1.0, 0.0)
    pos = (1.0 - quantile) * last
    lo = ops.floor(pos)
    hi = ops.minimum(lo + 1.0, last)
    v_lo = ops.gather(ascending, ops.cast(lo, ms.int32), 0)
    v_hi = ops.gather(ascending, ops.cast(hi, ms.int32), 0)
    threshold = v_lo + (v_hi - v_lo) * (pos - lo)
    return ops.cast(ent >= threshold, ms.float32) * m


def tis_weights(old_logp, rollout_logp, cap: float):
    """Truncated importance sampling (TIS) against a rollout/train mismatch: per token
    min(exp(train_old - rollout), cap), no gradient; returns (weight, ratio before the cap)."""
    ratio = ops.exp(ops.stop_gradient(old_logp) - rollout_logp)
    return ops.minimum(ratio, cap), ratio


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_low: float, clip_high: float, beta: float,
              kl_estimator: str, agg: str, max_len: int, token_norm=None, pg_weight=None, loss_mode: str = "vanilla",
              entropy=None, top_entropy_quantile: float = 1.0, cov: CovOptions = CovOptions(),
              entropy_coeff: float = 0.0):
    """Total loss and its parts: (loss, policy_loss, kl, clip_fraction), each a scalar (see agg_token_mean
    for `token_norm`). `advantages` (N,) per sequence, or (N, R) per token (packed rows, trainer/packing.py).
    The policy term is POLICY_LOSSES[loss_mode]; `pg_weight` (N, R) multiplies it (TIS),
    and with top_entropy_quantile < 1 only the tokens of highest `entropy` (N, R) keep it (top_entropy_mask;
    the aggregation still counts every masked token, as TRL). Neither touches the KL term. `entropy_coeff` != 0
    subtracts that times the aggregated `entropy` (verl's and MindSpeed-RL's entropy bonus; `entropy` must then
    carry its gradient)."""
    mask = ops.cast(mask, ms.float32)
    adv = advantages if advantages.ndim == 2 else ops.expand_dims(advantages, -1)
    pg, clipped = POLICY_LOSSES[loss_mode](logp, old_logp, adv, mask, clip_low, clip_high, cov)
    if pg_weight is not None:
        pg = pg * pg_weight
    if top_entropy_quantile < 1.0:
        pg = pg * top_entropy_mask(entropy, mask, top_entropy_quantile)
    aggregate = LOSS_AGGREGATIONS[agg]
    pg_loss = aggregate(pg, mask, max_len, token_norm)
    if beta > 0:
        kl = aggregate(KL_ESTIMATORS[kl_estimator](logp, ref_logp), mask, max_len, token_norm)
        loss = pg_loss + beta * kl
    else:
        kl = ops.zeros((), ms.float32)
        loss = pg_loss
    if entropy_coeff != 0:
        loss = loss - entropy_coeff * aggregate(entropy, mask, max_len, token_norm)
    clip_frac = agg_token_mean(clipped, mask, max_len, token_norm)
    return loss, pg_loss, kl, clip_frac
