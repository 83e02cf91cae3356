"""Slice a ~1 GB fp32 full checkpoint into 4 ranks: transform_checkpoint (ours) vs MindSpore's
`transform_checkpoints`, same strategy file, each in its own process (peak RSS is its own).

Ours streams .safetensors in and out (its recommended path); MindSpore runs on its native .ckpt (its
safetensors path slices row-parallel weights wrongly in 2.10, see tests/test_slicing.py). Ours on .ckpt ->
.ckpt is reported too, and ours with 2 worker processes (MindRLHF's --transform_process_num 2, spawned: each imports
MindSpore and reads the source; cutting and writing split): `process_speedup(_ckpt)` = 1 process / 2 processes, same run.
Last line: one JSON object (ours = safetensors path, 1 process).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import peak_rss_mb, run_child  # noqa: E402

TP = 4


def layouts(total_gb: float):
    """A model-like set of parameters: column/row-parallel matrices and replicated norms, ~total_gb."""
    from mindrlhf.parallel.layouts import Layout
    out, size, i = {}, 0, 0
    while size < total_gb * 1e9:
        out[f"layers.{i}.col.weight"] = Layout((4096, 4096), (1, TP), (0, -1))
        out[f"layers.{i}.row.weight"] = Layout((4096, 4096), (1, TP), (-1, 0))
        out[f"layers.{i}.norm.weight"] = Layout((4096,), (1, TP), (-1,))
        size += (2 * 4096 * 4096 + 4096) * 4
        i += 1
    return out


def prepare(work: str):
    from mindrlhf.checkpoint.model_io import save_checkpoint
    from mindrlhf.checkpoint.safetensors_io import write_safetensors
    from mindrlhf.parallel.strategy import write_strategy
    lay = layouts(1.0)
    write_strategy(os.path.join(work, "strategy.ckpt"), lay)
    rng = np.random.default_rng(0)
    tensors = [(n, rng.standard_normal(l.full_shape, dtype=np.float32)) for n, l in lay.items()]
    write_safetensors(os.path.join(work, "full.safetensors"), tensors)
    os.makedirs(os.path.join(work, "ms_src", "rank_0"))
    save_checkpoint(dict(tensors), os.path.join(work, "ms_src", "rank_0", "full.ckpt"))
    return sum(a.nbytes for _, a in tensors)


def child(which: str, work: str) -> dict:
    t0 = time.perf_counter()
    strategy = os.path.join(work, "strategy.ckpt")
    if which == "ours_safetensors":
        from mindrlhf.checkpoint.slicing import transform
        transform(os.path.join(work, "full.safetensors"), os.path.join(work, "out_ours_st"), strategy,
                  out_format="safetensors")
    elif which == "ours_2proc":
        from mindrlhf.checkpoint.slicing import transform
        transform(os.path.join(work, "full.safetensors"), os.path.join(work, "out_ours_2p"), strategy,
                  out_format="safetensors", processes=2)
    elif which == "ours_ckpt_2proc":
        from mindrlhf.checkpoint.slicing import transform
        transform(os.path.join(work, "ms_src", "rank_0", "full.ckpt"), os.path.join(work, "out_ours_ckpt_2p"),
                  strategy, out_format="ckpt", processes=2)
    elif which == "ours_ckpt":
        from mindrlhf.checkpoint.slicing import transform
        transform(os.path.join(work, "ms_src", "rank_0", "full.ckpt"), os.path.join(work, "out_ours_ckpt"), strategy,
                  out_format="ckpt")
    else:
        import mindspore as ms
        ms.transform_checkpoints(os.path.join(work, "ms_src"), os.path.join(work, "out_ms"), "checkpoint_",
                                 src_strategy_file=None, dst_strategy_file=strategy)
    return {"seconds": time.perf_counter() - t0, "peak_rss_mb": peak_rss_mb()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--child", nargs=2)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    work = tempfile.mkdtemp(prefix="bench_slicing_")
    try:
        nbytes = prepare(work)
        gb = nbytes / 1e9
        res = {k: run_child(__file__, k, work) for k in ("ours_safetensors", "ours_2proc", "ours_ckpt", "ours_ckpt_2proc", "mindspore")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for k, v in res.items():
        print(f"{k:17s} {gb / v['seconds']:.3f} GB/s  peak RSS {v['peak_rss_mb']:.0f} MB  ({v['seconds']:.1f} s)")
    ours, ref = res["ours_safetensors"], res["mindspore"]
    print(json.dumps({"bench": "slicing", "ours": round(gb / ours["seconds"], 3), "reference": round(gb / ref["seconds"], 3),
                      "unit": "GB/s", "ratio": round(ref["seconds"] / ours["seconds"], 2),
                      "peak_rss_mb_ours": round(ours["peak_rss_mb"]), "peak_rss_mb_reference": round(ref["peak_rss_mb"]),
                      "ours_ckpt_path_ratio": round(ref["seconds"] / res["ours_ckpt"]["seconds"], 2),
                      "process_speedup": round(ours["seconds"] / res["ours_2proc"]["seconds"], 2),
                      "process_speedup_ckpt": round(res["ours_ckpt"]["seconds"] / res["ours_ckpt_2proc"]["seconds"], 2),
                      "peak_rss_mb_ours_2proc_parent": round(res["ours_2proc"]["peak_rss_mb"])}))


if __name__ == "__main__":
    main()
