"""Online weight re-layout: policy (train layout) -> rollout model (infer layout), in memory.

The plan is computed once from the two layouts: for each parameter, which ranks own a distinct source
slice (one replica each) and which slice of the full tensor each destination rank keeps. Execution moves
parameters in flattened buckets through one all-reduce per bucket (owners contribute their slice at its
place in a zero buffer), so extra memory is about one bucket of full tensors. When both layouts are the
same and the model object is shared, there is nothing to do.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np
from mindspore import Tensor

from mindrlhf.models.qwen2 import param_specs
from mindrlhf.parallel import comm
from mindrlhf.parallel.layouts import Layout, ranks_holding, role_layouts


@dataclass
class ParamMove:
    name: str
    src: Layout
    dst: Layout
    owners: Tuple[int, ...]       # source ranks whose slices together make the full tensor once

    @property
    def full_size(self) -> int:
        return int(np.prod(self.src.full_shape))


def plan_reshard(cfg, src_dp: int, src_tp: int, dst_dp: int, dst_tp: int) -> List[ParamMove]:
    specs = param_specs(cfg)
    src, dst = role_layouts(specs, src_dp, src_tp), role_layouts(specs, dst_dp, dst_tp)
    return [ParamMove(n, src[n], dst[n], tuple(ranks_holding(src[n]))) for n in specs]


class WeightSync:
    """Copies the policy's current weights into the rollout model after each update."""

    def __init__(self, policy, rollout_model, bucket_bytes: int = 64 << 20):
        self.policy, self.rollout = policy, rollout_model
        self.shared = policy is rollout_model
        self.bucket_elems = max(1, bucket_bytes // 4)
        if not self.shared:
            pm, rm = policy.mesh, rollout_model.mesh
            self.plan = plan_reshard(policy.config, pm.dp, pm.tp, rm.dp, rm.tp)
            self._src = {p.name: p for p in policy.get_parameters()}
            self._dst = {p.name: p for p in rollout_model.get_parameters()}
        self.last_seconds = 0.0

    def _buckets(self):
        bucket, size = [], 0
        for move in self.plan:
            if bucket and size + move.full_size > self.bucket_elems:
                yield bucket
                bucket, size = [], 0
            bucket.append(move)
            size += move.full_size
        if bucket:
            yield bucket

    def sync(self):
        t0 = time.time()
        if self.shared:
            self.last_seconds = 0.0
            return
        rank = self.policy.mesh.rank
        world = comm.world_ranks()
        for bucket in self._buckets():
            offsets, total = [], 0
            for move in bucket:
                offsets.append(total)
                total += move.full_size
            flat = np.zeros(total, np.float32)
            for move, off in zip(bucket, offsets):
                if rank in move.owners:
                    full = flat[off:off + move.full_size].reshape(move.src.full_shape)
                    full[move.src.shard_slices(rank)] = self._src[move.name].asnumpy().astype(np.float32)
            flat = comm.all_reduce_sum(flat, world)
            for move, off in zip(bucket, offsets):
                full = flat[off:off + move.full_size].reshape(move.src.full_shape)
                param = self._dst[move.name]
                param.set_data(Tensor(np.ascontiguousarray(full[move.dst.shard_slices(rank)])).astype(param.dtype))
        self.last_seconds = time.time() - t0
