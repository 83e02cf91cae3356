"""Convert GSM8K / MATH / DeepScaleR / OpenR1-Math rows (jsonl, a JSON array, parquet, or a directory of them)
into the GRPO prompt MindRecord (schema: mindrlhf/data/mindrecord_io.py; inputs: mindrlhf/data/sources.py).

python examples/grpo/qwen_grpo_tutorial/rlhf_data.py --vocab_path vocab.json --merges_file_path merges.txt \
    --file_path train.jsonl --output_path gsm8k_train.mindrecord
python examples/grpo/qwen_grpo_tutorial/rlhf_data.py --vocab_path vocab.json --merges_file_path merges.txt \
    --file_path deepscaler.json --dataset_type deepscaler --output_path deepscaler.mindrecord
python examples/grpo/qwen_grpo_tutorial/rlhf_data.py --config MindSpeed-RL/configs/datasets/deepscaler.yaml
"""
import sys

from mindrlhf.data.convert import main

if __name__ == "__main__":
    sys.exit(main())
