"""msrun worker: pipelined train layouts against one process holding the whole model, on the same weights.

argv: out_dir case [case ...], each case "pp,dp,tp,m[,sp]" (pipeline stages, data parallel, tensor parallel,
micro-batches, sequence parallelism; pp x dp x tp = the worker count). The sequences are P + R - 1 = 11 long:
under sequence parallelism they are padded to a multiple of tp. Per case and rank, out_dir/{case}_rank{r}.json holds the
largest relative differences (gradients summed over the schedule and averaged over DP, loss, gradient
norm, weights after one AdamW update, log-probs) against the single-model reference computed in the same
process with the plain (unpipelined) train step.
"""
import json
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindrlhf.checkpoint.model_io import load_full_weights
from mindrlhf.configs import ModelConfig
from mindrlhf.configs.grpo_config import GRPOConfig
from mindrlhf.models.padding import causal_bias, position_ids
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.models.specs import param_specs
from mindrlhf.parallel import comm
from mindrlhf.parallel.mesh import Mesh, init_distributed
from mindrlhf.trainer.optim import AdamW
from mindrlhf.trainer.update.loss_inputs import LossInputs
from mindrlhf.trainer.update.pipelined import PipelineLogProb, PipelineTrainStep
from mindrlhf.trainer.update.loss import GRPOLossCell
from mindrlhf.trainer.update.one_graph import PolicyTrainStep, ResponseLogProb
from mindrlhf.utils.params import param_as_f32

CFG = dict(hidden_size=64, num_layers=3, num_heads=4, n_kv_heads=2, intermediate_size=96, vocab_size=160,
           qkv_has_bias=True, seq_length=64)
N, P, R = 8, 6, 6            # mini-batch rows (all DP ranks), prompt width, response width
TEMPERATURE, LR = 0.8, 1e-3


def full_weights(cfg):
    rng = np.random.RandomState(11)
    out = {}
    for name, (shape, _) in param_specs(cfg).items():
        base = 1.0 if "norm" in name else 0.0
        out[name] = (base + rng.normal(0, 0.08, shape)).astype(np.float32)
    return out


def batch():
    """[left-padded prompt | right-padded response] rows with ragged lengths, as training_tensors makes."""
    rng = np.random.RandomState(5)
    seq = rng.randint(3, 160, (N, P + R))
    pmask = np.zeros((N, P), np.int64)
    rmask = np.zeros((N, R), np.int64)
    for i in range(N):
        pmask[i, rng.randint(0, P - 1):] = 1
        rmask[i, :rng.randint(1, R + 1)] = 1
    mask = np.concatenate([pmask, rmask], 1)
    seq = seq * mask
    inputs, labels, in_mask = seq[:, :-1], seq[:, 1:], mask[:, :-1]
    extra = {"mask": rmask.astype(np.float32), "old": rng.normal(-2.5, 0.3, (N, R)).astype(np.float32),
             "rollout": rng.normal(-2.5, 0.3, (N, R)).astype(np.float32),
             "ref": rng.normal(-2.5, 0.3, (N, R)).astype(np.float32),
             "adv": rng.normal(0, 1, N).astype(np.float32)}
    return inputs, position_ids(in_mask), in_mask, labels, extra


def rl_config():
    rl = GRPOConfig().rl
    rl.beta, rl.clip_low, rl.clip_high, rl.loss_agg = 0.04, 0.2, 0.28, "token-mean"
    return rl


def tensors(rows, inputs, pos, in_mask, labels, extra, token_norm):
    """The train step's inputs for `rows` of the mini-batch."""
    t = [Tensor(inputs[rows].astype(np.int32)), Tensor(pos[rows]), causal_bias(Tensor(in_mask[rows].astype(np.int32))),
         Tensor(labels[rows].astype(np.int32))]
    t += [Tensor(extra[k][rows]) for k in ("mask", "old", "rollout", "ref", "adv")]
    return t + [Tensor(np.float32(token_norm))]


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def reference(cfg, weights, data):
    """The whole model in this process, the plain train step on the whole mini-batch: loss, gradients,
    gradient norm, weights after one update, log-probs after it."""
    inputs, pos, in_mask, labels, extra = data
    rl, tokens, rows = rl_config(), extra["mask"].sum(), np.arange(N)
    ref = CausalLM(cfg)
    load_full_weights(ref, weights.items(), "init")
    params = list(ref.trainable_params())
    (loss, _), grads = ms.value_and_grad(GRPOLossCell(ref, rl, R, TEMPERATURE), None, params, has_aux=True)(
        *tensors(rows, *data, tokens))
    step = PolicyTrainStep(GRPOLossCell(ref, rl, R, TEMPERATURE), AdamW(params, 0.01), Mesh(1, 1, 0), 1.0)
    t = tensors(rows, *data, tokens)
    out = step(*t[:4], Tensor(np.float32(LR)), *t[4:])
    logp = ResponseLogProb(ref, R, TEMPERATURE)(*tensors(rows, *data, tokens)[:4]).asnumpy()
    return {"loss": float(loss.asnumpy()), "grads": {p.name: g.asnumpy() for p, g in zip(params, grads)},
            "norm": float(out[5].asnumpy()), "after": {p.name: param_as_f32(p).copy() for p in params},
            "logp": logp, "params": len(params)}


def run_case(out_dir, case, rank, cfg, weights, data, ref):
    pp, dp, tp, m = (int(x) for x in case.split(",")[:4])
    sp = case.endswith(",sp")
    inputs, pos, in_mask, labels, extra = data
    rl, tokens = rl_config(), extra["mask"].sum()
    mesh = Mesh(dp, tp, rank, pp, seq_parallel=sp)
    model = CausalLM(cfg, mesh)
    load_full_weights(model, weights.items(), "init")
    params = list(model.trainable_params())
    layouts = model.layouts()
    opt = AdamW(params, 0.01)
    rows = np.arange(N)[mesh.dp_index * (N // dp):(mesh.dp_index + 1) * (N // dp)]
    local = tensors(rows, *data, tokens / dp)
    if pp > 1:
        step = PipelineTrainStep(GRPOLossCell(model, rl, R, TEMPERATURE, micro_batches=m), opt, mesh, 1.0, m)
        loss = step.accumulate(*local[:4], LossInputs(*local[4:]))[0]
        grads = [acc.asnumpy() for acc in step.acc]
    else:                      # sequence parallelism without stages: the plain train step
        loss_cell = GRPOLossCell(model, rl, R, TEMPERATURE)
        (loss, _), grads = ms.value_and_grad(loss_cell, None, params, has_aux=True)(*local)
        loss, grads = float(loss.asnumpy()), [g.asnumpy() for g in grads]
        step = PolicyTrainStep(loss_cell, opt, mesh, 1.0)
        step.links, step.acc = (None, None), []
    loss = comm.all_reduce_sum(np.array([loss], np.float32), mesh.dp_ranks())[0] / dp
    grad_err = 0.0
    for p, g in zip(params, grads):
        g = comm.all_reduce_sum(g, mesh.dp_ranks()) / dp
        grad_err = max(grad_err, rel(g, layouts[p.name].shard(ref["grads"][p.name], rank)))
    if pp > 1:
        norm = float(step.apply(Tensor(np.float32(LR))).asnumpy())
    else:
        norm = float(step(*local[:4], Tensor(np.float32(LR)), *local[4:])[5].asnumpy())
    # weights after one AdamW update, relative in norm: per tensor (Adam's first step is ~lr x sign(g), so float
    # noise in near-zero gradient elements moves single elements by up to ~2 lr, see test_layout_invariance)
    # and over all of this rank's tensors
    after = {p.name: (param_as_f32(p), layouts[p.name].shard(ref["after"][p.name], rank)) for p in params}
    per_tensor = max(float(np.linalg.norm(a - b) / np.linalg.norm(b)) for a, b in after.values())
    whole = float(np.sqrt(sum(np.linalg.norm(a - b) ** 2 for a, b in after.values()) /
                          sum(np.linalg.norm(b) ** 2 for _, b in after.values())))
    cleared = max([float(np.abs(a.asnumpy()).max()) for a in step.acc] + [0.0])
    # log-probs through the pipeline, with the updated weights against the updated reference
    logprob = PipelineLogProb(model, R, TEMPERATURE, m) if pp > 1 else ResponseLogProb(model, R, TEMPERATURE)
    logp = logprob(*local[:4]).asnumpy()
    result = {"case": case, "rank": rank, "stage": mesh.stage, "grad": grad_err,
              "loss": abs(loss - ref["loss"]) / abs(ref["loss"]), "norm": abs(norm - ref["norm"]) / ref["norm"],
              "values": [loss, ref["loss"], norm, ref["norm"]], "weights_tensor": per_tensor, "weights": whole,
              "cleared": cleared, "logp": rel(logp, ref["logp"][rows]), "params": len(params),
              "ref_params": ref["params"], "links": [0 if link is None else link.calls for link in step.links]}
    with open(os.path.join(out_dir, f"{case.replace(',', '_')}_rank{rank}.json"), "w") as fh:
        json.dump(result, fh)


def main():
    out_dir, cases = sys.argv[1], sys.argv[2:]
    rank, _ = init_distributed()
    cfg = ModelConfig(**CFG)
    weights, data = full_weights(cfg), batch()
    ref = reference(cfg, weights, data)
    for case in cases:
        run_case(out_dir, case, rank, cfg, weights, data, ref)
        comm.barrier()


if __name__ == "__main__":
    main()
