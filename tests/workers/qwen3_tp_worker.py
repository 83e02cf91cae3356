"""msrun worker: a tiny Qwen3 (q/k norms, head width 24) under TP=2, with and without sequence parallelism,
against TP=1 on the same weights: logits, the loss and every parameter's gradient, the gradients both op by op
and in one compiled graph (as the train step takes them: the q/k norms' TP sum inside a reused layer
subgraph came out wrong there only).

argv: hf_dir out_dir. Writes out_dir/rank_{r}.npz with what tests/test_qwen3_msrun.py compares.
"""
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from hf_reference import qwen3_model_kwargs  # noqa: E402
from model_helpers import load_ours, model_inputs, one_process_reference, token_loss_and_grads  # noqa: E402
from mindrlhf.configs import ModelConfig  # noqa: E402
from mindrlhf.parallel.mesh import Mesh, init_distributed  # noqa: E402


class CompiledGrads(nn.Cell):
    """The mean next-token NLL's gradients w.r.t. every parameter, in one compiled graph."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)           # the parameters keep their names
        self.model = model
        self.params = ms.ParameterTuple(model.get_parameters())
        self.grad = ms.ops.GradOperation(get_by_list=True)

    def loss(self, ids, pos, bias, labels):
        return -self.model.token_logprobs(ids, pos, bias, labels)[0].mean()

    @ms.jit
    def construct(self, ids, pos, bias, labels):
        return self.grad(self.loss, self.params)(ids, pos, bias, labels)


def compiled_grads(model, ids):
    grads = CompiledGrads(model)(*model_inputs(ids[:, :-1]), Tensor(ids[:, 1:].astype(np.int32)))
    return {p.name: g.asnumpy() for p, g in zip(model.get_parameters(), grads)}


def main():
    hf_dir, out_dir = sys.argv[1], sys.argv[2]
    rank, world = init_distributed()
    assert world == 2, world
    cfg = ModelConfig(**qwen3_model_kwargs())
    ids = np.random.RandomState(7).randint(0, 160, (4, 12))
    names, result = one_process_reference(hf_dir, cfg, ids)
    for tag, sp in (("tp", False), ("sp", True)):
        model = load_ours(hf_dir, cfg, Mesh(dp=1, tp=2, rank=rank, seq_parallel=sp))
        result[tag + "_logits"] = model.full_logits(*model_inputs(ids)).asnumpy()
        result[tag + "_loss"], grads = token_loss_and_grads(model, ids, names)
        result.update({f"{tag}_grad/{n}": g for n, g in grads.items()})
        result.update({f"{tag}_jitgrad/{n}": g for n, g in compiled_grads(model, ids).items()})
    np.savez(os.path.join(out_dir, f"rank_{rank}.npz"), **result)


if __name__ == "__main__":
    main()
