"""Our decoder against Hugging Face transformers (torch CPU) on the same random weights, fp32."""
import numpy as np
import pytest

from hf_reference import hf_logits, make_hf_model, tiny_model_kwargs
from model_helpers import load_ours, model_inputs, token_loss_and_grads
from mindrlhf.checkpoint.hf_interop import ms_to_hf_name
from mindrlhf.configs import ModelConfig

CASES = [  # (qkv bias, tied head, n_kv_heads): Qwen2 GQA, Llama MHA tied, Qwen2 MQA tied
    (True, False, 2),
    (False, True, 4),
    (True, True, 1),
    (False, False, 2),
]


@pytest.mark.parametrize("bias,tie,kv", CASES)
def test_logits_match_hf(tmp_path, rng, bias, tie, kv):
    hf = make_hf_model(str(tmp_path), qkv_bias=bias, tie=tie, n_kv_heads=kv)
    ours = load_ours(str(tmp_path), ModelConfig(**tiny_model_kwargs(bias, tie, kv)))
    ids = rng.randint(0, 160, (3, 13))
    ref = hf_logits(hf, ids)
    got = ours.full_logits(*model_inputs(ids)).asnumpy()
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= 1e-4


def test_left_padded_logits_match_hf(tmp_path, rng):
    hf = make_hf_model(str(tmp_path), qkv_bias=True, tie=False, n_kv_heads=2)
    ours = load_ours(str(tmp_path), ModelConfig(**tiny_model_kwargs(True, False, 2)))
    ids = rng.randint(0, 160, (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, :4] = 0  # row 1 is left-padded
    ref = hf_logits(hf, ids, mask)
    got = ours.full_logits(*model_inputs(ids, mask)).asnumpy()
    real = mask.astype(bool)
    assert np.abs(got[real] - ref[real]).max() <= 1e-4


@pytest.mark.parametrize("bias,tie,kv", CASES[:2])
def test_gradients_match_hf(tmp_path, rng, bias, tie, kv):
    import torch
    hf = make_hf_model(str(tmp_path), qkv_bias=bias, tie=tie, n_kv_heads=kv)
    ours = load_ours(str(tmp_path), ModelConfig(**tiny_model_kwargs(bias, tie, kv)))
    names = ["model.layers.0.attention.wq.weight", "model.layers.1.feed_forward.w2.weight",
             "model.layers.0.attention_norm.weight", "model.tok_embeddings.embedding_weight",
             "model.norm_out.weight", "model.layers.1.ffn_norm.weight"]
    if bias:
        names.append("model.layers.1.attention.wk.bias")
    ids = rng.randint(0, 160, (2, 12))
    loss, grads = token_loss_and_grads(ours, ids, names)

    hf.zero_grad()
    logits = hf(torch.tensor(ids[:, :-1])).logits
    logp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids[:, 1:])[..., None])
    ref_loss = -logp.mean()
    ref_loss.backward()
    hf_params = dict(hf.named_parameters())
    assert abs(loss - ref_loss.item()) <= 1e-5
    for name in names:
        ref = hf_params[ms_to_hf_name(name)].grad.numpy()
        rel = np.abs(grads[name] - ref).max() / np.abs(ref).max()
        assert rel <= 1e-4, (name, rel)
