"""Rollout samples as host arrays, and their packing into training tensors (exchange.py moves them between ranks)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np
from mindspore import Tensor

from mindrlhf.models.padding import causal_bias, left_pad, position_ids
from mindrlhf.reward.verifiers import Scores, merge_scores
from mindrlhf.rollout.engine import unrouted
from mindrlhf.trainer.update.loss_inputs import LossInputs


@dataclass
class SampleBatch:
    """Rows are sequences; row i*G + j is sample j of prompt i. Prompts left-padded to P, responses
    right-padded to R.

    Two response masks: `response_mask` is the present tokens (a prefix of the row: attended to, what the
    forward, packing and the log-prob passes read), `loss_mask` the trained ones (the model's own tokens; a
    multi-turn episode's tool results and template tokens are present but 0 here). One turn: the same."""
    prompt_ids: np.ndarray      # (N, P) int64
    prompt_mask: np.ndarray     # (N, P) int64
    response_ids: np.ndarray    # (N, R) int64
    response_mask: np.ndarray   # (N, R) int64 present tokens
    rollout_logp: np.ndarray    # (N, R) float32 (0 on tool tokens)
    solution_index: np.ndarray  # (N,) int64 index into the step's solutions
    finished: np.ndarray        # (N,) int64 1 unless cut at the response length (EOS, or the tool-call limit)
    loss_mask: np.ndarray = None    # (N, R) int64 trained tokens; None: response_mask
    tool_calls: np.ndarray = None   # (N,) int64 tool calls per episode; None: zeros
    # Qwen3-MoE: (N, P + R, sparse layers, k) int32 the experts each token went to in the rollout (router
    # replay; padding holds experts 0..k-1); None for a dense model
    routing: np.ndarray = None

    def __post_init__(self):
        if self.loss_mask is None:
            self.loss_mask = np.array(self.response_mask, np.int64, copy=True)
        if self.tool_calls is None:
            self.tool_calls = np.zeros(len(self.prompt_ids), np.int64)

    @staticmethod
    def blank(rows: int, prompt_width: int, response_width: int, routing=None) -> "SampleBatch":
        """Zeros of the shapes and dtypes a rollout produces (for compiling graphs ahead of one); `routing`
        (sparse layers, k): a MoE rollout's routing too (experts 0..k-1)."""
        def ints(width):
            return np.zeros((rows, width), np.int64)
        experts = None
        if routing is not None:
            layers, k = routing
            experts = unrouted((rows, prompt_width + response_width, layers), k)
        return SampleBatch(ints(prompt_width), ints(prompt_width), ints(response_width), ints(response_width),
                           np.zeros((rows, response_width), np.float32), np.zeros(rows, np.int64),
                           np.zeros(rows, np.int64), routing=experts)

    @staticmethod
    def of_rollout(out, prompt_width: int, pad_id: int, first_prompt: int = 0) -> "SampleBatch":
        """An infer replica's rollout/engine.RolloutOutput as samples: prompts left-padded to `prompt_width`,
        solution indices offset by `first_prompt` (the replica's first prompt in the step's batch)."""
        ids, mask = left_pad(out.prompt_ids, prompt_width, pad_id)
        return SampleBatch(ids, mask, out.response_ids, out.response_mask, out.logprobs,
                           (out.prompt_index + first_prompt).astype(np.int64),
                           np.array([r != "length" for r in out.finish_reason], np.int64),
                           out.loss_mask.astype(np.int64), out.tool_calls.astype(np.int64),
                           None if out.response_routing is None else
                           padded_routing(out.prompt_routing, out.response_routing, prompt_width))

    def rows(self, start: int, stop: int) -> "SampleBatch":
        return self.take(slice(start, stop))

    def take(self, index) -> "SampleBatch":
        return SampleBatch(**{k: None if v is None else v[index] for k, v in self.__dict__.items()})

    def fields(self) -> Dict[str, np.ndarray]:
        """The per-row arrays this batch holds (routing only for a MoE model)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def input_routing(self) -> np.ndarray:
        """routing as the model inputs are laid out (training_tensors: the sequence without its last token),
        (N, P + R - 1, sparse layers, k)."""
        if self.routing is None:
            raise ValueError("router replay: these samples carry no routing (a dense model's rollout)")
        return self.routing[:, :-1]

    def __len__(self):
        return len(self.prompt_ids)

    def check_groups(self, group: int):
        """Rows i*group .. i*group + group - 1 hold one prompt: what a shared-prompt forward relies on."""
        for name in ("prompt_ids", "prompt_mask"):
            rows = getattr(self, name).reshape(-1, group, self.prompt_ids.shape[1])
            if not (rows == rows[:, :1]).all():
                raise RuntimeError(f"samples: {name} differ within a group of {group} rows; a shared-prompt "
                                   f"forward would be wrong (engine.share_prompt: false avoids it)")


@dataclass
class ScoredBatch:
    """One rollout round's samples and what scoring made of them (rows as in SampleBatch): the reward per
    row, the verifiers' parts and statistics, the decoded responses, and the round's solutions (indexed
    by samples.solution_index). `group_mask` (groups,): False for groups whose loss is masked out."""
    samples: SampleBatch
    rewards: np.ndarray
    scores: Scores
    texts: List[str]
    solutions: List[str]
    group_mask: np.ndarray = None

    @staticmethod
    def concat(rounds: Sequence["ScoredBatch"]) -> "ScoredBatch":
        """Several rounds as one batch (solution lists concatenated, indices offset to match)."""
        offsets = np.cumsum([0] + [len(r.solutions) for r in rounds[:-1]])
        fields = {k: np.concatenate([r.samples.fields()[k] for r in rounds]) for k in rounds[0].samples.fields()}
        fields["solution_index"] = np.concatenate([r.samples.solution_index + o for r, o in zip(rounds, offsets)])
        return ScoredBatch(SampleBatch(**fields), np.concatenate([r.rewards for r in rounds]),
                           merge_scores([r.scores for r in rounds], range(sum(len(r.texts) for r in rounds))),
                           [t for r in rounds for t in r.texts], [s for r in rounds for s in r.solutions])

    def take_groups(self, groups: np.ndarray, group_size: int) -> "ScoredBatch":
        """The rows of the given groups (each group's G rows, in the order given)."""
        rows = (np.asarray(groups)[:, None] * group_size + np.arange(group_size)).reshape(-1)
        return ScoredBatch(self.samples.take(rows), self.rewards[rows], merge_scores([self.scores], rows),
                           [self.texts[i] for i in rows], self.solutions)


def padded_routing(prompt_routing: Sequence[np.ndarray], response_routing: np.ndarray,
                   prompt_width: int) -> np.ndarray:
    """A rollout's routing record (RolloutOutput.prompt_routing, response_routing) laid out as SampleBatch.routing:
    each row's prompt tokens left-padded to `prompt_width`, then its response; padding holds experts 0..k-1."""
    rows, width, layers, k = response_routing.shape
    out = unrouted((rows, prompt_width + width, layers), k)
    for i, prompt in enumerate(prompt_routing):
        out[i, prompt_width - len(prompt):prompt_width] = prompt
    out[:, prompt_width:] = response_routing
    return out


def training_tensors(batch: SampleBatch) -> Dict[str, Tensor]:
    """[prompt | response] sequences as model inputs; labels shifted by one; static shapes."""
    seq = np.concatenate([batch.prompt_ids, batch.response_ids], 1)
    mask = np.concatenate([batch.prompt_mask, batch.response_mask], 1)
    inputs, labels, in_mask = seq[:, :-1], seq[:, 1:], mask[:, :-1]
    pos = position_ids(in_mask)
    return {
        "input_ids": Tensor(inputs.astype(np.int32)),
        "position_ids": Tensor(pos.astype(np.int32)),
        "bias": causal_bias(in_mask),
        "labels": Tensor(labels.astype(np.int32)),
    }


def train_step_inputs(batch: SampleBatch, loss_inputs: LossInputs, lr) -> tuple:
    """The arguments of an update (trainer/update/) for a mini-batch of padded rows."""
    return step_inputs(training_tensors(batch), loss_inputs, lr)


def step_inputs(model_inputs: Dict[str, Tensor], loss_inputs: LossInputs, lr) -> tuple:
    """Model inputs (training_tensors' keys), the learning rate and the loss inputs as an update's arguments;
    every float input float32, so the graph compiled for one call serves the next."""
    t = model_inputs
    return (t["input_ids"], t["position_ids"], t["bias"], t["labels"], Tensor(np.float32(lr)),
            *loss_inputs.tensors().args())


class PaddedRows:
    """One padded row per sequence (the default; trainer/packing.PackedRowLayout is the packed one): what the
    trainer calls to run a log-prob cell over samples and to make a training step's inputs."""

    def __init__(self, rows_per_call: int):
        self.rows_per_call = rows_per_call

    def logprobs(self, cell, samples: SampleBatch, routing: np.ndarray = None):
        """`cell` over the samples, rows_per_call rows a call, its output (or each of its outputs) row-joined;
        `routing` (N, T, sparse layers, k): the experts it replays (router replay), None: it routes itself."""
        out = []
        for start in range(0, len(samples), self.rows_per_call):
            t = training_tensors(samples.rows(start, start + self.rows_per_call))
            args = (t["input_ids"], t["position_ids"], t["bias"], t["labels"])
            if routing is not None:
                args += (Tensor(np.asarray(routing[start:start + self.rows_per_call], np.int32)),)
            got = cell(*args)
            out.append(tuple(x.asnumpy() for x in got) if isinstance(got, tuple) else got.asnumpy())
        return tuple(map(np.concatenate, zip(*out))) if isinstance(out[0], tuple) else np.concatenate(out)

    def step_inputs(self, batch: SampleBatch, loss_inputs: LossInputs, lr) -> tuple:
        return train_step_inputs(batch, loss_inputs, lr)
