"""DAPO's dynamic sampling on the demo task: held-out greedy accuracy against policy updates, with and
without it, for two GRPO seeds (same data, warm-up and settings otherwise). Each arm is a full demo run
(`python -m mindrlhf.demo`), so this takes ~4 x the demo's time. Not a timing benchmark: it reports the
first step (= updates / 2) at which each arm reaches the accuracy the plain run ends with, and the rollout
rounds dynamic sampling spent. Last line: one JSON object.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def run_demo(workdir, seed, dynamic, steps, eval_steps):
    cmd = [sys.executable, "-m", "mindrlhf.demo", "--workdir", workdir, "--steps", str(steps), "--seed", str(seed),
           "--eval_steps", str(eval_steps)] + (["--dynamic_sampling"] if dynamic else [])
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    ckpt = os.path.join(workdir, "grpo_ckpt")
    with open(os.path.join(ckpt, "metrics.jsonl")) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    evals = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
    rounds = [r.get("dynamic_sampling/rounds", 1.0) for r in rows if "loss" in r]
    return evals, sum(rounds) / max(len(rounds), 1)


def first_step_reaching(evals, level):
    return next((step for step, acc in evals if acc >= level), None)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--eval_steps", type=int, default=10)
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="bench_ds_")
    result = {"bench": "dynamic_sampling", "updates_per_step": 2}
    for seed in [int(s) for s in args.seeds.split(",")]:
        plain, _ = run_demo(os.path.join(root, f"plain_{seed}"), seed, False, args.steps, args.eval_steps)
        dyn, rounds = run_demo(os.path.join(root, f"dyn_{seed}"), seed, True, args.steps, args.eval_steps)
        target = plain[-1][1]
        print(f"seed {seed}: plain  " + " ".join(f"{s}:{a:.3f}" for s, a in plain))
        print(f"seed {seed}: dynamic " + " ".join(f"{s}:{a:.3f}" for s, a in dyn) + f"  (rollout rounds/step {rounds:.2f})")
        result[f"seed{seed}"] = {"plain_final": target, "dynamic_final": dyn[-1][1],
                                 "plain_step_to_final": first_step_reaching(plain, target),
                                 "dynamic_step_to_plain_final": first_step_reaching(dyn, target),
                                 "dynamic_rounds_per_step": round(rounds, 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
