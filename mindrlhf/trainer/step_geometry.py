"""How one GRPO step's sequences split over train-DP ranks and mini-batches.

Mini-batches are global: mini-batch k is rows [k*M, (k+1)*M) of the step (M = mini_batch_size x train dp),
and train-DP rank d takes its d-th run of mini_batch_size rows of each. So the same global mini-batch size
gives the same updates on any train layout, and every rank still holds whole-row shares of equal size.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mindrlhf.configs.errors import ConfigError


@dataclass(frozen=True)
class StepGeometry:
    sequences: int      # rows of a step: prompts x num_generations, over all infer-DP replicas
    train_dp: int
    mini_batch: int     # rows per optimizer update on one train-DP rank

    @classmethod
    def from_config(cls, rl, infer_dp: int, train_dp: int) -> "StepGeometry":
        prompts = rl.batch_size * infer_dp
        if prompts % train_dp:
            raise ConfigError(f"rl.batch_size: {rl.batch_size} prompts x infer data_parallel {infer_dp} = {prompts} "
                              f"prompt groups do not split over train data_parallel={train_dp}")
        per_rank = prompts * rl.num_generations // train_dp
        mini_batch = rl.mini_batch_size or per_rank
        if per_rank % mini_batch:
            raise ConfigError(f"rl.mini_batch_size: {mini_batch} does not divide the {per_rank} "
                              f"sequences each train-DP rank gets per step")
        return cls(prompts * rl.num_generations, train_dp, mini_batch)

    @property
    def rows_per_rank(self) -> int:
        return self.sequences // self.train_dp

    @property
    def minibatches(self) -> int:
        return self.rows_per_rank // self.mini_batch

    def rows_of(self, dp_index: int) -> np.ndarray:
        """Rank `dp_index`'s rows of the step, mini-batch by mini-batch."""
        starts = np.arange(self.minibatches) * self.mini_batch * self.train_dp + dp_index * self.mini_batch
        return (starts[:, None] + np.arange(self.mini_batch)).reshape(-1)

    def token_norms(self, response_mask: np.ndarray) -> np.ndarray:
        """Per mini-batch: response tokens of the whole (global) mini-batch / dp, the token-mean's
        denominator on each rank (grpo_math.agg_token_mean). `response_mask`: (sequences, R) of the step."""
        counts = response_mask.reshape(self.minibatches, self.mini_batch * self.train_dp, -1).sum((1, 2))
        return np.maximum(counts, 1).astype(np.float32) / self.train_dp
