"""Completions of held-out prompts, decoded and scored: one path for the trainer's in-training eval
(GRPOTrainer.evaluate) and the eval command (mindrlhf/eval.py). Sharing it is what makes the command's greedy
accuracy on the trainer's weights and prompts the trainer's exactly: the same prompts per replica, generate
calls of the same rows, the same decoding and scores, the same division.

Prompt p of an eval set is sampled with key (p,) (rollout/sampling.row_uniforms): its samples are the same
whichever replica generates it and in whichever chunk, and at every eval of a run (the same random numbers each
time, so two evals differ by the weights only); greedy decoding draws nothing.

A completion is correct when its score is at least CORRECT_SCORE (accuracy_reward's 1.0 for a right answer);
pass@k is the unbiased estimator of Chen et al. 2021 (1 - C(n-c, k) / C(n, k) per prompt, averaged).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from mindrlhf.reward.custom_function import references
from mindrlhf.reward.verifiers import accuracy_reward, score_each
from mindrlhf.rollout.sampling import SamplingParams

# (completions, solutions, each completion's episode tool calls) -> one score each
Scorer = Callable[[List[str], List[str], Sequence[int]], Sequence[float]]
CORRECT_SCORE = 1.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k completions drawn without replacement from n, c of them correct,
    is correct: 1 - C(n-c, k) / C(n, k), as the product 1 - prod_{i=n-c+1..n} (1 - k / i) (no huge
    binomials)."""
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_ks(n: int) -> List[int]:
    """The k reported for n completions per prompt: the powers of two below n, and n."""
    return [k for k in (2 ** i for i in range(n.bit_length())) if k < n] + [n]


def replica_prompts(count: int, replicas: int, replica: int) -> np.ndarray:
    """The rows of the first `count` prompts that replica `replica` of `replicas` generates: every
    replicas-th from its own index (r::replicas), so the shares differ by at most one prompt."""
    return np.arange(count)[replica::replicas]


def accuracy_scores(time_limit: float) -> Scorer:
    """accuracy_reward per completion (0 where it raised or overran `time_limit`): the trainer's eval score."""
    return lambda texts, solutions, tool_calls: [v or 0.0 for v in score_each(accuracy_reward, texts, solutions,
                                                                             time_limit)]


def share(part: float, whole: float) -> float:
    """part / whole of counts (exact integers, also after a float32 all-reduce), 0 for an empty whole."""
    return float(part) / max(float(whole), 1.0)


def tallies(scores: np.ndarray, n: int) -> List[float]:
    """What a replica adds to a run's eval metrics, from its completions' scores in (prompt, sample) order: [sum
    of scores, completions, prompts with a correct completion, prompts]: sums, so replicas all-reduce them."""
    correct = (np.asarray(scores).reshape(-1, n) >= CORRECT_SCORE).any(1)
    return [float(np.sum(scores)), float(len(scores)), float(correct.sum()), float(len(correct))]


def eval_metrics(totals: Sequence[float], n: int) -> Dict[str, float]:
    """The trainer's eval metrics from tallies summed over the replicas: eval_accuracy, the mean score of every
    completion (greedy: the share answered right; sampled: verl's mean@n), and with n > 1 eval_pass@n, the share
    of prompts with at least one correct completion."""
    score_sum, completions, solved, prompts = totals
    out = {"eval_accuracy": share(score_sum, completions)}
    if n > 1:
        out[f"eval_pass@{n}"] = share(solved, prompts)
    return out


@dataclass
class Completions:
    """params.n completions per prompt; completion j of the i-th prompt given is row i * n + j."""
    prompt_index: np.ndarray       # (N,) int64: the prompt's row in the eval table
    response_ids: np.ndarray       # (N, max_tokens) int64, right-padded
    lengths: np.ndarray            # (N,) int64: generated tokens (EOS included)
    finished: np.ndarray           # (N,) int64: 1 ended with EOS ("stop"), 0 reached max_tokens ("length")
    texts: List[str]
    scores: np.ndarray             # (N,) float64
    tool_calls: np.ndarray         # (N,) int64: the episode's tool calls (0 single-turn)


def complete(engine, tokenizer, table: Dict[str, np.ndarray], idx: np.ndarray, params: SamplingParams, rows: int,
             score: Scorer, generating: Callable = contextlib.nullcontext,
             after_chunk: Optional[Callable[[int], None]] = None) -> Completions:
    """params.n completions of the prompts `idx` of `table` (prompt_ids, prompt_length, solution), generated
    rows // n prompts per engine call (the trainer passes its rollout's rows, whose decode graphs are compiled
    already), each chunk decoded and scored with `score` as it comes. `generating()` wraps each generate call
    (the trainer's swap schedule); `after_chunk(prompts done)` is called after each chunk (progress)."""
    prompts = [table["prompt_ids"][i][:table["prompt_length"][i]].tolist() for i in idx]
    per_call = max(1, rows // params.n)
    ids, lengths, finished, texts, scores, calls = [], [], [], [], [], []
    for start in range(0, len(prompts), per_call):
        chunk = idx[start:start + per_call]
        with generating():
            out = engine.generate(prompts[start:start + per_call], params, [(int(i),) for i in chunk])
        chunk_texts = tokenizer.decode_batch([r[m == 1].tolist() for r, m in zip(out.response_ids,
                                                                                 out.response_mask)])
        scores += [float(s) for s in score(chunk_texts, references(table, chunk[out.prompt_index]),
                                           out.tool_calls)]
        calls.append(out.tool_calls)
        ids.append(out.response_ids)
        lengths.append(out.response_lengths)
        finished += [r == "stop" for r in out.finish_reason]
        texts += chunk_texts
        if after_chunk is not None:
            after_chunk(min(start + per_call, len(prompts)))
    if getattr(engine, "tools", None) is not None:      # multi-turn: an evaluation's calls are not a step's
        engine.tools.runner.metrics(reset=True)
    width = params.max_tokens
    return Completions(np.repeat(np.asarray(idx, np.int64), params.n),
                       np.concatenate(ids).astype(np.int64) if ids else np.zeros((0, width), np.int64),
                       np.concatenate(lengths).astype(np.int64) if lengths else np.zeros(0, np.int64),
                       np.array(finished, np.int64), texts, np.array(scores, np.float64),
                       np.concatenate(calls).astype(np.int64) if calls else np.zeros(0, np.int64))
