"""How MindSpore runs CPU kernels in this process: which thread launches them and how many threads split
them (one decision, for the trainer and the benchmarks alike).

Which thread: by default MindSpore's host hands each graph run to async queues and the Python thread waits
for them in a loop without a yield (`AsyncRQueue::Wait`). On a 2-core machine that spinning thread and the
runtime's actor thread fill both cores, and each time a kernel hands half its work to the kernel thread
pool, that thread waits for a core and the same matmul takes several times longer. With
MS_DEV_HOST_BLOCKING_RUN=1 the calling thread runs the work itself, and those stalls mostly go
(docs/BENCHMARKS.md, "Measurements behind code choices"). `run_in_calling_thread` sets it (unless the user did) before
anything runs; MindSpore reads it once, at the first task it queues. Not on Ascend, whose host-device
overlap the queues exist for.

How many threads: MindSpore defaults to 25 kernel threads per process, and takes the setting once. With
the spinning wait above, its kernels split the mid-sized work of a small model's step poorly: two threads
were never faster than one for a single process, and two ranks at the default 25 threads each were much
slower than at one thread each. oneDNN's matmuls use both cores whatever this says (its pool reports 2
threads at threads_num 1). With calling-thread runs a lone process does better with two. Hence: the cores this process may use divided by the ranks on its node (`run.cpu_threads`
sets another value); two ranks on two cores get one thread each.

Which kernels: MindSpore's graph-kernel fusion (MS_DEV_GRAPH_KERNEL_FLAGS, AKG-compiled fused kernels) is
refused on CPU: with 2.10 it gave NaN log-probs in the real-model example's rollout, other bits in a plain
forward (so a trajectory would depend on it), and no faster step (docs/BENCHMARKS.md, bench_floors.py).
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

import mindspore as ms

from mindrlhf.errors import ConfigError

_SET: Optional[int] = None     # what this process set (MindSpore takes it once)
BLOCKING_RUN = "MS_DEV_HOST_BLOCKING_RUN"
GRAPH_KERNEL_FLAGS = "MS_DEV_GRAPH_KERNEL_FLAGS"


def run_in_calling_thread() -> str:
    """Have MindSpore run graphs and kernels in the calling thread (see above) unless the environment says
    otherwise; returns the value in force. Call before any MindSpore op or graph runs."""
    return os.environ.setdefault(BLOCKING_RUN, "1")


def refuse_graph_kernel_fusion():
    """A ConfigError if the environment turns on graph-kernel fusion (see above): any value of
    MS_DEV_GRAPH_KERNEL_FLAGS but --opt_level=0. Call before anything runs, on CPU."""
    flags = os.environ.get(GRAPH_KERNEL_FLAGS, "").strip()
    if flags and flags != "--opt_level=0":
        raise ConfigError(f"{GRAPH_KERNEL_FLAGS}={flags}: MindSpore's graph-kernel fusion is not supported on CPU "
                          f"(with MindSpore 2.10 it made the rollout's log-probs NaN and changed a forward's values; "
                          f"docs/TROUBLESHOOTING.md); unset it")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def auto_threads(local_ranks: int = 1) -> Tuple[int, str]:
    """(threads, why) for a process that shares its node with `local_ranks` ranks (itself included)."""
    cores = usable_cores()
    share = max(1, cores // max(1, local_ranks))
    return share, f"{cores} core(s) / {local_ranks} rank(s) on this node = {share}"


def set_kernel_threads(threads: int) -> int:
    """Set MindSpore's CPU kernel threads unless this process already did; returns the value in force."""
    global _SET
    if _SET is None:
        ms.device_context.cpu.op_tuning.threads_num(int(threads))
        _SET = int(threads)
    return _SET
