"""Qwen2 / Qwen2.5 / Qwen3 / Llama decoder with explicit tensor parallelism.

One architecture covers all four: Qwen2 has q/k/v biases (`qkv_has_bias`), Llama and Qwen3 do not; Qwen3
RMS-normalises each head of q and k before RoPE (`qk_layernorm`) and sets its head width apart from
hidden / heads (`head_dim`); all use GQA, RoPE (rotate-half convention, as Hugging Face), RMSNorm and a
SwiGLU MLP. Parameter names follow MindFormers (`model.layers.0.attention.wq.weight`, ...) so checkpoints
travel between the projects.

Shapes: B batch, T query length, S key length, H hidden, nh/nkv local heads on this TP rank, hd head dim,
Vl = vocab/tp. The residual stream (B, T, H) is replicated across TP ranks.

Under pipeline parallelism (mesh.pp > 1) a rank builds only its stage: a contiguous run of decoder layers
(configs.model_config.layer_split), the embedding on the first stage, the final norm and LM head on the
last. Parameter names keep the global layer index, so checkpoints and strategy files read the same.

Beside this file: layer_graphs.py holds the other execution paths (shared prompt, prefill, decode: attention's
variant of each, each path as a cell compiled once per model, the passes through the layers); cpu_cells.py
holds the ops written for MindSpore's CPU backend (norm, rotation, softmax with their backward by hand, the
batched matmul primitives); specs.py lists every parameter (shape, split, stage, layout) without building the
model; padding.py lays out inputs (left padding, positions, the causal bias).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import One, initializer

from mindrlhf.configs.lora import LoraSpec
from mindrlhf.configs.model_config import ModelConfig, ParallelConfig, layer_split
from mindrlhf.models.cpu_cells import BMM, BMM_NT, HalfRotation, LastAxisSoftmax, RMSNormFunction
from mindrlhf.models.graph_ops import expand_as, swap_middle, take
from mindrlhf.models.layer_graphs import LayerGraphs, layer_routing, routed_forward, shared_prompt_forward
from mindrlhf.models.moe import MoEFeedForward, load_balancing_loss
from mindrlhf.models.padding import NEG_INF
from mindrlhf.models.specs import mesh_layouts
from mindrlhf.models.lora import freeze_base, init_adapters
from mindrlhf.models.tp_layers import (MS_DTYPES, ColumnParallelLinear, HeadLogProb, RowParallelLinear, linear,
                                       VocabParallelEmbedding, VocabParallelLogProb)
from mindrlhf.models.tp_regions import GatherSeq, Identity, copy_to_tp, enter_tp, gather_from_tp
from mindrlhf.parallel.layouts import Layout, RoleWeights
from mindrlhf.parallel.mesh import Mesh

_NO_LORA = LoraSpec(1, 1.0, ())     # no layer carries an adapter


def _std(cfg: ModelConfig, random_init: bool) -> Optional[float]:
    """The weights' init std; None: zeros (tp_layers), for weights loaded next."""
    return cfg.initializer_range if random_init else None




class RMSNorm(nn.Cell):
    """`sequence_parallel_mesh`: under sequence parallelism each TP rank normalises its part of the sequence,
    so its weight gradient is partial; the weight enters through copy_to_tp, whose backward sums them.
    `split_rows_mesh`: the same for a norm whose rows are always split over TP ranks (q/k norms: each rank
    normalises its own heads with the replicated weight)."""

    def __init__(self, dim, eps, param_dtype, compute_dtype=ms.float32, sequence_parallel_mesh=None,
                 split_rows_mesh=None):
        super().__init__()
        self.weight = Parameter(initializer(One(), (dim,), param_dtype), name="weight")
        self.norm = RMSNormFunction(eps, compute_dtype)
        sp = sequence_parallel_mesh is not None and sequence_parallel_mesh.seq_parallel
        mesh = sequence_parallel_mesh if sp else split_rows_mesh
        self.enter_weight = copy_to_tp(mesh) if mesh is not None else Identity()

    def construct(self, x):
        return self.norm(x, self.enter_weight(self.weight))


def rope_tables(head_dim: int, max_positions: int, theta: float,
                scaling: Optional[Dict[str, float]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """cos/sin tables (max_positions, head_dim), computed in float32 as Hugging Face does; `scaling` is Llama
    3's RoPE scaling (ModelConfig.scaling_factor with extend_method LLAMA3), None for plain RoPE."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    inv_freq = inv_freq.astype(np.float32)
    if scaling is not None:
        inv_freq = llama3_inv_freq(inv_freq, **scaling)
    freqs = np.arange(max_positions, dtype=np.float32)[:, None] * inv_freq[None, :].astype(np.float32)
    emb = np.concatenate([freqs, freqs], axis=-1).astype(np.float32)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def llama3_inv_freq(inv_freq: np.ndarray, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_max_position_embeddings: float) -> np.ndarray:
    """Llama 3.x RoPE scaling: wavelengths longer than the original context / low_freq_factor are divided by
    `factor`, shorter than context / high_freq_factor kept, those between interpolated smoothly."""
    f32 = np.float32
    context = f32(original_max_position_embeddings)
    wavelen = f32(2 * np.pi) / inv_freq
    scaled = np.where(wavelen > context / f32(low_freq_factor), inv_freq / f32(factor), inv_freq).astype(f32)
    smooth = (context / wavelen - f32(low_freq_factor)) / f32(high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / f32(factor) + smooth * scaled
    medium = ~(wavelen < context / f32(high_freq_factor)) & ~(wavelen > context / f32(low_freq_factor))
    return np.where(medium, smoothed, scaled).astype(f32)


def rope_swap(head_dim: int) -> Tuple[np.ndarray, np.ndarray]:
    """(index, sign) with x[..., index] * sign == rotate_half(x) == concat(-x[..., half:], x[..., :half])."""
    half = head_dim // 2
    index = np.concatenate([np.arange(half, head_dim), np.arange(half)]).astype(np.int32)
    sign = np.concatenate([-np.ones(half), np.ones(half)]).astype(np.float32)
    return index, sign


def apply_rope(x, cos, signed_sin, rotate: HalfRotation):
    """x (..., hd) * cos + rotate_half(x) * sin, with rotate_half(x) * sin written as rotate(x) * signed_sin
    (x[..., swap] by HalfRotation; sin times rope_swap's sign, folded into the table): one gather instead of
    two slices and a concat, which compile and run several times slower on CPU (docs/BENCHMARKS.md,
    "Measurements behind code choices")."""
    return x * expand_as(cos, x) + rotate(x) * expand_as(signed_sin, x)


class Attention(nn.Cell):
    def __init__(self, cfg: ModelConfig, mesh: Mesh, lora: Optional[LoraSpec] = None, random_init: bool = True):
        super().__init__()
        pdt, cdt = MS_DTYPES[cfg.param_init_type], MS_DTYPES[cfg.compute_dtype]
        self.hd = cfg.head_dim          # not always hidden / heads (Qwen3-8B: 4096 hidden, 32 heads of 128)
        self.nh = cfg.num_heads // mesh.tp
        self.nkv = cfg.n_kv_heads // mesh.tp
        self.rep = self.nh // self.nkv
        std = _std(cfg, random_init)
        on = (lora or _NO_LORA).on
        self.wq = ColumnParallelLinear(cfg.hidden_size, cfg.num_heads * self.hd, mesh, cfg.qkv_has_bias,
                                       pdt, cdt, std, on("wq"))
        self.wk = ColumnParallelLinear(cfg.hidden_size, cfg.n_kv_heads * self.hd, mesh, cfg.qkv_has_bias,
                                       pdt, cdt, std, on("wk"))
        self.wv = ColumnParallelLinear(cfg.hidden_size, cfg.n_kv_heads * self.hd, mesh, cfg.qkv_has_bias,
                                       pdt, cdt, std, on("wv"))
        self.wo = RowParallelLinear(cfg.num_heads * self.hd, cfg.hidden_size, mesh, False, pdt, cdt, std, on("wo"))
        # Qwen3: each head of q and k RMS-normed over hd before RoPE, one (hd,) weight each, replicated over TP
        ndt = MS_DTYPES[cfg.layernorm_compute_type]
        self.q_layernorm = RMSNorm(self.hd, cfg.rms_norm_eps, pdt, ndt, split_rows_mesh=mesh) \
            if cfg.qk_layernorm else Identity()
        self.k_layernorm = RMSNorm(self.hd, cfg.rms_norm_eps, pdt, ndt, split_rows_mesh=mesh) \
            if cfg.qk_layernorm else Identity()
        self.qk_norm = cfg.qk_layernorm
        self.scale = 1.0 / float(np.sqrt(self.hd))
        self.rotate = HalfRotation(rope_swap(self.hd)[0])
        self.softmax_dtype = MS_DTYPES[cfg.softmax_compute_type]
        self.softmax = LastAxisSoftmax()

    def project_qkv(self, x, cos, sin):
        """x (B, T, H) -> q (B, nh, T, hd), k/v (B, nkv, T, hd), q/k normed (qk_layernorm), RoPE applied, q
        scaled by 1 / sqrt(hd) (rotary_q)."""
        b, t, _ = x.shape
        q = swap_middle(self.head_norm(self.q_layernorm, self.wq(x), b, t, self.nh))
        k = swap_middle(self.head_norm(self.k_layernorm, self.wk(x), b, t, self.nkv))
        v = swap_middle(ops.reshape(self.wv(x), (b, t, self.nkv, self.hd)))
        cos = ops.cast(cos, q.dtype)
        sin = ops.cast(sin, q.dtype)
        return self.rotary_q(q, cos, sin), self.rotary(k, cos, sin), v

    def head_norm(self, norm, y, b: int, t: int, heads: int):
        """(B, T, heads * hd) -> (B, T, heads, hd), each head RMS-normed (qk_layernorm; Identity otherwise). In a
        decode step (T 1) each head goes through the norm as a position of its own, (B x heads, 1, hd): the same
        values, with the norm's broadcasts left implicit (graph_ops.expand_as), fewer kernels per token."""
        if t == 1 and self.qk_norm:
            return ops.reshape(norm(ops.reshape(y, (b * heads, 1, self.hd))), (b, t, heads, self.hd))
        return norm(ops.reshape(y, (b, t, heads, self.hd)))

    def attend(self, q, k, v, bias):
        """q (B, nh, T, hd), k/v (B, nkv, S, hd), bias (B, 1, T, S) additive -> (B, T, H) after wo."""
        return self.wo(self.attend_heads(q, k, v, bias))

    def attend_heads(self, q, k, v, bias):
        """attend before wo: the heads' outputs side by side, (B, T, nh * hd)."""
        b, _, t, _ = q.shape
        s = k.shape[2]
        # GQA without materialising repeated k/v: group query heads by their kv head.
        qg = ops.reshape(q, (b, self.nkv, self.rep * t, self.hd))
        scores = BMM_NT(qg, k)                                  # (B, nkv, rep*T, S), q already scaled (rotary_q)
        scores = ops.reshape(scores, (b, self.nh, t, s))
        scores = ops.cast(scores, self.softmax_dtype)
        scores = scores + expand_as(bias, scores)
        probs = ops.cast(self.softmax(scores), v.dtype)
        out = BMM(ops.reshape(probs, (b, self.nkv, self.rep * t, s)), v)   # (B, nkv, rep*T, hd)
        out = swap_middle(ops.reshape(out, (b, self.nh, t, self.hd)))
        return ops.reshape(out, (b, t, self.nh * self.hd))

    def rotary(self, x, cos, sin):
        return apply_rope(x, cos, sin, self.rotate)

    def rotary_q(self, q, cos, sin):
        """RoPE on q, times 1 / sqrt(hd) through the tables (T x hd products): the scores need no scaling of
        their own, a product per score (T x S per head) in the forward and again in the backward."""
        return apply_rope(q, cos * self.scale, sin * self.scale, self.rotate)

    def construct(self, x, cos, sin, bias):
        q, k, v = self.project_qkv(x, cos, sin)           # x (B, T, H) -> q (B, nh, T, hd), k/v (B, nkv, T, hd)
        return self.attend(q, k, v, bias)                  # softmax(q k^T + bias) v, q scaled; then wo: (B, T, H)

class FeedForward(nn.Cell):
    """SwiGLU: w2(silu(w1 x) * w3 x); w1 = gate_proj, w3 = up_proj, w2 = down_proj."""

    def __init__(self, cfg: ModelConfig, mesh: Mesh, lora: Optional[LoraSpec] = None, random_init: bool = True):
        super().__init__()
        pdt, cdt = MS_DTYPES[cfg.param_init_type], MS_DTYPES[cfg.compute_dtype]
        std = _std(cfg, random_init)
        on = (lora or _NO_LORA).on
        self.w1 = ColumnParallelLinear(cfg.hidden_size, cfg.intermediate_size, mesh, False, pdt, cdt, std, on("w1"))
        self.w3 = ColumnParallelLinear(cfg.hidden_size, cfg.intermediate_size, mesh, False, pdt, cdt, std, on("w3"))
        self.w2 = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, mesh, False, pdt, cdt, std, on("w2"))

    def construct(self, x):
        gate = self.w1(x)                                      # (B, T, H) -> (B, T, I/tp)
        return self.w2(gate * ops.sigmoid(gate) * self.w3(x))  # silu(gate) * up -> (B, T, H), summed over TP


class DecoderLayer(nn.Cell):
    def __init__(self, cfg: ModelConfig, mesh: Mesh, lora: Optional[LoraSpec] = None, random_init: bool = True,
                 layer_id: int = 0):
        super().__init__()
        pdt, ndt = MS_DTYPES[cfg.param_init_type], MS_DTYPES[cfg.layernorm_compute_type]
        self.attention_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pdt, ndt, mesh)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pdt, ndt, mesh)
        self.attention = Attention(cfg, mesh, lora, random_init)
        # Qwen3-MoE: routed experts where cfg.is_moe_layer (models/moe.py), the dense SwiGLU elsewhere
        self.is_moe = cfg.is_moe_layer(layer_id)
        self.feed_forward = MoEFeedForward(cfg, mesh, pdt, MS_DTYPES[cfg.compute_dtype], _std(cfg, random_init),
                                           lora) \
            if self.is_moe else FeedForward(cfg, mesh, lora, random_init)
        self.enter_attn = enter_tp(mesh)        # under sequence parallelism: gather the sequence
        self.enter_ffn = enter_tp(mesh)

    def construct(self, x, cos, sin, bias, replay=None, router_grad=None):
        # pre-norm residual block on the stream x (B, T, H); the other paths (layer_graphs.py) differ only
        # in how attention reads its keys. A sparse layer's routing inputs (models/moe.py): `replay` (B, T, k)
        # its experts per token, replayed (router replay; -1: its own), `router_grad` (B, T, E) the aux loss's
        # gradient with respect to its router probabilities
        h = x + self.attention(self.attention_input(x), cos, sin, bias)
        return self.mlp_residual(h, replay, router_grad)

    def attention_input(self, x):
        return self.enter_attn(self.attention_norm(x))

    def mlp_residual(self, h, replay=None, router_grad=None):
        if self.is_moe:
            return h + self.feed_forward(self.enter_ffn(self.ffn_norm(h)), replay, router_grad)
        return h + self.feed_forward(self.enter_ffn(self.ffn_norm(h)))

    def mlp_residual_routed(self, h):
        """mlp_residual, and of a sparse layer the experts each token went to (N, k) (MoEFeedForward.routed) and
        its router logits (N, E): the rollout's passes record the experts for router replay."""
        out, experts, logits = self.feed_forward.routed(self.enter_ffn(self.ffn_norm(h)))
        return h + out, experts, logits


class DecoderModel(nn.Cell):
    """Embedding, decoder layers and final norm (MindFormers' `model.*`); under PP, this stage's part."""

    def __init__(self, cfg: ModelConfig, mesh: Mesh, lora: Optional[LoraSpec] = None, random_init: bool = True):
        super().__init__()
        pdt = MS_DTYPES[cfg.param_init_type]
        self.compute_dtype = MS_DTYPES[cfg.compute_dtype]
        self.first, self.last = mesh.is_first_stage, mesh.is_last_stage
        self.sp_pad = mesh.tp if mesh.seq_parallel else 1   # the sequence is padded to a multiple of this
        self.layer_ids = layer_split(cfg.num_layers, mesh.pp, cfg.offset)[mesh.stage]
        # per layer of this stage: its index among the model's sparse layers (the routing axis router replay
        # reads), -1 for a dense layer
        sparse = cfg.sparse_layers
        self.sparse_index = tuple(sparse.index(n) if n in sparse else -1 for n in self.layer_ids)
        self.num_sparse, self.top_k, self.num_experts = len(sparse), cfg.num_experts_per_tok, cfg.num_experts
        if self.first:
            self.tok_embeddings = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, mesh, pdt,
                                                         _std(cfg, random_init))
        self.layers = nn.CellList([DecoderLayer(cfg, mesh, lora, random_init, n) for n in self.layer_ids])
        object.__setattr__(self, "graphs", LayerGraphs(self.layers))     # outside the cell tree: layer_graphs.py
        # A layer that sums a weight's gradient over the TP ranks inside it (a copy_to_tp on the weight: the
        # norms under sequence parallelism, Qwen3's q/k norms under TP) compiles on its own in the passes that
        # are differentiated: in the reused subgraph the compiled train step's gradients came out wrong (Qwen3
        # train tp2: grad norm 0.4% off, tests/test_qwen3_msrun.py; sequence parallelism dp2 x tp2: 1.4%,
        # tests/test_pipeline.py, slow). Prefill and decode, forward only, keep the reuse.
        self.reuse_layers = not (mesh.tp > 1 and (mesh.seq_parallel or cfg.qk_layernorm))
        if self.last:
            self.norm_out = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pdt, MS_DTYPES[cfg.layernorm_compute_type],
                                    mesh)
        cos, sin = rope_tables(cfg.head_dim, cfg.max_position_embedding, cfg.theta,
                               cfg.scaling_factor if cfg.extend_method == "LLAMA3" else None)
        rdt = MS_DTYPES[cfg.rotary_dtype]
        self.cos_table = Tensor(cos).astype(rdt)
        self.signed_sin_table = Tensor(sin * rope_swap(cfg.head_dim)[1]).astype(rdt)     # see apply_rope

    def rope(self, position_ids):
        """position_ids (B, T) -> cos / signed sin (B, 1, T, hd) (apply_rope)."""
        cos = ops.expand_dims(ops.gather(self.cos_table, position_ids, 0), 1)
        sin = ops.expand_dims(ops.gather(self.signed_sin_table, position_ids, 0), 1)
        return cos, sin

    def construct(self, input_ids, position_ids, bias, routing=None, router_grad=None):
        return self.stage_forward(input_ids, position_ids, bias, routing, router_grad)

    def routing_inputs(self, rows: int, length: int, routing=None, router_grad=None):
        """The sparse layers' routing inputs, both or neither: `routing` (rows, length, sparse layers, k) the
        experts to replay, -1 where a token routes itself (all of it when only `router_grad` is given), and
        `router_grad` (rows, length, E) the aux loss's gradient, zeros when only `routing` is given."""
        if routing is None and router_grad is None:
            return None, None
        if routing is None:
            routing = ops.fill(ms.int32, (rows, length, self.num_sparse, self.top_k), -1)
        if router_grad is None:
            router_grad = ops.zeros((rows, length, self.num_experts), ms.float32)
        return routing, router_grad

    def sp_padded(self, x, position_ids, bias, routing=None, router_grad=None):
        """Under sequence parallelism the sequence padded to a multiple of tp (_pad_sequence): token ids (on the
        first stage), positions, bias and the routing inputs; as they are otherwise."""
        pad = (-position_ids.shape[1]) % self.sp_pad
        if pad:
            position_ids, bias = _pad_sequence(position_ids, bias, pad)
            if self.first:
                x = ops.concat((x, ops.zeros((x.shape[0], pad), x.dtype)), 1)
            # the pad positions' experts: any (their outputs are never read); no aux gradient
            routing, router_grad = (None if z is None else ops.concat(
                (z, ops.zeros((z.shape[0], pad) + z.shape[2:], z.dtype)), 1) for z in (routing, router_grad))
        return x, position_ids, bias, routing, router_grad

    def stage_forward(self, x, position_ids, bias, routing=None, router_grad=None):
        """This stage's part of the forward: token ids (B, T) in on the first stage, else the residual stream
        (B, T, H); out the residual stream, normed on the last stage. Without PP: the whole model.
        `routing` (B, T, sparse layers, k): the experts to replay (router replay), None: the router's own;
        `router_grad` (B, T, E): the aux loss's gradient (routing_inputs)."""
        routing, router_grad = self.routing_inputs(position_ids.shape[0], position_ids.shape[1], routing,
                                                   router_grad)
        x, position_ids, bias, routing, router_grad = self.sp_padded(x, position_ids, bias, routing, router_grad)
        if self.first:
            x = ops.cast(self.tok_embeddings(x), self.compute_dtype)     # (B, T, H); under SP (B, T/tp, H)
        cos, sin = self.rope(position_ids)
        plain = self.graphs.whole_rows if self.reuse_layers else self.layers          # see reuse_layers
        routed = self.graphs.whole_rows_routed if self.reuse_layers else self.layers
        for i in range(len(self.layers)):
            if routing is not None and self.sparse_index[i] >= 0:
                x = routed[i](x, cos, sin, bias, layer_routing(routing, self.sparse_index[i]), router_grad)
            else:
                x = plain[i](x, cos, sin, bias)
        return self.norm_out(x) if self.last else x

def _pad_sequence(position_ids, bias, pad: int):
    """Sequence parallelism splits the sequence evenly over TP ranks: `pad` positions appended at the end.
    Real queries never see them (they are later than every real key), the pad queries see nothing."""
    b, t = position_ids.shape
    position_ids = ops.concat((position_ids, ops.zeros((b, pad), position_ids.dtype)), 1)
    bias = ops.concat((bias, ops.full((b, 1, t, pad), NEG_INF, dtype=bias.dtype)), 3)
    bias = ops.concat((bias, ops.full((b, 1, pad, t + pad), NEG_INF, dtype=bias.dtype)), 2)
    return position_ids, bias


class CausalLM(nn.Cell):
    """Decoder + LM head. `construct` returns this rank's vocabulary shard of the logits (B, T, Vl).
    With `lora`, the targeted layers carry adapters (initialised, models/lora.py) and only those train.
    `random_init` False: the base weights start as zeros, for a model whose weights are loaded or synced next."""

    def __init__(self, cfg: ModelConfig, mesh: Optional[Mesh] = None, lora: Optional[LoraSpec] = None,
                 random_init: bool = True):
        super().__init__()
        mesh = mesh or Mesh(1, 1, 0)
        ParallelConfig(data_parallel=mesh.data_parallel, model_parallel=mesh.tp, pipeline_stage=mesh.pp,
                       expert_parallel=mesh.ep, moe_tp_extend_ep=mesh.experts_over_tp).check_model(cfg)
        self.config = cfg
        self.mesh = mesh
        self.lora = lora
        self.model = DecoderModel(cfg, mesh, lora, random_init)
        self.tie = cfg.tie_word_embeddings
        # under sequence parallelism the final hidden states are gathered along the sequence first, whose
        # backward already sums over TP ranks: the head then needs no copy_to_tp
        self.gather_seq = GatherSeq(mesh.tp_group, mesh.tp, mesh.tp_index) if mesh.seq_parallel else Identity()
        self.enter_head = Identity() if mesh.seq_parallel else copy_to_tp(mesh)
        if not self.tie and mesh.is_last_stage:
            self.lm_head = ColumnParallelLinear(cfg.hidden_size, cfg.vocab_size, mesh, False,
                                                MS_DTYPES[cfg.param_init_type], MS_DTYPES[cfg.compute_dtype],
                                                _std(cfg, random_init))
        self.compute_dtype = MS_DTYPES[cfg.compute_dtype]
        # one TP rank holds the whole vocabulary: the head and the log-prob in one cell with its own backward
        self.head_in_logprob = mesh.tp == 1
        self.logprob_fn = (HeadLogProb(self.compute_dtype) if self.head_in_logprob
                           else VocabParallelLogProb(cfg.vocab_size, mesh))
        self.gather_vocab = gather_from_tp(mesh)
        if mesh.pp > 1:
            _global_layer_names(self, self.model.layer_ids.start)
        if lora is not None:
            init_adapters(self, lora)
            freeze_base(self)

    def head(self, hidden):
        hidden = self.enter_head(hidden)
        if self.tie:
            return linear(hidden, self.model.tok_embeddings.embedding_weight, self.compute_dtype)
        return self.lm_head(hidden)

    def construct(self, input_ids, position_ids, bias):
        return self.head(self.whole_sequence(self.model(input_ids, position_ids, bias), input_ids.shape[1]))

    def whole_sequence(self, hidden, length: int):
        """The final hidden states of all `length` positions: under sequence parallelism gathered from the TP
        ranks' parts (padding dropped); otherwise they already are."""
        if self.mesh.seq_parallel:
            hidden = take(self.gather_seq(hidden), 1, 0, length)
        return hidden

    def activation_shape(self, rows: int, length: int) -> Tuple[int, int, int]:
        """The residual stream one pipeline stage passes to the next for `rows` sequences of `length`."""
        if self.mesh.seq_parallel:
            length = -(-length // self.mesh.tp)
        return rows, length, self.config.hidden_size

    def layouts(self) -> Dict[str, Layout]:
        """Every parameter's layout in this model's mesh (under PP, also those other stages hold)."""
        return mesh_layouts(self.config, self.mesh, self.lora)

    def weights(self) -> RoleWeights:
        """This rank's parameters with their layouts: what a weight transfer (sync, export) needs."""
        return RoleWeights({p.name: p for p in self.get_parameters()}, self.layouts(), self.mesh.rank)

    def moe_aux_loss(self, input_ids, position_ids, bias, mask=None):
        """Qwen3-MoE's load-balancing loss over this model's sparse layers (models/moe.load_balancing_loss, as
        transformers' aux_loss with output_router_logits; `mask` (B, T) excludes padding), not times
        config.router_aux_loss_coef: a report (the GRPO update applies it: trainer/aux_loss.py). Whole model on
        one pipeline stage. 0.0 for a dense model."""
        if not self.config.num_experts:
            return Tensor(0.0, ms.float32)
        return load_balancing_loss(self.router_logits(input_ids, position_ids, bias), self.config.num_experts,
                                   self.config.num_experts_per_tok, None if mask is None else ops.reshape(mask, (-1,)))

    def router_logits(self, input_ids, position_ids, bias) -> list:
        """Each sparse layer's router logits (B x T, E) float32 (layer_graphs.routed_forward): for the aux loss
        and the expert-load report. Whole model on one pipeline stage."""
        logits = routed_forward(self.model, input_ids, position_ids, bias)[1]
        return [ops.reshape(logits[i], (-1, logits.shape[-1])) for i in range(logits.shape[0])]

    def full_logits(self, input_ids, position_ids, bias):
        """Logits over the whole vocabulary (gathers across TP): for tests and sampling only."""
        return self.gather_vocab(self(input_ids, position_ids, bias))

    def token_logprobs(self, input_ids, position_ids, bias, labels, last_n: int = 0, temperature: float = 1.0,
                       group: int = 0, prompt_len: int = 0, routing=None, router_grad=None):
        """Per-position log p(labels) and entropy (B, T) under softmax(logits / temperature),
        vocabulary-parallel; with last_n > 0 only for the last `last_n` positions (B, last_n), and the LM
        head never runs on the positions nobody reads (in GRPO, the prompt: the head is most of a small
        model's FLOPs and its largest activations). The head is linear without bias, so the temperature
        scales its input (hidden size) instead of the vocabulary-sized logits. With `group` > 0 the rows
        come in groups of that many sharing their first `prompt_len` tokens, and last_n = the rest + 1:
        the shared prompt runs once per group (layer_graphs.shared_prompt_forward). `routing` (B, T, sparse
        layers, k): a Qwen3-MoE's experts to replay instead of its router's top-k (router replay);
        `router_grad` (B, T, E): the aux loss's gradient (DecoderModel.routing_inputs)."""
        if group:
            if last_n != input_ids.shape[1] - prompt_len + 1:
                raise ValueError(f"a shared prompt of {prompt_len} tokens reads the last "
                                 f"{input_ids.shape[1] - prompt_len + 1} positions, not {last_n}")
            hidden = shared_prompt_forward(self.model, input_ids, position_ids, bias, group, prompt_len, routing,
                                           router_grad)
        else:
            hidden = self.model(input_ids, position_ids, bias, routing, router_grad)
        return self.logprobs_of_hidden(hidden, labels, last_n, temperature)

    def differentiate_entropy(self):
        """Let the entropy token_logprobs returns carry its gradient (an entropy bonus in the loss); otherwise it is
        a metric and the whole-vocabulary head's backward skips its vocabulary-sized terms (HeadLogProb)."""
        if self.head_in_logprob:
            self.logprob_fn.entropy_grad = True

    def logprobs_of_hidden(self, hidden, labels, last_n: int = 0, temperature: float = 1.0):
        """token_logprobs from the final (normed) hidden states: the last pipeline stage's part."""
        hidden = self.whole_sequence(hidden, labels.shape[1])
        if last_n:
            hidden, labels = last_positions(hidden, last_n), last_positions(labels, last_n)
        if temperature != 1.0:
            hidden = hidden * (1.0 / temperature)
        if self.head_in_logprob:
            weight = self.model.tok_embeddings.embedding_weight if self.tie else self.lm_head.weight
            return self.logprob_fn(hidden, weight, labels)[:2]
        return self.logprob_fn(self.head(hidden), labels)


def last_positions(x, n: int):
    """x[:, -n:] (graph_ops.take), and x itself when that is all of it."""
    return x if x.shape[1] == n else take(x, 1, x.shape[1] - n, x.shape[1])


def _global_layer_names(model: nn.Cell, first_layer: int):
    """A pipeline stage's layers are built as layers.0.. of its CellList; name their parameters by their
    global index (model.layers.{first_layer + i}.*), as the whole model and MindFormers do."""
    prefix = "model.layers."
    for p in model.get_parameters():
        if p.name.startswith(prefix):
            local, rest = p.name[len(prefix):].split(".", 1)
            p.name = f"{prefix}{first_layer + int(local)}.{rest}"
