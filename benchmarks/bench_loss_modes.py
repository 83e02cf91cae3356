"""GRPO vs GSPO vs CISPO on the real model (SmolLM2-135M-Instruct, 30 layers): held-out accuracy per step.

    python benchmarks/bench_loss_modes.py [--steps 20] [--eval_every 5] [--mini_batch_size 16]

examples/grpo/smollm2_arithmetic's config and data, as bench_real_model.py prepares them, with two updates per
step (rl.mini_batch_size 16 of the step's 32 sequences): with one update per rollout every ratio is 1, and
GRPO's, GSPO's and CISPO's gradients coincide (CISPO's exactly, GSPO's up to its sequence-mean weighting), so
the second, off-policy update is where they differ. rl.loss_mode vanilla (GRPO with clip-higher 0.2 / 0.28),
gspo (the paper's 3e-4 / 4e-4 clip, set explicitly, and its sequence mean), cispo (IS weight capped at 1 + clip_high = 1.28), the same
seed, data and everything else. Each run is a fresh process, one after the other (2 cores). Per run one JSON line
{"bench": "loss_mode", "loss_mode", "curve": [[step, accuracy]...], "step_s", "clip_frac_mean", "wall_min"}, then
{"bench": "loss_modes", "final": {mode: accuracy}, "area": {mode: mean accuracy over the evaluations}, "cpu"}, and
the plot docs/loss_mode_curves.png (--plot to choose).
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_packing import cpu_model  # noqa: E402
from bench_real_model import child_ours, plot, prepare  # noqa: E402
from common import REPO, run_child  # noqa: E402

MODES = ("vanilla", "gspo", "cispo")
LABELS = {"vanilla": "GRPO", "gspo": "GSPO", "cispo": "CISPO"}
# the example sets clip_low/clip_high 0.2 / 0.28 (GRPO's, and CISPO's cap 1 + 0.28); GSPO clips the sequence's
# geometric-mean ratio, which moves far less than a token's: the paper's range, set explicitly here
EXTRA = {"vanilla": {}, "gspo": {"clip_low": 3e-4, "clip_high": 4e-4}, "cispo": {}}


def child(mode: str, work: str, steps: int, eval_every: int, mini_batch_size: int) -> dict:
    from mindrlhf.trainer.metrics import read_metrics
    with open(os.path.join(work, "inputs.json")) as fh:
        inputs = json.load(fh)
    r = child_ours(work, inputs, steps, eval_every, {"loss_mode": mode, "mini_batch_size": mini_batch_size,
                                                     **EXTRA[mode]}, out_name=mode)
    rows = read_metrics(os.path.join(work, mode, "metrics.jsonl"))
    clip = [row["clip_frac"] for row in rows if "clip_frac" in row]
    r["clip_frac_mean"] = sum(clip) / max(len(clip), 1)
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval_every", type=int, default=5)
    p.add_argument("--mini_batch_size", type=int, default=16)
    p.add_argument("--model_dir", default=os.path.join(os.path.expanduser("~"), ".cache", "mindrlhf", "smollm2"))
    p.add_argument("--work", default="")
    p.add_argument("--plot", default=os.path.join(REPO, "docs", "loss_mode_curves.png"))
    p.add_argument("--modes", default=",".join(MODES), help="the modes to run now; the plot and summary also take "
                                                          "the other modes' curves from an earlier run in --work")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        mode, work = args.child
        print(json.dumps(child(mode, work, args.steps, args.eval_every, args.mini_batch_size)), flush=True)
        return
    work = args.work or tempfile.mkdtemp(prefix="bench_loss_modes_")
    os.makedirs(work, exist_ok=True)
    if not os.path.exists(os.path.join(work, "inputs.json")):
        with open(os.path.join(work, "inputs.json"), "w") as fh:
            json.dump(prepare(work, args.model_dir), fh)
    curves = {}
    for mode in args.modes.split(","):
        r = run_child(os.path.abspath(__file__), mode, work, "--steps", args.steps, "--eval_every", args.eval_every,
                      "--mini_batch_size", args.mini_batch_size)
        curves[mode] = r["curve"]
        print(json.dumps({"bench": "loss_mode", "loss_mode": mode, "curve": r["curve"], "step_s": round(r["step_s"], 3),
                          "clip_frac_mean": round(r["clip_frac_mean"], 5), "wall_min": round(r["wall_s"] / 60, 2)}),
              flush=True)
    from mindrlhf.trainer.metrics import read_metrics
    for mode in MODES:                  # modes not run now: their curves from an earlier run in --work
        path = os.path.join(work, mode, "metrics.jsonl")
        if mode not in curves and os.path.exists(path):
            curves[mode] = [[r["step"], r["eval_accuracy"]] for r in read_metrics(path) if "eval_accuracy" in r]
    curves = {m: curves[m] for m in MODES if m in curves}
    plot(args.plot, {LABELS[m]: c for m, c in curves.items()}, "SmolLM2-135M-Instruct: rl.loss_mode",
         "GRPO step (2 updates each)")
    print(json.dumps({"bench": "loss_modes", "final": {m: c[-1][1] for m, c in curves.items() if c},
                      "area": {m: round(sum(a for _, a in c) / len(c), 4) for m, c in curves.items() if c},
                      "steps": args.steps, "mini_batch_size": args.mini_batch_size, "cpu": cpu_model()}), flush=True)


if __name__ == "__main__":
    main()
