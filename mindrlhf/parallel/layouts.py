"""Per-parameter layouts: full shape, device matrix and tensor map, as MindSpore strategy files say them.

Conventions (MindSpore's): the device matrix arranges a role's ranks row-major (for us [dp, tp], so
rank = dp_index * tp + tp_index); `tensor_map[d]` names the device-matrix axis that splits tensor dim d,
counting axes from the right (tp = 0, dp = 1), or -1 for "not split". Device-matrix axes that split no
dimension replicate the tensor across them (here: dp). Under pipeline parallelism a parameter lives on one
stage: its device matrix covers that stage's ranks, which start at `rank_offset` (stage x dp x tp).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Dict, Optional, Tuple

import numpy as np

from mindrlhf.configs.errors import CheckpointError


# how a parameter is split, {tensor dim: mesh axis} (models/specs.param_specs)
REPLICATED = MappingProxyType({})
TP_ROWS = MappingProxyType({0: "tp"})      # output rows over the TP ranks: column-parallel weights, embeddings
TP_COLS = MappingProxyType({1: "tp"})      # input columns over the TP ranks: row-parallel weights
# stacked experts over the EP ranks (E), each expert's intermediate width over the TP ranks (I): gate / up
# (E, H, I) and down (E, I, H)
EXPERTS_IN = MappingProxyType({0: "ep", 2: "tp"})
EXPERTS_OUT = MappingProxyType({0: "ep", 1: "tp"})
EXPERTS_ONLY = MappingProxyType({0: "ep"})    # a per-expert tensor whole on every TP rank (an expert's LoRA factor)


def experts_split_over(split, axes: Tuple[str, ...]):
    """A parameter's split when each expert's tensors are whole on one rank of `axes` together (Mesh.expert_axes
    under moe_tp_extend_ep: ep x tp): an expert's tensor (split over ep) has its expert dimension split over
    them and nothing else split; other parameters unchanged."""
    experts = [d for d, axis in split.items() if axis == "ep"]
    return MappingProxyType({experts[0]: axes}) if experts else split


def mesh_axis(dev_matrix: Tuple[int, ...], tensor_map_entry: int) -> int:
    """The device-matrix axis a tensor_map entry names (MindSpore counts them from the right)."""
    return len(dev_matrix) - 1 - tensor_map_entry


def split_counts(dev_matrix: Tuple[int, ...], tensor_map: Tuple[int, ...]) -> Tuple[int, ...]:
    """How many ways each tensor dimension is split."""
    return tuple(1 if m == -1 else dev_matrix[mesh_axis(dev_matrix, m)] for m in tensor_map)


@dataclass(frozen=True)
class Layout:
    full_shape: Tuple[int, ...]
    dev_matrix: Tuple[int, ...]
    tensor_map: Tuple[int, ...]
    rank_offset: int = 0            # first global rank of the stage that holds the tensor
    # the mesh axes behind each device-matrix axis (role_layouts'; "ep+tp" for two merged), not in strategy files
    axis_names: Tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self):
        if len(self.tensor_map) != len(self.full_shape):
            raise ValueError(f"tensor_map {self.tensor_map} does not match shape {self.full_shape}")
        for d, m in enumerate(self.tensor_map):
            if m != -1:
                if not 0 <= m < len(self.dev_matrix):
                    raise ValueError(f"tensor_map {self.tensor_map} names axis {m} outside device matrix "
                                     f"{self.dev_matrix}")
                if self.full_shape[d] % self.split_count(d):
                    raise ValueError(f"dimension {d} of shape {self.full_shape} does not divide by "
                                     f"{self.split_count(d)}")

    @property
    def num_ranks(self) -> int:
        return int(np.prod(self.dev_matrix))

    @property
    def ranks(self) -> range:
        """The global ranks that hold a shard."""
        return range(self.rank_offset, self.rank_offset + self.num_ranks)

    def split_count(self, dim: int) -> int:
        m = self.tensor_map[dim]
        return split_counts(self.dev_matrix, (m,))[0]

    @property
    def shard_shape(self) -> Tuple[int, ...]:
        return tuple(s // self.split_count(d) for d, s in enumerate(self.full_shape))

    def coords(self, rank: int) -> Tuple[int, ...]:
        if rank not in self.ranks:
            raise ValueError(f"rank {rank} holds no shard of this tensor (its ranks: {self.ranks.start}.."
                             f"{self.ranks.stop - 1})")
        return tuple(int(c) for c in np.unravel_index(rank - self.rank_offset, self.dev_matrix))

    def shard_slices(self, rank: int) -> Tuple[slice, ...]:
        """Which part of the full tensor `rank` holds."""
        coords = self.coords(rank)
        out = []
        for d, size in enumerate(self.full_shape):
            m = self.tensor_map[d]
            if m == -1:
                out.append(slice(0, size))
            else:
                axis = mesh_axis(self.dev_matrix, m)
                step = size // self.dev_matrix[axis]
                out.append(slice(coords[axis] * step, (coords[axis] + 1) * step))
        return tuple(out)

    def shard(self, full: np.ndarray, rank: int) -> np.ndarray:
        return full[self.shard_slices(rank)]


@dataclass
class RoleWeights:
    """One role's parameters on this rank and every parameter's layout: all a weight transfer needs."""
    params: Dict[str, Any]          # name -> this rank's Parameter (its shard); under PP only its stage's
    layouts: Dict[str, "Layout"]    # name -> layout in the role's mesh, for every parameter of the model
    rank: int


def role_layouts(specs: Dict[str, Tuple[Tuple[int, ...], Dict[int, Any]]], mesh,
                 stages: Optional[Dict[str, int]] = None) -> Dict[str, Layout]:
    """Layouts of every parameter for a role's `mesh` (parallel/mesh.py), from `param_specs` (shape, {dim:
    mesh axis that splits it, or a tuple of adjacent axes that split it together}) and, under pipeline
    parallelism, each parameter's stage. The device matrix is the mesh's device axes, the axes a dimension is
    split over together merged into one (MindSpore's form of a split over two axes); an axis of size 1 splits
    nothing."""
    out = {}
    for name, (shape, split) in specs.items():
        groups = {d: tuple(a for a in ((axes,) if isinstance(axes, str) else axes) if mesh.axis_size(a) > 1)
                  for d, axes in split.items()}
        axes = _merged_axes(mesh.device_axes, [g for g in groups.values() if len(g) > 1], name)
        labels = [a for a, _ in axes]
        tmap = tuple(len(labels) - 1 - labels.index("+".join(groups[d])) if groups.get(d) else -1
                     for d in range(len(shape)))
        offset = (stages or {}).get(name, 0) * mesh.stage_size
        try:
            out[name] = Layout(tuple(shape), tuple(n for _, n in axes), tmap, offset, tuple(labels))
        except ValueError as err:
            raise CheckpointError(f"parameter {name}: {err}") from None
    return out


def _merged_axes(device_axes, groups, name: str):
    """`device_axes` [(axis, size)] with each group of adjacent axes merged into one ("ep+tp", product)."""
    out = list(device_axes)
    for group in groups:
        labels = [a for a, _ in out]
        start = labels.index(group[0]) if group[0] in labels else -1
        if start < 0 or tuple(labels[start:start + len(group)]) != group:
            raise CheckpointError(f"parameter {name}: split over {' x '.join(group)}, which are not adjacent "
                                  f"device axes ({labels})")
        merged = ("+".join(group), int(np.prod([n for _, n in out[start:start + len(group)]])))
        out[start:start + len(group)] = [merged]
    return out
