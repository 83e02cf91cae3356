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
    mean = grad_sync.DPGradMean(SimpleNamespace(dp=2, dp_group="dp", row_ways=2, row_group="dp", row_axes=("dp",)))
    values = [0.1 * i for i in range(54)]
    grads = [Tensor(np.full((3, 5), v, np.float32)) for v in values]
    peak, out = heap_peak_growth(lambda: _Mean(mean)(*grads))
    assert len(out) == 54
    for got, v in zip(out, values):
        np.testing.assert_array_equal(got.asnumpy(), np.full((3, 5), np.float32(v) / 2, np.float32))
    assert peak < 40 * 2**20, f"compiling the DP mean of 54 gradients peaked at +{peak / 2**20:.1f} MB of heap"


def test_under_the_all_to_all_dispatcher_expert_gradients_are_summed_over_dp_only(monkeypatch):
    """dp 2 x ep 2, each EP rank its own rows (4 row shares): a replicated parameter's gradient is summed over all 4
    shares, an expert's (which already holds both EP ranks' tokens) over the 2 dp replicas only; both divided by
    4. The two groups' all-reduces are stood in by Identity (the row group) and Neg (the dp group), so the sign
    says which one each gradient went through. Without the parameters' split axes the mean is refused."""
    monkeypatch.setattr(grad_sync.ops, "AllReduce", lambda group: ops.Neg() if group == "dp" else ops.Identity())
    mesh = SimpleNamespace(dp=2, dp_group="dp", row_ways=4, row_group="rows", row_axes=("dp", "ep"))
    axes = [(), ("ep",), ("tp",), ("ep", "tp")]
    grads = [Tensor(np.full((2, 3), float(i + 1), np.float32)) for i in range(4)]
    out = _Mean(grad_sync.DPGradMean(mesh, axes))(*grads)
    for i, (got, a) in enumerate(zip(out, axes)):
        sign = -1.0 if "ep" in a else 1.0
        np.testing.assert_array_equal(got.asnumpy(), np.full((2, 3), sign * (i + 1) / 4, np.float32))
    try:
        grad_sync.DPGradMean(mesh)
    except ValueError as err:
        assert "split axes" in str(err)
    else:
        raise AssertionError("a split mean without the parameters' axes was accepted")
