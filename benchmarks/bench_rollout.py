"""Generated tokens/s: our engine vs transformers `generate` (torch CPU, KV cache on), same weights and
sampling (temperature 1, no top-k/top-p), 16 prompts x 64 tokens, 128 new tokens; plus batch 1 / 8 / 32.

Early-stop variant (batch 16; --early_batch N for another): EOS_IDS token ids all count as EOS, so under the
random model about half of the sequences stop at random lengths before 128 tokens (GRPO's usual ragged
rollouts). Tokens/s counts generated tokens (EOS included); ours runs with finished rows compacted out of
the decode batch and decoding every row to the end (compact_below 0), which is what the saving is measured
against: the two alternate EARLY_REPEATS times on the same samples and their medians are reported (one run
of each, one after the other, moved the saving between 0.93 and 1.06 on one machine); transformers runs
once. Compaction halves the batch only while at least 8 rows remain (GenerationEngine.compact_below), so at
batch 16 it runs 8 rows for the steps after half the sequences ended; at batch 64 it can go 64 -> 32 -> 16
-> 8.
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
from common import BENCH_MODEL, hf_model_dir, ours_kernel_threads, peak_rss_mb, run_child  # noqa: E402

PROMPT, NEW = 64, 128
EOS_IDS = list(range(1000, 1000 + 180))      # ~0.56% stop chance per token: half the rows end early
EARLY = 16                                   # batch of the early-stop variant (--early_batch)
EARLY_REPEATS = 5                            # its two modes alternate this many times; medians reported


def prompts(n):
    return np.random.RandomState(n).randint(0, BENCH_MODEL["vocab_size"], (n, PROMPT))


def ours(hf_dir, batches, early_stop=0):
    from mindrlhf.checkpoint.model_io import load_weights
    from mindrlhf.configs import ModelConfig
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.rollout.engine import GenerationEngine
    from mindrlhf.rollout.sampling import SamplingParams
    ours_kernel_threads()
    model = CausalLM(ModelConfig(**BENCH_MODEL))
    load_weights(model, hf_dir)
    eng = GenerationEngine(model, pad_token_id=0, prompt_bucket=PROMPT)
    if early_stop:
        out = {}
        ps = prompts(early_stop).tolist()
        params = SamplingParams(temperature=1.0, max_tokens=NEW, eos_token_ids=EOS_IDS, seed=0)
        modes = (("compacting", eng.compact_below), ("every_row", 0))
        for name, compact_below in modes:
            eng.compact_below = compact_below
            eng.generate(ps, params)                      # compile (the same samples: same seed)
        speeds = {name: [] for name, _ in modes}
        for _ in range(EARLY_REPEATS):                    # interleaved: the machine drifts between runs
            for name, compact_below in modes:
                eng.compact_below = compact_below
                rows_before = eng.decoded_rows
                t0 = time.perf_counter()
                res = eng.generate(ps, params)
                speeds[name].append(float(res.response_mask.sum()) / (time.perf_counter() - t0))
                out[name + "_decoded_rows"] = eng.decoded_rows - rows_before
        for name, runs in speeds.items():
            out[name] = float(np.median(runs))
        lengths = res.response_lengths
        out["stopped_early"] = float((lengths < NEW).mean())
        out["mean_length"] = float(lengths.mean())
        return out
    out = {}
    for b in batches:
        ps = prompts(b).tolist()
        params = SamplingParams(temperature=1.0, max_tokens=NEW, eos_token_ids=[], seed=0)
        eng.generate(ps, params)                      # compile
        t0 = time.perf_counter()
        res = eng.generate(ps, params)
        out[b] = float(res.response_mask.sum()) / (time.perf_counter() - t0)
    return out


def reference(hf_dir, batches, early_stop=0):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    if early_stop:
        ids = torch.tensor(prompts(early_stop))
        with torch.no_grad():
            model.generate(ids[:, :8], max_new_tokens=4, do_sample=True, top_k=0, pad_token_id=0)   # warm-up
            t0 = time.perf_counter()
            res = model.generate(ids, max_new_tokens=NEW, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 pad_token_id=0, eos_token_id=EOS_IDS, use_cache=True)
            seconds = time.perf_counter() - t0
        new = res[:, PROMPT:].numpy()
        is_eos = np.isin(new, EOS_IDS)
        lengths = np.where(is_eos.any(1), is_eos.argmax(1) + 1, new.shape[1])
        return {"every_row": float(lengths.sum()) / seconds, "stopped_early": float((lengths < NEW).mean()),
                "mean_length": float(lengths.mean())}
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
    p.add_argument("--early_batch", type=int, default=EARLY,
                   help="rows of the early-stop variant (compaction halves them while at least 8 remain)")
    p.add_argument("--child", nargs=3, metavar=("WHICH", "HF_DIR", "BATCHES"))
    args = p.parse_args()
    if args.early_batch < 1:
        p.error(f"--early_batch must be >= 1, got {args.early_batch}")
    if args.child:
        which, hf_dir, batches = args.child
        early = int(batches[len("early"):]) if batches.startswith("early") else 0
        bs = [] if early else [int(x) for x in batches.split(",")]
        res = (ours if which == "ours" else reference)(hf_dir, bs, early)
        print(json.dumps({"tokens_per_s": res, "peak_rss_mb": peak_rss_mb()}))
        return
    hf_dir = hf_model_dir(os.path.join(tempfile.gettempdir(), "mindrlhf_bench_model"))
    batches = "16,1,8,32"
    mine = run_child(__file__, "ours", hf_dir, batches)["tokens_per_s"]
    ref = run_child(__file__, "reference", hf_dir, batches)["tokens_per_s"]
    early_ours = run_child(__file__, "ours", hf_dir, f"early{args.early_batch}")["tokens_per_s"]
    early_ref = run_child(__file__, "reference", hf_dir, f"early{args.early_batch}")["tokens_per_s"]
    print("batch | ours tokens/s | transformers tokens/s | ratio")
    for b in ("1", "8", "16", "32"):
        print(f"{b:>5} | {mine[b]:13.0f} | {ref[b]:21.0f} | {mine[b] / ref[b]:.2f}")
    print(f"early stop, batch {args.early_batch}: ours {early_ours['compacting']:.0f} tokens/s compacting finished "
          f"rows ({early_ours['compacting_decoded_rows']} rows decoded), {early_ours['every_row']:.0f} decoding every "
          f"row ({early_ours['every_row_decoded_rows']}); transformers {early_ref['every_row']:.0f}; "
          f"{early_ours['stopped_early']:.0%} / {early_ref['stopped_early']:.0%} of the sequences stopped early, "
          f"mean length {early_ours['mean_length']:.0f} / {early_ref['mean_length']:.0f}")
    print(json.dumps({"bench": "rollout", "ours": round(mine["16"], 1), "reference": round(ref["16"], 1),
                      "unit": "tokens/s", "ratio": round(mine["16"] / ref["16"], 3),
                      "scaling_ours": {b: round(mine[b], 1) for b in ("1", "8", "32")},
                      "scaling_reference": {b: round(ref[b], 1) for b in ("1", "8", "32")},
                      "early_stop": {"ours": round(early_ours["compacting"], 1),
                                     "ours_every_row": round(early_ours["every_row"], 1),
                                     "reference": round(early_ref["every_row"], 1),
                                     "ratio": round(early_ours["compacting"] / early_ref["every_row"], 3),
                                     "compaction_saving": round(early_ours["compacting"] / early_ours["every_row"], 3),
                                     "stopped_early": round(early_ours["stopped_early"], 3),
                                     "batch": args.early_batch}}))


if __name__ == "__main__":
    main()
