"""glibc heap measurements for tests: what a piece of work leaves in the heap, and its peak while it runs."""
from __future__ import annotations

import ctypes
import functools
import threading
import time

import numpy as np
import pytest


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.lru_cache(maxsize=None)
def _mallinfo2():
    """glibc's mallinfo2, loaded once (heap_peak_growth calls it every half millisecond), or None."""
    libc = ctypes.CDLL("libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2


def heap_in_use() -> int:
    """Bytes in use in glibc's heap (mallinfo2: arenas + mmapped blocks); skips where glibc has no mallinfo2
    (< 2.33)."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        pytest.skip("glibc without mallinfo2 (< 2.33)")
    info = mallinfo2()
    return info.uordblks + info.hblkhd


def _pool_ready():
    """Run a first tiny graph, so that setting up MindSpore's memory pool is not counted."""
    import mindspore as ms
    from mindspore import Tensor

    def plus_one(a):
        return a + 1

    ms.jit(plus_one)(Tensor(np.ones(2, np.float32))).asnumpy()


def heap_growth(fn):
    """(bytes the heap grows by across `fn()`, what fn returned)."""
    _pool_ready()
    before = heap_in_use()
    result = fn()
    return heap_in_use() - before, result


def heap_peak_growth(fn, period_s: float = 0.0005):
    """(highest heap in use while `fn()` runs, above where it started, sampled every `period_s`; what fn
    returned). A compile's transient peak, which the process's peak RSS keeps."""
    _pool_ready()
    before = heap_in_use()
    peak, done = [before], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], heap_in_use())
            time.sleep(period_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = fn()
    finally:
        done.set()
        sampler.join()
    return max(peak[0], heap_in_use()) - before, result
