"""What the entropy bonus (rl.entropy_coeff) costs: the LM head's log-prob forward + backward with the entropy's
gradient on (models/tp_layers.HeadLogProb, entropy_grad) against the same head with the entropy a metric, in one
process, alternating.

    python benchmarks/bench_entropy_bonus.py [--rounds 6]
    python benchmarks/bench_entropy_bonus.py --quick      # small shapes, one round: checks that the script runs

Shapes: 2048 tokens (8 x 256, bench_train_step's), hidden 512, the 32000-word vocabulary: the head is where the
bonus's cost lies (four vocabulary-sized passes in the backward; the rest of the model is unchanged). Kernel
threads as the trainer sets them (common.ours_kernel_threads).

Last line: {"bench": "entropy_bonus", "cpu", "head_fwd_bwd_s": {"off", "on"}, "ratio_on_over_off"} (medians).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_floors import cpu_info  # noqa: E402
from common import BENCH_MODEL, ours_kernel_threads  # noqa: E402


def head_step(entropy_grad: bool, coeff: float, weight):
    """value_and_grad of mean(-log p(label)) - coeff x mean(entropy) with respect to the head weight."""
    import mindspore as ms
    from mindspore import nn
    from mindrlhf.models.tp_layers import HeadLogProb
    head = HeadLogProb()
    head.entropy_grad = entropy_grad

    class Loss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.head, self.weight = head, weight

        def construct(self, hidden, labels):
            logp, entropy, _ = self.head(hidden, self.weight, labels)
            return -logp.mean() - coeff * entropy.mean()
    return ms.value_and_grad(Loss(), 0, [weight])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    import mindspore as ms
    from mindspore import Parameter, Tensor
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ours_kernel_threads()
    tokens, hidden, vocab = (64, 32, 512) if args.quick else (8 * 256, BENCH_MODEL["hidden_size"],
                                                               BENCH_MODEL["vocab_size"])
    rs = np.random.RandomState(0)
    h = Tensor(rs.randn(tokens, hidden).astype(np.float32) * 0.5)
    labels = Tensor(rs.randint(0, vocab, tokens).astype(np.int32))
    weight = Parameter(Tensor(rs.randn(vocab, hidden).astype(np.float32) * 0.02), name="w")
    steps = {"off": head_step(False, 0.0, weight), "on": head_step(True, 0.01, weight)}
    for step in steps.values():                 # compile
        step(h, labels)[0].asnumpy()
    times = {k: [] for k in steps}
    for _ in range(1 if args.quick else args.rounds):
        for name, step in steps.items():
            t = time.perf_counter()
            step(h, labels)[0].asnumpy()
            times[name].append(time.perf_counter() - t)
    med = {k: float(np.median(v)) for k, v in times.items()}
    cpu = cpu_info()
    print(f"head fwd + bwd, {tokens} tokens x vocab {vocab}: entropy a metric {med['off']:.3f} s, with its gradient "
          f"{med['on']:.3f} s ({med['on'] / med['off']:.2f}x)")
    print(json.dumps({"bench": "entropy_bonus", "cpu": f"{cpu['model_name']} ({cpu['family']}/{cpu['model']})",
                      "head_fwd_bwd_s": {k: round(v, 4) for k, v in med.items()},
                      "ratio_on_over_off": round(med["on"] / med["off"], 3), "quick": args.quick}))


if __name__ == "__main__":
    main()
