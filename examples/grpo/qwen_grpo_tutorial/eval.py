"""Evaluate a trained policy on held-out prompts (accuracy, pass@k, a completions file): mindrlhf.eval.

python examples/grpo/qwen_grpo_tutorial/eval.py --model ckpt/hf_policy --dataset gsm8k_test.mindrecord \
    --vocab_path vocab.json --merges_file_path merges.txt --output completions.jsonl
msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port=9190 --join=True \
    --log_dir=./eval_log examples/grpo/qwen_grpo_tutorial/eval.py --use_parallel True --model finetune.yaml \
    --checkpoint ckpt/step_000100 --dataset test.jsonl --vocab_path vocab.json --merges_file_path merges.txt \
    --n 8 --temperature 0.7

`--help` lists every flag.
"""
import sys

from mindrlhf.eval import main

if __name__ == "__main__":
    sys.exit(main())
