"""HF <-> MindSpore checkpoint conversion (full, unsharded).

  python -m mindrlhf.checkpoint.convert --hf_dir Qwen2.5-7B-Instruct/ --output qwen2_5_7b.safetensors [--dtype bfloat16]
  python -m mindrlhf.checkpoint.convert --to_hf --input policy.ckpt --model_yaml finetune.yaml --output hf_out/

MindSpore files keep MindFormers' parameter names; `.ckpt` or `.safetensors` by the output's extension.
"""
from __future__ import annotations

import argparse
import sys

from mindrlhf.configs.errors import CheckpointError, ConfigError


def convert(hf_dir: str = "", output: str = "", dtype=None, to_hf: bool = False, input_path: str = "",
            model_yaml: str = ""):
    """HF directory -> one MindSpore checkpoint, or (to_hf) a MindSpore checkpoint -> an HF directory."""
    from mindrlhf.checkpoint.hf_interop import export_hf, iter_hf_as_ms
    from mindrlhf.checkpoint.model_io import iter_checkpoint, save_checkpoint
    from mindrlhf.checkpoint.safetensors_io import require_float
    from mindrlhf.utils.bf16 import BF16, bf16_to_f32, f32_to_bf16

    def cast(a):
        if dtype == "bfloat16" and not isinstance(a, BF16):
            return f32_to_bf16(a)
        if dtype == "float32" and isinstance(a, BF16):
            return bf16_to_f32(a)
        return a

    if to_hf:
        if not (input_path and model_yaml):
            raise ConfigError("converting to HF needs the MindSpore checkpoint and the model YAML that describes it")
        from mindrlhf.configs.compat.sources import load_model_yaml
        cfg = load_model_yaml(model_yaml).model
        tensors = {n: cast(require_float(a, n, input_path)) for n, a in iter_checkpoint(input_path)}
        export_hf(tensors, output, cfg, torch_dtype=dtype or "float32")
    else:
        if not hf_dir:
            raise ConfigError("--hf_dir: required (or --to_hf)")
        save_checkpoint({n: cast(a) for n, a in iter_hf_as_ms(hf_dir)}, output)


def _run(fn) -> int:
    try:
        fn()
    except (ConfigError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


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
    rc = _run(lambda: convert(args.hf_dir, args.output, args.dtype, args.to_hf, args.input, args.model_yaml))
    if rc == 0:
        print(f"wrote {args.output}")
    return rc


# MindFormers' convert_weight.py names (repo root `convert_weight.py --model qwen2_5 --input_path ...`, and
# research/qwen2_5/convert_weight.py's `--torch_ckpt_dir --mindspore_ckpt_path`). MindFormers r1.7 reads a Qwen3
# HF folder directly (its mcore model, `pretrained_model_dir`); `--model qwen3` here writes our names for it.
MINDFORMERS_MODELS = ("qwen2_5", "qwen2", "qwen3", "qwen3_moe", "llama")
MINDFORMERS_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "float32": "float32", "bfloat16": "bfloat16"}


def _check_fits_yaml(tensors, config_path: str):
    """Every parameter of the YAML's model is among `tensors` (name, array) with the YAML's shape."""
    from mindrlhf.configs.compat.sources import load_model_yaml
    from mindrlhf.models.specs import param_specs
    specs = param_specs(load_model_yaml(config_path).model)
    seen = set()
    for name, arr in tensors:
        seen.add(name)
        if name in specs and tuple(arr.shape) != tuple(specs[name][0]):
            raise ConfigError(f"--config_path {config_path}: {name} has shape {tuple(arr.shape)} in the weights "
                              f"to convert, the YAML's model expects {tuple(specs[name][0])}")
    missing = sorted(set(specs) - seen)
    if missing:
        raise ConfigError(f"--config_path {config_path}: the weights to convert lack {missing[:3]} "
                          f"({len(missing)} parameter(s) the YAML's model has)")


def mindformers_main(argv=None) -> int:
    """`python convert_weight.py` with MindFormers' flags (Qwen2/Qwen2.5/Qwen3/Qwen3-MoE/Llama decoders only)."""
    p = argparse.ArgumentParser(description="HF <-> MindSpore weights with MindFormers' convert_weight.py flags")
    p.add_argument("--model", default="qwen2_5", help=f"one of {', '.join(MINDFORMERS_MODELS)}")
    p.add_argument("--reversed", action="store_true", help="MindSpore -> HF (needs --config_path)")
    p.add_argument("--input_path", "--torch_ckpt_dir", dest="input_path", help="HF directory (or, reversed, the "
                   "MindSpore checkpoint)")
    p.add_argument("--output_path", "--mindspore_ckpt_path", dest="output_path", help="output file (or HF directory)")
    p.add_argument("--dtype", default=None, help="fp32 or bf16 (default: as the source)")
    p.add_argument("--config_path", default="", help="model YAML (needed with --reversed; checked otherwise)")
    p.add_argument("--qkv_concat", default="False", help="False only: the MindSpore names keep wq/wk/wv")
    args = p.parse_args(argv)

    def run():
        if args.model not in MINDFORMERS_MODELS:
            raise ConfigError(f"--model: {args.model!r} is not supported here (expected one of "
                              f"{', '.join(MINDFORMERS_MODELS)}: Qwen2/Qwen3/Llama-architecture decoders)")
        if args.dtype is not None and args.dtype not in MINDFORMERS_DTYPES:
            raise ConfigError(f"--dtype: expected fp32 or bf16, got {args.dtype!r} (fp16 is not supported)")
        if str(args.qkv_concat).lower() not in ("false", "0"):
            raise ConfigError("--qkv_concat: only False is supported (the checkpoint keeps separate wq/wk/wv)")
        if not (args.input_path and args.output_path):
            raise ConfigError("--input_path and --output_path are required")
        dtype = MINDFORMERS_DTYPES.get(args.dtype)
        if args.reversed:
            convert(output=args.output_path, dtype=dtype, to_hf=True, input_path=args.input_path,
                    model_yaml=args.config_path)
            return
        if args.config_path:             # the weights must fit the model the YAML describes: checked first,
            from mindrlhf.checkpoint.hf_interop import iter_hf_as_ms     # so a mismatch replaces nothing
            _check_fits_yaml(iter_hf_as_ms(args.input_path), args.config_path)
        convert(hf_dir=args.input_path, output=args.output_path, dtype=dtype)

    rc = _run(run)
    if rc == 0:
        print(f"wrote {args.output_path}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
