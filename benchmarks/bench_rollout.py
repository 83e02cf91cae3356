"""Generated tokens/s: our engine vs transformers `generate` (torch CPU, KV cache on), same weights and
sampling (temperature 1, no top-k/top-p), 16 prompts x 64 tokens, 128 new tokens; plus batch 1 / 8 / 32.
Each side runs in its own process. Last line: one JSON object.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BENCH_MODEL, hf_model_dir, peak_rss_mb, run_child  # noqa: E402

PROMPT, NEW = 64, 128


def prompts(n):
    return np.random.RandomState(n).randint(0, BENCH_MODEL["vocab_size"], (n, PROMPT))


def ours(hf_dir, batches):
    from mindrlhf.checkpoint.model_io import load_weights
    from mindrlhf.configs import ModelConfig
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.rollout.engine import GenerationEngine
    from mindrlhf.rollout.sampling import SamplingParams
    model = CausalLM(ModelConfig(**BENCH_MODEL))
    load_weights(model, hf_dir)
    eng = GenerationEngine(model, pad_token_id=0, prompt_bucket=PROMPT)
    out = {}
    for b in batches:
        ps = prompts(b).tolist()
        params = SamplingParams(temperature=1.0, max_tokens=NEW, eos_token_ids=[], seed=0)
        eng.generate(ps, params)                      # compile
        t0 = time.perf_counter()
        res = eng.generate(ps, params)
        out[b] = float(res.response_mask.sum()) / (time.perf_counter() - t0)
    return out


def reference(hf_dir, batches):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    out = {}
    for b in batches:
        ids = torch.tensor(prompts(b))
        kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                  pad_token_id=0, use_cache=True)
        with torch.no_grad():
            model.generate(ids[:, :8], max_new_tokens=4, do_sample=True, top_k=0, pad_token_id=0)   # warm-up
            t0 = time.perf_counter()
            res = model.generate(ids, **kw)
        out[b] = float((res.shape[1] - PROMPT) * b) / (time.perf_counter() - t0)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--child", nargs=3, metavar=("WHICH", "HF_DIR", "BATCHES"))
    args = p.parse_args()
    if args.child:
        which, hf_dir, batches = args.child
        bs = [int(x) for x in batches.split(",")]
        res = ours(hf_dir, bs) if which == "ours" else reference(hf_dir, bs)
        print(json.dumps({"tokens_per_s": res, "peak_rss_mb": peak_rss_mb()}))
        return
    hf_dir = hf_model_dir(os.path.join(tempfile.gettempdir(), "mindrlhf_bench_model"))
    batches = "16,1,8,32"
    mine = run_child(__file__, "ours", hf_dir, batches)["tokens_per_s"]
    ref = run_child(__file__, "reference", hf_dir, batches)["tokens_per_s"]
    print("batch | ours tokens/s | transformers tokens/s | ratio")
    for b in ("1", "8", "16", "32"):
        print(f"{b:>5} | {mine[b]:13.0f} | {ref[b]:21.0f} | {mine[b] / ref[b]:.2f}")
    print(json.dumps({"bench": "rollout", "ours": round(mine["16"], 1), "reference": round(ref["16"], 1),
                      "unit": "tokens/s", "ratio": round(mine["16"] / ref["16"], 3),
                      "scaling_ours": {b: round(mine[b], 1) for b in ("1", "8", "32")},
                      "scaling_reference": {b: round(ref[b], 1) for b in ("1", "8", "32")}}))


if __name__ == "__main__":
    main()
