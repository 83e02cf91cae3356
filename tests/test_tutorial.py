"""MindRLHF's Qwen-GRPO tutorial, step by step, at tiny scale, with its files and flags: HF weights ->
convert_weight.py -> rlhf_data.py -> strategy files -> transform_checkpoint.py -> msrun grpo_one_stage.py.

The model YAMLs and the flat grpo_config.yaml are MindRLHF's key sets at tiny sizes (tests/fixtures/upstream);
the one change to the tutorial's layout is pipeline_stage 1 (pipeline parallelism is not implemented yet).
"""
import json
import os
import subprocess
import sys

import numpy as np

from data_helpers import arithmetic_rows, make_tokenizer_files, write_jsonl
from hf_reference import make_hf_model
from msrun_util import REPO, run_msrun

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "upstream")
TUTORIAL = os.path.join(REPO, "examples", "grpo", "qwen_grpo_tutorial")


def _run(*args):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=600)
    assert proc.returncode == 0, proc.stdout.decode(errors="replace")[-3000:]
    return proc.stdout.decode(errors="replace")


def test_the_tutorial_commands_run_as_written(tmp_path):
    finetune = os.path.join(FIXTURES, "finetune_qwen2_5_tiny.yaml")     # dp1 x mp2, use_seq_parallel, interleave 2
    predict = os.path.join(FIXTURES, "predict_qwen2_5_tiny_instruct.yaml")   # dp2 x mp1, max_decode_length 8
    grpo_config = os.path.join(FIXTURES, "grpo_config.yaml")             # beta 0.01, epochs 1, chunk_size 2
    hf_dir, ckpt = tmp_path / "Qwen-tiny", tmp_path / "qwen_tiny.ckpt"
    make_hf_model(str(hf_dir), vocab=416)
    vocab, merges = make_tokenizer_files(str(tmp_path / "tok"), vocab_size=400)

    # 1. HF -> MindSpore weights, MindFormers' flags
    _run("convert_weight.py", "--model", "qwen2_5", "--input_path", hf_dir, "--output_path", ckpt, "--dtype", "bf16",
         "--config_path", finetune)
    # 2. data: 8 prompts = one epoch of two steps (chunk_size 2 x 2 rollout replicas per step)
    jsonl = write_jsonl(str(tmp_path / "train.jsonl"), arithmetic_rows(8))
    data = tmp_path / "gsm8k_train.mindrecord"
    _run(os.path.join(TUTORIAL, "rlhf_data.py"), "--vocab_path", vocab, "--merges_file_path", merges,
         "--file_path", jsonl, "--output_path", data, "--max_prompt_length", 32, "--seq_length", 64)
    # 3. strategy files of both layouts
    strategy = tmp_path / "strategy"
    _run(os.path.join(TUTORIAL, "grpo_one_stage.py"), "--only_save_strategy", "True", "--sft_path_train", finetune,
         "--sft_path_infer", predict, "--save_strategy_dir", strategy)
    # 4. slice: train with two worker processes; infer as two cooperating invocations (one per rank)
    _run("transform_checkpoint.py", "--src_checkpoint", ckpt, "--dst_checkpoint_dir", tmp_path / "ckpt_train",
         "--dst_strategy", strategy / "train_strategy", "--transform_process_num", 2)
    for rank in (0, 1):
        _run("transform_checkpoint.py", "--src_checkpoint", ckpt, "--dst_checkpoint_dir", tmp_path / "ckpt_infer",
             "--dst_strategy", strategy / "infer_strategy", "--rank_id", rank, "--world_size", 2)
    # 5. train under msrun with the tutorial's flags
    save, log_dir = tmp_path / "save_ckpt", tmp_path / "grpo_log"
    run_msrun(os.path.join(TUTORIAL, "grpo_one_stage.py"), [
        "--config", grpo_config, "--sft_path_infer", predict, "--sft_path_train", finetune, "--vocab_path", vocab,
        "--merges_file_path", merges, "--mind_dataset_dir", data, "--save_data_file", tmp_path / "grpo.mindrecord",
        "--save_ckpt_dir", save, "--use_parallel", "True", "--load_sft_checkpoint_infer", tmp_path / "ckpt_infer",
        "--load_sft_checkpoint_train", tmp_path / "ckpt_train", "--load_ref_checkpoint", ckpt,
        "--load_ckpt_format", "ckpt", "--enable_compile_cache", "False", "--progress", "False"], 2, str(log_dir))

    with open(log_dir / "worker_0.log", errors="replace") as fh:
        log = fh.read()
    for inert in ("grpo_epochs", "ppo_epochs", "auto_tune", "parallel_config.micro_batch_num", "--load_ckpt_format"):
        assert inert in log, inert
    # honoured, not inert: sequence parallelism over the 2 TP ranks, each mini-batch in 2 interleaved parts
    assert "use_seq_parallel" not in log.split("ignored in")[-1] and "sequence parallel" in log
    assert "2 micro-batches per update" in log
    assert "sampling from" in log and "max_tokens=8" in log
    with open(save / "metrics.jsonl") as fh:
        rows = [json.loads(line) for line in fh]
    assert [r["step"] for r in rows] == [1, 2]
    # beta 0.01: the reference model is loaded and the KL term is live once the policy has moved (4 updates a
    # step; the first has lr 0 under MindRLHF's warmup, the later ones move the policy off the reference)
    assert all(r["kl"] > 0 for r in rows)
    assert all(r["rollout_train_logprob_gap"] < 1e-3 for r in rows)   # bf16 weights, the same in both roles
    import mindspore.dataset as ds
    exp = list(ds.MindDataset(str(tmp_path / "grpo.mindrecord"), shuffle=False).create_dict_iterator(
        output_numpy=True, num_epochs=1))
    assert len(exp) == 16 and np.all([r["responses_mask"].sum() > 0 for r in exp])
    assert os.path.isfile(save / "hf_policy" / "model.safetensors") or os.listdir(save / "hf_policy")
