"""msrun worker: the same GRPO run with and without every host-memory swap; final weights must match.

argv: assets_json out_dir. Writes out_dir/rank_{r}.json.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from grpo_helpers import grpo_overrides  # noqa: E402
from mindrlhf.checkpoint.model_io import model_state  # noqa: E402
from mindrlhf.configs.grpo_load import load_grpo_config  # noqa: E402
from mindrlhf.trainer.grpo_trainer import GRPOTrainer  # noqa: E402
from mindrlhf.reward.verifiers import register_verifier  # noqa: E402


@register_verifier("digit_fraction_test")
def digit_fraction(completion, solution):
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


SWAPS = dict(offload_train_param=True, offload_train_optimizer=True, offload_infer_param=True,
             offload_ref_param=True, offload_kv_cache=True)


def run(assets, save_dir, swaps):
    extra = dict(total_steps=2, beta=0.05, verifier_function="digit_fraction_test", mini_batch_size=8,
                 use_parallel=True, save_steps=0, **swaps)
    trainer = GRPOTrainer(load_grpo_config(None, grpo_overrides(assets, save_dir, **extra)), log=lambda *a: None)
    history = trainer.fit()
    opt = {p.name: p.asnumpy().copy() for p in trainer.optimizer.state_parameters()}
    return model_state(trainer.policy), model_state(trainer.rollout_model), opt, history, trainer


def main():
    with open(sys.argv[1]) as fh:
        assets = json.load(fh)
    out_dir = sys.argv[2]
    plain_p, plain_r, plain_o, plain_h, t0 = run(assets, os.path.join(out_dir, "plain"), {})
    swap_p, swap_r, swap_o, swap_h, t1 = run(assets, os.path.join(out_dir, "swap"), SWAPS)
    rank = t1.rank
    result = {
        "separate_rollout_model": t1.rollout_model is not t1.policy,
        "policy_equal": all(np.array_equal(plain_p[k], swap_p[k]) for k in plain_p),
        "rollout_equal": all(np.array_equal(plain_r[k], swap_r[k]) for k in plain_r),
        "optimizer_equal": all(np.array_equal(plain_o[k], swap_o[k]) for k in plain_o),
        "max_diff": max(float(np.abs(plain_p[k] - swap_p[k]).max()) for k in plain_p),
        "opt_diff": {k: float(np.abs(plain_o[k].astype(np.float64) - swap_o[k]).max()) for k in plain_o
                     if not np.array_equal(plain_o[k], swap_o[k])},
        "learned": any(not np.array_equal(plain_p[k], v) for k, v in model_state(t0.ref_model).items()),
        "swap_seconds": [h["time_swap"] for h in swap_h],
        "swaps_enabled": {k: g.enabled for k, g in t1.swap.groups.items()},
        "peak_rollout_mb": [h["peak_mb_rollout"] for h in swap_h],
        "peak_rollout_mb_plain": [h["peak_mb_rollout"] for h in plain_h],
    }
    with open(os.path.join(out_dir, f"rank_{rank}.json"), "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main()
