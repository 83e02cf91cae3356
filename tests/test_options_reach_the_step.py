"""Every option of the advantage and the loss reaches the trainer's step: each test fails when the trainer
ignores the option (passes a default instead, or computes the advantage another way). Values come from the
run's own files (the experience file's advantages and mask, the rollout log's rewards) against numpy
written here, not from grpo_math."""
import numpy as np
import pytest

import mindspore.dataset as ds
from grpo_helpers import grpo_overrides, make_grpo_assets
from mindrlhf.configs.grpo_load import load_grpo_config
from mindrlhf.trainer.grpo_trainer import GRPOTrainer

G = 4


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_grpo_assets(str(tmp_path_factory.mktemp("options")))


def _rows(path):
    return list(ds.MindDataset(str(path), shuffle=False).create_dict_iterator(output_numpy=True, num_epochs=1))


def _one_step(assets, tmp_path, **options):
    exp, log = tmp_path / "exp.mindrecord", tmp_path / "log.mindrecord"
    cfg = load_grpo_config(None, grpo_overrides(assets, str(tmp_path), total_steps=1, beta=0.05,
                                                verifier_function="digit_fraction_test", temperature=0.9,
                                                save_data_file=str(exp), rollout_log_file=str(log), **options))
    metrics = GRPOTrainer(cfg, log=lambda *a: None).fit()[0]
    experience = _rows(exp)
    rewards = np.array([float(r["reward"]) for r in _rows(log)], np.float64)
    advantages = np.array([float(r["advantages"][0]) for r in experience])
    tokens = np.array([r["responses_mask"].sum() for r in experience], np.float64)
    return metrics, rewards, advantages, tokens


def _whitened(values, weights):
    mean = np.sum(weights * values) / weights.sum()
    var = np.sum(weights * (values - mean) ** 2) / (weights.sum() - 1)
    return (values - mean) / np.sqrt(var + 1e-8)


def _expected(name, rewards, tokens):
    r = rewards.reshape(-1, G)
    if name == "grpo_std":
        return ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)
    if name == "grpo_no_std":
        return (r - r.mean(1, keepdims=True)).reshape(-1)
    if name == "rloo":          # each sample against the mean of the other G - 1 of its prompt
        others = (r.sum(1, keepdims=True) - r) / (G - 1)
        return (r - others).reshape(-1)
    if name == "reinforce_plus_plus":
        return _whitened(rewards, tokens)
    if name == "reinforce_plus_plus_baseline":
        return _whitened((r - r.mean(1, keepdims=True)).reshape(-1), tokens)
    raise AssertionError(name)


ESTIMATORS = {"grpo_std": dict(adv_estimator="grpo", adv_norm_std=True),
              "grpo_no_std": dict(adv_estimator="grpo", adv_norm_std=False),
              "rloo": dict(adv_estimator="rloo"),
              "reinforce_plus_plus": dict(adv_estimator="reinforce_plus_plus"),
              "reinforce_plus_plus_baseline": dict(adv_estimator="reinforce_plus_plus_baseline")}


# ~11 s each: grpo_std stays in the default run, the other estimators are -m slow (their math against numpy:
# tests/test_loss_variants.py)
@pytest.mark.parametrize("name", [n if n == "grpo_std" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(ESTIMATORS)])
def test_the_step_trains_on_the_configured_advantage(assets, tmp_path, name):
    _, rewards, advantages, tokens = _one_step(assets, tmp_path, **ESTIMATORS[name])
    assert len(rewards) == 2 * G and np.ptp(rewards) > 0          # some signal, so estimators differ
    np.testing.assert_allclose(advantages, _expected(name, rewards, tokens), rtol=1e-5, atol=1e-6)
    others = [n for n in ESTIMATORS if n != name]                 # the test tells the options apart
    assert all(np.abs(_expected(o, rewards, tokens) - advantages).max() > 1e-3 for o in others), name


@pytest.mark.slow       # ~55 s; each loss mode's math against numpy: tests/test_loss_variants.py
def test_the_loss_mode_and_entropy_quantile_reach_the_step(assets, tmp_path):
    """Same rollout (same seed and weights), other loss: a trainer that dropped the option would give the
    vanilla numbers. Two passes over the rollout, so the second update sees ratios away from 1 (at ratio 1
    and equal lengths GSPO's and CISPO's gradients are the PPO surrogate's)."""
    runs = {}
    for name, options in {"vanilla": {}, "cispo": dict(loss_mode="cispo"), "gspo": dict(loss_mode="gspo"),
                          "top_entropy": dict(top_entropy_quantile=0.2)}.items():
        runs[name], rewards, _, _ = _one_step(assets, tmp_path / name, num_iterations=2, **options)
        runs[name]["rewards"] = rewards
    vanilla = runs["vanilla"]
    assert runs["gspo"]["clip_frac"] > vanilla["clip_frac"]        # GSPO clips at 3e-4 / 4e-4, PPO at 0.2
    for name, metrics in runs.items():
        np.testing.assert_array_equal(metrics["rewards"], vanilla["rewards"])   # the same samples
        if name != "vanilla":
            assert abs(metrics["grad_norm"] - vanilla["grad_norm"]) > 1e-4 * vanilla["grad_norm"], name
            assert abs(metrics["pg_loss"] - vanilla["pg_loss"]) > 1e-6, name


@pytest.mark.parametrize("engine", ["one_graph", pytest.param("layerwise", marks=pytest.mark.slow)])
def test_the_entropy_bonus_reaches_the_step(assets, tmp_path, engine):
    """rl.entropy_coeff on the same rollout (same seed and weights): the step's loss is the bonus-free one minus
    entropy_coeff x its token-mean entropy (one update: the same policy and tokens), and the gradient differs; each
    update engine (the layerwise one computes the head in its own graph)."""
    layerwise = dict(layerwise_update=True) if engine == "layerwise" else {}
    plain, rewards, _, _ = _one_step(assets, tmp_path / "plain", **layerwise)
    bonus, rewards_b, _, _ = _one_step(assets, tmp_path / "bonus", entropy_coeff=0.5, **layerwise)
    np.testing.assert_array_equal(rewards, rewards_b)                     # the same samples
    assert plain["entropy"] == pytest.approx(bonus["entropy"], rel=1e-6) and plain["entropy"] > 0.1
    assert bonus["loss"] == pytest.approx(plain["loss"] - 0.5 * plain["entropy"], rel=1e-5, abs=1e-6)
    assert bonus["pg_loss"] == pytest.approx(plain["pg_loss"], rel=1e-6, abs=1e-7)
    assert abs(bonus["grad_norm"] - plain["grad_norm"]) > 1e-3 * plain["grad_norm"]
