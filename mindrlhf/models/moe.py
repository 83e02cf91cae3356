"""Qwen3-MoE's sparse MLP: a router and routed SwiGLU experts (transformers' Qwen3MoeSparseMoeBlock).

Router: logits = x W_r^T (no bias) in float32, softmax over the experts, the top `num_experts_per_tok`
kept (ties broken by the lower expert id, so every layout routes alike), renormalised to sum to 1 when
`norm_topk_prob`. Each expert is a SwiGLU MLP of width `moe_intermediate_size`; a token's output is the
routing-weighted sum of its experts' outputs.

Computed grouped, never a loop over tokens or experts: the experts' weights are stacked Parameters
(E, H, I) / (E, I, H) and every expert runs on every token (side by side in plain matmuls, or batched per expert
for a few tokens: ExpertsFFN), weighted by the (tokens, E) routing weights, which are zero off the top-k. Exact
(an unrouted expert's term is multiplied by 0 in the forward and gets 0 gradient) and simple, but E / top-k
times the expert FLOPs of a dispatch: right for the tiny E of CPU tests, wrong for Qwen3-30B-A3B's 128 experts. The alternative for large E is to sort the
(token, expert) pairs by expert, gather the tokens, run one grouped matmul over the groups and scatter-add
back (MindSpore's GroupedMatmul on Ascend; an all-to-all dispatcher under expert parallelism): not built yet.

Expert parallelism (the mesh's `ep` axis): each EP rank holds experts [i E/ep, (i+1) E/ep) and the EP ranks see the
same tokens (the all-gather dispatcher of Megatron, with the gather done by the data layout: an EP group's ranks
get the same rows: AllGatherDispatcher). The router runs replicated; each rank runs its experts on every token,
weighted by its columns of the routing weights, and the partial outputs are summed over the EP group (forward
all-reduce, backward identity); the inputs' gradients (tokens and routing weights) are summed the other way. The
collectives are this CPU backend's AllReduce on a subgroup. The price: attention runs on the same rows on every
EP rank.

Tensor parallelism (the `tp` axis, with or without sequence parallelism): each expert's intermediate width is split
over the TP ranks as the dense MLP's is (gate / up column-parallel, down row-parallel); the router runs replicated
on the layer's gathered tokens, and the partial outputs leave the TP region as the dense MLP's do (all-reduce, or
reduce-scatter along the sequence). With EP too, the EP sum comes first. MindSpeed-RL's `moe_tp_extend_ep` (the TP
ranks holding other experts instead of a share of each) is another layout of the same model.

An all-to-all dispatcher (each EP rank's attention on its own rows, tokens sent only to the ranks of their experts)
is what Ascend would use; it needs the data layout to give EP ranks distinct rows and an all-to-all this backend
lacks, so it is not built (nothing here could verify it).

Parameter names are MindFormers' (vllm-mindspore / MindFormers Qwen3-MoE and DeepSeek-V3 weight conversion):
`feed_forward.routed_experts.router.dense.weight` (E, H) and `feed_forward.routed_experts.ffn.w1/w3.weight`
(E, H, I), `...ffn.w2.weight` (E, I, H): stacked and transposed as MindFormers stores them (x @ W).

The load-balancing loss (Switch Transformer; transformers' load_balancing_loss_func): `load_balancing_loss`
below over every sparse layer's router logits. In the GRPO update its gradient enters the router probabilities
in the backward (AuxLossGradient; trainer/aux_loss.py says why that is exact and layout-invariant).
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, Zero, initializer

from mindrlhf.configs.model_config import ModelConfig
from mindrlhf.models.cpu_cells import BMM
from mindrlhf.models.graph_ops import take
from mindrlhf.models.tp_regions import CopyToTP, Identity, ReduceFromTP, ScaleGradient, copy_to_tp, leave_tp
from mindrlhf.parallel.mesh import Mesh

PREFIX = "routed_experts"


class Router(nn.Cell):
    """x (N, H) -> router logits (N, E), float32 (MindFormers' `router.dense`)."""

    def __init__(self, hidden: int, experts: int, param_dtype, std: Optional[float]):
        super().__init__()
        init = Normal(std) if std is not None else Zero()
        self.dense = nn.Cell()
        self.dense.weight = Parameter(initializer(init, (experts, hidden), param_dtype), name="weight")
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, x):
        return self.matmul(ops.cast(x, ms.float32), ops.cast(self.dense.weight, ms.float32))


class ExpertsFFN(nn.Cell):
    """This rank's E / ep stacked SwiGLU experts, each its I / tp share of the intermediate width: w1 = gate_proj,
    w3 = up_proj (E/ep, H, I/tp), w2 = down_proj (E/ep, I/tp, H)."""

    def __init__(self, cfg: ModelConfig, param_dtype, std: Optional[float], ep: int = 1, tp: int = 1):
        super().__init__()
        e, h, i = cfg.num_experts // ep, cfg.hidden_size, cfg.moe_intermediate_size // tp
        init = (lambda: Normal(std)) if std is not None else (lambda: Zero())
        self.w1 = nn.Cell()
        self.w1.weight = Parameter(initializer(init(), (e, h, i), param_dtype), name="weight")
        self.w3 = nn.Cell()
        self.w3.weight = Parameter(initializer(init(), (e, h, i), param_dtype), name="weight")
        self.w2 = nn.Cell()
        self.w2.weight = Parameter(initializer(init(), (e, i, h), param_dtype), name="weight")
        self.experts = e
        self.matmul = ops.MatMul()

    def construct(self, x, weights, compute_dtype):
        """x (N, H), weights (N, E/ep) of this rank's experts -> sum_e weights[:, e] * expert_e(x), (N, H).

        Two forms of the same dense FLOPs, picked by the token count (static in a graph):
        - many tokens (N >= 2 I: training, prefill): two plain matmuls over all experts side by side, gate / up =
          x @ [W_1 | ... | W_E] (N, E*I), and the routing-weighted sum of the down projections as one matmul,
          [w_1 h_1 | ... | w_E h_E] @ [W2_1; ...; W2_E]: no E copies of the tokens or outputs, at the price of a
          transposed copy of W1 and W3 per call;
        - few tokens (decode steps): a batched matmul per expert over the tokens broadcast E times, which is
          cheaper than transposing the weights for a handful of rows.
        Measured with benchmarks/bench_moe.py (docs/BENCHMARKS.md): our train tokens/s 903 batched, 983-1035 side
        by side; rollout against transformers 1.45x batched, 1.13x with every call side by side, 1.38x mixed."""
        n, h = x.shape
        e, i = self.experts, self.w1.weight.shape[2]
        if n < 2 * i:
            xe = ops.broadcast_to(ops.expand_dims(x, 0), (e, n, h))                               # (E, N, H)
            gate = BMM(xe, ops.cast(self.w1.weight, compute_dtype))                               # (E, N, I)
            up = BMM(xe, ops.cast(self.w3.weight, compute_dtype))
            y = BMM(gate * ops.sigmoid(gate) * up, ops.cast(self.w2.weight, compute_dtype))       # (E, N, H)
            w = ops.expand_dims(ops.transpose(ops.cast(weights, compute_dtype), (1, 0)), 2)       # (E, N, 1)
            return (y * w).sum(0)
        w1 = ops.reshape(ops.transpose(ops.cast(self.w1.weight, compute_dtype), (1, 0, 2)), (h, e * i))
        w3 = ops.reshape(ops.transpose(ops.cast(self.w3.weight, compute_dtype), (1, 0, 2)), (h, e * i))
        gate, up = self.matmul(x, w1), self.matmul(x, w3)                                      # (N, E*I)
        act = ops.reshape(gate * ops.sigmoid(gate) * up, (n, e, i)) * \
            ops.expand_dims(ops.cast(weights, compute_dtype), 2)                                # (N, E, I)
        return self.matmul(ops.reshape(act, (n, e * i)), ops.reshape(ops.cast(self.w2.weight, compute_dtype),
                                                                       (e * i, h)))


class RoutedExperts(nn.Cell):
    """The router and the experts under one name (MindFormers' `feed_forward.routed_experts`)."""

    def __init__(self, cfg: ModelConfig, param_dtype, std: Optional[float], ep: int = 1, tp: int = 1):
        super().__init__()
        self.router = Router(cfg.hidden_size, cfg.num_experts, param_dtype, std)
        self.ffn = ExpertsFFN(cfg, param_dtype, std, ep, tp)


def top_k_mask(probs, k: int):
    """(N, E) -> 1.0 where an expert is among the token's top k, else 0.0; of equal probabilities the lower
    expert id wins (deterministic, the same in every layout). Rank by counting: expert e's rank is how many
    experts beat it (E x E comparisons per token: fine for the E this dense path is for)."""
    e = probs.shape[-1]
    lower = Tensor(np.tril(np.ones((e, e), np.float32), -1))      # [e, j] = 1 when j < e
    pi = ops.expand_dims(probs, 2)                                  # (N, E, 1): expert e
    pj = ops.expand_dims(probs, 1)                                  # (N, 1, E): its rivals j
    beats = ops.cast(pj > pi, ms.float32) + ops.cast(pj == pi, ms.float32) * lower
    rank = beats.sum(2)
    return ops.stop_gradient(ops.cast(rank < k, ms.float32))


class AllGatherDispatcher(nn.Cell):
    """How tokens reach the experts of other EP ranks, the one interface a dispatcher fills: `dispatch` gives this
    rank's tokens and its experts' routing-weight columns, `combine` its experts' partial outputs summed into
    every token's output. Here the EP ranks already hold the same tokens (the data layout's all-gather), so
    dispatch is the identity whose backward sums the gradients over the EP group, and combine an all-reduce
    whose backward is the identity. With ep 1 both are the identity."""

    def __init__(self, mesh: Mesh, num_experts: int):
        super().__init__()
        self.ep = mesh.ep
        self.local = num_experts // self.ep
        self.first = mesh.index("ep") * self.local if self.ep > 1 else 0
        group = mesh.group("ep") if self.ep > 1 else None
        self.enter_tokens = CopyToTP(group) if self.ep > 1 else Identity()
        self.enter_weights = CopyToTP(group) if self.ep > 1 else Identity()
        self.leave = ReduceFromTP(group) if self.ep > 1 else Identity()

    def dispatch(self, x, weights):
        """x (N, H), weights (N, E) -> this rank's (tokens, (N, E/ep) weights of its experts)."""
        if self.ep == 1:
            return x, weights
        return self.enter_tokens(x), take(self.enter_weights(weights), 1, self.first, self.first + self.local)

    def combine(self, y):
        return self.leave(y)


class MoEFeedForward(nn.Cell):
    """A sparse layer's MLP: x (..., H) -> (..., H), token by token. Experts split over the mesh's `ep` axis, each
    expert's intermediate width over `tp` (see the module's docstring). Called inside the layer's TP region
    (DecoderLayer.enter_ffn: the tokens replicated over TP, their gradients summed on the way out) and leaves it
    itself (all-reduce, or reduce-scatter along the sequence under sequence parallelism), as the dense MLP's
    row-parallel projection does."""

    def __init__(self, cfg: ModelConfig, mesh: Mesh, param_dtype, compute_dtype, std: Optional[float]):
        super().__init__()
        self.routed_experts = RoutedExperts(cfg, param_dtype, std, mesh.ep, mesh.tp)
        self.dispatcher = AllGatherDispatcher(mesh, cfg.num_experts)
        # Under TP every rank routes the same tokens alike and runs its share of each expert's width: the routing
        # weights' gradients are partial per rank (summed by enter_weights), the router's input gradient then
        # full on every rank, so it enters the region's sum scaled by 1 / tp (router_input)
        self.router_input = ScaleGradient(1.0 / mesh.tp) if mesh.tp > 1 else Identity()
        self.enter_weights = copy_to_tp(mesh)
        self.leave = leave_tp(mesh)
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.compute_dtype = compute_dtype
        self.topk = ops.TopK()
        self.aux_gradient = AuxLossGradient()

    def route(self, x, replay=None, router_grad=None):
        """x (N, H) -> (router logits (N, E) float32, routing weights (N, E): zero off the chosen experts,
        chosen (N, E): 1.0 on them). The chosen experts are the top-k of the router's probabilities, or, under
        router replay, `replay` (N, k) expert ids recorded elsewhere (the rollout's pass; a token whose ids are
        -1 routes itself): the weights are then the router's probabilities of the replayed experts
        (renormalised as usual), so gradients still reach the router. `router_grad` (N, E): the load-balancing
        loss's gradient with respect to the router probabilities, added in the backward (AuxLossGradient)."""
        logits = self.routed_experts.router(self.router_input(x))
        probs = ops.softmax(logits, -1)
        if router_grad is not None:
            probs = self.aux_gradient(probs, router_grad)
        chosen = top_k_mask(probs, self.top_k)
        if replay is not None:
            own = ops.cast(replay[:, :1] < 0, ms.float32)
            chosen = own * chosen + replay_mask(replay, probs.shape[-1])
        weights = probs * chosen
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdims=True)
        return logits, weights, chosen

    def construct(self, x, replay=None, router_grad=None):
        """x (..., H): (B, T, H) for whole rows, (M, H) for a shared-prompt token matrix; `replay` (..., k) the
        expert ids to use instead of the router's top-k, `router_grad` (..., E) the aux loss's gradient (route)."""
        return self.routed(x, replay, router_grad)[0]

    def routed(self, x, replay=None, router_grad=None):
        """construct's output, the experts each token went to, (N, k) int32 ids (in no particular order: what
        the rollout records for router replay) and the router logits (N, E) float32."""
        shape = x.shape
        flat = ops.reshape(x, (-1, shape[-1]))
        logits, weights, chosen = self.route(flat, None if replay is None else ops.reshape(replay, (-1, self.top_k)),
                                        None if router_grad is None else ops.reshape(router_grad,
                                                                                     (-1, router_grad.shape[-1])))
        tokens, mine = self.dispatcher.dispatch(flat, self.enter_weights(weights))
        out = self.dispatcher.combine(self.routed_experts.ffn(tokens, mine, self.compute_dtype))
        return self.leave(ops.reshape(out, shape)), self.topk(chosen, self.top_k)[1], logits


class AuxLossGradient(nn.Cell):
    """The load-balancing loss's gradient joins the router probabilities' in the backward, its value stays out
    of the forward (Megatron's MoEAuxLossAutoScaler): probs (N, E) pass unchanged, their gradient gains
    `router_grad` (N, E). Exact because the loss is linear in the probabilities once the expert fractions are
    fixed (trainer/aux_loss.py computes them and the gradient)."""

    def construct(self, probs, router_grad):
        return probs

    def bprop(self, probs, router_grad, out, dout):
        return dout + router_grad, ops.zeros_like(router_grad)


def replay_mask(ids, num_experts: int):
    """(N, k) expert ids -> (N, E) float32, 1.0 on each token's k experts, none for ids -1 (no gradient: a
    choice, not a value)."""
    hot = ops.one_hot(ops.cast(ids, ms.int32), num_experts, Tensor(1.0, ms.float32), Tensor(0.0, ms.float32))
    return ops.stop_gradient(hot.sum(1))


def load_balancing_loss(router_logits: List, num_experts: int, top_k: int, mask=None):
    """transformers' load_balancing_loss_func: over all sparse layers' router logits (each (N, E)) together,
    E * sum_e f_e * P_e with f_e the fraction of (token, top-k slot) assignments to expert e per token and
    P_e the mean router probability, both over the tokens of every layer (weighted by `mask` (N,) when given:
    padding excluded). Not times router_aux_loss_coef: the GRPO update applies it (trainer/aux_loss.py)."""
    counts, prob_sum, rows = 0.0, 0.0, 0.0
    for logits in router_logits:
        probs = ops.softmax(ops.cast(logits, ms.float32), -1)
        chosen = top_k_mask(probs, top_k)
        m = ops.ones((probs.shape[0], 1), ms.float32) if mask is None else ops.reshape(ops.cast(mask, ms.float32),
                                                                                       (-1, 1))
        counts = counts + (chosen * m).sum(0)
        prob_sum = prob_sum + (probs * m).sum(0)
        rows = rows + m.sum()
    return (counts / rows * (prob_sum / rows)).sum() * num_experts


def expert_load(router_logits: List, top_k: int, mask=None) -> np.ndarray:
    """(sparse layers, E) tokens routed to each expert (top-k, ties to the lower id as the model routes) over the
    tokens where `mask` (B x T,) is 1: expert load balance as a report (max / mean per layer), from
    CausalLM.router_logits."""
    out = []
    for logits in router_logits:
        probs = ops.softmax(ops.cast(logits, ms.float32), -1)
        chosen = top_k_mask(probs, top_k).asnumpy()
        keep = np.ones(len(chosen), bool) if mask is None else np.asarray(mask).reshape(-1).astype(bool)
        out.append(chosen[keep].sum(0))
    return np.asarray(out)
