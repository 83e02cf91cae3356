"""Layout invariance with the reward model on: a 2-step GRPO run (rewards = a verifier + 0.5 x the reward
model's score) gives the same per-step rewards, reward-model scores and losses in one process as on 2 msrun
workers, where the reward model runs in the train layout (TP2: its layers split, every rank reads the same
score; DP2: each replica scores half of the rows, shared through exchange.rows_of_all_replicas) or in its own
(reward.reward_model_parallel: DP2 beside a TP2 train layout)."""
import os
import subprocess
import sys

import mindspore as ms
import pytest

from grpo_helpers import TEST_DEFAULTS, WORKER, cli_args, make_grpo_assets, model_yaml
from hf_reference import make_hf_classifier
from msrun_util import REPO, run_msrun
from mindrlhf.checkpoint.model_io import model_state, save_checkpoint
from mindrlhf.configs import load_model_yaml
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.trainer.metrics import read_metrics

pytestmark = pytest.mark.msrun

# name: (train dp, tp), (infer dp, tp), reward.reward_model_parallel (0: the train layout)
LAYOUTS = {"single": ((1, 1), (1, 1), 0), "train_tp2_infer_dp2": ((1, 2), (2, 1), 0),
           "train_dp2_infer_tp2": ((2, 1), (1, 2), 0), "train_tp2_infer_dp2_rm_dp2": ((1, 2), (2, 1), 1)}
COMPARED = ("reward_mean", "reward/reward_model", "reward/digit_fraction_test", "reward/reward_model_share", "loss",
            "grad_norm", "response_len_mean")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("rm_layouts"))
    out = make_grpo_assets(root)
    out["root"] = root
    out["rm"] = os.path.join(root, "rm")
    make_hf_classifier(out["rm"], vocab=416, layers=2, tokenizer_dir=os.path.dirname(out["vocab_path"]))
    out["yamls"] = {(dp, tp): model_yaml(os.path.join(root, f"m_{dp}x{tp}.yaml"), dp=dp, tp=tp)
                    for train, infer, _ in LAYOUTS.values() for dp, tp in (train, infer)}
    ms.set_seed(5)
    out["init"] = os.path.join(root, "init.safetensors")
    save_checkpoint(model_state(CausalLM(load_model_yaml(out["yamls"][(1, 1)]).model)), out["init"])
    return out


def _run(assets, name):
    train, infer, rm_parallel = LAYOUTS[name]
    out = os.path.join(assets["root"], name)
    batch = 4 // infer[0]                     # 4 prompts per step on every layout
    flags = {**TEST_DEFAULTS, "sft_path_train": assets["yamls"][train], "sft_path_infer": assets["yamls"][infer],
             "vocab_path": assets["vocab_path"], "merges_file_path": assets["merges_file_path"],
             "mind_dataset_dir": assets["mind_dataset_dir"], "load_sft_checkpoint_train": assets["init"],
             "save_ckpt_dir": out, "use_parallel": name != "single", "total_steps": 2, "seed": 7,
             "batch_size": batch, "num_generations": 4, "max_tokens": 8, "lr": 1e-4, "temperature": 0.8,
             "verifier_function": "digit_fraction_test", "verifier_weight": "1.0", "reward_model": assets["rm"],
             "reward_model_weight": 0.5, "reward_model_batch_size": 3, "progress": False, "export_hf": False,
             "share_prompt": False, "reward_model_parallel": rm_parallel}
    if name == "single":
        env = dict(os.environ, PYTHONPATH=REPO)
        proc = subprocess.run([sys.executable, WORKER] + cli_args(flags), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=900)
        assert proc.returncode == 0, proc.stdout.decode(errors="replace")[-4000:]
    else:
        run_msrun(WORKER, cli_args(flags), 2, os.path.join(out, "log"))
    return read_metrics(os.path.join(out, "metrics.jsonl"))


@pytest.fixture(scope="module")
def single(assets):
    return _run(assets, "single")


@pytest.mark.slow       # ~25 s each on 2 msrun workers; the default run keeps the reward model's single-process tests
@pytest.mark.parametrize("name", ["train_tp2_infer_dp2", "train_dp2_infer_tp2", "train_tp2_infer_dp2_rm_dp2"])
def test_reward_model_scores_are_layout_invariant(assets, single, name):
    ref, got = single, _run(assets, name)
    assert len(ref) == len(got) == 2
    assert all(abs(r["reward/reward_model"]) > 1e-3 and 0 < r["reward/reward_model_share"] <= 1 for r in ref)
    assert ref[0]["grad_norm"] > 1e-3
    for r, g in zip(ref, got):
        for key in COMPARED:
            assert g[key] == pytest.approx(r[key], rel=1e-5, abs=1e-6), (name, r["step"], key)
