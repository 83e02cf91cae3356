"""Rollout samples as host arrays, and their packing into training tensors (exchange.py moves them between ranks)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import numpy as np
from mindspore import Tensor

from mindrlhf.models.qwen2 import causal_bias, position_ids


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

    def take(self, index: np.ndarray) -> "SampleBatch":
        return SampleBatch(**{k: v[index] for k, v in self.__dict__.items()})

    def __len__(self):
        return len(self.prompt_ids)


def concat_samples(batches, solutions_per_batch) -> SampleBatch:
    """Several steps' worth of rows as one batch; each batch's solution_index is offset by the solutions of
    the batches before it (their solution lists are concatenated in the same order)."""
    offsets = np.cumsum([0] + list(solutions_per_batch[:-1]))
    fields = {k: np.concatenate([getattr(b, k) for b in batches]) for k in batches[0].__dict__}
    fields["solution_index"] = np.concatenate([b.solution_index + o for b, o in zip(batches, offsets)])
    return SampleBatch(**fields)


def training_tensors(batch: SampleBatch) -> Dict[str, Tensor]:
    """[prompt | response] sequences as model inputs; labels shifted by one; static shapes."""
    seq = np.concatenate([batch.prompt_ids, batch.response_ids], 1)
    mask = np.concatenate([batch.prompt_mask, batch.response_mask], 1)
    inputs, labels, in_mask = seq[:, :-1], seq[:, 1:], mask[:, :-1]
    pos = position_ids(in_mask)
    return {
        "input_ids": Tensor(inputs.astype(np.int32)),
        "position_ids": Tensor(pos.astype(np.int32)),
        "bias": causal_bias(Tensor(in_mask.astype(np.int32))),
        "labels": Tensor(labels.astype(np.int32)),
    }
