"""LoRA against full fine-tuning on the real model (SmolLM2-135M-Instruct, 30 layers), same GRPO run otherwise:
examples/grpo/smollm2_arithmetic's config and data, as bench_real_model.py prepares them.

    python benchmarks/bench_lora.py [--steps 10] [--eval_every 0] [--beta 0.04] [--rank 16] [--one_graph]

Full fine-tuning trains every weight (AdamW moments for all, and with --beta > 0 a reference copy); LoRA
(lora.lora_rank --rank, alpha 2 x rank, all linear layers) trains the adapters only, and its reference is the
policy with the adapters off. Both runs use engine.layerwise_update (the update and the log-prob passes one
decoder layer per graph), the update to choose when memory is the reason for LoRA: with one graph for the
whole model's update, its compile heap and activations, which LoRA does not shrink, set both runs' peak
(--one_graph runs that way: docs/BENCHMARKS.md has both). LoRA runs at --lora_lr (default 10x the full run's
lr: a low-rank update needs a larger step for the same change, the usual LoRA practice). Each run is a fresh
process, one after the other (2 cores: never at once). Per run one JSON line {"bench": "lora", "system",
"peak_rss_mb", "step_s", "train_s" (the update phase), "ref_s", "first_step_s", "heldout_before",
"heldout_after", "wall_min"}, then
{"bench": "lora_vs_full", "peak_rss_ratio": lora / full, "train_step_ratio": full train_s / lora train_s
(> 1: LoRA faster), "step_ratio": full step_s / lora step_s, "heldout_gain_full", "heldout_gain_lora"}.
Medians over steps 2..N (step 1 compiles).
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_real_model import child_ours, prepare  # noqa: E402
from common import run_child  # noqa: E402


def child(which: str, work: str, steps: int, eval_every: int, beta: float, rank: int, lora_lr: float,
          layerwise: bool) -> dict:
    with open(os.path.join(work, "inputs.json")) as fh:
        inputs = json.load(fh)
    extra = {"beta": beta, "layerwise_update": layerwise}
    if which == "lora":
        extra.update(lora_rank=rank, lora_alpha=2.0 * rank, lr=lora_lr)
    r = child_ours(work, inputs, steps, eval_every, extra, out_name=which)
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--eval_every", type=int, default=0, help="0: no held-out evaluation (timing and memory only)")
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient: > 0 keeps a reference model")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--lora_lr", type=float, default=1e-4)
    p.add_argument("--one_graph", action="store_true",
                   help="both runs with one graph for the update (engine.layerwise_update false)")
    p.add_argument("--model_dir", default=os.path.join(os.path.expanduser("~"), ".cache", "mindrlhf", "smollm2"))
    p.add_argument("--work", default="")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        which, work = args.child
        print(json.dumps(child(which, work, args.steps, args.eval_every, args.beta, args.rank, args.lora_lr,
                               not args.one_graph)), flush=True)
        return
    work = args.work or tempfile.mkdtemp(prefix="bench_lora_")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "inputs.json"), "w") as fh:
        json.dump(prepare(work, args.model_dir), fh)
    flags = ["--steps", args.steps, "--eval_every", args.eval_every, "--beta", args.beta, "--rank", args.rank,
             "--lora_lr", args.lora_lr] + (["--one_graph"] if args.one_graph else [])
    results = {}
    for which in ("full", "lora"):
        r = results[which] = run_child(os.path.abspath(__file__), which, work, *flags)
        curve = r["curve"]
        print(json.dumps({"bench": "lora", "system": which, "peak_rss_mb": round(r["peak_rss_mb"]),
                          "step_s": round(r["step_s"], 3), "train_s": round(r["phases"]["policy fwd+bwd+AdamW"], 3),
                          "ref_s": round(r["phases"]["reference log-probs"], 3),
                          "first_step_s": round(r["first_step_s"], 2), "wall_min": round(r["wall_s"] / 60, 2),
                          "heldout_before": curve[0][1] if curve else None,
                          "heldout_after": curve[-1][1] if curve else None, "curve": curve}), flush=True)
    full, lora = results["full"], results["lora"]
    line = {"bench": "lora_vs_full", "peak_rss_ratio": round(lora["peak_rss_mb"] / full["peak_rss_mb"], 3),
            "train_step_ratio": round(full["phases"]["policy fwd+bwd+AdamW"] / lora["phases"]["policy fwd+bwd+AdamW"], 3),
            "step_ratio": round(full["step_s"] / lora["step_s"], 3), "beta": args.beta, "rank": args.rank,
            "layerwise": not args.one_graph}
    if full["curve"] and lora["curve"]:
        line["heldout_gain_full"] = round(full["curve"][-1][1] - full["curve"][0][1], 4)
        line["heldout_gain_lora"] = round(lora["curve"][-1][1] - lora["curve"][0][1], 4)
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
