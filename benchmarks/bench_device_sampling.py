"""Why the rollout samples on the host: the GRPO default draw (temperature, EOS suppressed, inverse CDF over
the vocabulary, log-prob under softmax(logits / T)) by the host numpy sampler (rollout/sampling.py, what
mindrlhf runs) against the same computation written as a MindSpore jit graph on CPU, on the same logits and
uniforms, in one process. Shapes: a GRPO decode step of the small bench_vs_trl setup (64 rows x 318) and of
bench_rollout's model (16 rows x 32000).

Prints per shape how many tokens agree, the largest log-prob difference and both times (best of 5 x 100
calls, graph times include its call), and last {"bench": "device_sampling", "ours": host ms, "reference":
graph ms, "ratio": graph / host} for the 32000 vocabulary (ratio > 1: the host is faster).
"""
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ours_kernel_threads  # noqa: E402  (importing common puts the repository on sys.path)

SHAPES = ((64, 318), (16, 32000))
EOS = 0


def graph_sampler():
    import mindspore as ms
    from mindspore import nn, ops
    from mindrlhf.models.graph_ops import expand_as, sum_last, take
    row_max = ops.ReduceMax(keep_dims=True)

    class Sample(nn.Cell):
        @ms.jit
        def construct(self, logits, u, eos_bias):
            rows, v = logits.shape
            scores = logits + expand_as(eos_bias, logits)
            weights = ops.exp(scores - expand_as(row_max(scores, -1), scores))
            cdf = ops.cumsum(weights, 1)
            target = ops.reshape(u, (rows, 1)) * take(cdf, 1, v - 1, v)        # the row totals
            token = ops.cast(sum_last(ops.cast(cdf <= expand_as(target, cdf), ms.float32)), ms.int32)
            token = ops.minimum(token, v - 1)
            fallback = ops.reshape(ops.argmax(scores, -1), (rows, 1)).astype(ms.int32)
            token = ops.select(ops.gather_elements(weights, 1, token) > 0, token, fallback)
            top = row_max(logits, -1)
            log_z = ops.log(sum_last(ops.exp(logits - expand_as(top, logits))))
            logp = ops.gather_elements(logits, 1, token) - top - log_z
            return ops.reshape(token, (rows,)), ops.reshape(logp, (rows,))

    return Sample()


def best_ms(fn, calls=100, repeats=5):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls * 1e3)
    return best


def main():
    ours_kernel_threads()
    from mindspore import Tensor
    from mindrlhf.rollout.sampling import SamplingParams, process_logits, sample, token_logprobs
    params = SamplingParams(n=1, temperature=1.0, max_tokens=2, min_tokens=2, eos_token_ids=[EOS])
    graph = graph_sampler()
    result = {}
    for rows, vocab in SHAPES:
        rng = np.random.default_rng(0)
        logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
        u = rng.random(rows)
        eos_bias = np.zeros((1, vocab), np.float32)
        eos_bias[0, EOS] = -np.inf

        def host():
            tokens, _ = sample(process_logits(logits, params, None, suppress_eos=True), params, u)
            return tokens, token_logprobs(logits, tokens, params.temperature)

        def device():
            tokens, logp = graph(Tensor(logits), Tensor(u.astype(np.float32)), Tensor(eos_bias))
            return tokens.asnumpy(), logp.asnumpy()

        (ht, hl), (gt, gl) = host(), device()
        host_ms, graph_ms = best_ms(host), best_ms(device)
        print(f"{rows} x {vocab}: tokens equal {np.mean(ht == gt):.3f}, max |log-prob diff| "
              f"{np.abs(hl - gl).max():.1e}; host numpy {host_ms:.3f} ms, MindSpore graph {graph_ms:.3f} ms")
        result = {"bench": "device_sampling", "ours": round(host_ms, 3), "reference": round(graph_ms, 3),
                  "unit": "ms", "ratio": round(graph_ms / host_ms, 3), "shape": [rows, vocab]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
