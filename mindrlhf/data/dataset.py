"""Prompt reader for GRPO: global seeded shuffle per epoch, sharded by data-parallel rank, resumable.

Every rank reads the prompt columns (prompt_ids, prompt_length, solution; never the seq_length-wide
pretrain_ids/loss_mask) with MindDataset and permutes them with a seed that depends on
(seed, epoch) only. Step s of an epoch takes the next `batch_size * dp_size` rows of that order (the global
batch, the same for any DP size with the same global batch); DP rank d takes the d-th run of `batch_size`
of them. So the DP shards are disjoint, their union is the epoch, the global batch does not depend on the
layout, and the position (epoch, index) fully determines what comes next: a checkpoint stores just that.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional

import numpy as np

from mindrlhf.configs.errors import ConfigError
from mindrlhf.data.mindrecord_io import iter_chunks, read_mindrecord

# all GRPO reads of a prompt file; verl's rows add data_source and extra_info (data/mindrecord_io.py)
PROMPT_COLUMNS = ("prompt_ids", "prompt_length", "solution", "data_source", "extra_info")
ANSWER_CHUNK_ROWS = 1024    # rows of pretrain_ids/loss_mask recover_solutions holds at a time


@dataclass
class DataPosition:
    epoch: int = 0
    index: int = 0    # batches already taken in this epoch (per rank)


def prompt_lengths(prompt_ids: np.ndarray, pad_token_id: int) -> np.ndarray:
    """Length of right-padded prompts (MindRLHF files have no prompt_length column)."""
    not_pad = prompt_ids != pad_token_id
    return np.where(not_pad.any(1), prompt_ids.shape[1] - np.argmax(not_pad[:, ::-1], axis=1), 0)


class PromptDataset:
    def __init__(self, path: str, batch_size: int, dp_size: int = 1, dp_rank: int = 0, seed: int = 0,
                 pad_token_id: int = 0, shuffle: bool = True, columns: Optional[Dict[str, np.ndarray]] = None):
        table = columns if columns is not None else read_mindrecord(path, PROMPT_COLUMNS)
        self.table = {k: v for k, v in table.items() if k in PROMPT_COLUMNS}
        self.path = path
        n = len(self.table["prompt_ids"])
        if "prompt_length" not in self.table:
            self.table["prompt_length"] = prompt_lengths(self.table["prompt_ids"], pad_token_id)
        self.has_solutions = "solution" in self.table     # MindRLHF's 3-column files have none
        if not self.has_solutions:
            self.table["solution"] = np.array([""] * n, dtype=object)
        empty = np.flatnonzero(np.asarray(self.table["prompt_length"]) <= 0)
        if empty.size:
            raise ConfigError(f"{path}: {empty.size} prompt(s) are empty (no token other than pad_token_id="
                              f"{pad_token_id}), first at row {int(empty[0])}; remove them or re-run rlhf_data.py")
        if self.has_solutions:
            blank = [i for i, x in enumerate(self.table["solution"]) if not str(x).strip()]
            if blank:
                raise ConfigError(f"{path}: {len(blank)} row(s) have an empty solution, first at row {blank[0]}: such "
                                  f"a row cannot be scored; re-run rlhf_data.py, which refuses them")
        if batch_size <= 0:
            raise ConfigError(f"batch_size: expected > 0, got {batch_size}")
        if n < batch_size * dp_size:
            raise ConfigError(f"{path}: {n} prompts cannot fill one step of batch_size={batch_size} x "
                              f"data_parallel={dp_size}")
        self.num_rows = n
        self.batch_size, self.dp_size, self.dp_rank = batch_size, dp_size, dp_rank
        self.seed, self.shuffle = seed, shuffle
        self.position = DataPosition()

    @property
    def batches_per_epoch(self) -> int:
        """Whole steps per epoch (every rank the same number; the remainder is dropped this epoch)."""
        return self.num_rows // (self.batch_size * self.dp_size)

    def epoch_steps(self, epoch: int) -> np.ndarray:
        """Row indices of `epoch` as (steps, dp_size, batch_size): [s, d] is DP rank d's part of step s."""
        order = (np.random.default_rng([self.seed, epoch]).permutation(self.num_rows) if self.shuffle
                 else np.arange(self.num_rows))
        usable = self.batches_per_epoch * self.batch_size * self.dp_size
        return order[:usable].reshape(self.batches_per_epoch, self.dp_size, self.batch_size)

    def epoch_rows(self, epoch: int) -> np.ndarray:
        """This rank's row indices for `epoch`, in order."""
        return self.epoch_steps(epoch)[:, self.dp_rank].reshape(-1)

    def next_global_batch(self) -> Dict[str, np.ndarray]:
        """The next step's prompts of every DP rank, in DP order (rank d's are rows d*batch_size...)."""
        if self.position.index >= self.batches_per_epoch:
            self.position = DataPosition(self.position.epoch + 1, 0)
        take = self.epoch_steps(self.position.epoch)[self.position.index].reshape(-1)
        self.position = DataPosition(self.position.epoch, self.position.index + 1)
        batch = {k: v[take] for k, v in self.table.items()}
        batch["row_index"] = take
        return batch

    def local_part(self, global_batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """This DP rank's rows of a global batch."""
        mine = slice(self.dp_rank * self.batch_size, (self.dp_rank + 1) * self.batch_size)
        return {k: v[mine] for k, v in global_batch.items()}

    def next_batch(self) -> Dict[str, np.ndarray]:
        return self.local_part(self.next_global_batch())

    def recover_solutions(self, decode: Callable, extract: Callable):
        """MindRLHF's rlhf_data.py stores no solution column; the reference answer is the answer part of
        `pretrain_ids` (where `loss_mask` is 1). Take each row's final answer from there (`extract`, the
        verifiers' extraction), or stop naming the first row without one: training on rewards that can only
        be 0 must never happen silently. The file is read again a chunk at a time: only the solutions stay."""
        solutions = []
        for part in iter_chunks(self.path, ["pretrain_ids", "loss_mask"], ANSWER_CHUNK_ROWS):
            answers = decode([ids[m == 1].tolist() for ids, m in zip(part["pretrain_ids"], part["loss_mask"])])
            solutions += [extract(a) or "" for a in answers]
        missing = [i for i, s in enumerate(solutions) if not s]
        if missing:
            raise ConfigError(f"{self.path}: the file has no 'solution' column (MindRLHF's three-column format), "
                              f"and {len(missing)} of {self.num_rows} rows have no final answer ('#### n', \\boxed{{}} "
                              f"or <answer>) in the answer part of pretrain_ids (loss_mask = 1), first at row "
                              f"{missing[0]}: rewards would all be 0. Convert the data with this project's "
                              f"rlhf_data.py, which stores the solution")
        self.table["solution"] = np.array(solutions, dtype=object)
        self.has_solutions = True

    def __iter__(self) -> Iterator[Dict[str, np.ndarray]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> Dict[str, int]:
        return {"epoch": self.position.epoch, "index": self.position.index}

    def load_state_dict(self, state: Dict[str, int]):
        self.position = DataPosition(int(state["epoch"]), int(state["index"]))
