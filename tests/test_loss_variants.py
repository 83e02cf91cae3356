"""GRPO-family variants against numpy: GSPO, CISPO, KL-Cov, Clip-Cov, the 80/20 entropy mask and the advantage
estimators (values and gradients), their config fields, and the loss cell honouring them on a tiny model."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindrlhf.configs import ConfigError
from mindrlhf.configs.grpo_config import GRPOConfig
from mindrlhf.configs.grpo_load import load_grpo_config
from mindrlhf.trainer.grpo_math import (CovOptions, compute_advantages, group_advantages, grpo_loss, kl_cov_policy_loss,
                                        clip_cov_policy_loss, top_entropy_mask)

RS = np.random.RandomState(7)
N, R = 6, 5
LOGP = (-RS.rand(N, R) * 3).astype(np.float32)
OLD = (LOGP + RS.randn(N, R) * 0.25).astype(np.float32)
REF = (LOGP + RS.randn(N, R) * 0.3).astype(np.float32)
MASK = (np.arange(R)[None, :] < np.array([5, 3, 4, 1, 5, 2])[:, None]).astype(np.float32)
ADV = np.array([1.2, -0.7, 0.4, -1.5, 0.9, -0.2], np.float32)
ENT = (RS.rand(N, R) * 4).astype(np.float32)


def T(x):
    return Tensor(np.asarray(x, np.float32))


def loss_and_grad(mode, agg="token-mean", lo=0.2, hi=0.28, beta=0.0, q=1.0, cov=CovOptions(), logp=LOGP):
    """(loss, policy loss, clip_frac, d loss / d logp) of grpo_loss at the module's inputs."""
    def f(lp):
        loss, pg, _, clip = grpo_loss(lp, T(OLD), T(REF), T(ADV), T(MASK), lo, hi, beta, "k3", agg, R,
                                      loss_mode=mode, entropy=T(ENT), top_entropy_quantile=q, cov=cov)
        return loss, (pg, clip)
    (loss, (pg, clip)), grad = ms.value_and_grad(f, has_aux=True)(T(logp))
    return float(loss.asnumpy()), float(pg.asnumpy()), float(clip.asnumpy()), grad.asnumpy()


def finite_diff(fn, x, h=1e-5):
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += h
        down[idx] -= h
        g[idx] = (fn(up) - fn(down)) / (2 * h)
    return g


# ---- GSPO -------------------------------------------------------------------------------------------------
def np_gspo_objective(logp, lo, hi):
    """The GSPO paper's loss: -(1/N) sum_i min(s_i A_i, clip(s_i, 1-lo, 1+hi) A_i), s_i = exp(mean_t log r)."""
    lengths = MASK.sum(1)
    s = np.exp(((logp - OLD) * MASK).sum(1) / lengths)
    return -np.minimum(s * ADV, np.clip(s, 1 - lo, 1 + hi) * ADV).mean()


def test_gspo_ratio_is_the_geometric_mean_of_the_token_ratios():
    from mindrlhf.trainer.grpo_math import gspo_policy_loss
    pg, clipped = gspo_policy_loss(T(LOGP), T(OLD), T(ADV[:, None]), T(MASK), 10.0, 10.0, CovOptions())
    ratios = np.exp(LOGP.astype(np.float64) - OLD)
    geo = np.array([np.prod(ratios[i, MASK[i] > 0]) ** (1 / MASK[i].sum()) for i in range(N)])
    # unclipped (wide range): every token of sequence i carries -A_i s_i, padding included (the mask drops it)
    np.testing.assert_allclose(pg.asnumpy(), np.repeat((-ADV * geo)[:, None], R, 1), rtol=1e-5)
    assert clipped.asnumpy().sum() == 0
    assert np.ptp(geo) > 0.1                    # the sequences' ratios do differ


@pytest.mark.parametrize("lo,hi", [(10.0, 10.0), (0.03, 0.04), (3e-4, 4e-4)])
def test_gspo_loss_and_gradient_are_the_sequence_objectives(lo, hi):
    """GSPO-token under the sequence mean has the value and the gradient of GSPO's sequence-level objective
    (finite differences in float64), whichever sequences the clip catches."""
    loss, _, clip, grad = loss_and_grad("gspo", "seq-mean-token-mean", lo, hi)
    assert loss == pytest.approx(np_gspo_objective(LOGP, lo, hi), rel=1e-5)
    expected = finite_diff(lambda x: np_gspo_objective(x, lo, hi), LOGP)
    np.testing.assert_allclose(grad, expected, rtol=2e-3, atol=2e-6)
    assert np.all(grad[MASK == 0] == 0)
    # a whole sequence is clipped or not: its tokens' gradients are all zero or all non-zero
    nonzero = (np.abs(grad) > 0)[MASK > 0]
    per_seq = [set((np.abs(grad[i, MASK[i] > 0]) > 0).tolist()) for i in range(N)]
    assert all(len(s) == 1 for s in per_seq)
    assert (clip == 0) == nonzero.all()
    if lo < 1:
        assert 0 < clip < 1                     # tight ranges: some sequences clipped, some not


def test_gspo_differs_from_token_level_ppo():
    vanilla = loss_and_grad("vanilla", "seq-mean-token-mean", 10.0, 10.0)
    gspo = loss_and_grad("gspo", "seq-mean-token-mean", 10.0, 10.0)
    assert abs(vanilla[0] - gspo[0]) > 1e-3 and np.abs(vanilla[3] - gspo[3]).max() > 1e-3


# ---- CISPO ------------------------------------------------------------------------------------------------
def test_cispo_value_and_gradient_are_the_clipped_is_weight_times_advantage():
    hi = 0.1
    ratio = np.exp(LOGP.astype(np.float64) - OLD)
    w = np.minimum(ratio, 1 + hi)
    loss, pg, clip, grad = loss_and_grad("cispo", lo=0.2, hi=hi)
    n = MASK.sum()
    assert loss == pytest.approx((-w * ADV[:, None] * LOGP * MASK).sum() / n, rel=1e-5)
    # d/dlogp of -sg(w) A logp: -w A, nothing through w
    np.testing.assert_allclose(grad, -w * ADV[:, None] * MASK / n, rtol=1e-5, atol=1e-8)
    assert clip == pytest.approx(((ratio > 1 + hi) * MASK).sum() / n, abs=1e-7)
    on = MASK > 0
    # no lower clip: a ratio below 1 - 0.2 keeps its own weight; every token keeps a gradient, also those
    # PPO's clip would drop (ratio past 1 + hi with A > 0)
    assert (ratio[on] < 0.8).any() and (ratio[on] > 1 + hi).any()
    assert np.all(np.abs(grad[on]) > 0)
    ppo_grad = loss_and_grad("vanilla", lo=0.2, hi=hi)[3]
    dropped = on & (ratio > 1 + hi) & (ADV[:, None] > 0)
    assert dropped.any() and np.all(ppo_grad[dropped] == 0) and np.all(grad[dropped] != 0)


# ---- KL-Cov / Clip-Cov ------------------------------------------------------------------------------------
def np_covariance():
    on = MASK > 0
    a = np.broadcast_to(ADV[:, None], LOGP.shape).astype(np.float64)
    return (a - a[on].mean()) * (LOGP - LOGP[on].mean())


def test_kl_cov_penalises_exactly_the_top_covariance_tokens():
    cov = CovOptions(kl_cov_ratio=0.17, ppo_kl_coef=0.7)
    on = MASK > 0
    c = np_covariance()
    k = max(1, int(0.17 * on.sum()))            # 20 tokens -> floor(3.4) = 3
    assert k == 3
    chosen = np.zeros_like(MASK)
    flat = np.flatnonzero(on)
    chosen.flat[flat[np.argsort(-c[on])[:k]]] = 1
    log_ratio = LOGP.astype(np.float64) - OLD
    per_token = -ADV[:, None] * np.exp(log_ratio) + chosen * 0.7 * np.abs(log_ratio)
    n = MASK.sum()
    loss, _, frac, grad = loss_and_grad("kl_cov", cov=cov)
    assert loss == pytest.approx((per_token * MASK).sum() / n, rel=1e-5)
    assert frac == pytest.approx(k / n, abs=1e-7)
    expected = (-ADV[:, None] * np.exp(log_ratio) + chosen * 0.7 * np.sign(log_ratio)) * MASK / n
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-8)
    _, flag = kl_cov_policy_loss(T(LOGP), T(OLD), T(ADV[:, None]), T(MASK), 0.2, 0.2, cov)
    np.testing.assert_array_equal(flag.asnumpy(), chosen)


def test_kl_cov_picks_one_token_at_least_and_exactly_k_on_ties():
    """All advantages equal: every covariance is 0 (a tie); still exactly max(1, floor(r n)) tokens."""
    for ratio, want in [(1e-4, 1), (0.5, 10), (0.33, 6)]:
        _, flag = kl_cov_policy_loss(T(LOGP), T(OLD), T(np.ones((N, 1))), T(MASK), 0.2, 0.2,
                                     CovOptions(kl_cov_ratio=ratio))
        f = flag.asnumpy()
        assert f.sum() == want and np.all(f[MASK == 0] == 0)


def test_clip_cov_cuts_the_gradient_of_a_random_share_of_eligible_tokens():
    cov = CovOptions(clip_cov_ratio=0.1, clip_cov_lb=0.0, clip_cov_ub=1.0)
    lo, hi = 0.2, 0.2
    ratio = np.exp(LOGP.astype(np.float64) - OLD)
    a = ADV[:, None]
    clipped = -a * np.clip(ratio, 1 - lo, 1 + hi) > -a * ratio
    c = np_covariance()
    eligible = (MASK > 0) & ~clipped & (c > 0.0) & (c < 1.0)
    assert eligible.sum() > 2 and clipped[MASK > 0].any()
    k = max(1, int(0.1 * MASK.sum()))           # 2 of the eligible ones
    ppo_grad = loss_and_grad("vanilla", lo=lo, hi=hi)[3]
    picks = set()
    for _ in range(6):
        def f(lp):
            pg, flag = clip_cov_policy_loss(lp, T(OLD), T(a), T(MASK), lo, hi, cov)
            return (pg * T(MASK)).sum() / float(MASK.sum()), flag
        (_, flag), grad = ms.value_and_grad(f, has_aux=True)(T(LOGP))
        flag, grad = flag.asnumpy() > 0, grad.asnumpy()
        assert flag.sum() == k and np.all(eligible[flag])
        assert np.all(grad[flag] == 0)
        np.testing.assert_allclose(grad[~flag], ppo_grad[~flag], rtol=1e-5, atol=1e-8)
        picks.add(tuple(np.flatnonzero(flag)))
    assert len(picks) > 1                       # the choice is random


# ---- 80/20: policy gradient on the top-entropy tokens -----------------------------------------------------
@pytest.mark.parametrize("q", [1.0, 0.5, 0.2, 0.0])
def test_top_entropy_mask_is_the_quantile_of_the_masked_tokens(q):
    on = MASK > 0
    threshold = np.quantile(ENT[on].astype(np.float64), 1 - q)     # linear interpolation, as torch.quantile
    expected = ((ENT >= threshold) & on).astype(np.float32)
    got = top_entropy_mask(T(ENT), T(MASK), q).asnumpy()
    np.testing.assert_array_equal(got, expected)
    if q == 1.0:
        np.testing.assert_array_equal(got, MASK)
    if q == 0.0:
        assert got.sum() == 1 and ENT[got > 0][0] == ENT[on].max()
    if q == 0.2:
        assert got.sum() == 4                   # threshold at sorted position (1 - 0.2) x 19 = 15.2: 16..19


def test_top_entropy_quantile_masks_the_policy_term_only():
    q, beta = 0.2, 0.1
    keep = top_entropy_mask(T(ENT), T(MASK), q).asnumpy()
    ratio = np.exp(LOGP.astype(np.float64) - OLD)
    a = ADV[:, None]
    pg_tok = np.maximum(-a * ratio, -a * np.clip(ratio, 0.8, 1.28))
    log_r = REF.astype(np.float64) - LOGP
    kl_tok = np.exp(log_r) - log_r - 1
    n = MASK.sum()
    loss, pg, _, grad = loss_and_grad("vanilla", beta=beta, q=q)
    assert pg == pytest.approx((pg_tok * keep).sum() / n, rel=1e-5)          # denominator: every token
    assert loss == pytest.approx((pg_tok * keep).sum() / n + beta * (kl_tok * MASK).sum() / n, rel=1e-5)
    # dropped tokens: only the KL's gradient, beta (1 - ref/pi) / n
    dropped = (MASK > 0) & (keep == 0)
    np.testing.assert_allclose(grad[dropped], (beta * (1 - np.exp(log_r)) / n)[dropped], rtol=1e-4, atol=1e-8)
    assert loss_and_grad("vanilla", beta=beta, q=1.0)[1] != pytest.approx(pg)


# ---- advantage estimators (host) --------------------------------------------------------------------------
REWARDS = np.array([1.0, 0.0, 0.5, 0.0, 2.0, 2.0, 1.0, 3.0, 0.0, 0.0, 0.0, 1.0], np.float32)
TOKENS = np.array([4, 1, 3, 2, 5, 5, 1, 2, 3, 4, 5, 6])
RESP_MASK = (np.arange(6)[None, :] < TOKENS[:, None]).astype(np.float32)


def test_grpo_estimator_is_group_advantages():
    for norm in (True, False):
        np.testing.assert_array_equal(compute_advantages("grpo", REWARDS, 4, norm),
                                      group_advantages(REWARDS, 4, norm))


def test_rloo_is_reward_minus_the_mean_of_the_other_samples():
    g = 4
    by_hand = np.array([REWARDS[i] - np.delete(REWARDS[(i // g) * g:(i // g + 1) * g], i % g).mean()
                        for i in range(len(REWARDS))])
    np.testing.assert_allclose(compute_advantages("rloo", REWARDS, g), by_hand, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(compute_advantages("rloo", REWARDS, g, norm_std=False), by_hand, rtol=1e-6, atol=1e-7)
    assert by_hand[0] == pytest.approx(1.0 - 0.5 / 3)


def np_token_whiten(values, tokens):
    """verl's masked_whiten on per-token copies: every token of a sequence carries its value."""
    per_token = np.repeat(np.asarray(values, np.float64), tokens)
    return (values - per_token.mean()) / np.sqrt(per_token.var(ddof=1) + 1e-8)


def test_reinforce_plus_plus_whitens_the_rewards_over_the_batch():
    got = compute_advantages("reinforce_plus_plus", REWARDS, 4, response_mask=RESP_MASK)
    np.testing.assert_allclose(got, np_token_whiten(REWARDS, TOKENS), rtol=1e-5)
    # token-weighted: mean 0 and unit variance over the tokens, not over the sequences
    per_token = np.repeat(got.astype(np.float64), TOKENS)
    assert per_token.mean() == pytest.approx(0, abs=1e-6) and per_token.std(ddof=1) == pytest.approx(1, rel=1e-5)
    assert got.astype(np.float64).mean() != pytest.approx(0, abs=1e-3)
    # no mask: every sequence once
    r = REWARDS.astype(np.float64)
    np.testing.assert_allclose(compute_advantages("reinforce_plus_plus", REWARDS, 4),
                               (r - r.mean()) / np.sqrt(r.var(ddof=1) + 1e-8), rtol=1e-5)


def test_reinforce_plus_plus_baseline_centres_per_group_then_whitens_over_the_batch():
    centred = (REWARDS.reshape(-1, 4) - REWARDS.reshape(-1, 4).mean(1, keepdims=True)).reshape(-1)
    got = compute_advantages("reinforce_plus_plus_baseline", REWARDS, 4, response_mask=RESP_MASK)
    np.testing.assert_allclose(got, np_token_whiten(centred, TOKENS), rtol=1e-5, atol=1e-6)
    # the batch's std, not each group's: differs from GRPO's per-group scaling
    assert np.abs(got - group_advantages(REWARDS, 4)).max() > 0.1


def test_advantage_entry_point_rejects_bad_input():
    with pytest.raises(ConfigError, match="rl.adv_estimator: expected one of"):
        compute_advantages("ppo", REWARDS, 4)
    with pytest.raises(ConfigError, match="groups of num_generations=5"):
        compute_advantages("rloo", REWARDS, 5)
    assert np.all(compute_advantages("reinforce_plus_plus", np.ones(8), 4) == 0)      # no spread: no signal
    assert np.all(compute_advantages("reinforce_plus_plus", REWARDS, 4, response_mask=0 * RESP_MASK) == 0)


# ---- config -----------------------------------------------------------------------------------------------
def test_defaults_keep_todays_grpo():
    rl = GRPOConfig().rl
    assert (rl.adv_estimator, rl.loss_mode, rl.top_entropy_quantile) == ("grpo", "vanilla", 1.0)


def test_gspo_takes_the_papers_clip_range_and_sequence_mean_unless_set():
    cfg = load_grpo_config(None, {"loss_mode": "gspo"})
    assert (cfg.rl.clip_low, cfg.rl.clip_high, cfg.rl.loss_agg) == (3e-4, 4e-4, "seq-mean-token-mean")
    assert any("rl.clip_low: 0.0003" in d for d in cfg.derived)
    cfg = load_grpo_config(None, {"loss_mode": "gspo", "clip_high": 1e-3, "loss_agg": "token-mean"})
    assert (cfg.rl.clip_low, cfg.rl.clip_high, cfg.rl.loss_agg) == (3e-4, 1e-3, "token-mean")
    cfg = load_grpo_config(None, {"loss_mode": "cispo"})
    assert (cfg.rl.clip_low, cfg.rl.clip_high, cfg.derived) == (0.2, 0.2, [])


@pytest.mark.parametrize("extra,pattern", [
    ({"top_entropy_quantile": 1.5}, r"rl.top_entropy_quantile: expected in \[0, 1\]"),
    ({"top_entropy_quantile": -0.1}, r"rl.top_entropy_quantile: expected in \[0, 1\]"),
    ({"kl_cov_ratio": 0.0}, r"rl.kl_cov_ratio: expected a share of tokens in \(0, 1\]"),
    ({"clip_cov_ratio": 2.0}, r"rl.clip_cov_ratio: expected a share of tokens in \(0, 1\]"),
    ({"ppo_kl_coef": -1.0}, "rl.ppo_kl_coef: expected >= 0"),
    ({"clip_cov_lb": 5.0}, "rl.clip_cov_lb/clip_cov_ub: expected lb < ub"),
    ({"loss_mode": "ppo"}, r"--loss_mode: expected one of \['vanilla', 'gspo'"),
    ({"adv_estimator": "gae"}, r"--adv_estimator: expected one of \['grpo', 'rloo'")])
def test_variant_config_errors(extra, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_grpo_config(None, extra)


def test_a_config_built_in_code_is_checked_against_the_choices_too():
    cfg = GRPOConfig()
    cfg.rl.loss_mode = "gspo_typo"
    with pytest.raises(ConfigError, match=r"rl.loss_mode: expected one of \['vanilla'"):
        cfg.validate()


# ---- the loss cell on a tiny model ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    """A 1-layer CausalLM and one mini-batch of [left-padded prompt | right-padded response] rows."""
    from mindrlhf.configs import ModelConfig
    from mindrlhf.models.padding import causal_bias, position_ids
    from mindrlhf.models.qwen2 import CausalLM
    model = CausalLM(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=48, vocab_size=64,
                                 seq_length=16))
    rng = np.random.RandomState(4)
    n, p, r = 4, 3, 5
    seq = rng.randint(3, 64, (n, p + r))
    full = np.concatenate([np.ones((n, p), np.int64), (np.arange(r)[None] < np.array([5, 2, 4, 3])[:, None])], 1)
    seq = seq * full
    inputs = [Tensor(seq[:, :-1].astype(np.int32)), Tensor(position_ids(full[:, :-1])),
              causal_bias(Tensor(full[:, :-1].astype(np.int32))), Tensor(seq[:, 1:].astype(np.int32))]
    mask = full[:, p:].astype(np.float32)
    logp, ent = model.token_logprobs(*inputs, r)
    logp, ent = logp.asnumpy(), ent.asnumpy()
    old = (logp + rng.normal(0, 0.3, logp.shape)).astype(np.float32)
    adv = np.array([1.0, -0.5, 0.7, -1.2], np.float32)
    return model, inputs, mask, logp, ent, old, adv, r


def _cell_loss(tiny, compiled=False, **rl_fields):
    from mindrlhf.trainer.update.loss import GRPOLossCell
    model, inputs, mask, logp, ent, old, adv, r = tiny
    rl = GRPOConfig().rl
    rl.clip_low, rl.clip_high, rl.beta, rl.loss_agg = 0.2, 0.28, 0.0, "token-mean"
    for k, v in rl_fields.items():
        setattr(rl, k, v)
    cell = GRPOLossCell(model, rl, r, 1.0)
    args = inputs + [Tensor(mask), Tensor(old), Tensor(old), Tensor(np.zeros_like(old)), Tensor(adv),
                     Tensor(np.float32(mask.sum()))]
    if compiled:
        (loss, aux), _ = ms.jit(ms.value_and_grad(cell, None, model.trainable_params(), has_aux=True))(*args)
    else:
        loss, aux = cell(*args)
    return float(loss.asnumpy()), float(aux[2].asnumpy())


@pytest.mark.parametrize("mode", ["vanilla", "gspo", "cispo", "kl_cov"])
def test_loss_cell_uses_the_configured_loss_mode(tiny, mode):
    """The cell's loss is grpo_loss of the chosen mode on the model's own log-probs, and the modes differ."""
    _, _, mask, logp, ent, old, adv, r = tiny
    cov = CovOptions(kl_cov_ratio=0.2)
    want = grpo_loss(T(logp), T(old), T(old), T(adv), T(mask), 0.2, 0.28, 0.0, "k3", "token-mean", r,
                     T(np.float32(mask.sum())), loss_mode=mode, cov=cov)[0]
    loss, _ = _cell_loss(tiny, loss_mode=mode, kl_cov_ratio=0.2)
    assert loss == pytest.approx(float(want.asnumpy()), rel=1e-5, abs=1e-6)
    if mode != "vanilla":
        assert abs(loss - _cell_loss(tiny)[0]) > 1e-3


def test_loss_cell_applies_the_top_entropy_quantile(tiny):
    _, _, mask, logp, ent, old, adv, r = tiny
    keep = top_entropy_mask(T(ent), T(mask), 0.2).asnumpy()
    assert 0 < keep.sum() < mask.sum()
    a = adv[:, None].astype(np.float64)
    ratio = np.exp(logp.astype(np.float64) - old)
    pg = np.maximum(-a * ratio, -a * np.clip(ratio, 0.8, 1.28))
    loss, _ = _cell_loss(tiny, top_entropy_quantile=0.2)
    assert loss == pytest.approx((pg * keep).sum() / mask.sum(), rel=1e-4, abs=1e-6)
    assert abs(loss - _cell_loss(tiny)[0]) > 1e-3


@pytest.mark.parametrize("fields", [dict(loss_mode="gspo", top_entropy_quantile=0.5), dict(loss_mode="cispo"),
                                    dict(loss_mode="kl_cov", kl_cov_ratio=0.2), dict(loss_mode="clip_cov")])
def test_loss_cell_compiles_each_variant(tiny, fields):
    """Under jit with gradients (as PolicyTrainStep and the pipeline's last stage run it) each variant compiles
    and gives the eager loss (clip_cov's random pick aside)."""
    loss, clip = _cell_loss(tiny, compiled=True, **fields)
    assert np.isfinite(loss) and 0 <= clip <= 1
    if fields["loss_mode"] != "clip_cov":
        assert loss == pytest.approx(_cell_loss(tiny, **fields)[0], rel=1e-5, abs=1e-6)
