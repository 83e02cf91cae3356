"""The readable rollout log (`rollout_log_file`): every sample of the run as a MindRecord, rewritten whole
(atomically) at each checkpoint, so after a crash it holds at least the rows of the last complete
checkpoint; resume keeps exactly the rows of the steps it resumes from."""
from __future__ import annotations

import os

import numpy as np

from mindrlhf.data.mindrecord_io import read_columns, write_mindrecord
from mindrlhf.trainer.samples import SampleBatch

SCHEMA = {"step": {"type": "int64"}, "prompt": {"type": "string"}, "response": {"type": "string"},
          "reward": {"type": "float32"}, "solution": {"type": "string"}}


class RolloutLog:
    def __init__(self, path: str):
        self.path = path
        self.rows = {k: [] for k in SCHEMA}

    def add(self, step: int, samples: SampleBatch, texts, rewards, solutions, tokenizer):
        if not self.path:
            return
        prompts = tokenizer.decode_batch([p[m == 1].tolist() for p, m in zip(samples.prompt_ids, samples.prompt_mask)],
                                         skip_special_tokens=False)
        for i, text in enumerate(texts):
            self.rows["step"].append(np.int64(step))
            self.rows["prompt"].append(prompts[i])
            self.rows["response"].append(text)
            self.rows["reward"].append(np.float32(rewards[i]))
            self.rows["solution"].append(solutions[samples.solution_index[i]])

    def flush(self):
        if self.path and self.rows["step"]:
            write_mindrecord(self.path, self.rows, SCHEMA)

    def restore(self, up_to_step: int):
        """Resume: the rows already written for steps <= up_to_step (later ones are trained again)."""
        if not (self.path and os.path.isfile(self.path)):
            return
        cols = read_columns(self.path, list(SCHEMA))
        keep = [i for i, s in enumerate(cols["step"]) if int(s) <= up_to_step]
        cast = {"step": lambda v: np.int64(int(v)), "reward": lambda v: np.float32(float(v))}
        self.rows = {k: [cast.get(k, str)(cols[k][i]) for i in keep] for k in SCHEMA}
