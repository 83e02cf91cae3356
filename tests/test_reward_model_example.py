"""examples/grpo/reward_model/rm_grpo.py: the reward model it builds loads where --reward_model loads it and
scores like the rule it imitates; the whole example (GRPO against it) in the slow run."""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SCRIPT = os.path.join(REPO, "examples", "grpo", "reward_model", "rm_grpo.py")


def _example():
    spec = importlib.util.spec_from_file_location("rm_grpo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ~17 s; the reward model's scores against transformers and in the trainer stay in the default run
@pytest.mark.slow
def test_the_built_reward_model_loads_and_scores_right_answers_above_wrong_ones(tmp_path, capsys):
    """~20 s: 300 questions, 200 steps. Right '#### n' rows score above bare numbers, malformed and random
    responses (the wrong-number rows need the full run's training: not asserted here)."""
    from mindrlhf import demo
    from mindrlhf.data.tokenizer import load_tokenizer
    from mindrlhf.configs.grpo_config import RewardConfig
    from mindrlhf.parallel.mesh import Mesh
    from mindrlhf.trainer.reward_model import resolve_reward_model
    ex, work = _example(), str(tmp_path)
    vocab, merges = demo.stage_tokenizer(work, demo.stage_data(work, 300))
    demo.stage_convert(work, vocab, merges)
    tok = load_tokenizer(vocab, merges)
    paths = demo.stage_configs(work, 2, tok.vocab_size, argparse.Namespace(
        arch="qwen2", steps=4, eval_steps=0, seed=1, dynamic_sampling=False))
    rm_dir = ex.train_reward_model(str(tmp_path / "rm"), paths["single"], vocab, merges,
                                   ex.prompts_of(os.path.join(work, "train.mindrecord")), steps=200,
                                   log=lambda s: None)
    # the trainer's start-up checks of the folder: one label, the policy's tokenizer, vocabulary size
    assert resolve_reward_model(RewardConfig(reward_model=rm_dir), tok, Mesh(rank=0, dp=1, tp=1), 4,
                                log=lambda s: None).model_cfg.hidden_size == 64
    prompts, solutions = ex.prompts_of(os.path.join(work, "test.mindrecord"))
    p, n = prompts[:4], [int(s) for s in solutions[:4]]
    texts = [f"#### {x}" for x in n] + [str(x) for x in n] + [f"### {x}" for x in n] + ["####"] * 4
    responses = [tok.encode(" " + t) + [tok.eos_token_id] for t in texts]
    scores = ex.score_with_framework(rm_dir, p * 4, responses)
    right, others = scores[:4], scores[4:]
    assert right.min() > others.max(), (texts, scores)
    agreement = ex.rule_agreement(rm_dir, vocab, merges, (prompts, solutions))
    assert agreement["agreement"] > 0.6 and agreement["score_right"] > agreement["score_wrong"], agreement


@pytest.mark.slow
@pytest.mark.msrun
def test_grpo_against_the_reward_model_end_to_end(tmp_path):
    """The example as the README runs it (~5 min): the reward model agrees with the rule on held-out rows, the
    rule's accuracy is logged without entering the reward, and the curves are written."""
    proc = subprocess.run([sys.executable, SCRIPT, "--workdir", str(tmp_path)], env=dict(os.environ, PYTHONPATH=REPO),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-5000:]
    with open(tmp_path / "summary.json") as fh:
        summary = json.load(fh)
    assert summary["reward_model"]["agreement"] > 0.8, summary["reward_model"]
    from mindrlhf.trainer.metrics import read_metrics
    steps = [r for r in read_metrics(str(tmp_path / "grpo_ckpt" / "metrics.jsonl")) if "reward_mean" in r]
    assert len(steps) == 100
    # the reward is the reward model's score alone: the weight-0 rule is a metric only
    assert all(r["reward/reward_model_share"] == pytest.approx(1.0) for r in steps)
    assert all(r["reward_mean"] == pytest.approx(r["reward/reward_model"], abs=1e-5) for r in steps)
    assert np.isfinite([r["accuracy"] for r in steps]).all()
    # measured 0.015 -> 0.395 (the rule-rewarded demo: 0.555); the reward model's near-miss blind spot is in
    # the README, not asserted
    assert summary["eval_accuracy_after"] - summary["eval_accuracy_before"] >= 0.2, summary
    with open(summary["curves"], "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
