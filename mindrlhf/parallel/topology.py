"""Which ranks share a node, and whether they share a host's memory: answered by asking the ranks, never
by hostname alone (containers may share hostnames; two msrun launches on one machine are two nodes).

A node is one msrun launch: the workers it starts share their parent process on one host. msrun does not
tell a worker its node rank, so ranks exchange (hostname, parent pid) keys and number the nodes in rank
order. Shared memory, and a shared checkpoint directory, are tested directly: rank 0 writes a probe file
and every rank reads it.
"""
from __future__ import annotations

import os
import socket
import zlib
from dataclasses import dataclass
from typing import List

import numpy as np

from mindrlhf.parallel import comm
from mindrlhf.parallel.mesh import distributed_env

_KEY_MOD = 1 << 23      # keys travel as float32 in the host all-reduce: exact below 2^24


def node_key() -> int:
    """This process's node: its host and the msrun launch (parent process) that started it."""
    return zlib.crc32(f"{socket.gethostname()}:{os.getppid()}".encode()) % _KEY_MOD


@dataclass(frozen=True)
class Nodes:
    node_of_rank: List[int]     # node index of each global rank, nodes numbered by their lowest rank
    rank: int

    @property
    def count(self) -> int:
        return max(self.node_of_rank) + 1

    @property
    def my_node(self) -> int:
        return self.node_of_rank[self.rank]

    @property
    def local_ranks(self) -> int:
        """Ranks on this rank's node."""
        return self.node_of_rank.count(self.my_node)

    @property
    def leader(self) -> bool:
        """The lowest rank of its node (writes what each node writes once)."""
        return self.node_of_rank.index(self.my_node) == self.rank


def discover_nodes() -> Nodes:
    """Collective over all ranks."""
    rank, world = distributed_env()
    if world == 1:
        return Nodes([0], 0)
    keys = comm.all_gather(np.array([node_key()], np.float32), comm.world_ranks(), rank)[:, 0]
    index = {}
    for k in keys:
        index.setdefault(float(k), len(index))
    return Nodes([index[float(k)] for k in keys], rank)


def ranks_not_sharing(directory: str) -> List[int]:
    """Collective: the ranks that do not see the probe file rank 0 writes into `directory` (empty when the
    directory is one and the same for every rank)."""
    rank, world = distributed_env()
    if world == 1:
        return []
    token = np.zeros(1, np.float32)
    if rank == 0:
        token[0] = float(np.random.default_rng().integers(1, _KEY_MOD))
    token = comm.all_reduce_sum(token, comm.world_ranks())           # rank 0's token, on every rank
    path = os.path.join(directory, f".mindrlhf_probe_{os.getuid()}_{int(token[0])}")
    if rank == 0 and os.path.isdir(directory):
        with open(path, "w") as fh:
            fh.write(str(int(token[0])))
    comm.barrier()
    try:
        with open(path) as fh:
            seen = fh.read() == str(int(token[0]))
    except OSError:
        seen = False
    votes = comm.all_gather(np.array([1.0 if seen else 0.0], np.float32), comm.world_ranks(), rank)[:, 0]
    comm.barrier()
    if rank == 0 and os.path.exists(path):
        os.remove(path)
    return [r for r, v in enumerate(votes) if v == 0]


def shares_host_memory() -> bool:
    """True when every rank sees the same /dev/shm (collective)."""
    return not ranks_not_sharing("/dev/shm")
