"""GRPO training entry point (argument names as in MindRLHF's qwen_grpo_tutorial).

msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port=9190 --join=True \
    --log_dir=./grpo_log examples/grpo/qwen_grpo_tutorial/grpo_one_stage.py \
    --sft_path_infer predict.yaml --sft_path_train finetune.yaml --vocab_path vocab.json \
    --merges_file_path merges.txt --mind_dataset_dir train.mindrecord --save_ckpt_dir ckpt/ \
    --use_parallel True [--config grpo_config.yaml]

Every field of mindrlhf.configs.grpo_config is also a flag; `--help` lists them.
"""
import sys

from mindrlhf.cli import grpo_main

if __name__ == "__main__":
    sys.exit(grpo_main())
