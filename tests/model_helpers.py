"""Shared test helpers: build our model from an HF directory and run it on numpy inputs."""
from __future__ import annotations

import numpy as np
from mindspore import Tensor

from mindrlhf.checkpoint.hf_interop import iter_hf_as_ms
from mindrlhf.configs import ModelConfig
from mindrlhf.models.padding import causal_bias
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.parallel.mesh import Mesh


def load_ours(hf_dir, cfg: ModelConfig, mesh: Mesh = None) -> CausalLM:
    from mindrlhf.checkpoint.model_io import load_full_weights
    model = CausalLM(cfg, mesh)
    load_full_weights(model, iter_hf_as_ms(hf_dir), hf_dir)
    return model


def model_inputs(ids: np.ndarray, attention_mask: np.ndarray = None):
    b, t = ids.shape
    mask = np.ones((b, t), np.int32) if attention_mask is None else attention_mask.astype(np.int32)
    pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return Tensor(ids.astype(np.int32)), Tensor(pos), causal_bias(Tensor(mask))


def token_loss_and_grads(model: CausalLM, ids: np.ndarray, names, entropy_coeff: float = 0.0):
    """Mean next-token NLL (minus entropy_coeff x the mean token entropy: an entropy bonus) and its gradients
    w.r.t. the named parameters (our model)."""
    import mindspore as ms
    inputs = model_inputs(ids[:, :-1])
    labels = Tensor(ids[:, 1:].astype(np.int32))
    params = [p for p in model.get_parameters() if p.name in names]
    assert len(params) == len(names), names
    if entropy_coeff:
        model.differentiate_entropy()

    def loss_fn(input_ids, pos, bias, lab):
        logprob, entropy = model.token_logprobs(input_ids, pos, bias, lab)
        return -logprob.mean() - entropy_coeff * entropy.mean()

    loss, grads = ms.value_and_grad(loss_fn, None, params)(*inputs, labels)
    return float(loss.asnumpy()), {p.name: g.asnumpy() for p, g in zip(params, grads)}


def one_process_reference(hf_dir, cfg: ModelConfig, ids: np.ndarray):
    """(parameter names, {"ref_logits", "ref_loss", "ref_grad/<name>"}): one process's logits, mean next-token NLL
    and every gradient on `ids`, what the msrun workers' layouts are compared with."""
    single = load_ours(hf_dir, cfg)
    names = [p.name for p in single.get_parameters()]
    result = {"ref_logits": single.full_logits(*model_inputs(ids)).asnumpy()}
    result["ref_loss"], grads = token_loss_and_grads(single, ids, names)
    result.update({"ref_grad/" + n: g for n, g in grads.items()})
    return names, result


def shared_prompt_against_hf(ours: CausalLM, hf, seq: np.ndarray, mask: np.ndarray, weights: np.ndarray,
                             resp: int, temp: float, group: int, width: int):
    """GRPO's shared-prompt pass on rows [prompt (width) | response (resp)] in groups of `group`, the prompt run
    once per group, against transformers on the whole rows: (our response log-probs, theirs, our gradients of
    sum(log-probs * weights) per parameter, transformers' named parameters after the same backward)."""
    import mindspore as ms
    import torch
    from mindrlhf.models.padding import position_ids
    params = list(ours.trainable_params())

    def loss_fn(input_ids, pos, bias, labels):
        logp, _ = ours.token_logprobs(input_ids, pos, bias, labels, resp, temp, group, width)
        return (logp * Tensor(weights)).sum(), logp

    inputs = (Tensor(seq[:, :-1].astype(np.int32)), Tensor(position_ids(mask[:, :-1])),
              causal_bias(Tensor(mask[:, :-1].astype(np.int32))), Tensor(seq[:, 1:].astype(np.int32)))
    (_, logp), grads = ms.value_and_grad(loss_fn, None, params, has_aux=True)(*inputs)
    hf.zero_grad()
    logits = hf(torch.tensor(seq[:, :-1]), attention_mask=torch.tensor(mask[:, :-1])).logits[:, -resp:]
    response = torch.tensor(seq[:, -resp:])
    ref_logp = torch.log_softmax(logits.float() / temp, -1).gather(-1, response[..., None])[..., 0]
    (ref_logp * torch.tensor(weights)).sum().backward()
    return (logp.asnumpy(), ref_logp.detach().numpy(), {p.name: g.asnumpy() for p, g in zip(params, grads)},
            dict(hf.named_parameters()))
