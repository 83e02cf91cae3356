"""msrun worker: a tiny Qwen3-MoE (one dense layer, one sparse; 4 experts, top-2) with its experts split over
an `ep` axis of 2 ranks, against one process on the same weights: logits, the loss and every parameter's
gradient (op by op and in one compiled graph, as the train step takes them).

argv: hf_dir out_dir. Writes out_dir/rank_{r}.npz with what tests/test_qwen3_moe_ep.py compares.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from hf_reference import qwen3_moe_model_kwargs  # noqa: E402
from model_helpers import load_ours, model_inputs, one_process_reference, token_loss_and_grads  # noqa: E402
from qwen3_tp_worker import compiled_grads  # noqa: E402
from mindrlhf.configs import ModelConfig  # noqa: E402
from mindrlhf.parallel.mesh import Mesh, init_distributed  # noqa: E402


def main():
    hf_dir, out_dir = sys.argv[1], sys.argv[2]
    rank, world = init_distributed()
    assert world == 2, world
    cfg = ModelConfig(**qwen3_moe_model_kwargs(mlp_only=(0,)))
    ids = np.random.RandomState(7).randint(0, 160, (4, 12))
    names, result = one_process_reference(hf_dir, cfg, ids)
    model = load_ours(hf_dir, cfg, Mesh(dp=1, tp=1, rank=rank, extra_axes=(("ep", 2),)))
    result["shapes"] = np.array([str((p.name, tuple(p.shape))) for p in model.get_parameters()])
    result["ep_logits"] = model.full_logits(*model_inputs(ids)).asnumpy()
    result["ep_loss"], grads = token_loss_and_grads(model, ids, names)
    result.update({"ep_grad/" + n: g for n, g in grads.items()})
    result.update({"ep_jitgrad/" + n: g for n, g in compiled_grads(model, ids).items()})
    np.savez(os.path.join(out_dir, f"rank_{rank}.npz"), **result)


if __name__ == "__main__":
    main()
