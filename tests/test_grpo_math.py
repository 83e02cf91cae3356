"""GRPO math against hand-computed numpy values."""
import dataclasses

import numpy as np
import pytest
from mindspore import Tensor
from mindrlhf.configs import ConfigError

from mindrlhf.trainer.grpo_math import (LOSS_AGGREGATIONS, clipped_policy_loss, group_advantages, grpo_loss,
                                        informative_groups, kl_k1, kl_k2, kl_k3, overlong_penalty, tis_weights)

LOGP = np.array([[-1.0, -2.0, -0.5], [-0.3, -1.2, -4.0]], np.float32)
OLD = np.array([[-1.5, -1.5, -0.5], [-0.3, -2.0, -4.0]], np.float32)
REF = np.array([[-0.9, -2.5, -1.0], [-0.2, -1.0, -3.0]], np.float32)
MASK = np.array([[1, 1, 0], [1, 1, 1]], np.float32)
ADV = np.array([1.5, -0.5], np.float32)


def T(x):
    return Tensor(np.asarray(x, np.float32))


def test_group_advantages_std_and_dr_grpo():
    r = np.array([1, 0, 0, 1, 1, 1, 1, 1], np.float32)
    adv = group_advantages(r, 4)
    g = r[:4]
    expected = (g - g.mean()) / (g.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(adv[:4], expected, rtol=1e-6)
    assert np.all(adv[4:] == 0)          # all-equal group: no signal
    np.testing.assert_allclose(group_advantages(r, 4, norm_std=False)[:4], g - g.mean(), rtol=1e-6)
    with pytest.raises(ValueError, match="groups of num_generations=3"):
        group_advantages(r, 3)


def test_kl_estimators():
    np.testing.assert_allclose(kl_k1(T(LOGP), T(REF)).asnumpy(), LOGP - REF, rtol=1e-6)
    np.testing.assert_allclose(kl_k2(T(LOGP), T(REF)).asnumpy(), 0.5 * (LOGP - REF) ** 2, rtol=1e-6)
    log_r = REF - LOGP
    np.testing.assert_allclose(kl_k3(T(LOGP), T(REF)).asnumpy(), np.exp(log_r) - log_r - 1, rtol=1e-5, atol=1e-7)
    assert (kl_k3(T(LOGP), T(REF)).asnumpy() >= 0).all()
    assert np.allclose(kl_k3(T(LOGP), T(LOGP)).asnumpy(), 0)


def _np_clipped(lo, hi):
    ratio = np.exp(LOGP - OLD)
    a = ADV[:, None]
    return np.maximum(-a * ratio, -a * np.clip(ratio, 1 - lo, 1 + hi)), ratio


def test_clipped_loss_with_clip_higher():
    loss, clipped, ratio = clipped_policy_loss(T(LOGP), T(OLD), T(ADV), 0.2, 0.28)
    exp_loss, exp_ratio = _np_clipped(0.2, 0.28)
    np.testing.assert_allclose(loss.asnumpy(), exp_loss, rtol=1e-5)
    np.testing.assert_allclose(ratio.asnumpy(), exp_ratio, rtol=1e-5)
    # row 0 token 0: ratio e^0.5=1.65 > 1.28 with A>0 -> clipped; row 1 token 1: ratio e^0.8 with A<0 -> the
    # pessimistic unclipped branch stays active; row 0 token 1: ratio 0.61 with A>0 -> unclipped
    c = clipped.asnumpy()
    assert c[0, 0] == 1 and c[1, 1] == 0 and c[0, 1] == 0
    assert loss.asnumpy()[0, 0] == pytest.approx(-1.5 * 1.28)


@pytest.mark.parametrize("agg", list(LOSS_AGGREGATIONS))
def test_aggregations(agg):
    vals = np.array([[1.0, 2.0, 100.0], [3.0, 4.0, 5.0]], np.float32)
    got = float(LOSS_AGGREGATIONS[agg](T(vals), T(MASK), 4).asnumpy())
    expected = {"token-mean": (1 + 2 + 3 + 4 + 5) / 5,
                "seq-mean-token-mean": ((1 + 2) / 2 + (3 + 4 + 5) / 3) / 2,
                "seq-mean-token-sum-norm": ((1 + 2) / 4 + (3 + 4 + 5) / 4) / 2}[agg]
    assert got == pytest.approx(expected, rel=1e-6)


def test_total_loss_combines_policy_and_kl():
    loss, pg, kl, clip = grpo_loss(T(LOGP), T(OLD), T(REF), T(ADV), T(MASK), 0.2, 0.2, 0.1, "k3", "token-mean", 3)
    exp_pg, _ = _np_clipped(0.2, 0.2)
    exp_pg = (exp_pg * MASK).sum() / MASK.sum()
    log_r = REF - LOGP
    exp_kl = ((np.exp(log_r) - log_r - 1) * MASK).sum() / MASK.sum()
    assert float(pg.asnumpy()) == pytest.approx(exp_pg, rel=1e-5)
    assert float(kl.asnumpy()) == pytest.approx(exp_kl, rel=1e-5)
    assert float(loss.asnumpy()) == pytest.approx(exp_pg + 0.1 * exp_kl, rel=1e-5)


def test_first_update_has_ratio_one_no_clip_and_zero_kl():
    """On-policy first step (old = current, ref = current): ratio 1, no clipping, KL 0."""
    loss, pg, kl, clip = grpo_loss(T(LOGP), T(LOGP), T(LOGP), T(ADV), T(MASK), 0.2, 0.28, 0.04, "k3", "token-mean", 3)
    assert float(clip.asnumpy()) == 0 and float(kl.asnumpy()) == 0
    assert float(pg.asnumpy()) == pytest.approx(-(ADV[:, None] * MASK).sum() / MASK.sum(), rel=1e-6)


def test_token_mean_is_global_under_data_parallelism():
    """Two DP ranks with different token counts: the mean of their losses (what averaging gradients does)
    equals the token mean over the whole mini-batch once each rank divides by global tokens / dp."""
    from mindrlhf.trainer.grpo_math import agg_token_mean
    rs = np.random.RandomState(0)
    vals = rs.randn(4, 6).astype(np.float32)
    mask = np.zeros((4, 6), np.float32)
    mask[0, :6], mask[1, :1], mask[2, :2], mask[3, :2] = 1, 1, 1, 1     # 7 tokens vs 4
    whole = float((vals * mask).sum() / mask.sum())
    norm = T(np.float32(mask.sum() / 2))
    ranks = [float(agg_token_mean(T(vals[r]), T(mask[r]), 6, norm).asnumpy()) for r in (slice(0, 2), slice(2, 4))]
    assert np.mean(ranks) == pytest.approx(whole, rel=1e-6)
    local = [float(agg_token_mean(T(vals[r]), T(mask[r]), 6).asnumpy()) for r in (slice(0, 2), slice(2, 4))]
    assert abs(np.mean(local) - whole) > 1e-3          # the per-rank mean is a different loss


def test_global_mini_batches_are_the_same_rows_on_any_train_layout():
    """dp1 with mini-batch 8 and dp2 with mini-batch 4 update on the same 8 rows each time, and the
    token-mean's per-rank denominator is the global mini-batch's tokens / dp."""
    from types import SimpleNamespace
    from mindrlhf.trainer.step_geometry import StepGeometry
    one = StepGeometry.from_config(SimpleNamespace(batch_size=4, num_generations=4, mini_batch_size=8), 1, 1)
    two = StepGeometry.from_config(SimpleNamespace(batch_size=2, num_generations=4, mini_batch_size=4), 2, 2)
    assert one.minibatches == two.minibatches == 2
    rows_two = [two.rows_of(d).reshape(2, 4) for d in range(2)]
    for k in range(2):
        assert sorted(np.concatenate([r[k] for r in rows_two]).tolist()) == one.rows_of(0).reshape(2, 8)[k].tolist()
    mask = (np.arange(8)[None, :] < np.random.RandomState(0).randint(1, 9, (16, 1))).astype(np.int64)
    assert one.token_norms(mask).tolist() == [mask[:8].sum(), mask[8:].sum()]
    assert (two.token_norms(mask) * 2).tolist() == one.token_norms(mask).tolist()
    with pytest.raises(ConfigError, match="rl.mini_batch_size: 3 does not divide the 16"):
        StepGeometry.from_config(SimpleNamespace(batch_size=4, num_generations=4, mini_batch_size=3), 1, 1)


# ---- GRPO variants ---------------------------------------------------------------------------------------
def test_informative_groups():
    rewards = np.array([1, 0, 1, 0, 0, 0, 0.5, 0.5, 0.5000001, 2, 2, 2], np.float32)
    assert informative_groups(rewards, 3).tolist() == [True, False, True, False]
    # an all-equal group is exactly the one whose advantages are all zero
    adv = group_advantages(rewards, 3).reshape(4, 3)
    assert np.all(adv[[1, 3]] == 0) and np.all(np.abs(adv[[0, 2]]).max(1) > 0)


def test_overlong_penalty_is_daposs_linear_ramp():
    # max_tokens 10, buffer 4: no penalty up to 6 tokens, then -(len - 6) / 4 x factor, -factor at 10
    lengths = np.array([1, 6, 7, 8, 10])
    np.testing.assert_allclose(overlong_penalty(lengths, 10, 4, 1.0), [0, 0, -0.25, -0.5, -1.0], atol=1e-7)
    np.testing.assert_allclose(overlong_penalty(lengths, 10, 4, 0.5), [0, 0, -0.125, -0.25, -0.5], atol=1e-7)


def test_tis_weights_and_weighted_policy_loss():
    rollout = np.array([[-1.2, -1.0, -0.5], [-1.0, -2.0, -3.0]], np.float32)
    w, ratio = tis_weights(T(OLD), T(rollout), 1.5)
    exp_ratio = np.exp(OLD - rollout)
    np.testing.assert_allclose(ratio.asnumpy(), exp_ratio, rtol=1e-5)
    np.testing.assert_allclose(w.asnumpy(), np.minimum(exp_ratio, 1.5), rtol=1e-5)
    assert (exp_ratio > 1.5).sum() == 1       # the cap binds on one token
    loss, pg, kl, _ = grpo_loss(T(LOGP), T(OLD), T(REF), T(ADV), T(MASK), 0.2, 0.2, 0.1, "k3", "token-mean", 3,
                                pg_weight=w)
    exp_pg, _ = _np_clipped(0.2, 0.2)
    exp_pg = (exp_pg * np.minimum(exp_ratio, 1.5) * MASK).sum() / MASK.sum()
    log_r = REF - LOGP
    exp_kl = ((np.exp(log_r) - log_r - 1) * MASK).sum() / MASK.sum()     # the KL term is not reweighted
    # float32 exp on both sides: ~4e-7 apart; a weight on the KL or a missing cap moves these by > 1e-2
    assert float(pg.asnumpy()) == pytest.approx(exp_pg, abs=1e-6)
    assert float(loss.asnumpy()) == pytest.approx(exp_pg + 0.1 * exp_kl, abs=1e-6)


def test_registries_hold_exactly_the_names_a_config_may_choose():
    """The registries fill at definition (decorators); the config's choices must name the same functions."""
    from mindrlhf.configs import choices
    from mindrlhf.configs.grpo_config import RLConfig
    from mindrlhf.trainer.grpo_math import (ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES, cispo_policy_loss,
                                            register_advantage, register_kl, register_policy_loss, rloo_advantage)
    assert tuple(KL_ESTIMATORS) == choices.KL_ESTIMATORS and KL_ESTIMATORS["k3"] is kl_k3
    assert tuple(LOSS_AGGREGATIONS) == choices.LOSS_AGGREGATIONS
    assert tuple(POLICY_LOSSES) == choices.POLICY_LOSSES and POLICY_LOSSES["cispo"] is cispo_policy_loss
    assert tuple(ADVANTAGE_ESTIMATORS) == choices.ADVANTAGE_ESTIMATORS
    assert ADVANTAGE_ESTIMATORS["rloo"] is rloo_advantage
    fields = {f.name: f for f in dataclasses.fields(RLConfig)}
    for name, registry in [("kl_estimator", KL_ESTIMATORS), ("loss_agg", LOSS_AGGREGATIONS),
                           ("loss_mode", POLICY_LOSSES), ("adv_estimator", ADVANTAGE_ESTIMATORS)]:
        assert tuple(fields[name].metadata["choices"]) == tuple(registry) and fields[name].default in registry
    for register, name in [(register_kl, "k1"), (register_policy_loss, "gspo"), (register_advantage, "grpo")]:
        with pytest.raises(ValueError, match="registered twice"):
            register(name)(lambda *a: None)
