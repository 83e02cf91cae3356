"""msrun worker: TP=2 and DP=2 against TP=1 on the same weights, and each TP region's backward.

argv: hf_dir out_dir. Writes out_dir/rank_{r}.npz with what the test compares.
"""
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from hf_reference import tiny_model_kwargs  # noqa: E402
from model_helpers import load_ours, model_inputs, token_loss_and_grads  # noqa: E402
from mindrlhf.configs import ModelConfig  # noqa: E402
from mindrlhf.models import tp_regions  # noqa: E402
from mindrlhf.parallel.grad_sync import DPGradMean  # noqa: E402
from mindrlhf.parallel.mesh import Mesh, init_distributed  # noqa: E402

NAMES = ["model.layers.0.attention.wq.weight", "model.layers.0.attention.wq.bias",
         "model.layers.1.attention.wo.weight", "model.layers.0.feed_forward.w1.weight",
         "model.layers.1.feed_forward.w2.weight", "model.layers.0.attention_norm.weight",
         "model.tok_embeddings.embedding_weight", "model.norm_out.weight"]


def region_grads(mesh):
    """Gradients through each region with a rank-dependent downstream weight, to check bprop rules."""
    r = mesh.tp_index
    x = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4))
    w = Tensor(np.full((2, 4), r + 1.0, np.float32))
    out = {}
    copy, reduce_ = tp_regions.copy_to_tp(mesh), tp_regions.reduce_from_tp(mesh)
    gather, scatter = tp_regions.gather_from_tp(mesh), tp_regions.scatter_to_tp(mesh)
    out["copy_fwd"] = copy(x).asnumpy()
    out["copy_bwd"] = ms.grad(lambda a: (copy(a) * w).sum())(x).asnumpy()
    out["reduce_fwd"] = reduce_(x * (r + 1)).asnumpy()
    out["reduce_bwd"] = ms.grad(lambda a: (reduce_(a) * w).sum())(x).asnumpy()
    wg = Tensor(np.arange(16, dtype=np.float32).reshape(2, 8))
    out["gather_fwd"] = gather(x + 10 * r).asnumpy()
    out["gather_bwd"] = ms.grad(lambda a: (gather(a) * wg).sum())(x).asnumpy()
    xs = Tensor(np.arange(16, dtype=np.float32).reshape(2, 8))
    out["scatter_fwd"] = scatter(xs).asnumpy()
    out["scatter_bwd"] = ms.grad(lambda a: (scatter(a) * w).sum())(xs).asnumpy()
    return out


def main():
    hf_dir, out_dir = sys.argv[1], sys.argv[2]
    rank, world = init_distributed()
    assert world == 2, world
    cfg = ModelConfig(**tiny_model_kwargs(True, False, 2))
    ids = np.random.RandomState(7).randint(0, 160, (4, 12))
    result = {}

    # Reference: TP=1, whole batch, on every rank.
    single = load_ours(hf_dir, cfg)
    result["ref_logits"] = single.full_logits(*model_inputs(ids)).asnumpy()
    result["ref_loss"], ref_grads = token_loss_and_grads(single, ids, NAMES)

    # TP=2.
    tp_mesh = Mesh(dp=1, tp=2, rank=rank)
    tp_model = load_ours(hf_dir, cfg, tp_mesh)
    result["tp_logits"] = tp_model.full_logits(*model_inputs(ids)).asnumpy()
    lp, _ = tp_model.token_logprobs(*model_inputs(ids[:, :-1]), Tensor(ids[:, 1:].astype(np.int32)))
    result["tp_logprob"] = lp.asnumpy()
    result["tp_loss"], tp_grads = token_loss_and_grads(tp_model, ids, NAMES)
    # an entropy bonus: the vocabulary-parallel entropy's autodiff against the whole head's written-out backward
    ent_model, ent_tp_model = load_ours(hf_dir, cfg), load_ours(hf_dir, cfg, tp_mesh)
    result["ref_ent_loss"], ref_ent = token_loss_and_grads(ent_model, ids, NAMES, entropy_coeff=0.3)
    result["tp_ent_loss"], tp_ent = token_loss_and_grads(ent_tp_model, ids, NAMES, entropy_coeff=0.3)

    # DP=2: each rank its half of the batch, gradients averaged over the DP group.
    dp_mesh = Mesh(dp=2, tp=1, rank=rank)
    dp_model = load_ours(hf_dir, cfg, dp_mesh)
    half = ids[2 * rank: 2 * rank + 2]
    _, dp_grads = token_loss_and_grads(dp_model, half, NAMES)
    reduced = DPGradMean(dp_mesh)(tuple(Tensor(dp_grads[n]) for n in NAMES))
    for n, g in zip(NAMES, reduced):
        result["ref_grad/" + n] = ref_grads[n]
        result["tp_grad/" + n] = tp_grads[n]
        result["ref_ent_grad/" + n], result["tp_ent_grad/" + n] = ref_ent[n], tp_ent[n]
        result["dp_grad/" + n] = g.asnumpy()
    # rollout: TP=2 samples the same tokens as TP=1 with the same seed
    from mindrlhf.rollout.engine import GenerationEngine
    from mindrlhf.rollout.sampling import SamplingParams
    prompts = [[5, 9, 3, 17, 2], [11, 2, 40]]
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=10, n=2, seed=4)
    result["rollout_tp"] = GenerationEngine(tp_model, 0, 8).generate(prompts, params).response_ids
    result["rollout_ref"] = GenerationEngine(single, 0, 8).generate(prompts, params).response_ids
    for k, v in region_grads(tp_mesh).items():
        result["region/" + k] = v
    np.savez(os.path.join(out_dir, f"rank_{rank}.npz"), **result)


if __name__ == "__main__":
    main()
