"""Seconds per GRPO step and the per-phase split for a fixed tiny setup: the demo pipeline (2 msrun workers,
train dp1 x tp2, infer dp2 x tp1, 16 prompts x 8 samples per step), steps 2..N averaged (step 1 compiles).
Last line: one JSON object.
"""
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402,F401
from mindrlhf import demo  # noqa: E402
from mindrlhf.trainer.metrics import read_metrics  # noqa: E402

STEPS = 12


def main():
    work = tempfile.mkdtemp(prefix="bench_grpo_step_")
    demo.main(["--workdir", work, "--steps", str(STEPS), "--sft_steps", "50", "--train_rows", "1000"])
    rows = [r for r in read_metrics(os.path.join(work, "grpo_ckpt", "metrics.jsonl")) if "reward_mean" in r][1:]
    phases = [k for k in rows[0] if k.startswith("time_") and k != "time_step"]
    print("\nphase        | s/step | share")
    total = float(np.mean([r["time_step"] for r in rows]))
    split = {}
    for k in phases:
        v = float(np.mean([r[k] for r in rows]))
        split[k[5:]] = round(v, 3)
        print(f"{k[5:]:12s} | {v:6.3f} | {100 * v / total:5.1f}%")
    print(f"{'step':12s} | {total:6.3f} |")
    print(json.dumps({"bench": "grpo_step", "ours": round(total, 3), "unit": "s/step", "phases": split,
                      "steps_averaged": len(rows), "workers": 2}))


if __name__ == "__main__":
    main()
