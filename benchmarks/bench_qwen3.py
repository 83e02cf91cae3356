"""Qwen3 dense against Qwen2 at equal shapes: what the q/k norms (and no q/k/v bias) cost in our train step and
rollout.

    python benchmarks/bench_qwen3.py [--rounds 2]

The benchmark model's shapes (common.BENCH_MODEL: 4 layers, hidden 512, 8 heads of 64, 2 kv heads,
intermediate 1408, vocab 32000), random weights: as Qwen2 (q/k/v bias, no q/k norms) and as Qwen3 (per-head
RMSNorm on q and k before RoPE, no bias, head_dim 64). Train: forward + backward + AdamW of 8 x 256 tokens
(trainer/sft.SFTStep, the update every engine shares), tokens/s over 6 steps after 2. Rollout: 16 prompts of 64
tokens -> 64 new tokens (GenerationEngine, EOS off), tokens/s of the second generate. Each measurement in a fresh
process, Qwen2 and Qwen3 alternating for --rounds rounds (2 cores: the machine drifts); medians reported.
Last line: {"bench": "qwen3_vs_qwen2", "cpu", "train_ratio", "rollout_ratio", ...} with ratio = Qwen3 / Qwen2
tokens/s (the issue's bar: >= 0.9).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BENCH_MODEL, ours_kernel_threads, run_child, train_tokens_per_s  # noqa: E402

BATCH, SEQ, WARMUP, STEPS = 8, 256, 2, 6
PROMPTS, PROMPT, NEW = 16, 64, 64


def model(arch: str):
    import mindspore as ms
    from mindrlhf.configs import ModelConfig
    from mindrlhf.models.qwen2 import CausalLM
    ms.set_seed(0)
    shape = dict(BENCH_MODEL, qkv_has_bias=arch == "qwen2")
    if arch == "qwen3":
        shape.update(qk_layernorm=True, head_dim=BENCH_MODEL["hidden_size"] // BENCH_MODEL["num_heads"])
    return CausalLM(ModelConfig(**shape))


def train(arch: str) -> float:
    ours_kernel_threads()
    ids = np.random.RandomState(0).randint(0, BENCH_MODEL["vocab_size"], (BATCH, SEQ + 1))
    return train_tokens_per_s(model(arch), ids, WARMUP, STEPS)


def rollout(arch: str) -> float:
    from mindrlhf.rollout.engine import GenerationEngine
    from mindrlhf.rollout.sampling import SamplingParams
    ours_kernel_threads()
    engine = GenerationEngine(model(arch), pad_token_id=0, prompt_bucket=PROMPT)
    prompts = np.random.RandomState(1).randint(1, BENCH_MODEL["vocab_size"], (PROMPTS, PROMPT)).tolist()
    params = SamplingParams(temperature=1.0, max_tokens=NEW, eos_token_ids=[], seed=0)
    engine.generate(prompts, params)                     # compile
    t0 = time.perf_counter()
    out = engine.generate(prompts, params)
    return float(out.response_mask.sum()) / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        phase, arch = args.child
        print(json.dumps({"tokens_per_s": (train if phase == "train" else rollout)(arch)}), flush=True)
        return
    from bench_floors import cpu_info
    runs = {(phase, arch): [] for phase in ("train", "rollout") for arch in ("qwen2", "qwen3")}
    for _ in range(args.rounds):
        for (phase, arch), values in runs.items():
            values.append(run_child(os.path.abspath(__file__), phase, arch)["tokens_per_s"])
    med = {k: float(np.median(v)) for k, v in runs.items()}
    for (phase, arch), values in runs.items():
        print(json.dumps({"bench": "qwen3_vs_qwen2", "phase": phase, "arch": arch,
                          "tokens_per_s": [round(v, 1) for v in values]}), flush=True)
    cpu = cpu_info()
    print(json.dumps({"bench": "qwen3_vs_qwen2", "cpu": f"{cpu['model_name']} ({cpu['family']}/{cpu['model']})",
                      "train_ratio": round(med[("train", "qwen3")] / med[("train", "qwen2")], 3),
                      "rollout_ratio": round(med[("rollout", "qwen3")] / med[("rollout", "qwen2")], 3),
                      "medians_tokens_per_s": {f"{p}_{a}": round(v, 1) for (p, a), v in med.items()}}), flush=True)


if __name__ == "__main__":
    main()
