"""DAPO's dynamic sampling and overlong shaping, truncated-completion masking and TIS, in the GRPO loop (one
process; tests/test_layout_invariance.py runs them on 1 and 2 ranks)."""
import numpy as np
import pytest

import mindspore.dataset as ds
from grpo_helpers import digit_fraction, grpo_overrides, make_grpo_assets, model_yaml
from mindrlhf.configs import ConfigError
from mindrlhf.configs.grpo_load import load_grpo_config
from mindrlhf.reward.verifiers import register_verifier
from mindrlhf.trainer.grpo_trainer import GRPOTrainer


@register_verifier("half_constant_test")
def half_constant(completion, solution):
    """Constant within the groups of prompts whose answer is odd (no signal there); dense elsewhere."""
    return 0.5 if int(solution) % 2 else sum(c.isdigit() for c in completion) / max(1, len(completion))


_SIGNAL = {}                                           # the one solution per step whose group carries signal


@register_verifier("one_group_test")
def one_group(completion, solution):
    """Distinct texts score apart in the chosen prompt's group (a sum of code points: a random model's
    completions differ); every other group gets 0.5 each, so it has no signal."""
    return sum(map(ord, completion)) % 101 / 100 if solution == _SIGNAL.get("solution") else 0.5


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_grpo_assets(str(tmp_path_factory.mktemp("variants")))


def _trainer(assets, save_dir, **extra):
    return GRPOTrainer(load_grpo_config(None, grpo_overrides(assets, str(save_dir), **extra)), log=lambda *a: None)


def _rows(path):
    return list(ds.MindDataset(str(path), shuffle=False).create_dict_iterator(output_numpy=True, num_epochs=1))


def _record_rounds(trainer):
    """Keep every generation round (a ScoredBatch) as the trainer makes it."""
    seen = []
    real = trainer._generate_round

    def wrapped(phase, round_index):
        out = real(phase, round_index)
        seen.append(out)
        return out

    trainer._generate_round = wrapped
    return seen


def test_dynamic_sampling_keeps_the_first_informative_groups_and_never_trains_on_others(assets, tmp_path):
    exp = tmp_path / "exp.mindrecord"
    trainer = _trainer(assets, tmp_path, total_steps=3, dynamic_sampling=True, max_num_gen_batches=6,
                       verifier_function="half_constant_test", save_data_file=str(exp))
    seen = _record_rounds(trainer)
    target, g = 2, 4                                   # batch_size 2 prompts x 1 replica, 4 samples each
    extra_rounds = 0
    for _ in range(3):
        seen.clear()
        m = trainer.train_one_step()
        # the groups the numpy rule picks: informative ones (rewards not all equal), in generation order
        rewards = np.concatenate([r.rewards for r in seen]).reshape(-1, g)
        informative = np.flatnonzero(rewards.max(1) > rewards.min(1))
        assert m["dynamic_sampling/rounds"] == len(seen) and m["dynamic_sampling/kept_groups"] == min(target, len(
            informative)) and m["dynamic_sampling/kept_groups"] + m["dynamic_sampling/masked_groups"] == target
        assert m["zero_std_groups_frac"] == pytest.approx(1 - len(informative) / len(rewards))
        extra_rounds += len(seen) - 1
        rows = _rows(exp)
        assert len(rows) == target * g
        # a short step fills up with the first dropped groups; the batch keeps round order either way
        dropped = np.flatnonzero(rewards.max(1) == rewards.min(1))
        chosen = np.sort(np.concatenate([informative, dropped])[:target])
        ids = np.concatenate([r.samples.response_ids for r in seen])
        for k, grp in enumerate(chosen):
            trained = rows[k * g:(k + 1) * g]
            np.testing.assert_array_equal(np.stack([r["prompt_completion_ids"][-ids.shape[1]:] for r in trained]),
                                          ids[grp * g:(grp + 1) * g])
            if grp in informative:
                assert max(abs(float(r["advantages"][0])) for r in trained) > 0
            else:                                      # a filler group: no loss at all
                assert sum(r["responses_mask"].sum() for r in trained) == 0
    assert extra_rounds > 0                            # the filter did drop groups and sample more


@pytest.mark.slow       # ~10 s
def test_a_short_step_tops_up_with_masked_groups_that_the_update_ignores(assets, tmp_path):
    """One round (max_num_gen_batches 1) with one informative group of two: the other group fills the batch
    with its loss masked out. The experience file shows the mask, and the update ignores that group: the
    same step re-run with the filler's completions, masks and rewards replaced gives the same loss, gradient
    norm and weights, bit for bit."""
    from mindrlhf.utils.params import param_to_numpy, write_param
    exp = tmp_path / "exp.mindrecord"
    trainer = _trainer(assets, tmp_path, total_steps=1, dynamic_sampling=True, max_num_gen_batches=1,
                       verifier_function="one_group_test", save_data_file=str(exp))
    g, draw, collect = 4, trainer.dataset.next_global_batch, trainer.collect

    def drawing():                                     # the step's second prompt is the informative one
        batch = draw()
        assert len(set(batch["solution"].tolist())) == 2
        _SIGNAL["solution"] = str(batch["solution"][1])
        return batch

    held = []

    def collecting(phase):
        held.append(collect(phase))
        return held[-1]

    trainer.dataset.next_global_batch, trainer.collect = drawing, collecting
    state = trainer.policy.trainable_params() + trainer.optimizer.state_parameters()
    start = {p.name: param_to_numpy(p) for p in state}
    first = trainer.train_one_step()
    assert first["dynamic_sampling/rounds"] == 1 and first["dynamic_sampling/kept_groups"] == 1
    assert first["dynamic_sampling/masked_groups"] == 1 and first["zero_std_groups_frac"] == 0.5
    batch, stats = held[0]
    np.testing.assert_array_equal(batch.group_mask, [False, True])
    rewards = batch.rewards.reshape(2, g)
    assert (rewards[0] == 0.5).all() and len(set(rewards[1].tolist())) == g
    mask = np.stack([r["responses_mask"] for r in _rows(exp)])          # over [prompt | response]
    width = batch.samples.response_mask.shape[1]
    assert mask[:g].sum() == 0 and batch.samples.response_mask[:g].sum() > 0
    np.testing.assert_array_equal(mask[g:, -width:], batch.samples.response_mask[g:])
    after = {p.name: param_to_numpy(p) for p in state}
    assert any(not np.array_equal(after[k], v) for k, v in start.items())

    for p in state:                                    # back to before the step; the filler group replaced
        write_param(p, start[p.name])
    trainer.step = 0
    rng = np.random.default_rng(0)
    s = batch.samples
    swapped = type(s)(**{k: v.copy() for k, v in s.fields().items()})
    swapped.response_ids[:g] = rng.integers(3, 300, swapped.response_ids[:g].shape)
    swapped.response_mask[:g] = np.arange(s.response_mask.shape[1]) < 3
    swapped.rollout_logp[:g] = -rng.uniform(0, 5, swapped.rollout_logp[:g].shape)
    other = type(batch)(swapped, np.concatenate([[0.0, 1.0, 0.3, 0.7], batch.rewards[g:]]).astype(np.float32),
                        batch.scores, batch.texts, batch.solutions, batch.group_mask)
    trainer.collect = lambda phase: (phase("rollout", lambda: other), stats)      # the step's timings need one
    second = trainer.train_one_step()
    differ = [k for k in ("loss", "pg_loss", "entropy", "clip_frac", "grad_norm") if second[k] != first[k]]
    assert differ + [p.name for p in state if not np.array_equal(param_to_numpy(p), after[p.name])] == []


def test_a_step_with_no_informative_group_skips_its_update(assets, tmp_path):
    trainer = _trainer(assets, tmp_path, total_steps=1, dynamic_sampling=True, max_num_gen_batches=2,
                       verifier_function="format_reward")          # a random model never writes the format: all 0
    before = {p.name: p.asnumpy().copy() for p in trainer.policy.trainable_params()}
    m = trainer.train_one_step()
    assert m["dynamic_sampling/skipped_update"] == 1 and m["dynamic_sampling/kept_groups"] == 0
    assert m["dynamic_sampling/rounds"] == 2 and m["zero_std_groups_frac"] == 1.0
    assert all(np.array_equal(p.asnumpy(), before[p.name]) for p in trainer.policy.trainable_params())


def test_overlong_penalty_and_truncated_completions(assets, tmp_path):
    exp, log = tmp_path / "exp.mindrecord", tmp_path / "log.mindrecord"
    ragged = model_yaml(str(tmp_path / "m.yaml"), eos_token_id=[2] + list(range(200, 260)))   # many EOS ids
    trainer = _trainer(assets, tmp_path, sft_path_train=ragged, total_steps=1, overlong_buffer_len=4,
                       overlong_penalty_factor=0.5,
                       mask_truncated_completions=True, verifier_function="digit_fraction_test",
                       save_data_file=str(exp), rollout_log_file=str(log))
    seen = _record_rounds(trainer)
    history = trainer.fit()
    assert "tis_ratio_mean" not in history[0]          # TIS off: its statistics are not logged
    samples, texts = seen[0].samples, seen[0].texts
    lengths = samples.response_mask.sum(1)
    penalty = np.minimum(0.0, -(lengths - (8 - 4)) / 4 * 0.5)          # max_tokens 8: ramp over tokens 5..8
    expected = np.array([digit_fraction(t, "") for t in texts]) + penalty
    logged = np.array([float(r["reward"]) for r in _rows(log)])
    np.testing.assert_allclose(logged, expected, atol=1e-6)
    assert penalty.min() < 0 and samples.finished.min() == 0 and samples.finished.max() == 1   # both kinds present
    mask_rows = np.array([r["responses_mask"].sum() for r in _rows(exp)])
    np.testing.assert_array_equal(mask_rows, lengths * samples.finished)   # truncated rows: no loss


def test_tis_weights_the_policy_term_by_the_capped_ratio(assets, tmp_path):
    """The train step's loss with TIS equals numpy's on the same log-probs, with a known rollout mismatch."""
    from mindspore import Tensor
    from mindrlhf.trainer.samples import training_tensors
    from mindrlhf.trainer.update.loss import GRPOLossCell
    trainer = _trainer(assets, tmp_path, total_steps=1, tis=True, tis_cap=1.3, beta=0.0)
    samples = trainer._generate_round(lambda name, fn, *a: fn(*a), 0).samples
    t = training_tensors(samples)
    old = trainer.logprobs(trainer.policy_logprob, samples)
    rng = np.random.default_rng(0)
    rollout = (old - rng.uniform(-0.5, 0.5, old.shape)).astype(np.float32)   # ratio exp(old - rollout) in [0.6, 1.6]
    mask = samples.response_mask.astype(np.float32)
    adv = np.linspace(-1, 1, len(samples)).astype(np.float32)
    rl = trainer.cfg.rl
    cell = GRPOLossCell(trainer.policy, rl, trainer.cfg.sampling.max_tokens, 1.0, on_policy=False)
    loss, aux = cell(t["input_ids"], t["position_ids"], t["bias"], t["labels"], Tensor(mask), Tensor(old),
                     Tensor(rollout), Tensor(np.zeros_like(old)), Tensor(adv), Tensor(np.float32(mask.sum())))
    ratio = np.exp(old.astype(np.float64) - rollout)
    weight = np.minimum(ratio, 1.3)
    # logp == old here (same weights), so the PPO ratio is 1: per-token loss -A x w
    exp_loss = (-adv[:, None] * weight * mask).sum() / mask.sum()
    assert float(loss.asnumpy()) == pytest.approx(exp_loss, abs=1e-5)
    _, _, _, _, _, tis_mean, tis_max, tis_clipped = [float(x.asnumpy()) for x in aux]
    on = mask.astype(bool)
    assert tis_mean == pytest.approx(ratio[on].mean(), rel=1e-5) and tis_max == pytest.approx(ratio[on].max(), rel=1e-5)
    assert tis_clipped == pytest.approx((ratio[on] > 1.3).mean(), abs=1e-6) and 0 < tis_clipped < 1


@pytest.mark.slow       # ~9 s; TIS's weighting of the update stays in the default run
def test_tis_metrics_in_a_step(assets, tmp_path):
    m = _trainer(assets, tmp_path, total_steps=1, tis=True).train_one_step()
    # rollout and train share the weights: the ratio is 1 up to float noise, nothing clipped
    assert m["tis_ratio_mean"] == pytest.approx(1.0, abs=1e-4) and m["tis_clipped_frac"] == 0


@pytest.mark.parametrize("extra,pattern", [
    ({"overlong_buffer_len": 8}, "overlong_buffer_len: expected 0 <= overlong_buffer_len < sampling.max_tokens=8"),
    ({"max_num_gen_batches": 0}, "max_num_gen_batches: expected >= 1"),
    ({"tis_cap": 0.5}, "tis_cap: expected >= 1")])
def test_variant_config_errors(assets, tmp_path, extra, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_grpo_config(None, grpo_overrides(assets, str(tmp_path), **extra))
