"""A tiny GRPO setup on disk: tokenizer, arithmetic prompts, model YAMLs, for trainer and msrun tests."""
from __future__ import annotations

import os

import yaml

from data_helpers import arithmetic_rows, make_tokenizer_files, write_jsonl
from mindrlhf.data.convert import build_parser, convert
from mindrlhf.reward.verifiers import register_verifier

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
WORKER = os.path.join(REPO, "tests", "workers", "grpo_worker.py")     # grpo_one_stage.py + the test verifiers


def cli_args(flags: dict) -> list:
    """grpo_one_stage.py flags {name: value} as its command line."""
    return [x for k, v in flags.items() for x in (f"--{k}", str(v))]


@register_verifier("digit_fraction_test")
def digit_fraction(completion, solution):
    """A dense reward a random model can move (tests need advantages that are not all zero)."""
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


def model_yaml(path: str, dp: int = 1, tp: int = 1, vocab_size: int = 416, pp: int = 1, micro_batch_num: int = 1,
               seq_parallel: bool = False, **model_overrides) -> str:
    with open(os.path.join(REPO, "model_configs", "qwen_grpo", "finetune_qwen2_tiny.yaml")) as fh:
        doc = yaml.safe_load(fh)
    doc["model"]["model_config"].update(vocab_size=vocab_size, **model_overrides)
    doc["parallel_config"].update(data_parallel=dp, model_parallel=tp, pipeline_stage=pp, use_seq_parallel=seq_parallel)
    if pp > 1:
        doc["parallel_config"]["micro_batch_num"] = micro_batch_num
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh)
    return path


def make_grpo_assets(root: str, rows: int = 64) -> dict:
    vocab, merges = make_tokenizer_files(os.path.join(root, "tok"), vocab_size=400)
    src = write_jsonl(os.path.join(root, "train.jsonl"), arithmetic_rows(rows))
    out = os.path.join(root, "train.mindrecord")
    convert(build_parser().parse_args(["--vocab_path", vocab, "--merges_file_path", merges, "--file_path", src,
                                       "--output_path", out, "--max_prompt_length", "16", "--seq_length", "48",
                                       "--prompt_template", "plain", "--no_progress"]))
    return {"vocab_path": vocab, "merges_file_path": merges, "mind_dataset_dir": out,
            "sft_path_train": model_yaml(os.path.join(root, "model.yaml"))}


# The tests' fixed settings where the package defaults (MindRLHF's: KL 0.01 with a reference, a 10-update
# warmup from lr 0, accuracy + format rewards) would slow every tiny run or leave it untrained; tests of those
# defaults set nothing (tests/test_upstream_compat.py).
TEST_DEFAULTS = dict(beta=0.0, loss_agg="token-mean", ref_sync_steps=0, lr_schedule="cosine", min_lr=0.0,
                     warmup_steps=0, decay_steps=0, beta2=0.999, verifier_function="accuracy_reward",
                     verifier_weight="1.0", epochs=0)


def grpo_overrides(assets: dict, save_dir: str, **extra) -> dict:
    # share_prompt is on by default for users; these runs check everything else, and its graphs compile ~20%
    # slower (most of a short test run). Its own tests: test_model_parity (against Hugging Face), test_trainer
    # (trajectory against whole rows), test_pipeline (micro-batches) and the layout-invariance runs.
    base = dict(assets, save_ckpt_dir=save_dir, total_steps=2, max_tokens=8, num_generations=4, batch_size=2,
                progress=False, export_hf=False, lr=1e-3, share_prompt=False, **TEST_DEFAULTS)
    base.update(extra)
    return base
