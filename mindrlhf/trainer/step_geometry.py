"""How one GRPO step's sequences split over the train layout's row shares and mini-batches.

The row shares are the train mesh's `row_ways` (parallel/mesh.py): its data-parallel replicas, times the EP ranks
under the all-to-all dispatcher (each of them its own rows). Mini-batches are global: mini-batch k is rows
[k*M, (k+1)*M) of the step (M = mini_batch_size x row shares), and share d takes its d-th run of mini_batch_size
rows of each. So the same global mini-batch size gives the same updates on any train layout, and every rank still
holds whole-row shares of equal size.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mindrlhf.configs.errors import ConfigError


@dataclass(frozen=True)
class StepGeometry:
    sequences: int      # rows of a step: prompts x num_generations, over all infer-DP replicas
    row_ways: int       # the train layout's row shares (Mesh.row_ways)
    mini_batch: int     # rows per optimizer update on one train-DP rank

    @classmethod
    def from_config(cls, rl, infer_dp: int, row_ways: int) -> "StepGeometry":
        prompts = rl.batch_size * infer_dp
        if prompts % row_ways:
            raise ConfigError(f"rl.batch_size: {rl.batch_size} prompts x infer data_parallel {infer_dp} = {prompts} "
                              f"prompt groups do not split over the train layout's {row_ways} data-parallel row "
                              f"shares")
        per_rank = prompts * rl.num_generations // row_ways
        mini_batch = rl.mini_batch_size or per_rank
        if per_rank % mini_batch:
            raise ConfigError(f"rl.mini_batch_size: {mini_batch} does not divide the {per_rank} "
                              f"sequences each train row share (data-parallel rank) gets per step")
        return cls(prompts * rl.num_generations, row_ways, mini_batch)

    @property
    def rows_per_rank(self) -> int:
        return self.sequences // self.row_ways

    @property
    def minibatches(self) -> int:
        return self.rows_per_rank // self.mini_batch

    def rows_of(self, share: int) -> np.ndarray:
        """Row share `share`'s rows of the step (Mesh.row_index), mini-batch by mini-batch."""
        starts = np.arange(self.minibatches) * self.mini_batch * self.row_ways + share * self.mini_batch
        return (starts[:, None] + np.arange(self.mini_batch)).reshape(-1)

    def token_norms(self, response_mask: np.ndarray) -> np.ndarray:
        """Per mini-batch: response tokens of the whole (global) mini-batch / row shares, the token-mean's
        denominator on each rank (grpo_math.agg_token_mean). `response_mask`: (sequences, R) of the step."""
        counts = response_mask.reshape(self.minibatches, self.mini_batch * self.row_ways, -1).sum((1, 2))
        return np.maximum(counts, 1).astype(np.float32) / self.row_ways
