"""How many threads MindSpore's CPU kernels use in this process (one decision, for the trainer and the
benchmarks alike).

MindSpore defaults to 25 kernel threads per process, and takes the setting once. Measured on a 2-core AMD
EPYC (Zen 1, AVX2 only) with MindSpore 2.10: its kernels split the mid-sized work of a small model's step
poorly, and two threads were never faster than one for a single process (GRPO step, small model 0.61 ->
0.53 s; 4 layers x hidden 512: 5.47 vs 5.43 s), while two ranks at the default 25 threads each took
1.20-1.28 s per demo step against 0.77 s at one thread each. The MatMuls do not split at all: oneDNN's gemm
ran 2048x512x1408 at ~60 GFLOP/s with user time equal to wall time at 1, 2, 4 and 25 threads. Only a large
share of cores per rank is worth splitting a kernel over, hence: the cores this process may use divided by
the ranks on its node when that leaves 4 or more, else 1.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

import mindspore as ms

SPLIT_FROM = 4          # per-rank core share from which kernels get more than one thread

_SET: Optional[int] = None     # what this process set (MindSpore takes it once)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def auto_threads(local_ranks: int = 1) -> Tuple[int, str]:
    """(threads, why) for a process that shares its node with `local_ranks` ranks (itself included)."""
    cores = usable_cores()
    share = max(1, cores // max(1, local_ranks))
    threads = share if share >= SPLIT_FROM else 1
    return threads, f"{cores} core(s) / {local_ranks} rank(s) on this node = {share}" + \
        ("" if threads == share else f"; below {SPLIT_FROM}, one thread splits no kernel")


def set_kernel_threads(threads: int) -> int:
    """Set MindSpore's CPU kernel threads unless this process already did; returns the value in force."""
    global _SET
    if _SET is None:
        ms.device_context.cpu.op_tuning.threads_num(int(threads))
        _SET = int(threads)
    return _SET
