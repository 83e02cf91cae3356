r"""HF <-> MindSpore weights with MindFormers' `convert_weight.py` flags (Qwen2 / Qwen2.5 / Qwen3 / Qwen3-MoE / Llama).

  python convert_weight.py --model qwen2_5 --input_path Qwen2.5-7B-Instruct/ --output_path qwen2_5_7b.ckpt \
      --dtype bf16 --config_path model_configs/qwen_grpo/finetune_qwen2_5_7b.yaml
  python convert_weight.py --reversed --input_path policy.ckpt --output_path hf_out/ --config_path finetune.yaml

research/qwen2_5's spelling (--torch_ckpt_dir, --mindspore_ckpt_path) is accepted too. Our own flags:
`python -m mindrlhf.checkpoint.convert --help`.
"""
import sys

from mindrlhf.checkpoint.convert import mindformers_main

if __name__ == "__main__":
    sys.exit(mindformers_main())
