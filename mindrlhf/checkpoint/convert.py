"""HF <-> MindSpore checkpoint conversion (full, unsharded).

  python -m mindrlhf.checkpoint.convert --hf_dir Qwen2.5-7B-Instruct/ --output qwen2_5_7b.safetensors [--dtype bfloat16]
  python -m mindrlhf.checkpoint.convert --to_hf --input policy.ckpt --model_yaml finetune.yaml --output hf_out/

MindSpore files keep MindFormers' parameter names; `.ckpt` or `.safetensors` by the output's extension.
"""
from __future__ import annotations

import argparse
import sys

from mindrlhf.configs.errors import CheckpointError, ConfigError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf_dir", help="HF model directory (config.json + safetensors)")
    p.add_argument("--to_hf", action="store_true", help="convert a MindSpore checkpoint to an HF directory")
    p.add_argument("--input", help="with --to_hf: the MindSpore .ckpt/.safetensors")
    p.add_argument("--model_yaml", help="with --to_hf: the model YAML that describes --input")
    p.add_argument("--output", required=True)
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="store as this dtype (default: as the source)")
    args = p.parse_args(argv)
    from mindrlhf.checkpoint.hf_interop import export_hf, iter_hf_as_ms
    from mindrlhf.checkpoint.model_io import iter_checkpoint, save_checkpoint
    from mindrlhf.utils.bf16 import BF16, bf16_to_f32, f32_to_bf16

    def cast(a):
        if args.dtype == "bfloat16" and not isinstance(a, BF16):
            return f32_to_bf16(a)
        if args.dtype == "float32" and isinstance(a, BF16):
            return bf16_to_f32(a)
        return a

    try:
        if args.to_hf:
            if not (args.input and args.model_yaml):
                raise ConfigError("--to_hf needs --input and --model_yaml")
            from mindrlhf.configs.model_config import load_model_yaml
            cfg = load_model_yaml(args.model_yaml).model
            export_hf({n: cast(a) for n, a in iter_checkpoint(args.input)}, args.output, cfg,
                      torch_dtype=args.dtype or "float32")
        else:
            if not args.hf_dir:
                raise ConfigError("--hf_dir: required (or --to_hf)")
            save_checkpoint({n: cast(a) for n, a in iter_hf_as_ms(args.hf_dir)}, args.output)
    except (ConfigError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
