"""Per-parameter layouts: full shape, device matrix and tensor map, as MindSpore strategy files say them.

Conventions (MindSpore's): the device matrix arranges a role's ranks row-major (for us [dp, tp], so
rank = dp_index * tp + tp_index); `tensor_map[d]` names the device-matrix axis that splits tensor dim d,
counting axes from the right (tp = 0, dp = 1), or -1 for "not split". Device-matrix axes that split no
dimension replicate the tensor across them (here: dp). Under pipeline parallelism a parameter lives on one
stage: its device matrix covers that stage's ranks, which start at `rank_offset` (stage x dp x tp).
"""
from __future__ import annotations

from dataclasses import dataclass
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


def role_layouts(specs: Dict[str, Tuple[Tuple[int, ...], Dict[int, str]]], mesh,
                 stages: Optional[Dict[str, int]] = None) -> Dict[str, Layout]:
    """Layouts of every parameter for a role's `mesh` (parallel/mesh.py), from `param_specs` (shape, {dim:
    mesh axis that splits it}) and, under pipeline parallelism, each parameter's stage. The device matrix is
    the mesh's device axes; an axis of size 1 splits nothing."""
    names = [a for a, _ in mesh.device_axes]
    dev_matrix = tuple(n for _, n in mesh.device_axes)
    out = {}
    for name, (shape, split) in specs.items():
        tmap = tuple(len(names) - 1 - names.index(split[d]) if d in split and mesh.axis_size(split[d]) > 1 else -1
                     for d in range(len(shape)))
        offset = (stages or {}).get(name, 0) * mesh.stage_size
        try:
            out[name] = Layout(tuple(shape), dev_matrix, tmap, offset)
        except ValueError as err:
            raise CheckpointError(f"parameter {name}: {err}") from None
    return out
