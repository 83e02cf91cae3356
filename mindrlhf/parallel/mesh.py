"""Process mesh: which ranks form a role's pipeline stages and its data- and tensor-parallel groups.

Ranks are laid out [pp, dp, tp] with tp fastest (rank = stage * dp * tp + dp_index * tp + tp_index), as in
MindSpore (a stage holds `rank // (world / pipeline_stage)`, its device matrix is [dp, tp]) and Megatron,
so a TP group is a run of consecutive ranks (one host, fast links) and a stage a run of dp x tp ranks.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from mindrlhf.configs.errors import ConfigError

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
    """One role's arrangement of `pp * dp * tp` ranks and this rank's place in it."""
    dp: int
    tp: int
    rank: int = 0
    pp: int = 1
    seq_parallel: bool = False      # activations outside attention/MLP split along the sequence over TP ranks

    def __post_init__(self):
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside a mesh of pipeline_stage={self.pp} x data_parallel="
                              f"{self.dp} x model_parallel={self.tp}")

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def stage_size(self) -> int:
        """Ranks per pipeline stage (dp x tp)."""
        return self.dp * self.tp

    @property
    def stage(self) -> int:
        return self.rank // self.stage_size

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.pp - 1

    @property
    def dp_index(self) -> int:
        return self.rank % self.stage_size // self.tp

    @property
    def tp_index(self) -> int:
        return self.rank % self.tp

    def rank_at(self, stage: int, dp_index: Optional[int] = None, tp_index: Optional[int] = None) -> int:
        d = self.dp_index if dp_index is None else dp_index
        t = self.tp_index if tp_index is None else tp_index
        return stage * self.stage_size + d * self.tp + t

    def tp_ranks(self, dp_index: Optional[int] = None) -> Tuple[int, ...]:
        return tuple(self.rank_at(self.stage, dp_index, t) for t in range(self.tp))

    def dp_ranks(self, tp_index: Optional[int] = None) -> Tuple[int, ...]:
        return tuple(self.rank_at(self.stage, d, tp_index) for d in range(self.dp))

    def pp_ranks(self) -> Tuple[int, ...]:
        """This rank's counterparts (same dp and tp index) on every stage, in stage order."""
        return tuple(self.rank_at(s) for s in range(self.pp))

    @property
    def tp_group(self) -> Optional[str]:
        """Communication group of this rank's TP peers; None when tp == 1."""
        return group_for(self.tp_ranks()) if self.tp > 1 else None

    @property
    def dp_group(self) -> Optional[str]:
        return group_for(self.dp_ranks()) if self.dp > 1 else None

    @property
    def pp_group(self) -> Optional[str]:
        return group_for(self.pp_ranks()) if self.pp > 1 else None


def mesh_for(parallel, world_size: int, rank: int, role: str) -> Mesh:
    """Mesh of a role from its parallel config; the role must use every rank of the process group."""
    if parallel.world_size != world_size:
        raise ConfigError(f"{role} parallel_config: data_parallel={parallel.data_parallel} x "
                          f"model_parallel={parallel.model_parallel} x pipeline_stage={parallel.pipeline_stage} = "
                          f"{parallel.world_size} ranks, but the job has {world_size} (msrun --worker_num)")
    return Mesh(dp=parallel.data_parallel, tp=parallel.model_parallel, rank=rank, pp=parallel.pipeline_stage,
                seq_parallel=parallel.use_seq_parallel and parallel.model_parallel > 1)
