"""Convert GSM8K-style jsonl into the GRPO prompt MindRecord (see mindrlhf/data/mindrecord_io.py for the schema).

python examples/grpo/qwen_grpo_tutorial/rlhf_data.py --vocab_path vocab.json --merges_file_path merges.txt \
    --file_path train.jsonl --output_path gsm8k_train.mindrecord
"""
import sys

from mindrlhf.data.convert import main

if __name__ == "__main__":
    sys.exit(main())
