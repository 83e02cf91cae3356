"""Rollout-phase peak memory with and without host swap of the policy's train weights and AdamW state
(fp32, the state is 2x the weights), with a separate rollout model as in the GRPO loop, on a model large
enough that weights dominate. Each case runs in its own process, after the train step and the rollout
have both run once (steady state), and measures the peak RSS of one rollout.

On a CPU-only machine host and "device" are the same RAM: the swap frees the buffers' pages
(mindrlhf/parallel/swap.py) but keeps an equal host copy in the same process. So "ours" is the
device-side peak, the process peak minus the host copies (constant during the phase); the process total
is printed too. The train phase is measured too, with the rollout weights and KV cache freed without a host
copy (what `offload_infer_param` / `offload_kv_cache` do): that lowers the process total even on CPU.
Last line: one JSON object.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_child  # noqa: E402

MODEL = dict(hidden_size=1024, num_layers=8, num_heads=16, n_kv_heads=4, intermediate_size=4096, vocab_size=32000,
             seq_length=128, max_position_embedding=128, qkv_has_bias=True)


def child(swap: bool) -> dict:
    from mindspore import Tensor
    from mindrlhf.configs import ModelConfig
    from mindrlhf.models.padding import causal_bias
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.parallel.swap import SwapGroup
    from mindrlhf.rollout.engine import GenerationEngine
    from mindrlhf.rollout.sampling import SamplingParams
    from mindrlhf.trainer.optim import AdamW
    from mindrlhf.trainer.sft import SFTStep
    from mindrlhf.utils import memory
    policy = CausalLM(ModelConfig(**MODEL))
    opt = AdamW(list(policy.trainable_params()))
    step = SFTStep(policy, opt, 1.0)
    ids = np.random.RandomState(0).randint(0, MODEL["vocab_size"], (2, 33))
    batch = (Tensor(ids[:, :-1].astype(np.int32)), Tensor(np.tile(np.arange(32, dtype=np.int32), (2, 1))),
             causal_bias(Tensor(np.ones((2, 32), np.int32))), Tensor(ids[:, 1:].astype(np.int32)),
             Tensor(np.ones((2, 32), np.float32)), Tensor(np.float32(64.0)), Tensor(np.float32(1e-5)))
    step(*batch)[0].asnumpy()
    rollout_model = CausalLM(ModelConfig(**MODEL))
    engine = GenerationEngine(rollout_model, 0, 16)
    prompts, sampling = [[1, 2, 3, 4]] * 4, SamplingParams(max_tokens=16, seed=0)
    engine.generate(prompts, sampling)                      # compile the rollout graphs
    groups = [SwapGroup("policy", policy.get_parameters(), enabled=swap),
              SwapGroup("optimizer", opt.state_parameters(), enabled=swap)]
    for g in groups:
        g.offload()
    memory.reset_peak()
    engine.generate(prompts, sampling)
    peak = memory.peak_mb()
    host_mb = sum(g.host_bytes() for g in groups) / 2**20
    result = {"peak_mb": peak, "host_mb": host_mb, "device_peak_mb": peak - host_mb,
              "swapped_mb": sum(g.released_bytes for g in groups) / 2**20}
    # train phase: rollout weights and KV cache freed without a host copy (the sync and prefill rewrite them)
    for g in groups:
        g.reload()
    scratch = [SwapGroup("rollout", rollout_model.get_parameters(), enabled=swap, keep_contents=False),
               SwapGroup("kv_cache", engine.cache_parameters(), enabled=swap, keep_contents=False)]
    for g in scratch:
        g.offload()
    memory.reset_peak()
    step(*batch)[0].asnumpy()
    result["train_peak_mb"] = memory.peak_mb()
    result["train_freed_mb"] = sum(g.released_bytes for g in scratch) / 2**20
    return result


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--child", nargs=1)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0] == "swap")))
        return
    plain = run_child(__file__, "plain")
    swapped = run_child(__file__, "swap")
    print(f"rollout-phase peak: without swap {plain['peak_mb']:.0f} MB; with policy + optimizer swapped out: "
          f"device side {swapped['device_peak_mb']:.0f} MB, process total {swapped['peak_mb']:.0f} MB "
          f"(host copies {swapped['host_mb']:.0f} MB, pages released {swapped['swapped_mb']:.0f} MB)")
    print(f"train-phase peak: without swap {plain['train_peak_mb']:.0f} MB; rollout weights + KV cache freed "
          f"({swapped['train_freed_mb']:.0f} MB, no host copy): {swapped['train_peak_mb']:.0f} MB process total")
    print(json.dumps({"bench": "swap_memory", "ours": round(swapped["device_peak_mb"]),
                      "reference": round(plain["peak_mb"]), "unit": "MB",
                      "ratio": round(plain["peak_mb"] / swapped["device_peak_mb"], 3),
                      "process_total_mb_with_swap": round(swapped["peak_mb"]),
                      "train_phase_mb": round(plain["train_peak_mb"]),
                      "train_phase_mb_rollout_freed": round(swapped["train_peak_mb"])}))


if __name__ == "__main__":
    main()
