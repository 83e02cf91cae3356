"""DP gradient mean: its graph compiles in heap proportional to the gradients."""
from types import SimpleNamespace

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from memory_helpers import heap_peak_growth
import mindrlhf.parallel.grad_sync as grad_sync


class _Mean(nn.Cell):
    def __init__(self, mean):
        super().__init__()
        self.mean = mean

    @ms.jit
    def construct(self, *grads):
        return self.mean(grads)


def test_dp_mean_of_54_gradients_compiles_in_little_heap(monkeypatch):
    """54 gradients at dp 2 (the all-reduce stood in by an identity: one process has no DP group) give g / 2
    each and compile under +40 MB of heap peak; a generator over the tuple once took +130 MB (108: +332 MB)."""
    monkeypatch.setattr(grad_sync.ops, "AllReduce", lambda group: ops.Identity())
    mean = grad_sync.DPGradMean(SimpleNamespace(dp=2, dp_group="dp"))
    values = [0.1 * i for i in range(54)]
    grads = [Tensor(np.full((3, 5), v, np.float32)) for v in values]
    peak, out = heap_peak_growth(lambda: _Mean(mean)(*grads))
    assert len(out) == 54
    for got, v in zip(out, values):
        np.testing.assert_array_equal(got.asnumpy(), np.full((3, 5), np.float32(v) / 2, np.float32))
    assert peak < 40 * 2**20, f"compiling the DP mean of 54 gradients peaked at +{peak / 2**20:.1f} MB of heap"
