"""The readable rollout log (`rollout_log_file`): every sample of the run as a MindRecord (an episode also turn
by turn: `turns` holds each turn's span, kind and text, which is its loss mask, and `tool_calls` its call
count). Each checkpoint appends the rows since the previous one (atomically and fsynced, before the step is marked complete) and
forgets them, so memory holds one checkpoint interval of rows however long the run; after a crash the file
holds at least the rows of the last complete checkpoint. Resume cuts it back to the rows of the steps it
resumes from, so a resumed run's log equals an uninterrupted run's."""
from __future__ import annotations

import json
import os

import numpy as np

from mindrlhf.data.mindrecord_io import WRITE_BATCH_ROWS, MindRecordWriter, iter_chunks, iter_rows
from mindrlhf.trainer.samples import SampleBatch

SCHEMA = {"step": {"type": "int64"}, "prompt": {"type": "string"}, "response": {"type": "string"},
          "reward": {"type": "float32"}, "solution": {"type": "string"}, "turns": {"type": "string"},
          "tool_calls": {"type": "int64"}}
# MindRecord's default indexes every field: the texts twice on disk, and re-indexed at each append
INDEX_FIELDS = ["step"]
_CAST = {"step": lambda v: np.int64(int(v)), "reward": lambda v: np.float32(float(v)),
         "tool_calls": lambda v: np.int64(int(v))}


def turn_spans(present: np.ndarray, trained: np.ndarray):
    """[(start, end, "model" | "tool")] of a response: runs of trained tokens (the model's) and of present,
    untrained ones (tool results and template tokens). The loss mask is these spans."""
    spans, start = [], 0
    n = int(present.sum())
    for k in range(1, n + 1):
        if k == n or trained[k] != trained[start]:
            spans.append((start, k, "model" if trained[start] else "tool"))
            start = k
    return spans


def turns_json(samples, tokenizer) -> list:
    """Per row, the episode turn by turn as JSON: [{"kind", "start", "end", "text"}] (special tokens kept);
    "[]" for rows without response masks (a log fed by hand)."""
    if getattr(samples, "loss_mask", None) is None:
        return ["[]"] * len(samples.prompt_ids)
    spans = [turn_spans(p, t) for p, t in zip(samples.response_mask, samples.loss_mask)]
    flat = [(i, a, b, kind) for i, row in enumerate(spans) for a, b, kind in row]
    texts = tokenizer.decode_batch([samples.response_ids[i][a:b].tolist() for i, a, b, _ in flat],
                                   skip_special_tokens=False) if flat else []
    rows = [[] for _ in spans]
    for (i, a, b, kind), text in zip(flat, texts):
        rows[i].append({"kind": kind, "start": a, "end": b, "text": text})
    return [json.dumps(r, ensure_ascii=False) for r in rows]


class RolloutLog:
    def __init__(self, path: str):
        self.path = path
        self.rows = {k: [] for k in SCHEMA}     # the rows since the last flush
        self._append = False                    # the file on disk is this run's (a resumed one): add after it

    def add(self, step: int, samples: SampleBatch, texts, rewards, solutions, tokenizer):
        if not self.path:
            return
        prompts = tokenizer.decode_batch([p[m == 1].tolist() for p, m in zip(samples.prompt_ids, samples.prompt_mask)],
                                         skip_special_tokens=False)
        turns = turns_json(samples, tokenizer)
        calls = getattr(samples, "tool_calls", None)
        for i, text in enumerate(texts):
            self.rows["step"].append(np.int64(step))
            self.rows["prompt"].append(prompts[i])
            self.rows["response"].append(text)
            self.rows["reward"].append(np.float32(rewards[i]))
            self.rows["solution"].append(str(solutions[samples.solution_index[i]]))
            self.rows["turns"].append(turns[i])
            self.rows["tool_calls"].append(np.int64(0 if calls is None else calls[i]))

    def flush(self):
        """Append the rows since the last flush; a run's first flush replaces an earlier run's file."""
        if not (self.path and self.rows["step"]):
            return
        with MindRecordWriter(self.path, SCHEMA, INDEX_FIELDS, append=self._append) as out:
            out.write(self.rows)
            out.commit()
        self._append = True
        self.rows = {k: [] for k in SCHEMA}

    def restore(self, up_to_step: int):
        """Resume: keep the file's rows of steps <= up_to_step (later ones are trained again), copied through
        a chunk at a time when some must go, and append after them."""
        if not (self.path and os.path.isfile(self.path)):
            return
        if max((int(row["step"]) for row in iter_rows(self.path, ["step"])), default=0) <= up_to_step:
            self._append = True
            return
        kept = 0
        with MindRecordWriter(self.path, SCHEMA, INDEX_FIELDS) as out:
            for part in iter_chunks(self.path, list(SCHEMA), WRITE_BATCH_ROWS):
                mine = [i for i, s in enumerate(part["step"]) if int(s) <= up_to_step]
                if mine:
                    out.write({k: [_CAST.get(k, str)(part[k][i]) for i in mine] for k in SCHEMA})
                    kept += len(mine)
            if kept:
                out.commit()
        if not kept:                            # nothing of this run's resumed steps: the next flush starts anew
            os.remove(self.path)
            os.remove(self.path + ".db")
        self._append = bool(kept)
