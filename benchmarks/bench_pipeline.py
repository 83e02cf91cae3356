"""Pipeline parallelism on 4 msrun CPU workers: step time and per-rank memory of pp2 x tp2 (micro_batch_num 1, 2,
4, 8) against tp4, dp2 x tp2 and dp4 at the same global batch (one GRPO policy update per step), and the
measured 1F1B bubble next to theory (pp - 1) / (m + pp - 1).

The bubble is measured per rank as 1 - (time inside this stage's compute graphs) / (time of the schedule),
averaged over ranks; on a 2-core machine the 4 workers share cores, so "compute" also absorbs contention.
Parameter + optimizer memory is counted from the tensors each rank holds (weights, Adam moments; pipelining
adds a gradient buffer, reported apart). Last line: one JSON object.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, peak_rss_mb  # noqa: E402

MODEL = dict(hidden_size=256, num_layers=4, num_heads=8, n_kv_heads=4, intermediate_size=704, vocab_size=4096,
             qkv_has_bias=True, seq_length=128)
ROWS, P, R = 16, 32, 32                # sequences per update (global), prompt and response widths
WARMUP, TIMED = 2, 5
# name: (pp, dp, tp, micro_batch_num)
CASES = {"pp2_tp2_m1": (2, 1, 2, 1), "pp2_tp2_m2": (2, 1, 2, 2), "pp2_tp2_m4": (2, 1, 2, 4),
         "pp2_tp2_m8": (2, 1, 2, 8), "tp4": (1, 1, 4, 1), "dp2_tp2": (1, 2, 2, 1), "dp4": (1, 4, 1, 1)}


def worker(work: str, case: str):
    import mindspore as ms
    from mindspore import Tensor
    from mindrlhf.checkpoint.model_io import load_full_weights
    from mindrlhf.configs import ModelConfig
    from mindrlhf.configs.grpo_config import GRPOConfig
    from mindrlhf.models.padding import causal_bias, position_ids
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.models.specs import param_specs
    from mindrlhf.parallel import comm
    from mindrlhf.parallel.mesh import Mesh, init_distributed
    from mindrlhf.trainer.optim import AdamW
    from mindrlhf.trainer.update.pipelined import PipelineTrainStep
    from mindrlhf.trainer.update.loss import GRPOLossCell
    from mindrlhf.trainer.update.one_graph import PolicyTrainStep
    pp, dp, tp, m = CASES[case]
    rank, world = init_distributed()
    cfg = ModelConfig(**MODEL)
    rng = np.random.default_rng(0)
    full = {n: (1.0 if "norm" in n else 0.0) + rng.standard_normal(s, dtype=np.float32) * 0.02
            for n, (s, _) in param_specs(cfg).items()}
    mesh = Mesh(dp, tp, rank, pp)
    model = CausalLM(cfg, mesh)
    load_full_weights(model, full.items(), "bench")
    del full
    params = list(model.trainable_params())
    opt = AdamW(params, 0.01)
    rl = GRPOConfig().rl
    rl.beta, rl.loss_agg = 0.04, "token-mean"     # the token-mean loss these figures were measured with
    if pp > 1:
        step = PipelineTrainStep(GRPOLossCell(model, rl, R, 1.0, micro_batches=m), opt, mesh, 1.0, m)
        step.profile = True
    else:
        step = PolicyTrainStep(GRPOLossCell(model, rl, R, 1.0), opt, mesh, 1.0)
    n = ROWS // dp
    rs = np.random.RandomState(rank // (tp * pp) if pp > 1 else mesh.dp_index)
    seq = rs.randint(3, cfg.vocab_size, (n, P + R))
    mask = np.ones((n, P + R), np.int64)
    inputs = [Tensor(seq[:, :-1].astype(np.int32)), Tensor(position_ids(mask[:, :-1])),
              causal_bias(Tensor(mask[:, :-1].astype(np.int32))), Tensor(seq[:, 1:].astype(np.int32)),
              Tensor(np.float32(1e-5)), Tensor(np.ones((n, R), np.float32))]
    inputs += [Tensor(rs.normal(-3, 0.3, (n, R)).astype(np.float32)) for _ in range(3)]
    inputs += [Tensor(rs.normal(0, 1, n).astype(np.float32)), Tensor(np.float32(ROWS * R / dp))]
    times, busy = [], []
    for i in range(WARMUP + TIMED):
        comm.barrier()
        if pp > 1:
            step.busy_seconds = step.schedule_seconds = 0.0
        t0 = time.perf_counter()
        out = step(*inputs)
        float(out[0].asnumpy())
        comm.barrier()
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
            if pp > 1:
                busy.append(1.0 - step.busy_seconds / step.schedule_seconds)
    held = sum(p.asnumpy().nbytes for p in params) + sum(s.asnumpy().nbytes for s in opt.state_parameters())
    acc = sum(a.asnumpy().nbytes for a in step.acc) if pp > 1 else 0
    res = {"step_s": float(np.median(times)), "bubble": float(np.mean(busy)) if busy else 0.0,
           "param_opt_mb": held / 2**20, "grad_buffer_mb": acc / 2**20, "peak_rss_mb": peak_rss_mb()}
    all_res = comm.all_gather(np.array([res[k] for k in sorted(res)], np.float32), comm.world_ranks(), rank)
    if rank == 0:
        with open(os.path.join(work, f"{case}.json"), "w") as fh:
            json.dump({k: all_res[:, i].tolist() for i, k in enumerate(sorted(res))}, fh)


def launch(work: str, case: str):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=REPO, GLOG_v="3")
    cmd = ["msrun", "--worker_num=4", "--local_worker_num=4", "--master_addr=127.0.0.1", f"--master_port={port}",
           "--join=True", f"--log_dir={os.path.join(work, 'log_' + case)}", os.path.abspath(__file__),
           "--run_worker", work, "--case", case]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"msrun failed for {case}; logs in {work}/log_{case}\n{proc.stdout[-2000:]}")
    with open(os.path.join(work, f"{case}.json")) as fh:
        return json.load(fh)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--run_worker", default=None)
    p.add_argument("--case", default=None)
    args = p.parse_args()
    if args.run_worker:
        worker(args.run_worker, args.case)
        return
    from mindrlhf.parallel.pipeline import bubble_fraction
    work = tempfile.mkdtemp(prefix="bench_pipeline_")
    results = {case: launch(work, case) for case in CASES}
    shutil.rmtree(work, ignore_errors=True)
    print(f"model {MODEL}, {ROWS} sequences x {P + R - 1} tokens per update, 4 workers")
    print(f"{'layout':12s} {'step s':>8s} {'bubble':>8s} {'theory':>8s} {'param+opt MB/rank (max)':>24s} "
          f"{'grad buf MB':>12s} {'peak RSS MB (max)':>18s}")
    for case, r in results.items():
        pp, _, _, m = CASES[case]
        theory = bubble_fraction(pp, m) if pp > 1 else 0.0
        print(f"{case:12s} {max(r['step_s']):8.3f} {np.mean(r['bubble']):8.3f} {theory:8.3f} "
              f"{max(r['param_opt_mb']):24.1f} {max(r['grad_buffer_mb']):12.1f} {max(r['peak_rss_mb']):18.0f}")
    m8 = results["pp2_tp2_m8"]
    print(json.dumps({"bench": "pipeline",
                      "bubble_vs_theory": round(float(np.mean(m8["bubble"])) / bubble_fraction(2, 8), 2),
                      "param_mem_ratio": round(max(m8["param_opt_mb"]) / max(results["dp2_tp2"]["param_opt_mb"]), 3),
                      "pp2_tp2_m8_vs_tp4_step": round(max(results["tp4"]["step_s"]) / max(m8["step_s"]), 2),
                      "pp2_tp2_m8_vs_dp4_step": round(max(results["dp4"]["step_s"]) / max(m8["step_s"]), 2)}))


if __name__ == "__main__":
    main()
