"""Qwen3-MoE's sparse MLP: a router and routed SwiGLU experts (transformers' Qwen3MoeSparseMoeBlock).

Router: logits = x W_r^T (no bias) in float32, softmax over the experts, the top `num_experts_per_tok`
kept (ties broken by the lower expert id, so every layout routes alike), renormalised to sum to 1 when
`norm_topk_prob`. Each expert is a SwiGLU MLP of width `moe_intermediate_size`; a token's output is the
routing-weighted sum of its experts' outputs.

Computed grouped, never a loop over tokens or experts; the experts' weights are stacked Parameters
(E, H, I) / (E, I, H), and ExpertsFFN runs them in one of two exact forms, the cheaper for the call's shapes
(`moe_expert_compute` "auto"; "dense" / "sorted" force one):
- dense: every expert on every token (side by side in plain matmuls, or batched per expert for a few tokens),
  weighted by the (tokens, E) routing weights, which are zero off the top-k: E / top-k times a dispatch's FLOPs;
- sorted: the (token, expert) pairs sorted by expert into one buffer whose groups are padded to a block size
  (the buffer's size is static: tokens x top-k + E x (block - 1) rows at most), each block runs its expert as
  one batched matmul over the blocks (each block's weights gathered), and each token's output is the sum of its
  rows, routing-weighted. The rows a dispatch computes, plus the padding, at the price of gathering a block's
  weights (MindSpore's GroupedMatmul does this without padding on Ascend: not used here). Tokens move into the
  buffer and back by gathers whose backward is the other move's gather (MoveRows), never a scatter-add.

Expert parallelism (the mesh's `ep` axis): each EP rank holds experts [i E/ep, (i+1) E/ep) and the EP ranks see the
same tokens (the all-gather dispatcher of Megatron, with the gather done by the data layout: an EP group's ranks
get the same rows: AllGatherDispatcher). The router runs replicated; each rank runs its experts on every token,
weighted by its columns of the routing weights, and the partial outputs are summed over the EP group (forward
all-reduce, backward identity); the inputs' gradients (tokens and routing weights) are summed the other way. The
collectives are this CPU backend's AllReduce on a subgroup. The price: attention runs on the same rows on every
EP rank, and a rank's expert work is sized for the worst case, every one of a token's top-k among its experts
(static shapes, nothing dropped: sorted_capacity), so EP divides the experts' memory, not their compute.

Tensor parallelism (the `tp` axis, with or without sequence parallelism): each expert's intermediate width is split
over the TP ranks as the dense MLP's is (gate / up column-parallel, down row-parallel); the router runs replicated
on the layer's gathered tokens, and the partial outputs leave the TP region as the dense MLP's do (all-reduce, or
reduce-scatter along the sequence). With EP too, the EP sum comes first. With `moe_tp_extend_ep` (MindSpeed's name;
Megatron's expert_tensor_parallel_size 1: mesh.experts_over_tp) the TP ranks hold other whole experts instead: the
experts split over ep x tp (rank share ep_index x tp + tp_index), each rank runs its experts at full width on the
layer's tokens, and the same TP exit sums the ranks' outputs. This is how Megatron lays out EP larger than the
data-parallel ranks (its EP folded onto the TP ranks).

The all-to-all dispatcher (Mesh.ep_dispatcher "alltoall", Megatron's moe_token_dispatcher_type of that name:
AllToAllDispatcher) is the other way: the EP ranks hold distinct rows, so attention's work divides over them too;
each rank routes its own tokens, sends them to its EP peers with the routing weights of each peer's experts, runs
its experts on what every peer sent, and sends the outputs back, where each token's partial outputs are summed.
Shapes are static, so every token goes to every peer (worst case, nothing dropped: the weights are zero off a
peer's experts) and the exchange moves as many rows as an all-gather; sending only the routed rows needs an
AlltoAllV with counts (dynamic shapes; not written). The exchange is MindSpore's AlltoAll on Ascend (written,
unverified: this CPU backend has none) and the same exchange composed from AllReduce on CPU, where the model's
values and gradients are checked against one process (tests/test_qwen3_moe_ep.py). The GRPO trainer's layouts use
the all-gather dispatcher: its data layout gives EP ranks the same rows.

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

from mindrlhf.configs.lora import LoraSpec
from mindrlhf.configs.model_config import ModelConfig
from mindrlhf.models.cpu_cells import BMM, BMM_NT, BMM_TT
from mindrlhf.models.lora import ADAPTER_A, ADAPTER_B
from mindrlhf.models.graph_ops import expand_as, take
from mindrlhf.models.tp_regions import (CopyToTP, ExchangeDim0, Identity, ReduceFromTP, ScaleGradient, copy_to_tp,
                                        leave_tp)
from mindrlhf.parallel.mesh import Mesh

PREFIX = "routed_experts"
_SUM_AXIS0 = ops.ReduceSum()


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


# The sorted form's cost per block, in rows of expert work: gathering the block's weights, summing their
# gradient back (GatherExperts) and the smaller batched matmuls. A dense row's cost against a sorted row's (plain
# matmuls run faster than the blocks' batched ones). Fitted on bench_moe's shapes (8 experts of 256, hidden 512,
# 2048 tokens: dense 350 ms, sorted by blocks of 64 / 128 / 256 / 512: 255 / 221 / 218 / 253 ms fwd + bwd;
# docs/BENCHMARKS.md).
BLOCK_COST_ROWS = 80
DENSE_ROW_COST = 0.8
BLOCK_SIZES = (16, 32, 64, 128, 256, 512)


def sorted_capacity(tokens: int, top_k: int, experts: int, block: int) -> int:
    """Rows of the sorted form's buffer: every (token, expert) pair of this rank's experts plus each expert's
    group padded up to a multiple of `block`, rounded up to whole blocks."""
    rows = tokens * min(top_k, experts) + experts * (block - 1)
    return -(-rows // block) * block


def expert_block(tokens: int, top_k: int, experts: int, form: str = "auto") -> int:
    """The sorted form's block size for a call on `tokens` tokens, `experts` local experts of which each token
    uses `top_k` (at most), or 0 for the dense form: the cheaper by the cost model above under "auto". Plain
    loops and arithmetic on constants: MindSpore's graph compiler folds it to a constant."""
    best, best_cost = 0, 0
    for block in BLOCK_SIZES:
        rows = sorted_capacity(tokens, top_k, experts, block)
        cost = rows + BLOCK_COST_ROWS * rows // block
        if best == 0 or cost < best_cost:
            best, best_cost = block, cost
    if form == "sorted":
        return best
    if form == "dense" or top_k >= experts or tokens < BLOCK_SIZES[0]:
        return 0
    if best_cost < DENSE_ROW_COST * tokens * experts:
        return best
    return 0


def sorted_slots(chosen, block: int, top_k: int):
    """chosen (N, E) 1.0 where a token uses an expert -> (slots (R,) int32: the (expert e, token n) pair in each
    row of the sorted buffer as e * N + n, E * N on padding rows; block_expert (R / block,) int32: each block's
    expert; token_rows (min(top_k, E), N) int32: the rows holding each token's pairs, R where it has fewer).
    Groups in expert order, tokens in order within a group: the same layout for the same routing. Counting in
    float32 is exact below 2^24 pairs."""
    n, e = chosen.shape
    rows = sorted_capacity(n, top_k, e, block)
    used = ops.transpose(chosen, (1, 0))                                             # (E, N)
    rank = ops.cumsum(used, 1) - used                                                 # place within the group
    padded = ops.ceil(used.sum(1) / block) * block                                    # (E,) group sizes
    ends = ops.cumsum(padded, 0)
    dest = ops.cast((ops.expand_dims(ends - padded, 1) + rank) * used + rows * (1 - used), ms.int32)
    pair = Tensor(np.arange(e * n, dtype=np.float32).reshape(e, n))
    pair = ops.cast(pair * used + (e * n) * (1 - used), ms.int32)                     # unused pairs: the dump row
    slots = ops.tensor_scatter_update(ops.fill(ms.int32, (rows + 1,), e * n), ops.reshape(dest, (-1, 1)),
                                      ops.reshape(pair, (-1,)))
    starts = Tensor(np.arange(0, rows, block, dtype=np.float32))
    block_expert = ops.cast((ops.expand_dims(starts, 1) >= ops.expand_dims(ends, 0)).astype(ms.float32).sum(1),
                            ms.int32)
    # each token's rows: the min(top_k, E) smallest of its column of dest (unused pairs point past the end)
    token_rows = -ops.TopK()(-ops.transpose(dest, (1, 0)).astype(ms.float32), min(top_k, e))[0]
    return (ops.stop_gradient(take(slots, 0, 0, rows)),
            ops.stop_gradient(ops.minimum(block_expert, e - 1)),       # blocks past the last group: padding only
            ops.stop_gradient(ops.cast(ops.transpose(token_rows, (1, 0)), ms.int32)))


def gather_rows(x, index):
    """Rows of x (M, H) picked by index, M standing for a zero row: index (R,) -> (R, H); index (k, N) -> (N, H),
    the k rows of each column summed."""
    padded = ops.concat((x, ops.zeros((1, x.shape[1]), x.dtype)), 0)
    if index.ndim == 1:
        return ops.gather(padded, index, 0)
    k, n = index.shape
    rows = ops.reshape(ops.gather(padded, ops.reshape(index, (-1,)), 0), (k, n * x.shape[1]))
    return ops.reshape(_SUM_AXIS0(rows, 0), (n, x.shape[1]))


class MoveRows(nn.Cell):
    """gather_rows(x, index), whose backward is gather_rows(dout, adjoint) with `adjoint` the inverse map. The
    sorted form's dispatch (each row's token; adjoint: each token's rows) and combine (the other way round) are
    each other's transposes, so neither direction scatter-adds: autodiff's backward of a gather is an
    UnsortedSegmentSum with its masks, ~0.1 s of a bench_moe train step (docs/BENCHMARKS.md)."""

    def construct(self, x, index, adjoint):
        return gather_rows(x, index)

    def bprop(self, x, index, adjoint, out, dout):
        return gather_rows(dout, adjoint), ops.zeros_like(index), ops.zeros_like(adjoint)


class GatherExperts(nn.Cell):
    """w (E, H, I) -> w[block_expert] (blocks, H, I), each block's expert weights; the backward sums each expert's
    blocks as one matmul with the blocks' one-hot expert matrix rather than autodiff's UnsortedSegmentSum of whole
    weight matrices (measured faster: docs/BENCHMARKS.md, bench_moe)."""

    def __init__(self):
        super().__init__()
        self.sum_blocks = ops.MatMul(transpose_a=True)

    def construct(self, w, block_expert):
        return ops.gather(w, block_expert, 0)

    def bprop(self, w, block_expert, out, dout):
        hot = ops.one_hot(block_expert, w.shape[0], Tensor(1.0, dout.dtype), Tensor(0.0, dout.dtype))
        flat = ops.reshape(dout, (dout.shape[0], -1))
        return ops.reshape(self.sum_blocks(hot, flat), w.shape), ops.zeros_like(block_expert)


class ExpertsFFN(nn.Cell):
    """This rank's E / ep stacked SwiGLU experts, each its I / tp share of the intermediate width: w1 = gate_proj,
    w3 = up_proj (E/ep, H, I/tp), w2 = down_proj (E/ep, I/tp, H).

    LoRA (`lora`): each targeted projection (w1, w3, w2, as on a dense layer) of every expert is W + scale (B A)^T
    in this x @ W layout, A (E, r, in), B (E, out, r): the per-expert adapters of transformers' per-expert linear
    layers (PEFT packs gate's and up's into one rank-2r adapter on its fused gate_up_proj: checkpoint/hf_interop.py).
    With many tokens the adapted weights are formed once per call (E x in x out x r multiply-adds each, small beside
    the experts' matmuls) and feed the form unchanged; with few (decode) the adapter goes the low-rank way
    (_batched; a LoRA rollout of bench_moe's model: 37 -> 25 ms per decode step, 21.6 without adapters). Under TP
    the factor that holds the whole width (A of gate / up, B of down) enters through copy_to_tp, as a dense
    layer's replicated factor does; every factor is split over ep with its experts."""

    def __init__(self, cfg: ModelConfig, param_dtype, std: Optional[float], ep: int = 1, tp: int = 1,
                 lora: Optional[LoraSpec] = None, mesh: Optional[Mesh] = None):
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
        self.top_k = cfg.num_experts_per_tok
        self.form = cfg.moe_expert_compute
        self.matmul = ops.MatMul()
        self.move_rows = MoveRows()
        self.gather_experts = GatherExperts()
        self.lora_scaling = lora.scaling if lora else 0.0
        self.adapted = tuple(bool(lora and lora.on(name)) for name in ("w1", "w3", "w2"))
        for name, on in zip(("w1", "w3", "w2"), self.adapted):
            if on:                  # initialised by models/lora.init_adapters: A drawn, B zero
                cell = getattr(self, name)
                _, fan_in, fan_out = cell.weight.shape
                cell.mindpet_delta_lora_a = Parameter(initializer(Zero(), (e, lora.rank, fan_in), param_dtype),
                                                      name=ADAPTER_A)
                cell.mindpet_delta_lora_b = Parameter(initializer(Zero(), (e, fan_out, lora.rank), param_dtype),
                                                      name=ADAPTER_B)
                cell.enter = copy_to_tp(mesh) if mesh is not None else Identity()

    def weights(self, compute_dtype):
        """(w1, w3, w2) in compute_dtype, each adapted (W + scale (B A)^T per expert) where LoRA puts an adapter."""
        out = []
        for cell, on, row in zip((self.w1, self.w3, self.w2), self.adapted, (False, False, True)):
            w = ops.cast(cell.weight, compute_dtype)
            if on:
                a, b = self._factors(cell, row, compute_dtype)
                w = w + self.lora_scaling * BMM_TT(a, b)
            out.append(w)
        return tuple(out)

    def _factors(self, cell, row: bool, compute_dtype):
        """A projection's (A, B) in compute_dtype, the factor whole on every TP rank through copy_to_tp."""
        a = ops.cast(cell.mindpet_delta_lora_a, compute_dtype)
        b = ops.cast(cell.mindpet_delta_lora_b, compute_dtype)
        return (a, cell.enter(b)) if row else (cell.enter(a), b)

    def _batched(self, xe, k: int, compute_dtype):
        """Projection k (0 gate, 1 up, 2 down) of every expert on its copy of the tokens, xe (E, N, in) -> (E, N,
        out): the few-token form, whose adapter goes the low-rank way, x W + scale (x A^T) B^T, rather than
        forming W + scale (B A)^T, which would read and write every expert weight twice more per decode step."""
        cell = (self.w1, self.w3, self.w2)[k]
        y = BMM(xe, ops.cast(cell.weight, compute_dtype))
        if self.adapted[k]:
            a, b = self._factors(cell, k == 2, compute_dtype)
            y = y + self.lora_scaling * BMM_NT(BMM_NT(xe, a), b)
        return y

    def construct(self, x, weights, compute_dtype):
        """x (N, H), weights (N, E/ep) of this rank's experts, zero off each token's chosen ones -> sum_e
        weights[:, e] * expert_e(x), (N, H), in the form expert_block picks for N (static in a graph)."""
        block = expert_block(x.shape[0], self.top_k, self.experts, self.form)
        if block:
            return self._sorted(x, weights, compute_dtype, block)
        return self._dense(x, weights, compute_dtype)

    def _sorted(self, x, weights, compute_dtype, block):
        """The sorted form (module docstring). A chosen expert whose routing weight is exactly 0 is left out: it
        adds 0 to the output, and its weight's gradient reaches the router only times that probability, 0."""
        n, h = x.shape
        e = self.experts
        w1, w3, w2 = self.weights(compute_dtype)
        slots, block_expert, token_rows = sorted_slots(ops.cast(weights != 0, ms.float32), block, self.top_k)
        rows = slots.shape[0]
        token = ops.stop_gradient(ops.select(slots < e * n, slots % n, ops.fill(ms.int32, (rows,), n)))
        xs = ops.reshape(self.move_rows(x, token, token_rows), (rows // block, block, h))    # padding: zero rows
        gate = BMM(xs, self.gather_experts(w1, block_expert))
        up = BMM(xs, self.gather_experts(w3, block_expert))
        act = gate * ops.sigmoid(gate) * up                                               # (blocks, block, I)
        pairs = ops.reshape(ops.transpose(ops.cast(weights, compute_dtype), (1, 0)), (-1, 1))   # row e * N + n
        pair_weight = gather_rows(pairs, slots)                                           # padding rows: 0
        act = act * expand_as(ops.reshape(pair_weight, (rows // block, block, 1)), act)
        y = BMM(act, self.gather_experts(w2, block_expert))
        return self.move_rows(ops.reshape(y, (rows, h)), token_rows, token)

    def _dense(self, x, weights, compute_dtype):
        """Every expert on every token. Two forms of the same FLOPs, picked by the token count:
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
            gate = self._batched(xe, 0, compute_dtype)                                             # (E, N, I)
            up = self._batched(xe, 1, compute_dtype)
            y = self._batched(gate * ops.sigmoid(gate) * up, 2, compute_dtype)                    # (E, N, H)
            w = ops.expand_dims(ops.transpose(ops.cast(weights, compute_dtype), (1, 0)), 2)       # (E, N, 1)
            return (y * w).sum(0)
        w1, w3, w2 = self.weights(compute_dtype)
        gate = self.matmul(x, ops.reshape(ops.transpose(w1, (1, 0, 2)), (h, e * i)))             # (N, E*I)
        up = self.matmul(x, ops.reshape(ops.transpose(w3, (1, 0, 2)), (h, e * i)))
        act = ops.reshape(gate * ops.sigmoid(gate) * up, (n, e, i)) * \
            ops.expand_dims(ops.cast(weights, compute_dtype), 2)                                # (N, E, I)
        return self.matmul(ops.reshape(act, (n, e * i)), ops.reshape(w2, (e * i, h)))


class RoutedExperts(nn.Cell):
    """The router and the experts under one name (MindFormers' `feed_forward.routed_experts`)."""

    def __init__(self, cfg: ModelConfig, param_dtype, std: Optional[float], ep: int = 1, tp: int = 1,
                 lora: Optional[LoraSpec] = None, mesh: Optional[Mesh] = None):
        super().__init__()
        self.router = Router(cfg.hidden_size, cfg.num_experts, param_dtype, std)
        self.ffn = ExpertsFFN(cfg, param_dtype, std, ep, tp, lora, mesh)


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
    whose backward is the identity. With ep 1 both are the identity. When the TP ranks hold other whole experts
    (mesh.experts_over_tp) this rank's columns are its share over ep x tp; the TP ranks' outputs are summed where
    the layer leaves its TP region, as a width share's are."""

    def __init__(self, mesh: Mesh, num_experts: int):
        super().__init__()
        self.ep = mesh.ep
        self.split = mesh.expert_ranks > 1
        self.local = num_experts // mesh.expert_ranks
        self.first = mesh.expert_index * self.local
        group = mesh.group("ep") if self.ep > 1 else None
        self.enter_tokens = CopyToTP(group) if self.ep > 1 else Identity()
        self.enter_weights = CopyToTP(group) if self.ep > 1 else Identity()
        self.leave = ReduceFromTP(group) if self.ep > 1 else Identity()

    def dispatch(self, x, weights):
        """x (N, H), weights (N, E) -> this rank's (tokens, (N, E / expert_ranks) weights of its experts)."""
        if not self.split:
            return x, weights
        return self.enter_tokens(x), take(self.enter_weights(weights), 1, self.first, self.first + self.local)

    def combine(self, y):
        return self.leave(y)


class AllToAllDispatcher(nn.Cell):
    """The dispatcher when the EP ranks hold distinct rows (Mesh.ep_dispatcher "alltoall"; the module's
    docstring). dispatch: this rank's N tokens and, for each EP peer j, the routing-weight columns of j's experts
    go to j (exchange_dim0), so it returns every peer's tokens (ep x N, H) with the weights of its own experts;
    combine sends each peer the outputs of its tokens and sums a token's ep partial outputs. The exchange is its
    own transpose, so the tokens' and weights' gradients come back from the peers whose experts used them, and an
    expert's weight gradient holds every EP rank's tokens: only the replicated parameters' gradients need a sum
    over the EP ranks. With whole experts over the TP ranks (mesh.experts_over_tp) peer j's columns are those of
    its share at this rank's TP index; the TP exit sums the TP ranks' outputs."""

    def __init__(self, mesh: Mesh, num_experts: int):
        super().__init__()
        self.ep = mesh.ep
        self.local = num_experts // mesh.expert_ranks
        self.shares = mesh.tp if "tp" in mesh.expert_axes else 1        # TP ranks' shares inside an EP block
        self.share = mesh.tp_index if self.shares > 1 else 0
        self.exchange = ExchangeDim0(mesh.group("ep"), self.ep, mesh.index("ep"))

    def dispatch(self, x, weights):
        """x (N, H), weights (N, E) -> (every peer's tokens (ep x N, H), their weights of this rank's experts)."""
        n, h = x.shape
        w = take(ops.reshape(weights, (n, self.ep, self.shares, self.local)), 2, self.share, self.share + 1)
        w = ops.transpose(ops.reshape(w, (n, self.ep, self.local)), (1, 0, 2))           # (ep, N, local)
        xs = ops.broadcast_to(ops.expand_dims(x, 0), (self.ep, n, h))
        return (ops.reshape(self.exchange(xs), (self.ep * n, h)),
                ops.reshape(self.exchange(w), (self.ep * n, self.local)))

    def combine(self, y):
        """y (ep x N, H), this rank's experts' outputs for every peer's tokens -> (N, H) of its own tokens."""
        back = self.exchange(ops.reshape(y, (self.ep, -1, y.shape[-1])))
        return _SUM_AXIS0(back, 0)


def dispatcher(mesh: Mesh, num_experts: int) -> nn.Cell:
    """The dispatcher the mesh's rows call for: all-to-all where the EP ranks hold distinct rows."""
    if mesh.ep > 1 and mesh.ep_dispatcher == "alltoall":
        return AllToAllDispatcher(mesh, num_experts)
    return AllGatherDispatcher(mesh, num_experts)


class MoEFeedForward(nn.Cell):
    """A sparse layer's MLP: x (..., H) -> (..., H), token by token. Experts split over the mesh's `ep` axis, each
    expert's intermediate width over `tp` (see the module's docstring). Called inside the layer's TP region
    (DecoderLayer.enter_ffn: the tokens replicated over TP, their gradients summed on the way out) and leaves it
    itself (all-reduce, or reduce-scatter along the sequence under sequence parallelism), as the dense MLP's
    row-parallel projection does."""

    def __init__(self, cfg: ModelConfig, mesh: Mesh, param_dtype, compute_dtype, std: Optional[float],
                 lora: Optional[LoraSpec] = None):
        super().__init__()
        if mesh.experts_over_tp:         # whole experts on each TP rank: nothing of an expert is split over tp
            self.routed_experts = RoutedExperts(cfg, param_dtype, std, mesh.expert_ranks, 1, lora)
        else:
            self.routed_experts = RoutedExperts(cfg, param_dtype, std, mesh.ep, mesh.tp, lora, mesh)
        self.dispatcher = dispatcher(mesh, cfg.num_experts)
        # Under TP every rank routes the same tokens alike and runs its share of each expert's width (or its own
        # experts): the routing weights' gradients are partial per rank (summed by enter_weights), the router's
        # input gradient then full on every rank, so it enters the region's sum scaled by 1 / tp (router_input)
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
