"""Where mindrlhf's cold peak RSS comes from: bench_vs_trl's small GRPO job (same work, weights, data and
settings; bench_vs_trl.child_ours) run with MindSpore's graph compiler used for none, some or all of its
graphs, each variant from a cold compile in a fresh process, against TRL's GRPOTrainer in the same run.

Variants (which `@ms.jit` graphs stay compiled; the others run op by op in PyNative):
  pynative           none
  rollout            the generation engine's prefill, decode and row-compaction graphs
  rollout+reference  those and the no-grad log-prob graph (the reference pass)
  all                every graph: what mindrlhf runs

A measurement harness, not a mode of mindrlhf: for the variants other than `all` the child replaces
`mindspore.jit` by a selective stand-in before mindrlhf is imported, and skips compile-ahead for a training
step left uncompiled. The variants compute the same GRPO step; only its speed and memory are read here.

Prints per variant its step time (median of steps 3..20), peak RSS (whole-life VmHWM) and start-up, each as
a ratio to TRL's from the same run, and last {"bench": "compile_memory", "ours": peak MB of `all`,
"reference": TRL's peak MB, "ratio": ours / reference, "variants": {name: {"step_s", "peak_rss_mb",
"speed_ratio": TRL step / step, "peak_rss_ratio": peak / TRL peak, "startup_s"}}}. With --rounds N the
figures are medians over N interleaved rounds.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_vs_trl  # noqa: E402
from common import run_child  # noqa: E402

VARIANTS = {"pynative": (), "rollout": ("_Prefill", "_Decode", "_Compact"),
            "rollout+reference": ("_Prefill", "_Decode", "_Compact", "ResponseLogProb"), "all": None}


def compile_only(classes) -> None:
    """Keep `mindspore.jit` for methods of the named classes, make it the identity elsewhere; call before
    mindrlhf is imported (its decorators run at import)."""
    import mindspore as ms
    real_jit = ms.jit

    def selective_jit(fn=None, **kwargs):
        def decorate(f):
            if f.__qualname__.split(".")[0] in classes:
                return real_jit(f, **kwargs)
            return f
        return decorate(fn) if fn is not None else decorate

    ms.jit = selective_jit
    from mindrlhf.utils import compile_ahead
    real_compile = compile_ahead.compile_jit_cell

    def compile_if_jit(cell, *args):
        if getattr(type(cell).construct, "__wrapped_by_jit__", False):
            real_compile(cell, *args)

    compile_ahead.compile_jit_cell = compile_if_jit


def child_ours(variant: str, work: str, inputs: dict) -> dict:
    if VARIANTS[variant] is not None:
        compile_only(VARIANTS[variant])
    shutil.rmtree(os.path.join(work, "ours"), ignore_errors=True)      # a cold compile, no cache to load
    return bench_vs_trl.child_ours(work, inputs, bench_vs_trl.SMALL)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trl_python", default=sys.executable, help="Python with trl installed (bench_vs_trl.py)")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds; the figures are their medians")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        which, work = args.child
        with open(os.path.join(work, "inputs.json")) as fh:
            inputs = json.load(fh)
        out = (child_ours(which, work, inputs) if which in VARIANTS
               else bench_vs_trl.child_trl(work, inputs, bench_vs_trl.SMALL))
        print(json.dumps(out), flush=True)
        return
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    work = tempfile.mkdtemp(prefix="bench_compile_memory_")
    runs = {name: [] for name in [*VARIANTS, "trl"]}
    try:
        inputs = bench_vs_trl.prepare(work, bench_vs_trl.SMALL)
        with open(os.path.join(work, "inputs.json"), "w") as fh:
            json.dump(inputs, fh)
        me = os.path.abspath(__file__)
        for _ in range(args.rounds):
            for name in VARIANTS:
                runs[name].append(run_child(me, name, work))
            runs["trl"].append(run_child(me, "trl", work, python=args.trl_python))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = bench_vs_trl.median
    trl_step = med([r["step_s"] for r in runs["trl"]])
    trl_peak = med([r["peak_rss_mb"] for r in runs["trl"]])
    trl_startup = med([r["startup_s"] for r in runs["trl"]])
    print(f"{'graphs compiled':20s} {'s/step':>8s} {'speed vs TRL':>13s} {'peak MB':>8s} {'RSS vs TRL':>11s} "
          f"{'start-up s':>11s}")
    variants = {}
    for name in VARIANTS:
        step = med([r["step_s"] for r in runs[name]])
        peak = med([r["peak_rss_mb"] for r in runs[name]])
        startup = med([r["startup_s"] for r in runs[name]])
        variants[name] = {"step_s": round(step, 4), "peak_rss_mb": round(peak, 1),
                          "speed_ratio": round(trl_step / step, 3), "peak_rss_ratio": round(peak / trl_peak, 3),
                          "startup_s": round(startup, 2)}
        print(f"{name:20s} {step:8.3f} {trl_step / step:13.3f} {peak:8.0f} {peak / trl_peak:11.3f} {startup:11.2f}")
    print(f"{'TRL':20s} {trl_step:8.3f} {1.0:13.3f} {trl_peak:8.0f} {1.0:11.3f} {trl_startup:11.2f}")
    print(json.dumps({"bench": "compile_memory", "ours": variants["all"]["peak_rss_mb"],
                      "reference": round(trl_peak, 1), "ratio": variants["all"]["peak_rss_ratio"],
                      "variants": variants}))


if __name__ == "__main__":
    main()
