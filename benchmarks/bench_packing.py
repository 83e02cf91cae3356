"""Sequence packing against padded rows: the GRPO update (loss, backward, AdamW) on the same mini-batches.

    python benchmarks/bench_packing.py [--updates 4] [--micro_rows 4] [--packed_micro_rows 1]

Model: the issues' benchmark model (benchmarks/common.py BENCH_MODEL: 4 layers, hidden 512, vocab 32000), random
weights. A mini-batch is 16 sequences of prompt width 96 and up to 400 response tokens (input rows of 495):
prompt lengths uniform in [24, 96], response lengths log-normal (median 80, sigma 0.9) clipped to [1, 400], the
long tail of reasoning RL, where a few responses reach the limit and most stop far earlier. Padded: micro-batches
of --micro_rows rows of 495 (the trainer with engine.micro_batch_size). Packed (engine.sequence_packing): the sequences
first-fit into rows of 495, micro-batches of --packed_micro_rows rows. The same code the trainer calls
(samples.train_step_inputs / packing.packed_step_inputs, update/pipelined.PipelineTrainStep). Each system runs in
its own process, one after the other; the first update compiles and is not timed.

Per system one JSON line {"bench": "packing", "system", "update_s" (median), "peak_rss_mb", "rows", "tokens"},
then {"bench": "packing_vs_padded", "speedup": padded update_s / packed update_s, "rss_ratio": packed / padded,
"padding_frac": share of padded positions that hold no token, "cpu"}.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BENCH_MODEL, ours_kernel_threads, peak_rss_mb, run_child  # noqa: E402

PROMPT_WIDTH, MAX_TOKENS, SEQUENCES = 96, 400, 16      # rows of 495 < the model's 512 positions


def mini_batch(seed: int):
    """One mini-batch of SampleBatch rows with the lengths described above, and its loss inputs."""
    from mindrlhf.trainer.samples import SampleBatch
    rng = np.random.RandomState(seed)
    n, p, r = SEQUENCES, PROMPT_WIDTH, MAX_TOKENS
    plen = rng.randint(24, p + 1, n)
    rlen = np.clip(np.round(rng.lognormal(np.log(80), 0.9, n)), 1, r).astype(np.int64)
    pmask = (np.arange(p)[None] >= p - plen[:, None]).astype(np.int64)
    rmask = (np.arange(r)[None] < rlen[:, None]).astype(np.int64)
    vocab = BENCH_MODEL["vocab_size"]
    batch = SampleBatch(rng.randint(3, vocab, (n, p)) * pmask, pmask, rng.randint(3, vocab, (n, r)) * rmask, rmask,
                        (rng.normal(-2.0, 0.5, (n, r)) * rmask).astype(np.float32), np.arange(n),
                        np.ones(n, np.int64))
    mask = rmask.astype(np.float32)
    ref = batch.rollout_logp + (rng.normal(0, 0.05, (n, r)) * rmask).astype(np.float32)
    adv = rng.normal(0, 1, n).astype(np.float32)
    return batch, mask, ref, adv


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            info = fh.read()
        name = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        family = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("cpu family"))
        model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model\t"))
        return f"{name} (family {family} model {model}), {os.cpu_count()} CPUs"
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def child(system: str, updates: int, micro_rows: int, packed_micro_rows: int) -> dict:
    import mindspore as ms
    from mindrlhf.configs import ModelConfig
    from mindrlhf.configs.grpo_config import GRPOConfig
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.parallel.mesh import Mesh
    from mindrlhf.trainer.optim import AdamW
    from mindrlhf.trainer.packing import packed_step_inputs
    from mindrlhf.trainer.update.pipelined import PipelineTrainStep
    from mindrlhf.trainer.samples import train_step_inputs
    from mindrlhf.trainer.update.loss_inputs import LossInputs
    from mindrlhf.trainer.update.loss import GRPOLossCell
    ours_kernel_threads()
    ms.set_seed(0)
    model = CausalLM(ModelConfig(**BENCH_MODEL))
    rl = GRPOConfig().rl
    rl.beta, rl.loss_agg = 0.04, "token-mean"     # the token-mean loss these figures were measured with
    packed = system == "packed"
    width = PROMPT_WIDTH + MAX_TOKENS - 1
    micro_batches = SEQUENCES // micro_rows
    loss_cell = GRPOLossCell(model, rl, width if packed else MAX_TOKENS, 1.0, True, micro_batches)
    optimizer = AdamW(list(model.trainable_params()), 0.0)
    step = PipelineTrainStep(loss_cell, optimizer, Mesh(1, 1, 0), 1.0, micro_batches,
                             packed_micro_rows if packed else 0)
    times, rows, tokens = [], [], []
    for u in range(updates + 1):
        batch, mask, ref, adv = mini_batch(u)
        loss_inputs = LossInputs(mask, batch.rollout_logp, batch.rollout_logp, ref, adv, mask.sum())
        if packed:
            args = packed_step_inputs(batch, loss_inputs, 1e-6, 0, packed_micro_rows)
        else:
            args = train_step_inputs(batch, loss_inputs, 1e-6)
        t0 = time.perf_counter()
        out = step(*args)
        float(out[0].asnumpy())
        if u:                                   # update 0 compiles
            times.append(time.perf_counter() - t0)
            rows.append(int(args[0].shape[0]))
            tokens.append(int((batch.prompt_mask.sum() + batch.response_mask.sum())))
    return {"update_s": statistics.median(times), "peak_rss_mb": peak_rss_mb(), "rows": rows, "tokens": tokens}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=4, help="timed updates (after one that compiles)")
    p.add_argument("--micro_rows", type=int, default=4, help="padded rows per micro-batch")
    p.add_argument("--packed_micro_rows", type=int, default=1, help="packed rows per micro-batch (1: the default "
                                                                     "of engine.max_packing_token_size)")
    p.add_argument("--child", nargs=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.updates, args.micro_rows, args.packed_micro_rows)), flush=True)
        return
    flags = ["--updates", args.updates, "--micro_rows", args.micro_rows, "--packed_micro_rows", args.packed_micro_rows]
    results = {}
    for system in ("padded", "packed"):
        r = results[system] = run_child(os.path.abspath(__file__), system, *flags)
        print(json.dumps({"bench": "packing", "system": system, "update_s": round(r["update_s"], 3),
                          "peak_rss_mb": round(r["peak_rss_mb"]), "rows": r["rows"], "tokens": r["tokens"]}),
              flush=True)
    padded, packed = results["padded"], results["packed"]
    width = PROMPT_WIDTH + MAX_TOKENS - 1
    real = sum(padded["tokens"]) - len(padded["tokens"]) * SEQUENCES    # input positions: tokens - 1 per sequence
    print(json.dumps({"bench": "packing_vs_padded", "speedup": round(padded["update_s"] / packed["update_s"], 3),
                      "rss_ratio": round(packed["peak_rss_mb"] / padded["peak_rss_mb"], 3),
                      "padding_frac": round(1 - real / (len(padded["tokens"]) * SEQUENCES * width), 3),
                      "micro_rows": args.micro_rows, "packed_micro_rows": args.packed_micro_rows,
                      "cpu": cpu_model()}), flush=True)


if __name__ == "__main__":
    main()
