"""Process mesh: which ranks form a role's pipeline stages and its data- and tensor-parallel groups.

Ranks are laid out [pp, dp, tp] with tp fastest (rank = stage * dp * tp + dp_index * tp + tp_index), as in
MindSpore (a stage holds `rank // (world / pipeline_stage)`, its device matrix is [dp, tp]) and Megatron,
so a TP group is a run of consecutive ranks (one host, fast links) and a stage a run of dp x tp ranks.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.model_config import EP_DISPATCHERS

_CREATED_GROUPS: Dict[Tuple[int, ...], str] = {}
_INITIALIZED = False


def is_world_group(group: str) -> bool:
    from mindspore.communication import GlobalComm
    return group == GlobalComm.WORLD_COMM_GROUP


def distributed_env() -> Tuple[int, int]:
    """(rank, world_size) from msrun's environment, without initialising communication."""
    world = int(os.environ.get("MS_WORKER_NUM", os.environ.get("RANK_SIZE", "1")))
    rank = int(os.environ.get("RANK_ID", os.environ.get("MS_NODE_ID", "0")))
    return rank, world


def init_distributed() -> Tuple[int, int]:
    """Initialise MindSpore communication once (under msrun); a no-op for a single process."""
    global _INITIALIZED
    _, world = distributed_env()
    if world == 1:
        return 0, 1
    from mindspore.communication import get_group_size, get_rank, init
    if not _INITIALIZED:
        from mindrlhf.parallel import rendezvous
        rendezvous.guard_start()
        init()
        rendezvous.started()
        _INITIALIZED = True
    return get_rank(), get_group_size()


def group_for(ranks: Tuple[int, ...]) -> str:
    """Name of a communication group over `ranks`, created on first use (every member must ask)."""
    ranks = tuple(sorted(ranks))
    if ranks not in _CREATED_GROUPS and len(ranks) == distributed_env()[1]:
        from mindspore.communication import GlobalComm
        _CREATED_GROUPS[ranks] = GlobalComm.WORLD_COMM_GROUP  # some CPU kernels accept only the world group
    if ranks not in _CREATED_GROUPS:
        from mindspore.communication import create_group
        name = "g" + "_".join(str(r) for r in ranks)
        create_group(name, list(ranks))
        _CREATED_GROUPS[ranks] = name
    return _CREATED_GROUPS[ranks]


@dataclass(frozen=True)
class Mesh:
    """One role's arrangement of ranks over named axes and this rank's place in it.

    Axes, outermost first: pp, dp, any `extra_axes`, tp (fastest), so rank = sum(index(a) x stride(a)).
    Every rank formula lives here: the rest of the code asks for an axis's size, index, ranks or group.
    """
    dp: int
    tp: int
    rank: int = 0
    pp: int = 1
    seq_parallel: bool = False      # activations outside attention/MLP split along the sequence over TP ranks
    extra_axes: Tuple[Tuple[str, int], ...] = ()    # (name, size) between dp and tp, e.g. a context axis
    experts_over_tp: bool = False   # MoE: the TP ranks hold other whole experts, not a share of each one's width
    ep_dispatcher: str = "allgather"    # MoE: "allgather", the EP ranks share their rows; "alltoall", distinct rows

    def __post_init__(self):
        names = [a for a, _ in self.axes]
        if len(set(names)) != len(names):
            raise ConfigError(f"mesh axes {names}: a name is used twice")
        if self.ep_dispatcher not in EP_DISPATCHERS:
            raise ConfigError(f"mesh ep_dispatcher {self.ep_dispatcher!r}: expected one of {list(EP_DISPATCHERS)}")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside a mesh of " +
                              " x ".join(f"{_AXIS_KEYS.get(a, a)}={n}" for a, n in self.axes))

    # ---- named axes ------------------------------------------------------------------------------------------
    @property
    def axes(self) -> Tuple[Tuple[str, int], ...]:
        return (("pp", self.pp), ("dp", self.dp)) + tuple(self.extra_axes) + (("tp", self.tp),)

    @property
    def device_axes(self) -> Tuple[Tuple[str, int], ...]:
        """The axes of a stage's device matrix in strategy files, outermost first: dp, the extra axes that
        split anything (size > 1), tp."""
        return tuple((a, n) for a, n in self.axes if a in ("dp", "tp") or (a != "pp" and n > 1))

    def size(self, axis: str) -> int:
        return dict(self.axes)[axis]

    def stride(self, axis: str) -> int:
        """Rank distance between neighbours along `axis`: the product of the sizes of the axes inside it."""
        out = 1
        for name, n in reversed(self.axes):
            if name == axis:
                return out
            out *= n
        raise KeyError(f"no mesh axis {axis!r} (axes: {[a for a, _ in self.axes]})")

    def index(self, axis: str, rank: Optional[int] = None) -> int:
        """`rank`'s (default: this rank's) position along `axis`."""
        return (self.rank if rank is None else rank) // self.stride(axis) % self.size(axis)

    def rank_with(self, **indices: int) -> int:
        """The rank at the given axis indices, this rank's index on every axis not named."""
        unknown = set(indices) - {a for a, _ in self.axes}
        if unknown:
            raise KeyError(f"no mesh axis {sorted(unknown)} (axes: {[a for a, _ in self.axes]})")
        return sum(indices.get(a, self.index(a)) * self.stride(a) for a, _ in self.axes)

    def ranks_along(self, axis: str, **fixed: int) -> Tuple[int, ...]:
        """The ranks that differ from this one only along `axis` (other axes at `fixed` or this rank's), in
        axis order."""
        return tuple(self.rank_with(**{**fixed, axis: i}) for i in range(self.size(axis)))

    def ranks_where(self, **indices: int) -> Tuple[int, ...]:
        """Every rank of the mesh at the given axis indices, in rank order."""
        return tuple(r for r in range(self.world_size)
                     if all(self.index(a, r) == i for a, i in indices.items()))

    def group(self, axis: str) -> Optional[str]:
        """Communication group of this rank's peers along `axis`; None when the axis has size 1."""
        return group_for(self.ranks_along(axis)) if self.size(axis) > 1 else None

    def is_leader(self, *axes: str) -> bool:
        """Whether this rank is at index 0 of every named axis: the one that speaks for its replicas."""
        return all(self.index(a) == 0 for a in axes)

    @property
    def row_replica_axes(self) -> Tuple[str, ...]:
        """The axes whose ranks hold the same rows of a batch (tp, and any extra axis such as ep: the all-gather
        dispatcher replicates the tokens over the EP ranks); only pp and dp tell ranks' rows apart, and ep too
        under the all-to-all dispatcher (models/moe.AllToAllDispatcher: each EP rank its own rows)."""
        distinct = ("pp", "dp") + (("ep",) if self.ep_dispatcher == "alltoall" else ())
        return tuple(a for a, _ in self.axes if a not in distinct)

    @property
    def row_axes(self) -> Tuple[str, ...]:
        """The axes of a stage whose ranks hold distinct rows of a batch, outermost first: dp, and ep under the
        all-to-all dispatcher."""
        return tuple(a for a, _ in self.axes if a != "pp" and a not in self.row_replica_axes)

    @property
    def row_ways(self) -> int:
        """How many distinct shares a stage's rows split into: dp, times ep under the all-to-all dispatcher.
        What a batch's rows, its token-mean's denominator and the gradients' mean divide by."""
        return int(np.prod([self.size(a) for a in self.row_axes]))

    @property
    def row_index(self) -> int:
        """This rank's share of the rows, dp outer, ep inner: in [0, row_ways)."""
        return self.flat_index(self.row_axes)

    def flat_index(self, axes: Tuple[str, ...]) -> int:
        """This rank's position on the grid of `axes` (outermost first), counted row-major."""
        index = 0
        for a in axes:
            index = index * self.size(a) + self.index(a)
        return index

    def row_ranks(self) -> Tuple[int, ...]:
        """The ranks of this stage at this rank's index on every row-replica axis: one per share of the rows."""
        return self.ranks_where(pp=self.stage, **{a: self.index(a) for a in self.row_replica_axes})

    @property
    def row_group(self) -> Optional[str]:
        """Communication group of row_ranks (the one a replicated parameter's gradient is averaged over); None
        when the rows do not split."""
        return group_for(self.row_ranks()) if self.row_ways > 1 else None

    @property
    def is_row_leader(self) -> bool:
        """Whether this rank speaks for the ranks that hold its rows (index 0 of every row-replica axis)."""
        return self.is_leader(*self.row_replica_axes)

    def same_layout(self, other: "Mesh") -> bool:
        """Whether a model built on `other` is laid out and runs as one built on this mesh: the same axes, expert
        split and token dispatcher (what lets one model serve two roles)."""
        return (self.axes, self.experts_over_tp, self.ep_dispatcher) == \
            (other.axes, other.experts_over_tp, other.ep_dispatcher)

    def axis_size(self, axis: str) -> int:
        """size(axis), and 1 for an axis this mesh does not have (a dense model's mesh has no ep)."""
        return dict(self.axes).get(axis, 1)

    @property
    def ep(self) -> int:
        """Expert-parallel ranks (the `ep` axis; 1 without it)."""
        return self.axis_size("ep")

    @property
    def expert_axes(self) -> Tuple[str, ...]:
        """The axes a MoE layer's experts are split over, outermost first: ep, and tp when the TP ranks hold other
        whole experts (experts_over_tp); the ones of size 1 left out."""
        axes = ("ep", "tp") if self.experts_over_tp else ("ep",)
        return tuple(a for a in axes if self.axis_size(a) > 1)

    @property
    def expert_ranks(self) -> int:
        """How many shares of the experts: the product of the expert axes' sizes."""
        return int(np.prod([self.size(a) for a in self.expert_axes]))

    @property
    def expert_index(self) -> int:
        """This rank's share of the experts: [i E / expert_ranks, (i + 1) E / expert_ranks)."""
        return self.flat_index(self.expert_axes)

    def sizes(self) -> str:
        """"dp=.. ep=.. tp=..": the row and tensor axes' sizes as start-up lines say them (ep only when split;
        "experts over ep x tp" when the TP ranks hold whole experts)."""
        return f"dp={self.dp}" + (f" ep={self.ep}" if self.ep > 1 else "") + \
            (" (all-to-all: each EP rank its own rows)" if self.ep > 1 and self.ep_dispatcher == "alltoall" else "") + \
            f" tp={self.tp}" + \
            (f" (experts over {' x '.join(self.expert_axes)})" if self.experts_over_tp and self.tp > 1 else "")

    @property
    def data_parallel(self) -> int:
        """parallel_config.data_parallel of this mesh: the dp replicas times the EP ranks taken from them."""
        return self.dp * self.ep

    # ---- the pp / dp / tp queries the code reads ---------------------------------------------------------
    @property
    def world_size(self) -> int:
        return int(np.prod([n for _, n in self.axes]))

    @property
    def stage_size(self) -> int:
        """Ranks per pipeline stage."""
        return self.stride("pp")

    @property
    def stage(self) -> int:
        return self.index("pp")

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.pp - 1

    @property
    def dp_index(self) -> int:
        return self.index("dp")

    @property
    def tp_index(self) -> int:
        return self.index("tp")

    def rank_at(self, stage: int, dp_index: Optional[int] = None, tp_index: Optional[int] = None) -> int:
        indices = {"pp": stage, "dp": dp_index, "tp": tp_index}
        return self.rank_with(**{a: i for a, i in indices.items() if i is not None})

    def tp_ranks(self, dp_index: Optional[int] = None) -> Tuple[int, ...]:
        return self.ranks_along("tp", **({} if dp_index is None else {"dp": dp_index}))

    def dp_ranks(self, tp_index: Optional[int] = None) -> Tuple[int, ...]:
        return self.ranks_along("dp", **({} if tp_index is None else {"tp": tp_index}))

    def pp_ranks(self) -> Tuple[int, ...]:
        """This rank's counterparts (same index on the other axes) on every stage, in stage order."""
        return self.ranks_along("pp")

    @property
    def tp_group(self) -> Optional[str]:
        """Communication group of this rank's TP peers; None when tp == 1."""
        return self.group("tp")

    @property
    def dp_group(self) -> Optional[str]:
        return self.group("dp")

    @property
    def pp_group(self) -> Optional[str]:
        return self.group("pp")


_AXIS_KEYS = {"pp": "pipeline_stage", "dp": "data_parallel", "tp": "model_parallel"}     # parallel_config's


def mesh_for(parallel, world_size: int, rank: int, role: str) -> Mesh:
    """Mesh of a role from its parallel config; the role must use every rank of the process group."""
    if parallel.world_size != world_size:
        raise ConfigError(f"{role} parallel_config: data_parallel={parallel.data_parallel} x "
                          f"model_parallel={parallel.model_parallel} x pipeline_stage={parallel.pipeline_stage} = "
                          f"{parallel.world_size} ranks, but the job has {world_size} (msrun --worker_num)")
    ep = parallel.expert_parallel     # taken from data_parallel (MindFormers'): rows shared or not, by the dispatcher
    return Mesh(dp=parallel.data_parallel // ep, tp=parallel.model_parallel, rank=rank, pp=parallel.pipeline_stage,
                seq_parallel=parallel.use_seq_parallel and parallel.model_parallel > 1,
                extra_axes=(("ep", ep),) if ep > 1 else (),
                experts_over_tp=parallel.moe_tp_extend_ep and parallel.model_parallel > 1,
                ep_dispatcher="alltoall" if parallel.distinct_ep_rows else "allgather")
