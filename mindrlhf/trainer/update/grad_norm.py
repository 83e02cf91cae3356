"""The gradient's global norm and its clipping, for every update engine: sums of squares (in a graph, or
driven from the host a run of buffers at a time), each parameter's squares summed over the ranks that split it (TP, EP) and
pipeline stages' sums added up (SplitNormSum), and the clip factor the optimizer applies as it reads each
gradient."""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from mindrlhf.models.graph_ops import sum_last
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.models.tp_regions import Identity, ReduceFromTP, reduce_from_tp
from mindrlhf.parallel.layouts import mesh_axis
from mindrlhf.parallel.grad_sync import StageSum


def square_sum(g):
    """Sum of a gradient's squared entries, in float32: the rows' sums first (graph_ops.sum_last), then theirs.
    One reduction of the whole tensor runs ~9x slower on MindSpore 2.10's CPU (SmolLM2's embedding gradient:
    93 vs 10 ms; the same float32 result)."""
    g = ops.cast(g, ms.float32)
    return ops.sum(sum_last(g * g))


def squares_total(grads, ids=None):
    """Sum of square_sum over `grads` (or over grads[i] for i in `ids`), added up in a loop: the same sum
    over a list built in the graph (a comprehension) costs MindSpore 2.10's front end more heap and compile
    time, and the heap stays as the process's peak RSS (docs/BENCHMARKS.md, "Measurements behind code choices")."""
    total = ops.zeros((), ms.float32)
    for i in (range(len(grads)) if ids is None else ids):
        total = total + square_sum(grads[i])
    return total


def clip_scale(grads, max_norm: float, norm_sum=None):
    """(factor to multiply every gradient by, total norm): min(1, max_norm / norm); 1 when max_norm <= 0.

    The optimizer applies the factor as it reads each gradient, so no clipped copy of all gradients is
    ever materialised. `norm_sum(grads)` gives the global squared norm when parameters are split over TP
    ranks or pipeline stages (SplitNormSum); default: squares_total.
    """
    norm = ops.sqrt(squares_total(grads) if norm_sum is None else norm_sum(grads))
    return clip_factor(norm, max_norm), norm


def clip_factor(norm, max_norm: float):
    if max_norm <= 0:
        return ops.ones((), ms.float32)
    return ops.minimum(max_norm / (norm + 1e-6), 1.0)


class AddSquares(nn.Cell):
    """total + the square_sum of each of `grads`, in order, as a graph of its own (compiled once per shapes
    of `grads`): squares_total driven from the host a run of gradients at a time, the same additions in the
    same order."""

    @ms.jit
    def construct(self, total, grads):
        for g in grads:
            total = total + square_sum(g)
        return total


def split_axes(model: CausalLM, params) -> list:
    """Per parameter: the mesh axes its layout in the model's mesh splits it over ("tp", "ep"; empty when
    replicated), read from the model's layouts, the one place that says so."""
    layouts = model.layouts()
    return [frozenset(axis for m in lay.tensor_map if m != -1
                      for axis in lay.axis_names[mesh_axis(lay.dev_matrix, m)].split("+"))
            for lay in (layouts[p.name] for p in params)]


class SplitNormSum(nn.Cell):
    """Global squared grad norm: each parameter's squares summed over the ranks that split it, replicated ones
    counted once, and under pipeline parallelism the stages' sums added up. Three groups (`id_groups`): split over
    tp only (attention, the dense MLP, the head), split over ep (a MoE model's experts; under TP also over tp:
    summed over ep, then with the first group over tp) and replicated."""

    def __init__(self, axes, mesh):
        super().__init__()
        # the index lists are fixed here: an `if` per parameter inside the graph's loop would compile into a
        # branch per parameter (type inference time)
        self.tp_ids = tuple(i for i, a in enumerate(axes) if a and "ep" not in a)
        self.ep_ids = tuple(i for i, a in enumerate(axes) if "ep" in a)
        self.replicated_ids = tuple(i for i, a in enumerate(axes) if not a)
        if mesh.tp > 1 and any("tp" not in axes[i] for i in self.ep_ids):
            raise ValueError("a parameter split over ep but not tp under tp > 1: its squares would count tp times")
        self.reduce_tp = reduce_from_tp(mesh)
        self.reduce_ep = ReduceFromTP(mesh.group("ep")) if mesh.ep > 1 else Identity()
        self.stage_sum = StageSum(mesh)

    @property
    def id_groups(self) -> tuple:
        """(tp-split, ep-split, replicated) parameter indices: what `combine` takes the sums of squares of."""
        return self.tp_ids, self.ep_ids, self.replicated_ids

    def construct(self, grads):
        return self.combine(*(squares_total(grads, ids) for ids in self.id_groups))

    def combine(self, tp_total, ep_total, replicated_total):
        """The global squared norm from this rank's sums of squares of each group (id_groups)."""
        return self.stage_sum(self.reduce_tp(tp_total + self.reduce_ep(ep_total)) + replicated_total)


class ClipScale(nn.Cell):
    """(clip factor, global norm) from this rank's sums of squares of each SplitNormSum group: the clip of an
    update whose squares were summed from the host (update/accumulate.py)."""

    def __init__(self, norm_sum: SplitNormSum, max_grad_norm: float):
        super().__init__(auto_prefix=False)
        self.norm_sum, self.max_grad_norm = norm_sum, max_grad_norm

    @ms.jit
    def construct(self, tp_total, ep_total, replicated_total):
        norm = ops.sqrt(self.norm_sum.combine(tp_total, ep_total, replicated_total))
        return clip_factor(norm, self.max_grad_norm), norm
