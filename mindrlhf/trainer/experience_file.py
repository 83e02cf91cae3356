"""`save_data_file`: the step's experience in MindRLHF's `save_grpoelement` schema, so upstream tooling
(its `init_grpo_dataset`, MindSpore's MindDataset) reads it. One row per sample, over the whole sequence
[left-padded prompt (P) | right-padded response (R)]:

    prompt_completion_ids  int32   [P + R]
    prompts_mask           int32   [P + R]   1 on prompt tokens
    responses_mask         int32   [P + R]   1 on the response tokens the loss sees (0 for groups that
                                   dynamic sampling masked out and, with mask_truncated_completions,
                                   for truncated completions: upstream trains with this mask)
    ref_per_token_logps    float32 [P + R - 1]  log-prob of token t + 1 under the reference (0 off the
                                   response, and everywhere when beta = 0: there is no reference model)
    advantages             float32 [1]

Written by rank 0 after every step's update, replaced atomically (as upstream, only the last step's).
"""
from __future__ import annotations

import numpy as np

from mindrlhf.data.mindrecord_io import write_mindrecord
from mindrlhf.trainer import exchange
from mindrlhf.trainer.samples import SampleBatch

SCHEMA = {"prompt_completion_ids": {"type": "int32", "shape": [-1]},
          "prompts_mask": {"type": "int32", "shape": [-1]},
          "responses_mask": {"type": "int32", "shape": [-1]},
          "ref_per_token_logps": {"type": "float32", "shape": [-1]},
          "advantages": {"type": "float32", "shape": [-1]}}


def experience_columns(samples: SampleBatch, train_mask: np.ndarray, ref_logp: np.ndarray, advantages: np.ndarray):
    n, p = samples.prompt_ids.shape
    r = samples.response_ids.shape[1]
    ref = np.zeros((n, p + r - 1), np.float32)
    ref[:, p - 1:] = ref_logp * train_mask        # response token k is predicted at position p - 1 + k
    zeros_p, zeros_r = np.zeros((n, p), np.int32), np.zeros((n, r), np.int32)
    return {"prompt_completion_ids": np.concatenate([samples.prompt_ids, samples.response_ids], 1).astype(np.int32),
            "prompts_mask": np.concatenate([samples.prompt_mask.astype(np.int32), zeros_r], 1),
            "responses_mask": np.concatenate([zeros_p, np.asarray(train_mask, np.int32)], 1),
            "ref_per_token_logps": ref,
            "advantages": np.asarray(advantages, np.float32).reshape(n, 1)}


def write_experience(path: str, samples: SampleBatch, train_mask: np.ndarray, ref_logp: np.ndarray,
                     advantages: np.ndarray):
    write_mindrecord(path, experience_columns(samples, train_mask, ref_logp, advantages), SCHEMA, index_fields=[])


def write_step_experience(path: str, writer: bool, mesh, samples: SampleBatch, train_mask: np.ndarray, mine,
                          ref_logp: np.ndarray, advantages: np.ndarray):
    """The step's file from every train replica's reference log-probs (this one holds rows `mine`), assembled
    on every rank and written by `writer` (rank 0)."""
    full_ref = exchange.rows_of_all_replicas(ref_logp, mine, len(samples), mesh)
    if writer:
        write_experience(path, samples, train_mask, full_ref, advantages)
