"""Sampling parameters and the logits processors, on host numpy (float64 for stable log-softmax).

On the host because there it is faster on CPU: the default path (temperature, EOS suppression, inverse-CDF
draw, log-prob) written as a MindSpore 2.10 jit graph draws the same tokens several times slower
(benchmarks/bench_device_sampling.py; docs/BENCHMARKS.md, "Measurements behind code choices"). On Ascend, where the logits would not have to leave the
device, that is unmeasured.

Order follows vLLM/HF: repetition penalty -> min_tokens (EOS suppressed) -> temperature -> top-k -> top-p ->
min-p.

Log-prob convention (one for rollout, old, current and reference log-probs alike, as TRL and verl use it):
the log-prob of a token is log softmax(logits / T) over the whole vocabulary (T = 1 when greedy). Top-k,
top-p, min-p, the repetition penalty and min_tokens shape which token is drawn, not the log-prob the loss
and the KL see, so the training passes need only the temperature (`SamplingParams.logprob_temperature`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np

from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.grpo_config import SamplingConfig


@dataclass
class SamplingParams(SamplingConfig):
    """The GRPO config's sampling section (fields, defaults and checks defined once, in SamplingConfig)
    plus what a generate call adds."""
    n: int = 1                        # samples per prompt (GRPO num_generations)
    eos_token_ids: List[int] = field(default_factory=list)
    seed: int = 0

    def validate(self, where: str = ""):
        super().validate(where)
        if self.n <= 0:
            raise ConfigError(f"{where}n: expected > 0, got {self.n}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def logprob_temperature(self) -> float:
        """The T of the log-prob convention above: the sampling temperature, 1 when it is 0 (greedy)."""
        return self.temperature if self.temperature > 0 else 1.0

    def reshapes_distribution(self, suppress_eos: bool) -> bool:
        """True when the sampled distribution differs from softmax(logits / T) (filters, penalties)."""
        return (self.greedy or 0 < self.top_k or self.top_p < 1.0 or self.min_p > 0
                or self.repetition_penalty != 1.0 or (suppress_eos and bool(self.eos_token_ids)))


def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """logits (N, V); seen (N, V) bool: tokens in the prompt or generated so far."""
    if penalty == 1.0:
        return logits
    penalised = np.where(logits > 0, logits / penalty, logits * penalty)
    return np.where(seen, penalised, logits)


def process_logits(logits: np.ndarray, params: SamplingParams, seen: Optional[np.ndarray],
                   suppress_eos: bool) -> np.ndarray:
    """Raw logits (N, V) -> the log-space scores actually sampled from (-inf where filtered)."""
    x = logits.astype(np.float32, copy=False)         # the caller's array until something must change
    if seen is not None:
        x = apply_repetition_penalty(x, seen, params.repetition_penalty)
    if suppress_eos and params.eos_token_ids:
        x = x.copy() if x is logits else x
        x[:, params.eos_token_ids] = -np.inf
    if params.greedy:
        return x
    if params.temperature != 1.0:                     # x / 1 is x: no 16 x vocabulary copy per decode step
        x = x / params.temperature
    v = x.shape[-1]
    if 0 < params.top_k < v:
        kth = np.partition(x, v - params.top_k, axis=-1)[:, v - params.top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    if params.top_p < 1.0:
        order = np.argsort(-x, axis=-1)
        sorted_x = np.take_along_axis(x, order, -1)
        probs = _softmax(sorted_x)
        cum = np.cumsum(probs, -1)
        drop_sorted = (cum - probs) >= params.top_p          # keep the smallest prefix reaching top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, -1)
        x = np.where(drop, -np.inf, x)
    if params.min_p > 0:
        probs = _softmax(x)
        x = np.where(probs < params.min_p * probs.max(-1, keepdims=True), -np.inf, x)
    return x


def token_logprobs(logits: np.ndarray, tokens: np.ndarray, temperature: float) -> np.ndarray:
    """log softmax(logits / temperature)[token] per row (the log-prob convention), float64 normaliser."""
    x = logits.astype(np.float32) / np.float32(temperature)
    m = x.max(-1, keepdims=True)
    log_z = np.log(np.exp(x - m).sum(-1, dtype=np.float64))
    rows = np.arange(x.shape[0])
    return ((x[rows, tokens] - m[:, 0]) - log_z).astype(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, -1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(-1, keepdims=True)


def row_uniforms(seed: int, keys: Sequence[Sequence[int]], n: int, steps: int) -> np.ndarray:
    """(len(keys) * n, steps) uniforms in [0, 1): row i*n + j draws from a stream keyed by (seed, *keys[i], j).

    Keying by what a sample *is* (in GRPO: step, prompt, sample) rather than by which rank draws it makes
    the completions independent of the parallel layout, and TP peers of a replica draw identically."""
    return np.stack([np.random.default_rng([seed, *(int(k) for k in key), j]).random(steps)
                     for key in keys for j in range(n)])


def sample(scores: np.ndarray, params: SamplingParams, u: np.ndarray):
    """scores (N, V) from process_logits, u (N,) uniforms -> (tokens (N,), logprobs (N,)).

    One exp over the vocabulary, then inverse-CDF sampling on the unnormalised weights; the log-normaliser
    is accumulated in float64, so the sampled token's logprob is exact to float32.
    """
    rows = np.arange(scores.shape[0])
    top = scores.max(-1, keepdims=True)
    weights = scores - top                                            # -inf stays -inf
    np.exp(weights, out=weights)
    log_z = np.log(weights.sum(-1, dtype=np.float64))
    if params.greedy:
        tokens = np.argmax(scores, -1)      # greedy: report the model's own (penalised) distribution
    else:
        tokens = np.minimum(inverse_cdf(weights, u), scores.shape[1] - 1)
        tokens = np.where(weights[rows, tokens] > 0, tokens, np.argmax(scores, -1))
    return tokens.astype(np.int64), ((scores[rows, tokens] - top[:, 0]) - log_z).astype(np.float32)


def inverse_cdf(weights: np.ndarray, u: np.ndarray, block: int = 256) -> np.ndarray:
    """For each row, the first index whose cumulative weight exceeds u * total (u in [0, 1)).

    Two levels: cumulative sums over blocks of `block` weights, then within the one chosen block. A full
    cumulative sum plus a compare over the vocabulary was most of the host time of a decode step. Indices past the vocabulary (padding) can come back only by rounding; the
    caller clamps them.
    """
    n, v = weights.shape
    rows = np.arange(n)
    pad = (-v) % block
    padded = np.pad(weights, ((0, 0), (0, pad))) if pad else weights
    blocks = padded.reshape(n, -1, block)
    block_sums = blocks.sum(-1)
    block_cdf = np.cumsum(block_sums, -1)
    target = u * block_cdf[:, -1]
    b = np.minimum((block_cdf <= target[:, None]).sum(-1), block_cdf.shape[1] - 1)
    inner = np.cumsum(blocks[rows, b], -1) + (block_cdf[rows, b] - block_sums[rows, b])[:, None]
    k = np.minimum((inner <= target[:, None]).sum(-1), block - 1)
    return b * block + k
