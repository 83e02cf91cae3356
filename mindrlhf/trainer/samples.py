"""Rollout samples as host arrays, their exchange between layouts, and packing into training tensors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import numpy as np
from mindspore import Tensor

from mindrlhf.models.qwen2 import causal_bias
from mindrlhf.parallel import comm


@dataclass
class SampleBatch:
    """Rows are sequences; row i*G + j is sample j of prompt i. Prompts left-padded to P, responses
    right-padded to R."""
    prompt_ids: np.ndarray      # (N, P) int64
    prompt_mask: np.ndarray     # (N, P) int64
    response_ids: np.ndarray    # (N, R) int64
    response_mask: np.ndarray   # (N, R) int64
    rollout_logp: np.ndarray    # (N, R) float32
    solution_index: np.ndarray  # (N,) int64 index into the step's solutions
    finished: np.ndarray        # (N,) int64 1 if EOS was produced

    def rows(self, start: int, stop: int) -> "SampleBatch":
        return SampleBatch(**{k: v[start:stop] for k, v in self.__dict__.items()})

    def __len__(self):
        return len(self.prompt_ids)


def left_pad(prompts, width: int, pad: int):
    ids = np.full((len(prompts), width), pad, np.int64)
    mask = np.zeros((len(prompts), width), np.int64)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = p
        mask[i, width - len(p):] = 1
    return ids, mask


def gather_samples(local: SampleBatch, infer_mesh) -> SampleBatch:
    """Every rank gets all infer-DP replicas' samples, in DP order (TP peers hold duplicates; take tp 0)."""
    world = comm.world_ranks()
    if len(world) == 1:
        return local
    gathered = {k: comm.all_gather(v, world, infer_mesh.rank) for k, v in local.__dict__.items()}
    keep = [d * infer_mesh.tp for d in range(infer_mesh.dp)]   # rank of (dp=d, tp=0)
    return SampleBatch(**{k: np.concatenate([v[r] for r in keep]) for k, v in gathered.items()})


def training_tensors(batch: SampleBatch) -> Dict[str, Tensor]:
    """[prompt | response] sequences as model inputs; labels shifted by one; static shapes."""
    seq = np.concatenate([batch.prompt_ids, batch.response_ids], 1)
    mask = np.concatenate([batch.prompt_mask, batch.response_mask], 1)
    inputs, labels, in_mask = seq[:, :-1], seq[:, 1:], mask[:, :-1]
    pos = np.maximum(np.cumsum(in_mask, 1) - 1, 0)
    return {
        "input_ids": Tensor(inputs.astype(np.int32)),
        "position_ids": Tensor(pos.astype(np.int32)),
        "bias": causal_bias(Tensor(in_mask.astype(np.int32))),
        "labels": Tensor(labels.astype(np.int32)),
    }
