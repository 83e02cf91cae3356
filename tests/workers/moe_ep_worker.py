"""msrun worker: a tiny Qwen3-MoE (one dense layer, one sparse; 4 experts, top-2) with its experts split over
an `ep` axis of 2 ranks, each expert's width over a `tp` axis of 2, or whole experts over the `tp` axis
(moe_tp_extend_ep), against one process on the same weights: logits, the loss and every parameter's gradient (op
by op and in one compiled graph, as the train step takes them); with LoRA on every linear layer and expert (the experts' adapters
split with their experts and widths), the adapters' gradients. With 4 workers: ep2 x tp2 with sequence
parallelism, and ep2 x tp2 with the experts over both (a quarter of the experts, whole, on each rank). With 2
workers also ep2 under the all-to-all dispatcher, each rank on its own half of the rows.

argv: hf_dir out_dir [lora] (and the worker count from msrun; `lora`: only the LoRA layouts, 2 workers). Writes
out_dir/rank_{r}.npz with what tests/test_qwen3_moe_ep.py compares.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from hf_reference import qwen3_moe_model_kwargs  # noqa: E402
from model_helpers import load_ours, model_inputs, one_process_reference, token_loss_and_grads  # noqa: E402
from qwen3_tp_worker import compiled_grads  # noqa: E402
from mindrlhf.checkpoint.hf_interop import iter_hf_as_ms  # noqa: E402
from mindrlhf.checkpoint.model_io import load_full_weights  # noqa: E402
from mindrlhf.configs import ModelConfig  # noqa: E402
from mindrlhf.configs.lora import LoraSpec, parse_targets  # noqa: E402
from mindrlhf.models.lora import ADAPTER_B, adapter_params  # noqa: E402
from mindrlhf.models.qwen2 import CausalLM  # noqa: E402
from mindrlhf.utils.params import write_param  # noqa: E402
from mindrlhf.parallel.mesh import Mesh, init_distributed  # noqa: E402
from mindrlhf.trainer.update.grad_norm import SplitNormSum, split_axes  # noqa: E402
from mindrlhf.trainer.update.one_graph import ModelRouting, ResponseLogProb  # noqa: E402
from mindspore import Tensor  # noqa: E402


def _routing(model, ids):
    inputs = model_inputs(ids[:, :-1])
    return np.sort(ModelRouting(model)(*inputs, Tensor(ids[:, 1:].astype(np.int32)))[0].asnumpy(), -1)


def _logprobs(model, ids, routing):
    inputs = model_inputs(ids[:, :-1])
    extra = () if routing is None else (Tensor(routing.astype(np.int32)),)
    return ResponseLogProb(model, ids.shape[1] - 1)(*inputs, Tensor(ids[:, 1:].astype(np.int32)), *extra).asnumpy()


LORA = LoraSpec(4, 8.0, parse_targets("all-linear"), seed=3)


def lora_model(hf_dir, cfg, mesh=None):
    """The weights of hf_dir with LoRA adapters: A as init_adapters draws it (the same on any layout), every B
    random at its full shape from its name, this rank's share written."""
    model = CausalLM(cfg, mesh, LORA)
    load_full_weights(model, iter_hf_as_ms(hf_dir), hf_dir)
    layouts = model.layouts()
    for p in adapter_params(model):
        if p.name.endswith(ADAPTER_B):
            full = np.random.RandomState(sum(map(ord, p.name))).randn(*layouts[p.name].full_shape) * 0.05
            write_param(p, layouts[p.name].shard(full.astype(np.float32), model.mesh.rank))
    return model


def lora_results(hf_dir, cfg, ids, meshes):
    """One process's and each mesh's logits, loss and adapter gradients (op by op and compiled) with LORA."""
    single = lora_model(hf_dir, cfg)
    names = [p.name for p in adapter_params(single)]
    result = {"lora_ref_logits": single.full_logits(*model_inputs(ids)).asnumpy()}
    result["lora_ref_loss"], grads = token_loss_and_grads(single, ids, names)
    result.update({"lora_ref_grad/" + n: g for n, g in grads.items()})
    for tag, mesh in meshes.items():
        model = lora_model(hf_dir, cfg, mesh)
        result[tag + "_logits"] = model.full_logits(*model_inputs(ids)).asnumpy()
        result[tag + "_loss"], grads = token_loss_and_grads(model, ids, names)
        result.update({f"{tag}_grad/{n}": g for n, g in grads.items()})
        result.update({f"{tag}_jitgrad/{n}": g for n, g in compiled_grads(model, ids).items() if n in grads})
    return result


def distinct_rows_results(hf_dir, cfg, ids, rank, tag):
    """ep2 with the all-to-all dispatcher: rank r holds rows [2r, 2r + 2) of `ids` and half of the experts; its
    logits, mean loss and gradients (op by op and compiled) on its own rows, which the test sums over the ranks."""
    model = load_ours(hf_dir, cfg, Mesh(dp=1, tp=1, rank=rank, extra_axes=(("ep", 2),), ep_dispatcher="alltoall"))
    mine = ids[2 * rank:2 * rank + 2]
    names = [p.name for p in model.get_parameters()]
    result = {tag + "_shapes": np.array([str((p.name, tuple(p.shape))) for p in model.get_parameters()]),
              tag + "_logits": model.full_logits(*model_inputs(mine)).asnumpy()}
    result[tag + "_loss"], grads = token_loss_and_grads(model, mine, names)
    result.update({f"{tag}_grad/{n}": g for n, g in grads.items()})
    result.update({f"{tag}_jitgrad/{n}": g for n, g in compiled_grads(model, mine).items()})
    return result


def main():
    hf_dir, out_dir = sys.argv[1], sys.argv[2]
    rank, world = init_distributed()
    assert world in (2, 4), world
    cfg = ModelConfig(**qwen3_moe_model_kwargs(mlp_only=(0,)))
    ids = np.random.RandomState(7).randint(0, 160, (4, 12))
    if sys.argv[3:] == ["lora"]:
        result = lora_results(hf_dir, cfg, ids, {"ep_lora": Mesh(dp=1, tp=1, rank=rank, extra_axes=(("ep", 2),)),
                                                 "tp_lora": Mesh(dp=1, tp=2, rank=rank),
                                                 "tpx_lora": Mesh(dp=1, tp=2, rank=rank, experts_over_tp=True)})
        np.savez(os.path.join(out_dir, f"rank_{rank}.npz"), **result)
        return
    names, result = one_process_reference(hf_dir, cfg, ids)
    ep2 = Mesh(dp=1, tp=1, rank=rank, extra_axes=(("ep", 2),)) if world == 2 else None
    # ep_sorted: ep2 with the experts sorted by expert (models/moe.py), against the one process's dense form
    sorted_cfg = ModelConfig(**qwen3_moe_model_kwargs(mlp_only=(0,)), moe_expert_compute="sorted")
    # tpx: the two TP ranks hold two whole experts each (mesh.experts_over_tp), sorted on one of the layouts
    layouts = {"ep": (ep2, cfg), "tp": (Mesh(dp=1, tp=2, rank=rank), cfg), "ep_sorted": (ep2, sorted_cfg),
               "tpx": (Mesh(dp=1, tp=2, rank=rank, experts_over_tp=True), sorted_cfg)} if world == 2 else \
        {"eptp": (Mesh(dp=1, tp=2, rank=rank, seq_parallel=True, extra_axes=(("ep", 2),)), cfg),
         "eptpx": (Mesh(dp=1, tp=2, rank=rank, seq_parallel=True, extra_axes=(("ep", 2),), experts_over_tp=True),
                   cfg)}
    if world == 2:
        for tag, layout_cfg in (("a2a", cfg), ("a2a_sorted", sorted_cfg)):
            result.update(distinct_rows_results(hf_dir, layout_cfg, ids, rank, tag))
    ref_routing = _routing(load_ours(hf_dir, cfg), ids) if world == 4 else None
    for tag, (mesh, layout_cfg) in layouts.items():
        model = load_ours(hf_dir, layout_cfg, mesh)
        if ref_routing is not None:
            # router replay in this layout: its routing pass gives one process's experts, and replaying them
            # gives the forward's own log-probs (the sequence padded for sequence parallelism's split)
            result[tag + "_routing_equal"] = np.array_equal(_routing(model, ids), ref_routing)
            plain, replayed = (_logprobs(model, ids, r) for r in (None, ref_routing))
            result[tag + "_replay_gap"] = np.abs(plain - replayed).max()
        result[tag + "_shapes"] = np.array([str((p.name, tuple(p.shape))) for p in model.get_parameters()])
        result[tag + "_logits"] = model.full_logits(*model_inputs(ids)).asnumpy()
        result[tag + "_loss"], grads = token_loss_and_grads(model, ids, names)
        result.update({f"{tag}_grad/{n}": g for n, g in grads.items()})
        result.update({f"{tag}_jitgrad/{n}": g for n, g in compiled_grads(model, ids).items()})
        params = list(model.get_parameters())        # the train step's global grad norm over this layout's shares
        norm_sum = SplitNormSum(split_axes(model, params), mesh)
        result[tag + "_grad_norm"] = np.sqrt(norm_sum([Tensor(grads[p.name]) for p in params]).asnumpy())
    np.savez(os.path.join(out_dir, f"rank_{rank}.npz"), **result)


if __name__ == "__main__":
    main()
