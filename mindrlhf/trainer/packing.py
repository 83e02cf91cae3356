"""Sequence packing: a rank's [prompt | response] sequences laid into rows of the padded row's width, several
per row, each seeing only itself (block-diagonal causal attention) with positions restarting at 0. The model
then computes the real tokens and little padding; the per-token values of the loss (mask, log-probs,
advantages) are laid out the same way, so the loss cell sees per-token tensors of the packed rows.

Sequence i of the batch is its prompt's real tokens then its response's real tokens (response_mask 1);
as model input it is those tokens minus the last (the label of position t is token t + 1), so it fits a
row of the padded input width P + R - 1 whatever its lengths. Response token k's log-prob is read at
position p_i - 1 + k of its segment. Rows are filled first-fit by decreasing length (deterministic), then
padded with empty rows to a multiple of the micro-batch's rows, so every compiled call has one shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import numpy as np
from mindspore import Tensor

from mindrlhf.models.padding import NEG_INF
from mindrlhf.trainer.samples import PaddedRows, SampleBatch, step_inputs
from mindrlhf.trainer.update.loss_inputs import LossInputs


def first_fit_decreasing(lengths: np.ndarray, capacity: int) -> List[List[int]]:
    """Indices of `lengths` grouped into bins of at most `capacity`: longest first, each into the first bin
    with room (ties by index, so the result is the same on every rank). Zero lengths are left out."""
    order = sorted((i for i in range(len(lengths)) if lengths[i] > 0), key=lambda i: (-int(lengths[i]), i))
    bins: List[List[int]] = []
    room: List[int] = []
    for i in order:
        n = int(lengths[i])
        if n > capacity:
            raise ValueError(f"sequence {i} has {n} tokens, more than the packed row's {capacity}")
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(capacity - n)
    return bins


@dataclass(frozen=True)
class PackingLayout:
    """A run's packed micro-batch: `micro_rows` rows of `width` tokens (the padded input width)."""
    width: int
    micro_rows: int

    def describe(self) -> str:
        return f"sequence packing: {self.micro_rows} row(s) of {self.width} tokens per micro-batch"


@dataclass
class PackedRows:
    """Packed model inputs (rows, W) and where each sequence's response tokens sit in them."""
    input_ids: np.ndarray       # (rows, W) int32
    position_ids: np.ndarray    # (rows, W) int32, 0 at each segment's first token
    labels: np.ndarray          # (rows, W) int32
    segments: np.ndarray        # (rows, W) int32: the sequence a position belongs to, -1 for padding
    response_rows: np.ndarray   # (N, R) int64: packed row of response token k of sequence i (-1: not packed)
    response_cols: np.ndarray   # (N, R) int64: its column
    # per sequence: its packed row (-1: not packed), first column, and first input position in the padded layout
    # (P - prompt length): its m input tokens are padded positions [first, first + m), contiguous
    segment_rows: np.ndarray = None
    segment_cols: np.ndarray = None
    segment_firsts: np.ndarray = None

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def tokens(self) -> int:
        return int((self.segments >= 0).sum())

    def bias(self, start: int = 0, stop: int = None) -> Tensor:
        """Additive attention bias (rows, 1, W, W) of rows [start, stop): 0 where query t may see key s (s <= t,
        same sequence), NEG_INF elsewhere (a padding position sees nothing: its softmax is uniform, unused)."""
        seg = self.segments[start:stop]
        w = seg.shape[1]
        same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0)
        allowed = same & np.tril(np.ones((w, w), bool))[None]
        return Tensor(np.where(allowed[:, None], np.float32(0.0), np.float32(NEG_INF)))

    def scatter(self, values: np.ndarray, dtype=np.float32) -> np.ndarray:
        """(N, R) per response token, or (N,) per sequence -> (rows, W) at the packed positions, 0 elsewhere."""
        values = np.asarray(values)
        if values.ndim == 1:
            values = np.broadcast_to(values[:, None], self.response_rows.shape)
        out = np.zeros(self.input_ids.shape, dtype)
        on = self.response_rows >= 0
        out[self.response_rows[on], self.response_cols[on]] = values[on]
        return out

    def scatter_tokens(self, values: np.ndarray) -> np.ndarray:
        """(N, P + R - 1, ...) per input token in the padded layout (a MoE's routing inputs) -> (rows, W, ...) at the
        packed positions; elsewhere -1 for integers (experts: the token routes itself), 0 for floats."""
        values = np.asarray(values)
        fill = -1 if np.issubdtype(values.dtype, np.integer) else 0
        out = np.full(self.input_ids.shape + values.shape[2:], fill, values.dtype)
        for i in np.flatnonzero(self.segment_rows >= 0):
            m = int((self.segments[self.segment_rows[i]] == i).sum())
            col, first = self.segment_cols[i], self.segment_firsts[i]
            out[self.segment_rows[i], col:col + m] = values[i, first:first + m]
        return out

    def model_inputs(self, start: int = 0, stop: int = None) -> Dict[str, Tensor]:
        """Rows [start, stop) as the model's inputs (samples.training_tensors' keys)."""
        return {"input_ids": Tensor(self.input_ids[start:stop]), "position_ids": Tensor(self.position_ids[start:stop]),
                "bias": self.bias(start, stop), "labels": Tensor(self.labels[start:stop])}

    def gather(self, packed: np.ndarray) -> np.ndarray:
        """(rows, W) -> (N, R): the values at each sequence's response positions, 0 where it has none."""
        out = np.zeros(self.response_rows.shape, np.asarray(packed).dtype)
        on = self.response_rows >= 0
        out[on] = packed[self.response_rows[on], self.response_cols[on]]
        return out


def pack(samples: SampleBatch, pad_id: int, row_multiple: int = 1, keep: np.ndarray = None) -> PackedRows:
    """`samples` packed into rows of their padded input width (P + R - 1), row count a multiple of
    `row_multiple` (at least one row). `keep` (N,) bool: the sequences to pack (default all); sequences
    with no response token are never packed (nothing of theirs is read)."""
    n, p = samples.prompt_ids.shape
    r = samples.response_ids.shape[1]
    width = p + r - 1
    prompt_len = samples.prompt_mask.sum(1).astype(np.int64)
    resp_len = samples.response_mask.sum(1).astype(np.int64)
    if not (samples.response_mask == (np.arange(r)[None] < resp_len[:, None])).all():
        raise ValueError("packing: response_mask must be 1 on a prefix of each response row")
    seg_len = np.where(resp_len > 0, prompt_len + resp_len - 1, 0)
    if keep is not None:
        seg_len = np.where(np.asarray(keep, bool), seg_len, 0)
    bins = first_fit_decreasing(seg_len, width)
    rows = max(1, -(-len(bins) // row_multiple) * row_multiple)
    ids = np.full((rows, width), pad_id, np.int32)
    labels = np.full((rows, width), pad_id, np.int32)
    pos = np.zeros((rows, width), np.int32)
    seg = np.full((rows, width), -1, np.int32)
    resp_rows = np.full((n, r), -1, np.int64)
    resp_cols = np.zeros((n, r), np.int64)
    seg_rows, seg_cols = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    for row, members in enumerate(bins):
        at = 0
        for i in members:
            tokens = np.concatenate([samples.prompt_ids[i][samples.prompt_mask[i] == 1],
                                     samples.response_ids[i][:resp_len[i]]])
            m = len(tokens) - 1
            ids[row, at:at + m] = tokens[:-1]
            labels[row, at:at + m] = tokens[1:]
            pos[row, at:at + m] = np.arange(m)
            seg[row, at:at + m] = i
            resp_rows[i, :resp_len[i]] = row
            resp_cols[i, :resp_len[i]] = at + prompt_len[i] - 1 + np.arange(resp_len[i])
            seg_rows[i], seg_cols[i] = row, at
            at += m
    return PackedRows(ids, pos, labels, seg, resp_rows, resp_cols, seg_rows, seg_cols, p - prompt_len)


def packed_logprobs(cell, samples: SampleBatch, pad_id: int, micro_rows: int, per_call: int,
                    routing: np.ndarray = None) -> np.ndarray:
    """(N, R) response log-probs of `samples` from a log-prob cell (update/one_graph.ResponseLogProb or
    update/pipelined.PipelineLogProb, built for the packed width) run on their packed rows, `per_call` rows per
    call (0: all at once, the pipelined cell cuts them into micro-batches itself); `routing` (N, P + R - 1,
    sparse layers, k): the experts to replay (router replay), packed as the tokens are."""
    packed = pack(samples, pad_id, micro_rows)
    routing = None if routing is None else packed.scatter_tokens(np.asarray(routing, np.int32))
    step = per_call or packed.rows
    out = []
    for start in range(0, packed.rows, step):
        t = packed.model_inputs(start, start + step)
        extra = () if routing is None else (Tensor(routing[start:start + step]),)
        out.append(cell(t["input_ids"], t["position_ids"], t["bias"], t["labels"], *extra).asnumpy())
    return packed.gather(np.concatenate(out))


def packed_step_inputs(batch: SampleBatch, loss_inputs: LossInputs, lr, pad_id: int, micro_rows: int) -> tuple:
    """samples.train_step_inputs for packed rows: the sequences with a token to train (loss_inputs.mask) or an aux
    gradient, packed into a multiple of `micro_rows` rows; the per-token values at their packed positions,
    advantages per token, the routing inputs per input token."""
    keep = np.asarray(loss_inputs.mask).any(1)
    if loss_inputs.router_grad is not None:         # a row with no trained token still takes the aux loss
        keep = keep | np.asarray(loss_inputs.router_grad).any((1, 2))
    packed = pack(batch, pad_id, micro_rows, keep=keep)
    return step_inputs(packed.model_inputs(), loss_inputs.per_row(packed.scatter, packed.scatter_tokens), lr)


class PackedRowLayout:
    """samples.PaddedRows for packed rows: log-prob passes and training steps on them."""

    def __init__(self, pad_id: int, micro_rows: int, pipelined: bool):
        self.pad_id, self.micro_rows = pad_id, micro_rows
        self.per_call = 0 if pipelined else micro_rows

    def logprobs(self, cell, samples: SampleBatch, routing=None) -> np.ndarray:
        if getattr(cell, "per_input_token", False):     # one_graph.ModelRouting: its output is per padded token
            return PaddedRows(self.micro_rows).logprobs(cell, samples, routing)
        return packed_logprobs(cell, samples, self.pad_id, self.micro_rows, self.per_call, routing)

    def step_inputs(self, batch: SampleBatch, loss_inputs: LossInputs, lr) -> tuple:
        return packed_step_inputs(batch, loss_inputs, lr, self.pad_id, self.micro_rows)
