"""The decoder's execution paths besides whole rows (qwen2.py): rows that share their group's prompt, prefill
and decode - attention's variant of each, the layer's path as a cell compiled once per model and reused by
every layer (utils/subgraph_reuse.py), and the model's pass through its layers. Most of a deep model's first
step is otherwise spent compiling 30 copies of one layer in the training graph, prefill and decode; the reuse
reaches a cell's `construct` only, hence a cell per path. Compile times: docs/BENCHMARKS.md
(bench_real_model.py, first step).

Under sequence parallelism DecoderModel runs its layers directly instead (see stage_forward).

The cells hold their layer as a child without a name prefix (its parameter names stay MindFormers') and are
kept outside the model's cell tree, so parameters, checkpoints and layouts see the layers only.
"""
from __future__ import annotations

from typing import Sequence

from mindspore import nn, ops

from mindrlhf.models.cpu_cells import BMM, BMM_NT
from mindrlhf.models.graph_ops import expand_as, swap_middle, take
from mindrlhf.utils.subgraph_reuse import new_key, reused


class SharedPrompt:
    """The token-matrix layout of a batch whose rows come in groups of `group` with one prompt each (GRPO's
    G samples of a prompt): the Q = N / group prompts' P tokens once each, then the N responses' T tokens,
    M = Q*P + N*T rows. Every layer but attention works on that matrix row by row, so the prompt's
    projections and MLP run once per group instead of once per sample; the values are the same as for the
    [prompt | response] rows of the whole batch (the prompt's tokens never see the responses)."""

    def __init__(self, rows: int, group: int, prompt_len: int, response_len: int, head_dim: int):
        if rows % group:
            raise ValueError(f"{rows} rows do not split into groups of {group}")
        self.rows, self.group, self.prompt_len, self.response_len = rows, group, prompt_len, response_len
        self.prompts = rows // group
        self.prompt_tokens = self.prompts * prompt_len
        self.head_dim = head_dim

    def tokens(self, z, sum_group: bool = False):
        """(N, P + T, ...) -> (Q*P + N*T, ...): each group's prompt once (its first row's, or with `sum_group`
        the sum of its rows'), then every response."""
        if sum_group:
            prompts = take(z, 1, 0, self.prompt_len)
            prompts = ops.reshape(prompts, (self.prompts, self.group) + prompts.shape[1:]).sum(1)
        else:
            prompts = take(take(z, 0, 0, self.rows, self.group), 1, 0, self.prompt_len)
        responses = take(z, 1, self.prompt_len, self.prompt_len + self.response_len)
        rest = z.shape[2:]          # per-token values keep their axes: a sparse layer's routing (N, P + T, k)
        return ops.concat((ops.reshape(prompts, (-1,) + rest), ops.reshape(responses, (-1,) + rest)), 0)

    def prompt_heads(self, z):
        """(Q*P, heads, hd) -> (Q, heads, P, hd)."""
        return swap_middle(ops.reshape(z, (self.prompts, self.prompt_len, -1, self.head_dim)))

    def response_heads(self, z):
        """(N*T, heads, hd) -> (N, heads, T, hd)."""
        return swap_middle(ops.reshape(z, (self.rows, self.response_len, -1, self.head_dim)))


# ---- attention's variants (the whole-rows one is Attention.construct) ------------------------------------
def shared_prompt_attention(attn, x, cos, sin, bias_p, bias_r, split):
    """Attention over a token matrix laid out as `split` says (SharedPrompt): each group's prompt tokens
    attend among themselves, each sample's response tokens to its group's prompt keys and its own.
    x (M, H), cos/sin (M, 1, hd), bias_p (Q, 1, P, P), bias_r (N, 1, T, P + T) -> (M, H)."""
    m = x.shape[0]
    q = attn.rotary_q(attn.q_layernorm(ops.reshape(attn.wq(x), (m, attn.nh, attn.hd))), cos, sin)
    k = attn.rotary(attn.k_layernorm(ops.reshape(attn.wk(x), (m, attn.nkv, attn.hd))), cos, sin)
    v = ops.reshape(attn.wv(x), (m, attn.nkv, attn.hd))
    cut = split.prompt_tokens
    k_p, v_p = split.prompt_heads(take(k, 0, 0, cut)), split.prompt_heads(take(v, 0, 0, cut))
    out_p = attn.attend_heads(split.prompt_heads(take(q, 0, 0, cut)), k_p, v_p, bias_p)
    # (N, nkv, P + T, hd): the group's prompt keys, then the row's own
    keys = ops.concat((_repeat_rows(k_p, split.group), split.response_heads(take(k, 0, cut, m))), 2)
    values = ops.concat((_repeat_rows(v_p, split.group), split.response_heads(take(v, 0, cut, m))), 2)
    out_r = attn.attend_heads(split.response_heads(take(q, 0, cut, m)), keys, values, bias_r)
    width = attn.nh * attn.hd
    return attn.wo(ops.concat((ops.reshape(out_p, (cut, width)), ops.reshape(out_r, (m - cut, width))), 0))


def prefill_attention(attn, x, cos, sin, bias, cache_k, cache_v, n_samples):
    """Full-prompt attention that also fills the KV cache, each prompt's entries copied n_samples times.

    cache_k/v: Parameters (B*n, nkv, L, hd), the layout attention reads, so decode never transposes them.
    """
    q, k, v = attn.project_qkv(x, cos, sin)
    ops.assign(cache_k, _cache_rows(k, n_samples, cache_k.shape[2]))
    ops.assign(cache_v, _cache_rows(v, n_samples, cache_v.shape[2]))
    return attn.attend(q, k, v, bias)


def decode_attention(attn, x, cos, sin, bias, cache_k, cache_v):
    """One new token per sequence against its cache and itself: bias (N, 1, 1, L) masks the cache slots the
    token must not see, its own slot included; its own key joins as an (L+1)-th score of one softmax. The
    cache is only read here: the caller adds the returned k/v (N, nkv, 1, hd) into it (decode)."""
    q, k, v = attn.project_qkv(x, cos, sin)                       # q (N, nh, 1, hd), k/v (N, nkv, 1, hd)
    n, length = q.shape[0], cache_k.shape[2]
    qg = ops.reshape(q, (n, attn.nkv, attn.rep, attn.hd))
    scores = ops.concat((BMM_NT(qg, cache_k), BMM_NT(qg, k)), 3)     # (N, nkv, rep, L + 1), q scaled
    scores = ops.cast(ops.reshape(scores, (n, attn.nh, 1, length + 1)), attn.softmax_dtype)
    bias = ops.concat((bias, ops.zeros((n, 1, 1, 1), bias.dtype)), 3)
    probs = ops.cast(attn.softmax(scores + expand_as(bias, scores)), v.dtype)
    probs = ops.reshape(probs, (n, attn.nkv, attn.rep, length + 1))
    out = BMM(take(probs, 3, 0, length), cache_v) + BMM(take(probs, 3, length, length + 1), v)
    out = ops.reshape(swap_middle(ops.reshape(out, (n, attn.nh, 1, attn.hd))), (n, 1, attn.nh * attn.hd))
    return attn.wo(out), k, v


def _repeat_rows(x, n: int):
    """x (B, ...) -> (B*n, ...): each row repeated n times in place (row i*n + j is row i); the backward sums
    the n copies' gradients."""
    shape = x.shape
    rows = ops.broadcast_to(ops.expand_dims(x, 1), (shape[0], n) + shape[1:])
    return ops.reshape(rows, (shape[0] * n,) + shape[1:])


def _cache_rows(kv, n_samples, cache_len):
    """kv (B, nkv, P, hd) -> (B*n, nkv, L, hd): each prompt's rows repeated n times, zero-padded to L."""
    rows = _repeat_rows(kv, n_samples)
    n, nkv, p, hd = rows.shape
    return ops.concat((rows, ops.zeros((n, nkv, cache_len - p, hd), rows.dtype)), 2)


# ---- each path of a layer as a cell compiled once per model ----------------------------------------------
class _LayerPath(nn.Cell):
    @reused
    def __init__(self, layer: nn.Cell, reuse_key: str):
        super().__init__(auto_prefix=False)
        self.layer = layer
        self.reuse_key = reuse_key


class WholeRows(_LayerPath):
    """DecoderLayer.construct: x (B, T, H)."""

    def construct(self, x, cos, sin, bias):
        return self.layer(x, cos, sin, bias)


class WholeRowsRouted(_LayerPath):
    """A sparse layer on whole rows with its routing inputs (DecoderModel.routing_inputs): replay (B, T, k) the
    experts to replay (-1: its own), router_grad (B, T, E) the aux loss's gradient."""

    def construct(self, x, cos, sin, bias, replay, router_grad):
        return self.layer(x, cos, sin, bias, replay, router_grad)


class SharedPromptRows(_LayerPath):
    """The layer on a shared-prompt token matrix, x (M, H); its layout (SharedPrompt) follows from the biases:
    bias_p (Q, 1, P, P), bias_r (N, 1, T, P + T)."""

    def construct(self, x, cos, sin, bias_p, bias_r):
        return shared_prompt_layer(self.layer, x, cos, sin, bias_p, bias_r)


class SharedPromptRouted(_LayerPath):
    """SharedPromptRows of a sparse layer with its routing inputs in the token matrix's order: replay (M, k),
    router_grad (M, E)."""

    def construct(self, x, cos, sin, bias_p, bias_r, replay, router_grad):
        return shared_prompt_layer(self.layer, x, cos, sin, bias_p, bias_r, replay, router_grad)


def shared_prompt_layer(layer, x, cos, sin, bias_p, bias_r, replay=None, router_grad=None):
    """SharedPromptRows' pass of `layer`, as a function (trainer/update/layerwise.py runs it outside the reused cell)."""
    rows = bias_r.shape[0]
    split = SharedPrompt(rows, rows // bias_p.shape[0], bias_p.shape[2], bias_r.shape[2], cos.shape[-1])
    h = x + shared_prompt_attention(layer.attention, layer.attention_input(x), cos, sin, bias_p, bias_r, split)
    return layer.mlp_residual(h, replay, router_grad)


class Prefill(_LayerPath):
    """The layer on the prompts, filling its KV cache; each prompt's cache rows are copied to cache rows /
    prompts samples. A sparse layer also returns the experts each prompt token went to (B x P, k), which the
    rollout records (router replay)."""

    def construct(self, x, cos, sin, bias, cache_k, cache_v):
        layer = self.layer
        h = x + prefill_attention(layer.attention, layer.attention_input(x), cos, sin, bias, cache_k, cache_v,
                                  cache_k.shape[0] // x.shape[0])
        return layer.mlp_residual_routed(h)[:2] if layer.is_moe else layer.mlp_residual(h)


class Decode(_LayerPath):
    """The layer on one new token per sequence, reading its KV cache: (what Prefill returns, the token's k, v),
    the k/v for the caller to write into the cache (decode)."""

    def construct(self, x, cos, sin, bias, cache_k, cache_v):
        layer = self.layer
        out, k, v = decode_attention(layer.attention, layer.attention_input(x), cos, sin, bias, cache_k, cache_v)
        h = x + out
        return (layer.mlp_residual_routed(h)[:2] if layer.is_moe else layer.mlp_residual(h)), k, v


class LayerGraphs:
    """The four paths of every layer of one model: `whole_rows[i]`, `shared_prompt[i]`, `prefill[i]`, `decode[i]`
    call layer i."""

    def __init__(self, layers: Sequence[nn.Cell]):
        # the layers of one model share each path's subgraph; Qwen3-MoE's sparse layers (other parameters)
        # share another
        keys = {kind: new_key("decoder layers" + kind) for kind in ("", " (MoE)")}
        key = [keys[" (MoE)" if getattr(layer, "is_moe", False) else ""] for layer in layers]
        self.whole_rows = tuple(WholeRows(layer, k) for layer, k in zip(layers, key))
        self.shared_prompt = tuple(SharedPromptRows(layer, k) for layer, k in zip(layers, key))
        # the sparse layers' paths with routing inputs (router replay, the aux loss; None at the dense layers)
        routed_key = new_key("decoder layers (MoE, routing inputs)")
        self.whole_rows_routed = tuple(WholeRowsRouted(layer, routed_key) if getattr(layer, "is_moe", False)
                                       else None for layer in layers)
        self.shared_prompt_routed = tuple(SharedPromptRouted(layer, routed_key)
                                          if getattr(layer, "is_moe", False) else None for layer in layers)
        self.prefill = tuple(Prefill(layer, k) for layer, k in zip(layers, key))
        self.decode = tuple(Decode(layer, k) for layer, k in zip(layers, key))


# ---- the model's paths through its layers -----------------------------------------------------------------
def shared_prompt_forward(decoder, input_ids, position_ids, bias, group: int, prompt_len: int, routing=None,
                          router_grad=None):
    """The final hidden states that predict the response tokens, (N, T + 1, H), of [prompt | response] rows
    (input_ids (N, P + T), bias (N, 1, P + T, P + T) as for `construct`) whose groups of `group` rows share
    their prompt: the prompt runs once per group (SharedPrompt). Position P - 1 (the prompt's last
    token, which predicts the first response token) is the group's, copied to its rows. Whole model
    only: no pipeline stages, no sequence parallelism. `routing` (N, P + T, sparse layers, k) and
    `router_grad` (N, P + T, E): the routing inputs (DecoderModel.routing_inputs); a shared prompt token's
    aux gradient is its rows' sum, as it stands for all of them."""
    if decoder.sp_pad != 1 or not (decoder.first and decoder.last):
        raise ValueError("a shared-prompt forward needs the whole model on one rank's sequence: no pipeline "
                         "stages, no sequence parallelism")
    tokens, cos, sin, bias_p, bias_r = layer_inputs(decoder, input_ids, position_ids, bias, group, prompt_len)
    x = embed(decoder, tokens)
    routing, router_grad = decoder.routing_inputs(input_ids.shape[0], input_ids.shape[1], routing, router_grad)
    if routing is not None:
        routing, router_grad = shared_prompt_routing(routing, router_grad, group, prompt_len)
    for i in range(len(decoder.layers)):
        sparse = decoder.sparse_index[i]
        if routing is not None and sparse >= 0:
            replay = layer_routing(routing, sparse)
            if decoder.reuse_layers:
                x = decoder.graphs.shared_prompt_routed[i](x, cos, sin, bias_p, bias_r, replay, router_grad)
            else:
                x = shared_prompt_layer(decoder.layers[i], x, cos, sin, bias_p, bias_r, replay, router_grad)
        elif decoder.reuse_layers:
            x = decoder.graphs.shared_prompt[i](x, cos, sin, bias_p, bias_r)
        else:                           # compiled layer by layer (DecoderModel.reuse_layers says why)
            x = shared_prompt_layer(decoder.layers[i], x, cos, sin, bias_p, bias_r)
    return final_hidden(decoder, x, input_ids.shape[0], group, prompt_len)


def shared_prompt_routing(routing, router_grad, group: int, prompt_len: int):
    """Routing inputs of [prompt | response] rows, (N, P + T, ...), in a shared-prompt token matrix's order (M, ...):
    SharedPrompt.tokens, the aux gradient of a prompt token summed over its group's rows (it stands for all)."""
    split = SharedPrompt(routing.shape[0], group, prompt_len, routing.shape[1] - prompt_len, 1)
    return split.tokens(routing), split.tokens(router_grad, sum_group=True)


def routed_forward(decoder, input_ids, position_ids, bias):
    """The experts each token of whole rows (B, T) goes to, (sparse layers, B, T, k), and the sparse layers'
    router logits (sparse layers, B, T, E) float32, from a forward of the layers up to the last sparse one
    (router replay's r2, the routing metrics, the aux loss's report); whole model on one stage."""
    return routed_stage(decoder, input_ids, position_ids, bias, to_the_end=False)[1:]


def routed_stage(decoder, x, position_ids, bias, to_the_end: bool = True):
    """A stage's routing pass: (the residual stream out, (sparse layers of this stage, B, T, k) experts, (...,
    E) router logits float32), x token ids on the first stage, else the stream in; `to_the_end` False stops
    after the stage's last sparse layer (its stream out is then not the stage's). Each layer compiled on its
    own: a pass once per step, not worth a reused subgraph of its own. Under sequence parallelism the sparse
    layers route the gathered sequence, padded (DecoderModel.sp_padded): the pad cut."""
    rows, length = position_ids.shape
    x, position_ids, bias, _, _ = decoder.sp_padded(x, position_ids, bias)
    if decoder.first:
        x = embed(decoder, x)
    cos, sin = decoder.rope(position_ids)
    experts, logits = [], []
    sparse = [i for i in range(len(decoder.layers)) if decoder.sparse_index[i] >= 0]
    for i in range(len(decoder.layers) if to_the_end else sparse[-1] + 1):
        layer = decoder.layers[i]
        h = x + layer.attention(layer.attention_input(x), cos, sin, bias)
        if decoder.sparse_index[i] >= 0:
            x, chosen, router = layer.mlp_residual_routed(h)
            experts.append(chosen)
            logits.append(router)
        else:
            x = layer.mlp_residual(h)

    def per_row(z):             # (sparse layers, B x T', ...) -> (sparse layers, B, T, ...)
        z = ops.stack(z)
        return take(ops.reshape(z, (z.shape[0], rows, -1, z.shape[-1])), 2, 0, length)
    return x, per_row(experts), per_row(logits)


def layer_routing(routing, sparse_index: int):
    """routing (..., sparse layers, k) -> one sparse layer's (..., k)."""
    one = take(routing, len(routing.shape) - 2, sparse_index, sparse_index + 1)
    return ops.reshape(one, one.shape[:-2] + one.shape[-1:])


def layer_inputs(decoder, input_ids, position_ids, bias, group: int = 0, prompt_len: int = 0):
    """What a pass reads besides the residual stream: (token ids, cos, sin, bias, bias_r). Whole rows (group 0):
    the ids as they are, cos/sin (B, 1, T, hd), the bias, and the bias again (unused). Rows sharing their
    group's prompt: the token matrix's ids (SharedPrompt.tokens), cos/sin (M, 1, hd), bias_p (Q, 1, P, P) and
    bias_r (N, 1, T, P + T), as SharedPromptRows reads them."""
    if not group:
        cos, sin = decoder.rope(position_ids)
        return input_ids, cos, sin, bias, bias
    rows, length = input_ids.shape
    split = SharedPrompt(rows, group, prompt_len, length - prompt_len, decoder.cos_table.shape[-1])
    pos = split.tokens(position_ids)
    cos = ops.expand_dims(ops.gather(decoder.cos_table, pos, 0), 1)                    # (M, 1, hd)
    sin = ops.expand_dims(ops.gather(decoder.signed_sin_table, pos, 0), 1)
    bias_p = take(take(take(bias, 0, 0, rows, group), 2, 0, prompt_len), 3, 0, prompt_len)
    bias_r = take(bias, 2, prompt_len, length)
    return split.tokens(input_ids), cos, sin, bias_p, bias_r


def embed(decoder, tokens):
    """Token ids -> the residual stream's first state, in the compute dtype."""
    return ops.cast(decoder.tok_embeddings(tokens), decoder.compute_dtype)


def final_hidden(decoder, x, rows: int, group: int = 0, prompt_len: int = 0):
    """The last layer's stream -> the normed hidden states the head reads: whole rows as they are; a
    shared-prompt token matrix (M, H) -> (N, T + 1, H), the group prompt's last position copied to its rows."""
    if not group:
        return decoder.norm_out(x)
    hidden = x.shape[-1]
    prompt_tokens = rows // group * prompt_len
    response_len = (x.shape[0] - prompt_tokens) // rows
    last = take(x, 0, prompt_len - 1, prompt_tokens, prompt_len)                          # (Q, H)
    responses = ops.reshape(take(x, 0, prompt_tokens, x.shape[0]), (rows, response_len, hidden))
    last = ops.reshape(last, (rows // group, 1, hidden))
    return decoder.norm_out(ops.concat((_repeat_rows(last, group), responses), 1))


def prefill(decoder, input_ids, position_ids, bias, caches_k, caches_v):
    """The prompts (B, P) through every layer, each layer's cache (B * n, nkv, L, hd) filled with each prompt's
    keys/values copied to its n samples' rows. Returns (final hidden states, the experts each token went to,
    (sparse layers, B x P, k), or None for a dense model)."""
    return _cached_pass(decoder, decoder.graphs.prefill, input_ids, position_ids, bias, caches_k, caches_v, False)


def decode(decoder, input_ids, position_ids, bias, caches_k, caches_v):
    """One token per row through every layer, bias (N, 1, 1, L) over the cache slots it may read (not the one
    it will be written to). Returns what prefill returns and each layer's new k/v, (N, nkv, 1, hd) each, for
    write_decoded; the caches are only read here."""
    return _cached_pass(decoder, decoder.graphs.decode, input_ids, position_ids, bias, caches_k, caches_v, True)


def write_decoded(caches_k, caches_v, new_kv, kv_index, kv_keep):
    """Each layer's new k/v (decode's), times kv_keep (N, 1, 1, 1: 0 for a row whose write must not land), added
    at kv_index (N * nkv, 3: row, kv head, slot) of its cache, a slot that holds zeros until then (prefill
    zeroes every slot past the prompt; GenerationEngine writes each slot once). An add, not an update:
    MindSpore 2.10's CPU ScatterNdUpdate copies the whole cache per call, ScatterNdAdd does not. Placed after
    every read of the step's graph: a write between two reads of one weight (the tied embedding and head)
    makes the graph copy that weight (docs/BENCHMARKS.md, bench_floors.py)."""
    for i, (k, v) in enumerate(new_kv):
        rows = k.shape[0] * k.shape[1]
        keep = ops.cast(kv_keep, k.dtype)
        ops.scatter_nd_add(caches_k[i], kv_index, ops.reshape(k * keep, (rows, k.shape[-1])))
        ops.scatter_nd_add(caches_v[i], kv_index, ops.reshape(v * keep, (rows, v.shape[-1])))


def _cached_pass(decoder, layers, input_ids, position_ids, bias, caches_k, caches_v, decoding: bool):
    """prefill's and decode's pass through `layers` (their Prefill or Decode cells)."""
    x = ops.cast(decoder.tok_embeddings(input_ids), decoder.compute_dtype)
    cos, sin = decoder.rope(position_ids)
    experts, new_kv = [], []
    for i in range(len(layers)):
        out = layers[i](x, cos, sin, bias, caches_k[i], caches_v[i])
        if decoding:
            out, k, v = out
            new_kv.append((k, v))
        if decoder.sparse_index[i] >= 0:
            x = out[0]
            experts.append(out[1])
        else:
            x = out
    hidden, experts = decoder.norm_out(x), (ops.stack(experts) if experts else None)
    return (hidden, experts, new_kv) if decoding else (hidden, experts)
