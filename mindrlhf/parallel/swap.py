"""Host-memory swap: move parameter groups a phase does not need to host memory, and back.

Ascend: MindSpore's `Parameter._offload()` / `_load()` move the device buffer to host and back. This
path has NOT been run here (no NPU on this machine); treat it as unverified.

CPU: `_offload()/_load()` do nothing, and `set_data` cannot be used to free a buffer: an `ms.jit` graph
keeps the buffer its Parameters had at compile time (measured on MindSpore 2.10), so after `set_data` it
silently computes with the stale buffer, which also stays allocated. What does work, measured: a CPU
Parameter's data pointer is the very buffer its compiled graphs read and write. So offload copies the
buffer's bytes to a host array and returns the buffer's physical pages to the OS
(`madvise(MADV_DONTNEED)`: the address stays valid and reads as zeros), and reload copies the bytes
back into the same address. Every graph stays correct without recompiling, a phase that wrongly used
offloaded weights would see zeros, and the pages really leave the process. On a CPU-only machine host
and "device" are the same RAM, so the host copy costs what the buffer did; what this shows is that the
device-side footprint of a phase excludes what is swapped out (benchmarks/bench_swap_memory.py).
Where `madvise` is unavailable (non-Linux) the buffer is zeroed in place instead and nothing is freed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
import time
from typing import Dict, Iterable, List

import numpy as np
import mindspore as ms

from mindrlhf.utils.params import param_buffer, wait_for_graphs


def on_ascend() -> bool:
    return ms.get_context("device_target") == "Ascend"


def _madvise():
    """libc's madvise, or None off Linux."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise() if sys.platform.startswith("linux") else None
_MADV_DONTNEED = 4
_PAGE = mmap.PAGESIZE


def release_pages(buf: np.ndarray) -> int:
    """Give the whole pages inside `buf` back to the OS (they read as zeros after) and zero the partial
    pages at its ends; returns the bytes released. Without madvise, zeroes everything and returns 0."""
    start = buf.ctypes.data
    lo = -(-start // _PAGE) * _PAGE
    hi = (start + buf.nbytes) // _PAGE * _PAGE
    if _MADVISE is None or hi <= lo or _MADVISE(lo, hi - lo, _MADV_DONTNEED) != 0:
        buf[:] = 0
        return 0
    buf[:lo - start] = 0
    buf[hi - start:] = 0
    return hi - lo


class SwapGroup:
    """A named set of Parameters that is either resident or on host.

    `keep_contents=False` is for scratch state rewritten before it is read again (the KV cache, which
    prefill overwrites): offload only releases the pages, with no host copy, so it saves memory even on a
    CPU-only machine, and reload has nothing to copy.
    """

    def __init__(self, name: str, params: Iterable, enabled: bool = True, keep_contents: bool = True):
        self.name = name
        self.params: List = list(params)
        self.enabled = enabled and bool(self.params)
        self.keep_contents = keep_contents
        self.resident = True
        self._host: Dict[str, np.ndarray] = {}
        self.seconds = 0.0
        self.released_bytes = 0              # pages returned to the OS, summed over every offload

    def offload(self):
        if not self.enabled or not self.resident:
            return
        t0 = time.time()
        wait_for_graphs()             # no graph may still be writing these buffers
        for p in self.params:
            if on_ascend():
                p._offload()  # pylint: disable=protected-access
                continue
            buf = param_buffer(p)
            if self.keep_contents:
                self._host[p.name] = buf.copy()
            self.released_bytes += release_pages(buf)
        self.resident = False
        self.seconds += time.time() - t0

    def reload(self):
        if not self.enabled or self.resident:
            return
        t0 = time.time()
        for p in self.params:
            if on_ascend():
                p._load()  # pylint: disable=protected-access
                continue
            if self.keep_contents:
                np.copyto(param_buffer(p), self._host.pop(p.name))
        self.resident = True
        self.seconds += time.time() - t0

    def host_bytes(self) -> int:
        return sum(a.nbytes for a in self._host.values())
