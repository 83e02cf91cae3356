"""msrun worker: a tiny Qwen3 (q/k norms, head width 24) under TP=2, with and without sequence parallelism,
against TP=1 on the same weights: logits, the loss and every parameter's gradient.

argv: hf_dir out_dir. Writes out_dir/rank_{r}.npz with what tests/test_qwen3_msrun.py compares.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from hf_reference import qwen3_model_kwargs  # noqa: E402
from model_helpers import load_ours, model_inputs, token_loss_and_grads  # noqa: E402
from mindrlhf.configs import ModelConfig  # noqa: E402
from mindrlhf.parallel.mesh import Mesh, init_distributed  # noqa: E402


def main():
    hf_dir, out_dir = sys.argv[1], sys.argv[2]
    rank, world = init_distributed()
    assert world == 2, world
    cfg = ModelConfig(**qwen3_model_kwargs())
    ids = np.random.RandomState(7).randint(0, 160, (4, 12))
    single = load_ours(hf_dir, cfg)
    names = [p.name for p in single.get_parameters()]
    result = {"ref_logits": single.full_logits(*model_inputs(ids)).asnumpy()}
    result["ref_loss"], grads = token_loss_and_grads(single, ids, names)
    result.update({"ref_grad/" + n: g for n, g in grads.items()})
    for tag, sp in (("tp", False), ("sp", True)):
        model = load_ours(hf_dir, cfg, Mesh(dp=1, tp=2, rank=rank, seq_parallel=sp))
        result[tag + "_logits"] = model.full_logits(*model_inputs(ids)).asnumpy()
        result[tag + "_loss"], grads = token_loss_and_grads(model, ids, names)
        result.update({f"{tag}_grad/{n}": g for n, g in grads.items()})
    np.savez(os.path.join(out_dir, f"rank_{rank}.npz"), **result)


if __name__ == "__main__":
    main()
