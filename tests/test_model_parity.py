"""Our decoder against Hugging Face transformers (torch CPU) on the same random weights, fp32."""
import numpy as np
import pytest

from hf_reference import hf_logits, make_hf_model, tiny_model_kwargs
from memory_helpers import heap_growth
from model_helpers import load_ours, model_inputs, shared_prompt_against_hf, token_loss_and_grads
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


def test_causal_bias_is_causal_and_masks_padded_keys():
    """Checked cell by cell against the definition; the Tensor and numpy inputs give the same bias."""
    from mindspore import Tensor
    from mindrlhf.models.padding import NEG_INF, causal_bias
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 0, 1, 1]], np.int32)
    got = causal_bias(mask).asnumpy()
    assert got.shape == (3, 1, 5, 5) and got.dtype == np.float32
    for b in range(3):
        for i in range(5):
            for j in range(5):
                assert got[b, 0, i, j] == np.float32(0.0 if j <= i and mask[b, j] else NEG_INF), (b, i, j)
    assert np.array_equal(causal_bias(Tensor(mask)).asnumpy(), got)


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


@pytest.mark.parametrize("bias,tie,kv", [CASES[0], CASES[2]])
def test_shared_prompt_logprobs_and_gradients_match_hf(tmp_path, rng, bias, tie, kv):
    """GRPO rows [left-padded prompt | right-padded response] in groups of G with one prompt each: with the
    prompt run once per group (engine.share_prompt), the response log-probs (temperature 0.7) and the gradients
    of a masked, weighted sum of them match Hugging Face on the whole rows."""
    from mindrlhf.models.padding import left_pad
    hf = make_hf_model(str(tmp_path), qkv_bias=bias, tie=tie, n_kv_heads=kv)
    ours = load_ours(str(tmp_path), ModelConfig(**tiny_model_kwargs(bias, tie, kv)))
    g, width, resp, temp = 3, 7, 5, 0.7
    prompt_ids, prompt_mask = left_pad([rng.randint(3, 160, n).tolist() for n in (4, 7)], width, 0)
    prompt_ids, prompt_mask = np.repeat(prompt_ids, g, 0), np.repeat(prompt_mask, g, 0)
    response = rng.randint(3, 160, (len(prompt_ids), resp))
    response_mask = np.ones_like(response)
    response_mask[1, 2:] = 0                      # one response ends early: right padding
    response[response_mask == 0] = 0
    seq = np.concatenate([prompt_ids, response], 1)
    mask = np.concatenate([prompt_mask, response_mask], 1)
    weights = (rng.randn(*response.shape) * response_mask).astype(np.float32)
    logp, ref_logp, grads, hf_params = shared_prompt_against_hf(ours, hf, seq, mask, weights, resp, temp, g, width)
    real = response_mask.astype(bool)
    assert np.abs(logp[real] - ref_logp[real]).max() <= 1e-4
    for name, grad in grads.items():
        ref = hf_params[ms_to_hf_name(name)].grad.numpy()
        rel = np.abs(grad - ref).max() / np.abs(ref).max()
        assert rel <= 1e-4, (name, rel)


def test_head_logprob_backward_matches_torch_with_per_token_weights(rng):
    """HeadLogProb's written-out backward (tp = 1): log-probs, entropy and the gradients of a loss with signed
    per-token weights (as GRPO's advantages) w.r.t. the hidden states and the head weight, against torch's
    autograd; the entropy carries no gradient."""
    import torch
    import mindspore as ms
    from mindspore import Tensor
    from mindrlhf.models.tp_layers import HeadLogProb
    hidden = rng.standard_normal((2, 5, 8)).astype(np.float32)
    weight = rng.standard_normal((40, 8)).astype(np.float32)
    labels = rng.randint(0, 40, (2, 5)).astype(np.int32)
    token_w = rng.standard_normal((2, 5)).astype(np.float32)
    cell = HeadLogProb()

    def loss_fn(h, w):
        logprob, entropy, _ = cell(h, w, Tensor(labels))
        return (logprob * Tensor(token_w)).sum() + 0.5 * entropy.sum(), logprob, entropy

    (_, logprob, entropy), (dh, dw) = ms.value_and_grad(loss_fn, (0, 1), has_aux=True)(Tensor(hidden), Tensor(weight))
    th, tw = torch.tensor(hidden, requires_grad=True), torch.tensor(weight, requires_grad=True)
    logp_all = torch.log_softmax(th @ tw.T, -1)
    ref_logprob = logp_all.gather(-1, torch.tensor(labels, dtype=torch.int64)[..., None])[..., 0]
    ref_entropy = -(logp_all.exp() * logp_all).sum(-1)
    ((ref_logprob * torch.tensor(token_w)).sum() + 0.5 * ref_entropy.detach().sum()).backward()
    np.testing.assert_allclose(logprob.asnumpy(), ref_logprob.detach().numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(entropy.asnumpy(), ref_entropy.detach().numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(dh.asnumpy(), th.grad.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(dw.asnumpy(), tw.grad.numpy(), atol=1e-5, rtol=0)


def _weighted_sum(y, g):
    """(sum of y * g, y): a scalar to differentiate, and y itself as the auxiliary output."""
    return (y * g).sum(), y


@pytest.mark.parametrize("rows", [1, 64, 65, 130])
def test_linear_values_and_gradients_on_both_sides_of_the_few_rows_form(rng, rows):
    """`linear` computes (W @ x^T)^T up to FEW_ROWS rows and x @ W^T above: both against numpy (float64),
    values and the gradients w.r.t. x and W, inside a compiled graph as the model uses it."""
    import mindspore as ms
    from mindspore import Tensor, nn
    from mindrlhf.models.tp_layers import FEW_ROWS, linear
    assert FEW_ROWS == 64             # the parametrisation straddles it
    x = rng.standard_normal((rows, 1, 48)).astype(np.float32)
    w = rng.standard_normal((40, 48)).astype(np.float32)
    dy = rng.standard_normal((rows, 1, 40)).astype(np.float32)

    class Net(nn.Cell):
        @ms.jit
        def construct(self, a, b, g):
            (_, y), grads = ms.value_and_grad(lambda p, q: _weighted_sum(linear(p, q, ms.float32), g), (0, 1),
                                              has_aux=True)(a, b)
            return y, grads

    y, (dx, dw) = Net()(Tensor(x), Tensor(w), Tensor(dy))
    x64, w64, dy64 = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    np.testing.assert_allclose(y.asnumpy(), x64 @ w64.T, atol=1e-4, rtol=0)
    np.testing.assert_allclose(dx.asnumpy(), dy64 @ w64, atol=1e-4, rtol=0)
    np.testing.assert_allclose(dw.asnumpy(), np.einsum("rto,rti->oi", dy64, x64), atol=1e-3, rtol=0)


@pytest.mark.parametrize("shape", [(3, 5, 4, 6), (3, 1, 4, 6), (3, 5, 1, 6)])
def test_swap_middle_moves_the_axes_in_values_and_gradient(rng, shape):
    """graph_ops.swap_middle (the heads transpose of attention) is numpy's transpose(0, 2, 1, 3), and its
    gradient the incoming gradient moved back, exactly: it only copies. Also with a middle axis of 1 (a
    decode step), where it is a reshape."""
    import mindspore as ms
    from mindspore import Tensor, nn
    from mindrlhf.models.graph_ops import swap_middle
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(x.transpose(0, 2, 1, 3).shape).astype(np.float32)

    class Net(nn.Cell):
        @ms.jit
        def construct(self, a, g):
            (_, y), dx = ms.value_and_grad(lambda p: _weighted_sum(swap_middle(p), g), has_aux=True)(a)
            return y, dx

    y, dx = Net()(Tensor(x), Tensor(dy))
    np.testing.assert_array_equal(y.asnumpy(), x.transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(dx.asnumpy(), dy.transpose(0, 2, 1, 3))


def test_swap_middle_launches_no_gather_when_a_middle_axis_is_1(monkeypatch):
    """In a decode step (one position per sequence) the heads swap keeps the memory order: swap_middle
    builds no gather there (a kernel launch per use, 4 per layer in every decode step), only in general."""
    from mindspore import Tensor
    from mindrlhf.models import graph_ops
    calls = []
    real_gather = graph_ops.ops.gather
    monkeypatch.setattr(graph_ops.ops, "gather", lambda *a, **k: calls.append(1) or real_gather(*a, **k))
    graph_ops.swap_middle(Tensor(np.ones((4, 1, 2, 8), np.float32)))
    graph_ops.swap_middle(Tensor(np.ones((4, 2, 1, 8), np.float32)))
    assert calls == []
    graph_ops.swap_middle(Tensor(np.ones((4, 2, 3, 8), np.float32)))
    assert calls == [1]


def test_swap_middle_keeps_no_per_element_table_on_the_heap():
    """The reason swap_middle is not ops.transpose: MindSpore 2.10's CPU Transpose keeps a size_t source
    offset per output element (twice a float32 output) on the heap for the compiled graph's lifetime.
    Measured with glibc's mallinfo2 around the first run of a graph with a 16 MB output (Transpose: +33 MB)."""
    import mindspore as ms
    from mindspore import Tensor
    from mindrlhf.models.graph_ops import swap_middle
    x = Tensor(np.ones((64, 256, 8, 32), np.float32))          # 16 MB
    grown, out = heap_growth(lambda: ms.jit(swap_middle)(x).asnumpy())
    assert grown < out.nbytes / 4, f"the heap grew by {grown / 2**20:.1f} MB for a {out.nbytes / 2**20:.0f} MB output"


def test_linear_keeps_no_transpose_table_for_a_vocabulary_head_above_32_rows():
    """tp_layers.linear over 64 rows into 32000 features (an LM head in a 64-row decode step) computes
    x @ W^T: the few-rows form's final CPU Transpose would keep a size_t per output element on the heap for
    the graph's lifetime (measured: +17.5 MB for this 7.8 MB output, against +1.3 MB), and was slower there.
    The values are the product's either way."""
    import mindspore as ms
    from mindspore import Tensor
    from mindrlhf.models.tp_layers import linear
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1, 128)).astype(np.float32)
    w = (rng.standard_normal((32000, 128)) * 0.02).astype(np.float32)

    def head(a, b):
        return linear(a, b, ms.float32)
    xt, wt = Tensor(x), Tensor(w)                 # their buffers are the heap's too: made before measuring
    grown, out = heap_growth(lambda: ms.jit(head)(xt, wt).asnumpy())
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-4, atol=1e-4)
    assert grown < out.nbytes / 4, f"the heap grew by {grown / 2**20:.1f} MB for a {out.nbytes / 2**20:.1f} MB output"


def test_attention_backward_keeps_no_transpose_tables_on_the_heap():
    """The attention's backward (RoPE's half rotation and probs @ v) has no CPU Transpose, whose size_t table
    of output offsets stays on the heap for the graph's lifetime: differentiated op by op, the rotation's
    gather became Transpose / UnsortedSegmentSum / Transpose and the functional matmul transposed both
    operands (probs: 8 MB here). Compile + first run of the gradient of one attention block, measured:
    +76.8 MB with those and the softmax's broadcasting Sub (LastAxisSoftmax), against +24.2 MB."""
    import mindspore as ms
    from mindspore import Tensor
    from mindrlhf.configs import ModelConfig
    from mindrlhf.models.padding import causal_bias
    from mindrlhf.models.qwen2 import Attention, rope_swap, rope_tables
    from mindrlhf.parallel.mesh import Mesh
    cfg = ModelConfig(hidden_size=128, num_layers=1, num_heads=4, n_kv_heads=2, intermediate_size=64,
                      vocab_size=64, seq_length=256)
    attention = Attention(cfg, Mesh(1, 1, 0))
    b, t = 8, 256
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((b, t, 128)).astype(np.float32))
    cos, sin = rope_tables(cfg.head_dim, t, cfg.theta)
    cos = Tensor(np.broadcast_to(cos[None, None], (b, 1, t, cfg.head_dim)).copy())
    sin = Tensor(np.broadcast_to((sin * rope_swap(cfg.head_dim)[1])[None, None], (b, 1, t, cfg.head_dim)).copy())
    bias = causal_bias(np.ones((b, t), np.int32))

    def loss(x_):
        return (attention(x_, cos, sin, bias) ** 2).sum()
    grad = ms.jit(ms.grad(loss))
    grown, dx = heap_growth(lambda: grad(x).asnumpy())
    assert np.isfinite(dx).all() and np.abs(dx).max() > 0
    assert grown < 40 * 2**20, f"the attention's backward grew the heap by {grown / 2**20:.1f} MB"


def test_last_axis_broadcast_and_reductions_equal_numpy():
    """graph_ops' last-axis forms (a product with a row of ones; reductions as 2-D) give numpy's values: the
    broadcast exactly, the sums within float32 rounding; float16 keeps BroadcastTo."""
    import mindspore as ms
    from mindspore import Tensor, ops
    from mindrlhf.models.graph_ops import expand_as, mean_last, sum_last
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 7, 16)).astype(np.float32)
    row = rng.standard_normal((3, 5, 7, 1)).astype(np.float32)

    def forms(a, r):
        return expand_as(r, a), sum_last(a), mean_last(a), expand_as(ops.cast(r, ms.float16), ops.cast(a, ms.float16))
    wide, total, mean, wide16 = ms.jit(forms)(Tensor(x), Tensor(row))
    np.testing.assert_array_equal(wide.asnumpy(), np.broadcast_to(row, x.shape))
    np.testing.assert_allclose(total.asnumpy(), x.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean.asnumpy(), x.mean(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(wide16.asnumpy(), np.broadcast_to(row.astype(np.float16), x.shape))


def test_a_model_whose_weights_are_loaded_next_starts_from_zeros_and_loads_them_all(tmp_path):
    """random_init=False skips drawing the weights (seconds at 135M parameters); loading then sets every one."""
    from mindrlhf.checkpoint.model_io import load_weights
    from mindrlhf.models.qwen2 import CausalLM
    cfg = ModelConfig(**tiny_model_kwargs(True, False, 2))
    blank = CausalLM(cfg, random_init=False)
    for p in blank.get_parameters():
        assert np.all(p.asnumpy() == (1.0 if "norm" in p.name else 0.0)), p.name
    make_hf_model(str(tmp_path), qkv_bias=True, tie=False, n_kv_heads=2)
    drawn = load_ours(str(tmp_path), cfg)
    load_weights(blank, str(tmp_path))
    for a, b in zip(blank.get_parameters(), drawn.get_parameters()):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
