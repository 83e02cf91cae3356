"""Host-memory swap: move parameter groups a phase does not need off the device, and back.

On Ascend, MindSpore's `Parameter._offload()/_load()` move device memory to host and back (not verified
here: this machine has no NPU). On CPU those calls do nothing, so we free the storage explicitly
(`set_data(1-element tensor, slice_shape=True)`) after keeping a host numpy copy, and restore from it; the
restore is bit-exact. Either way compiled graphs keep referring to the same Parameter objects.
"""
from __future__ import annotations

import time
from typing import Dict, Iterable, List

import numpy as np
import mindspore as ms
from mindspore import Tensor


def _on_ascend() -> bool:
    return ms.get_context("device_target") == "Ascend"


class SwapGroup:
    """A named set of Parameters that is either resident or on host."""

    def __init__(self, name: str, params: Iterable, enabled: bool = True):
        self.name = name
        self.params: List = list(params)
        self.enabled = enabled and bool(self.params)
        self.resident = True
        self._host: Dict[str, np.ndarray] = {}
        self._dtypes: Dict[str, object] = {}
        self.seconds = 0.0

    def offload(self):
        if not self.enabled or not self.resident:
            return
        t0 = time.time()
        for p in self.params:
            if _on_ascend():
                p._offload()  # pylint: disable=protected-access
                continue
            self._dtypes[p.name] = p.dtype
            self._host[p.name] = p.asnumpy().copy() if p.dtype != ms.bfloat16 else p.float().asnumpy().copy()
            p.set_data(Tensor(np.zeros(1, np.float32)).astype(p.dtype), slice_shape=True)
        self.resident = False
        self.seconds += time.time() - t0

    def reload(self):
        if not self.enabled or self.resident:
            return
        t0 = time.time()
        for p in self.params:
            if _on_ascend():
                p._load()  # pylint: disable=protected-access
                continue
            p.set_data(Tensor(self._host.pop(p.name)).astype(self._dtypes[p.name]), slice_shape=True)
        self.resident = True
        self.seconds += time.time() - t0

    def mark_resident(self):
        """The group's data was rewritten in place (e.g. by a weight sync): drop the stale host copy."""
        self._host.clear()
        self.resident = True

    def host_bytes(self) -> int:
        return sum(a.nbytes for a in self._host.values())
