"""The reward model in the GRPO loop (trainer/reward_model.py): its scores, times reward_model_weight, join the
verifiers' total before advantages, and reach the metrics; a bad folder is refused at start-up."""
import os

import numpy as np
import pytest

from grpo_helpers import digit_fraction, grpo_overrides, make_grpo_assets
from hf_reference import make_hf_classifier
from mindrlhf.configs import ConfigError
from mindrlhf.configs.grpo_load import load_grpo_config
from mindrlhf.trainer import grpo_trainer
from mindrlhf.trainer.grpo_trainer import GRPOTrainer

RM_WEIGHT = 0.5


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("grpo_rm"))
    assets = make_grpo_assets(root)
    rm_dir = os.path.join(root, "rm")
    hf = make_hf_classifier(rm_dir, vocab=416, layers=1, pad_token_id=0,
                            tokenizer_dir=os.path.dirname(assets["vocab_path"]))
    return assets, rm_dir, hf


def _config(assets, save_dir, **extra):
    paths, rm_dir, _ = assets
    flags = dict(verifier_function="digit_fraction_test", reward_model=rm_dir, reward_model_weight=RM_WEIGHT)
    flags.update(extra)
    return load_grpo_config(None, grpo_overrides(paths, str(save_dir), **flags))


def _hf_score(hf, ids):
    import torch
    with torch.no_grad():
        return float(hf(torch.tensor([ids], dtype=torch.long)).logits[0, 0])


def test_rewards_are_the_verifiers_plus_the_weighted_reward_model(assets, tmp_path, monkeypatch):
    seen = {"advantage_rewards": []}
    real_advantages = grpo_trainer.compute_advantages

    def advantages(estimator, rewards, *args):
        seen["advantage_rewards"].append(np.array(rewards))
        return real_advantages(estimator, rewards, *args)

    monkeypatch.setattr(grpo_trainer, "compute_advantages", advantages)
    trainer = GRPOTrainer(_config(assets, tmp_path, offload_reward_model_param=True), log=lambda *a: None)
    real_score, scored = trainer.score, []
    trainer.score = lambda samples, solutions: scored.append((samples, real_score(samples, solutions))) or scored[-1][1]
    history = trainer.fit()
    assert len(history) == 2 and len(scored) == 2
    hf = assets[2]
    for (samples, (rewards, scores, texts)), metrics, adv_rewards in zip(scored, history,
                                                                          seen["advantage_rewards"]):
        rm = np.array([_hf_score(hf, np.concatenate([p[pm == 1], r[rm_ == 1]]).tolist()) for p, pm, r, rm_ in zip(
            samples.prompt_ids, samples.prompt_mask, samples.response_ids, samples.response_mask)])
        rules = np.array([digit_fraction(t, "") for t in texts])
        assert np.abs(rm).max() > 0.05
        np.testing.assert_allclose(scores.parts["reward_model"], rm, atol=1e-4)
        np.testing.assert_allclose(rewards, rules + RM_WEIGHT * rm, atol=1e-4)
        np.testing.assert_array_equal(adv_rewards, rewards)          # what the advantages were computed from
        assert metrics["reward/reward_model"] == pytest.approx(rm.mean(), abs=1e-4)
        assert metrics["reward_mean"] == pytest.approx(rewards.mean(), abs=1e-5)
        share = np.abs(RM_WEIGHT * rm).sum() / (np.abs(RM_WEIGHT * rm).sum() + np.abs(rules).sum())
        assert metrics["reward/reward_model_share"] == pytest.approx(share, abs=1e-4)
    assert trainer.swap.groups["reward_model"].enabled and trainer.swap.groups["reward_model"].seconds > 0


@pytest.mark.slow       # ~12 s; the reward model beside the verifiers stays in the default run
def test_reward_model_alone_needs_no_verifier(assets, tmp_path):
    trainer = GRPOTrainer(_config(assets, tmp_path, verifier_function="", verifier_weight="", total_steps=1),
                          log=lambda *a: None)
    metrics = trainer.fit()[0]
    assert metrics["reward/reward_model_share"] == pytest.approx(1.0)
    assert metrics["reward_mean"] == pytest.approx(RM_WEIGHT * metrics["reward/reward_model"], abs=1e-5)


def test_no_verifier_and_no_reward_model_is_refused(assets, tmp_path):
    with pytest.raises(ConfigError, match="reward.verifier_function: empty and no reward.reward_model"):
        _config(assets, tmp_path, verifier_function="", verifier_weight="", reward_model="")


def test_a_reward_model_with_another_tokenizer_is_refused_naming_both(assets, tmp_path):
    from data_helpers import make_tokenizer_files
    other = str(tmp_path / "rm_other")
    make_tokenizer_files(str(tmp_path / "tok2"), vocab_size=380)
    make_hf_classifier(other, vocab=416, layers=1, tokenizer_dir=str(tmp_path / "tok2"))
    with pytest.raises(ConfigError, match=f"reward.reward_model: the tokenizer of {other} .*differs from the "
                                          f"policy's .*vocab.json"):
        GRPOTrainer(_config(assets, tmp_path / "run", reward_model=other), log=lambda *a: None)


def test_a_causal_lm_as_reward_model_is_refused(assets, tmp_path):
    from hf_reference import make_hf_model
    lm = str(tmp_path / "lm")
    make_hf_model(lm, vocab=416, layers=1)
    with pytest.raises(ConfigError, match="reward.reward_model: .*Qwen2ForCausalLM.*not supported .*"
                                          "Qwen2ForSequenceClassification"):
        GRPOTrainer(_config(assets, tmp_path / "run", reward_model=lm), log=lambda *a: None)


@pytest.mark.parametrize("mesh,labels,message", [
    (dict(dp=1, tp=1, pp=2), 1, r"runs in the train layout, whose pipeline_stage 2 it does not support; give it "
                                r"its own layout \(reward.reward_model_parallel\)"),
    (dict(dp=1, tp=3), 1, r"in the train layout: parallel_config.model_parallel=3 does not divide"),
    (dict(dp=1, tp=1), 2, r"num_labels 2; a reward model scores with one label")])
def test_a_reward_model_the_run_cannot_use_is_refused(assets, tmp_path, mesh, labels, message):
    from mindrlhf.configs.grpo_config import RewardConfig
    from mindrlhf.data.tokenizer import load_tokenizer
    from mindrlhf.parallel.mesh import Mesh
    from mindrlhf.trainer.reward_model import resolve_reward_model
    paths = assets[0]
    rm_dir = str(tmp_path / "rm")
    make_hf_classifier(rm_dir, vocab=416, layers=1, num_labels=labels, tokenizer_dir=os.path.dirname(paths["vocab_path"]))
    tokenizer = load_tokenizer(paths["vocab_path"], paths["merges_file_path"])
    with pytest.raises(ConfigError, match="reward.reward_model: .*" + message):
        resolve_reward_model(RewardConfig(reward_model=rm_dir), tokenizer, Mesh(rank=0, **mesh), 4)


def test_the_reward_models_own_layout(assets, tmp_path):
    """reward.reward_model_parallel: the reward model's layout is its own (TP ranks, the rest data-parallel),
    whatever the train layout (pipeline stages included); one that does not fit the ranks or the model is
    refused naming it."""
    from mindrlhf.configs.grpo_config import RewardConfig
    from mindrlhf.data.tokenizer import load_tokenizer
    from mindrlhf.parallel.mesh import Mesh
    from mindrlhf.trainer.reward_model import resolve_reward_model
    paths = assets[0]
    rm_dir = str(tmp_path / "rm")
    make_hf_classifier(rm_dir, vocab=416, layers=1, tokenizer_dir=os.path.dirname(paths["vocab_path"]))
    tokenizer = load_tokenizer(paths["vocab_path"], paths["merges_file_path"])
    lines = []
    train = Mesh(rank=1, dp=1, tp=2, pp=2)             # 4 ranks: two stages of TP2
    spec = resolve_reward_model(RewardConfig(reward_model=rm_dir, reward_model_parallel=1), tokenizer, train, 4,
                                lines.append)
    assert (spec.mesh.dp, spec.mesh.tp, spec.mesh.pp, spec.mesh.rank) == (4, 1, 1, 1)
    assert "in its own layout dp=4 tp=1" in lines[0]
    spec = resolve_reward_model(RewardConfig(reward_model=rm_dir, reward_model_parallel=2), tokenizer, train, 4,
                                lines.append)
    assert (spec.mesh.dp, spec.mesh.tp, spec.mesh.tp_index) == (2, 2, 1)
    with pytest.raises(ConfigError, match=r"reward.reward_model_parallel: 3 does not divide the 4 rank"):
        resolve_reward_model(RewardConfig(reward_model=rm_dir, reward_model_parallel=3), tokenizer, train, 4)
    with pytest.raises(ConfigError, match=r"in its own layout: parallel_config.model_parallel=4 does not divide"):
        resolve_reward_model(RewardConfig(reward_model=rm_dir, reward_model_parallel=4), tokenizer, train, 4)


@pytest.mark.slow       # ~12 s
def test_each_dynamic_sampling_round_is_scored_by_the_reward_model(assets, tmp_path):
    """Rounds alternate rollout and reward-model phases with the reward model's swap on: every round's rows
    are scored (all-equal groups are dropped, so a missing score would show as a zero-std group)."""
    trainer = GRPOTrainer(_config(assets, tmp_path, total_steps=1, dynamic_sampling=True, max_num_gen_batches=2,
                                  offload_reward_model_param=True), log=lambda *a: None)
    real_join, joined = trainer.reward_model.join, []
    trainer.reward_model.join = lambda samples, scores: joined.append(len(samples)) or real_join(samples, scores)
    metrics = trainer.fit()[0]
    assert len(joined) == metrics["dynamic_sampling/rounds"] and all(n == 8 for n in joined)
    assert metrics["zero_std_groups_frac"] == 0.0 and abs(metrics["reward/reward_model"]) > 1e-3
