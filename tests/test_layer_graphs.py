"""Each layer path compiled once per model (models/layer_graphs.py): the same values as the layers called one by
one, every layer with its own weights, and the parameters' names and count unchanged."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindrlhf.configs import ModelConfig
from mindrlhf.models.layer_graphs import (SharedPrompt, prefill, prefill_attention, shared_prompt_attention,
                                          shared_prompt_forward)
from mindrlhf.models.padding import causal_bias, position_ids
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.models.specs import param_specs
from mindrlhf.models.graph_ops import take

CFG = dict(hidden_size=32, num_layers=3, num_heads=4, n_kv_heads=2, intermediate_size=48, vocab_size=64, seq_length=32)


@pytest.fixture(scope="module")
def model():
    """Three layers with different random weights (a shared subgraph that read one layer's weights for every
    layer would give other values)."""
    ms.set_seed(3)
    m = CausalLM(ModelConfig(**CFG))
    rng = np.random.RandomState(0)
    for p in m.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.2 + ("norm" in p.name)).astype(np.float32)))
    return m


def _rows(n=4, p=5, r=3, seed=1):
    rng = np.random.RandomState(seed)
    ids = rng.randint(3, 64, (n, p + r))
    mask = np.ones((n, p + r), np.int64)
    mask[1, :2] = 0                                   # a left-padded prompt
    return Tensor((ids * mask).astype(np.int32)), Tensor(position_ids(mask)), causal_bias(Tensor(mask.astype(np.int32)))


class _Jit(nn.Cell):
    """A compiled graph of one DecoderModel path."""

    def __init__(self, decoder, path, *extra):
        super().__init__(auto_prefix=False)
        self.decoder, self.path, self.extra = decoder, path, extra

    @ms.jit
    def construct(self, ids, pos, bias):
        if self.path == "whole":
            return self.decoder.stage_forward(ids, pos, bias)
        if self.path == "shared":
            return shared_prompt_forward(self.decoder, ids, pos, bias, self.extra[0], self.extra[1])
        return prefill(self.decoder, ids, pos, bias, self.extra[0], self.extra[1])[0]


def _layer_by_layer(decoder, x, cos, sin, call):
    for layer in decoder.layers:
        x = call(layer, x, cos, sin)
    return x


def _with_attention(layer, x, attention, *args):
    """The layer's residual block around an attention variant of layer_graphs, called directly."""
    return layer.mlp_residual(x + attention(layer.attention, layer.attention_input(x), *args))


def test_whole_rows_equal_the_layers_called_one_by_one(model):
    dec = model.model
    ids, pos, bias = _rows()
    got = _Jit(dec, "whole")(ids, pos, bias).asnumpy()
    cos, sin = dec.rope(pos)
    x = ops.cast(dec.tok_embeddings(ids), ms.float32)
    want = dec.norm_out(_layer_by_layer(dec, x, cos, sin, lambda layer, x, c, s: layer(x, c, s, bias))).asnumpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.abs(want).max() > 0.1


def test_shared_prompt_rows_equal_the_layers_called_one_by_one(model):
    dec = model.model
    group, p = 2, 5
    ids, pos, bias = _rows()
    got = _Jit(dec, "shared", group, p)(ids, pos, bias).asnumpy()
    rows, length = ids.shape
    split = SharedPrompt(rows, group, p, length - p, CFG["hidden_size"] // CFG["num_heads"])
    x = ops.cast(dec.tok_embeddings(split.tokens(ids)), ms.float32)
    tok_pos = split.tokens(pos)
    cos = ops.expand_dims(ops.gather(dec.cos_table, tok_pos, 0), 1)
    sin = ops.expand_dims(ops.gather(dec.signed_sin_table, tok_pos, 0), 1)
    bias_p = take(take(take(bias, 0, 0, rows, group), 2, 0, p), 3, 0, p)
    bias_r = take(bias, 2, p, length)
    x = _layer_by_layer(dec, x, cos, sin, lambda layer, x, c, s: _with_attention(layer, x, shared_prompt_attention, c, s,
                                                                                bias_p, bias_r, split))
    # the hidden states that predict the responses: the prompt's last position per group, then the responses
    want = dec.norm_out(x).asnumpy()
    responses = want[split.prompt_tokens:].reshape(rows, length - p, -1)
    np.testing.assert_allclose(got[:, 1:], responses, rtol=1e-5, atol=1e-5)
    last = want[p - 1:split.prompt_tokens:p]
    np.testing.assert_allclose(got[:, 0], np.repeat(last, group, 0), rtol=1e-5, atol=1e-5)


def test_prefill_fills_every_layers_cache_from_its_own_weights(model):
    dec = model.model
    n = 2
    ids, pos, bias = _rows(n=2, p=5, r=0)
    hd, nkv, length = CFG["hidden_size"] // CFG["num_heads"], CFG["n_kv_heads"], 8

    def caches(tag):
        return [Parameter(Tensor(np.zeros((2 * n, nkv, length, hd), np.float32)), name=f"{tag}{i}", requires_grad=False)
                for i in range(CFG["num_layers"])]
    ck, cv, rk, rv = caches("ck"), caches("cv"), caches("rk"), caches("rv")
    got = _Jit(dec, "prefill", ms.ParameterTuple(ck), ms.ParameterTuple(cv))(ids, pos, bias).asnumpy()
    cos, sin = dec.rope(pos)
    x = ops.cast(dec.tok_embeddings(ids), ms.float32)
    for i, layer in enumerate(dec.layers):
        x = _with_attention(layer, x, prefill_attention, cos, sin, bias, rk[i], rv[i], n)
    np.testing.assert_allclose(got, dec.norm_out(x).asnumpy(), rtol=1e-5, atol=1e-5)
    for i in range(CFG["num_layers"]):
        np.testing.assert_allclose(ck[i].asnumpy(), rk[i].asnumpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(cv[i].asnumpy(), rv[i].asnumpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(ck[0].asnumpy(), ck[1].asnumpy())      # each layer wrote its own keys


def test_parameters_keep_their_names_and_layers_share_one_key(model):
    names = [p.name for p in model.get_parameters()]
    assert sorted(names) == sorted(param_specs(ModelConfig(**CFG)))          # each once, MindFormers' names
    graphs = model.model.graphs
    for path in (graphs.whole_rows, graphs.shared_prompt, graphs.prefill, graphs.decode):
        assert len({cell.cell_init_args for cell in path}) == 1                   # one subgraph per path
    other = CausalLM(ModelConfig(**CFG)).model.graphs
    assert other.decode[0].cell_init_args != graphs.decode[0].cell_init_args      # never across models
