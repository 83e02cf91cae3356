"""Host-memory swap: move parameter groups a phase does not need to host memory, and back.

Ascend: MindSpore's `Parameter._offload()` / `_load()` move the device buffer to host and back. This
path has NOT been run here (no NPU on this machine); treat it as unverified.

CPU: `_offload()/_load()` do nothing, and the free-and-restore trick (`set_data(1-element tensor)`)
is unsafe with compiled graphs: measured on MindSpore 2.10, an `ms.jit` graph keeps the buffer its
Parameters had at compile time, so after `set_data` it silently computes with the stale buffer, and that
buffer stays allocated (no memory is freed). So on CPU a swap keeps a host copy and zeroes the buffer in
place on offload, and copies the host data back in place on reload. That is exact and keeps every
graph correct (and a phase that wrongly used offloaded weights would see zeros), but it frees no memory:
on CPU swap is a correctness-preserving emulation, not a memory saving.
"""
from __future__ import annotations

import time
from typing import Dict, Iterable, List

import numpy as np
import mindspore as ms
from mindspore import ops

from mindrlhf.checkpoint.model_io import param_to_numpy, write_param


def on_ascend() -> bool:
    return ms.get_context("device_target") == "Ascend"


class SwapGroup:
    """A named set of Parameters that is either resident or on host."""

    def __init__(self, name: str, params: Iterable, enabled: bool = True):
        self.name = name
        self.params: List = list(params)
        self.enabled = enabled and bool(self.params)
        self.resident = True
        self._host: Dict[str, np.ndarray] = {}
        self.seconds = 0.0

    def offload(self):
        if not self.enabled or not self.resident:
            return
        t0 = time.time()
        for p in self.params:
            if on_ascend():
                p._offload()  # pylint: disable=protected-access
                continue
            self._host[p.name] = param_to_numpy(p)
            p.copy_(ops.zeros(p.shape, p.dtype))
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
            write_param(p, self._host.pop(p.name))
        self.resident = True
        self.seconds += time.time() - t0

    def host_bytes(self) -> int:
        return sum(a.nbytes for a in self._host.values())
