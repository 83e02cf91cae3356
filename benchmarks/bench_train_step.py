"""forward + backward + AdamW tokens/s: our model (ms.jit) vs the same model and weights in torch eager.

Model 4 layers / hidden 512 / 8 heads / 2 kv heads / intermediate 1408 / vocab 32000, batch 8 x seq 256.
Each side runs in its own process so peak RSS is its own. Last line: one JSON object.
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (BENCH_MODEL, hf_model_dir, ours_kernel_threads, peak_rss_mb, run_child,  # noqa: E402
                    torch_train_tokens_per_s, train_tokens_per_s)

BATCH, SEQ, WARMUP, STEPS = 8, 256, 2, 6


def batch(seed=0):
    return np.random.RandomState(seed).randint(0, BENCH_MODEL["vocab_size"], (BATCH, SEQ + 1))


def ours(hf_dir):
    from mindrlhf.checkpoint.model_io import load_weights
    from mindrlhf.configs import ModelConfig
    from mindrlhf.models.qwen2 import CausalLM
    ours_kernel_threads()
    model = CausalLM(ModelConfig(**BENCH_MODEL))
    load_weights(model, hf_dir)
    return train_tokens_per_s(model, batch(), WARMUP, STEPS)


def reference(hf_dir):
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    return torch_train_tokens_per_s(model, batch(), WARMUP, STEPS)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--child", nargs=2, metavar=("WHICH", "HF_DIR"))
    args = p.parse_args()
    if args.child:
        which, hf_dir = args.child
        tps = ours(hf_dir) if which == "ours" else reference(hf_dir)
        print(json.dumps({"tokens_per_s": tps, "peak_rss_mb": peak_rss_mb()}))
        return
    hf_dir = hf_model_dir(os.path.join(tempfile.gettempdir(), "mindrlhf_bench_model"))
    mine = run_child(__file__, "ours", hf_dir)
    ref = run_child(__file__, "reference", hf_dir)
    print(f"ours (MindSpore jit): {mine['tokens_per_s']:.0f} tokens/s, peak RSS {mine['peak_rss_mb']:.0f} MB")
    print(f"torch eager:          {ref['tokens_per_s']:.0f} tokens/s, peak RSS {ref['peak_rss_mb']:.0f} MB")
    print(json.dumps({"bench": "train_step", "ours": round(mine["tokens_per_s"], 1),
                      "reference": round(ref["tokens_per_s"], 1), "unit": "tokens/s",
                      "ratio": round(mine["tokens_per_s"] / ref["tokens_per_s"], 3),
                      "peak_rss_ratio": round(mine["peak_rss_mb"] / ref["peak_rss_mb"], 3)}))


if __name__ == "__main__":
    main()
