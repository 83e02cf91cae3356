"""How MindSpore runs CPU kernels in this process: which thread launches them and how many threads split
them (one decision, for the trainer and the benchmarks alike).

Which thread: by default MindSpore's host hands each graph run to async queues and the Python thread waits
for them in a loop without a yield (`AsyncRQueue::Wait`). On a 2-core machine that spinning thread and the
runtime's actor thread fill both cores, and each time a kernel hands half its work to the kernel thread
pool, that thread waits for a core: oneDNN matmuls of the small GRPO benchmark's train step took 0.5 or ~4
ms for the same shape, 522 of 5,586 matmuls over 3.5 ms (measured, AMD EPYC Zen 1). With
MS_DEV_HOST_BLOCKING_RUN=1 the calling thread runs the work itself: 46-57 such stalls, the train phase 0.24
-> 0.11 s, the whole step 0.42 -> 0.30 s. `run_in_calling_thread` sets it (unless the user did) before
anything runs; MindSpore reads it once, at the first task it queues. Not on Ascend, whose host-device
overlap the queues exist for.

How many threads: MindSpore defaults to 25 kernel threads per process, and takes the setting once. Measured on
a 2-core AMD EPYC (Zen 1, AVX2 only) with MindSpore 2.10: its kernels split the mid-sized work of a small
model's step poorly, and two threads were never faster than one for a single process (GRPO step, small model
0.61 -> 0.53 s; 4 layers x hidden 512: 5.47 vs 5.43 s), while two ranks at the default 25 threads each took
1.20-1.28 s per demo step against 0.77 s at one thread each. oneDNN's matmuls use both cores whatever this
says (its pool reports 2 threads at threads_num 1; 2048x512x1408 at 51-56 GFLOP/s, 30-34 pinned to one core
with taskset). All of that was measured with the spinning wait above. With calling-thread runs a lone
process does better with two: small GRPO step 0.288 -> 0.271 and 0.269 -> 0.261 s (train phase 0.106 ->
0.095, 0.101 -> 0.089), train_step benchmark 332 -> 337 and 336 -> 345 tokens/s (interleaved runs, AMD EPYC
Zen 1, 2 vCPUs). Hence: the cores this process may use divided by the ranks on its node (`run.cpu_threads`
sets another value); two ranks on two cores get one thread each.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

import mindspore as ms

_SET: Optional[int] = None     # what this process set (MindSpore takes it once)
BLOCKING_RUN = "MS_DEV_HOST_BLOCKING_RUN"


def run_in_calling_thread() -> str:
    """Have MindSpore run graphs and kernels in the calling thread (see above) unless the environment says
    otherwise; returns the value in force. Call before any MindSpore op or graph runs."""
    return os.environ.setdefault(BLOCKING_RUN, "1")


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
