"""Megatron-style tensor-parallel layers, built from the named regions in `tp_regions`.

Weights are stored as [out_features, in_features] (MindFormers and Hugging Face agree on this), and each
rank holds only its shard:

    ColumnParallelLinear   weight [out/tp, in], bias [out/tp]   input replicated, output split
    RowParallelLinear      weight [out, in/tp], bias [out]      input split, output replicated (all-reduce)
    VocabParallelEmbedding weight [vocab/tp, hidden]            ids replicated, output replicated

The caller places `copy_to_tp` before column-parallel layers (once per block, shared by q/k/v or
gate/up), so each layer itself issues at most one collective.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, nn, ops
from mindspore.common.initializer import Normal, Zero, initializer

from mindrlhf.models.graph_ops import expand_as
from mindrlhf.models.lora import ADAPTER_A, ADAPTER_B
from mindrlhf.models.tp_regions import Identity, copy_to_tp, leave_tp, max_from_tp, reduce_from_tp

MS_DTYPES = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}


_MATMUL_NT = ops.MatMul(transpose_b=True)
# Up to FEW_ROWS rows `linear` computes (weight @ x^T)^T; for an output of WIDE_OUT features or more (a
# vocabulary) only up to WIDE_FEW_ROWS rows: see there.
FEW_ROWS, WIDE_OUT, WIDE_FEW_ROWS = 64, 32000, 32


def _init(std):
    """A weight's initializer: N(0, std), or zeros for std None (a model whose weights are loaded next: drawing
    them would cost seconds at 135M parameters for nothing)."""
    return Zero() if std is None else Normal(std)


def linear(x, weight, compute_dtype):
    """x (..., in) @ weight(out, in)^T -> (..., out), computed in compute_dtype.

    The [out, in] weight is read as it is stored (an explicit transpose would copy the whole weight on every
    call). With many rows, as x @ weight^T; with few (decode steps: one row per sequence), as
    (weight @ x^T)^T, where oneDNN streams the weight as the row-major left operand instead of repacking it
    as a transposed right one; from 128 rows on the first form is faster. A vocabulary-sized output is the
    exception above 32 rows: there the final transpose (a CPU Transpose that also keeps a size_t offset per
    output element on the heap for the graph's lifetime) outweighs the gain (docs/BENCHMARKS.md, "Measurements behind code choices").
    The row count is a compile-time constant, so each graph holds one form. Measured on CPU only (the same product
    values either way; which form is faster on Ascend is unmeasured).
    """
    x2, w = _rows_and_weight(x, weight, compute_dtype)
    rows, out = x2.shape[0], weight.shape[0]
    if rows <= FEW_ROWS and (rows <= WIDE_FEW_ROWS or out < WIDE_OUT):
        y = ops.transpose(_MATMUL_NT(w, x2), (1, 0))
    else:
        y = _MATMUL_NT(x2, w)
    return ops.reshape(y, x.shape[:-1] + (weight.shape[0],))


def _rows_and_weight(x, weight, compute_dtype):
    """x as rows (-1, in) and the weight, both in compute_dtype (cast only when they are not)."""
    x2 = ops.reshape(x if x.dtype == compute_dtype else ops.cast(x, compute_dtype), (-1, x.shape[-1]))
    return x2, weight if weight.dtype == compute_dtype else ops.cast(weight, compute_dtype)


class _LoraLinear(nn.Cell):
    """A linear layer that may carry a LoRA adapter (models/lora.py): `lora` = (rank, scaling) or None.
    The adapter's factors are shaped like the layer's shard: A (r, in shard), B (out shard, r); the factor that
    is not split (A of a column-parallel layer, B of a row-parallel one) enters through copy_to_tp."""

    def _add_lora(self, lora, local_in, local_out, mesh, param_dtype, replicated: str):
        self.lora_scaling = 0.0
        if lora is None:
            return
        rank, self.lora_scaling = lora
        self.mindpet_delta_lora_a = Parameter(initializer(Zero(), (rank, local_in), param_dtype), name=ADAPTER_A)
        self.mindpet_delta_lora_b = Parameter(initializer(Zero(), (local_out, rank), param_dtype), name=ADAPTER_B)
        self.enter_a = copy_to_tp(mesh) if replicated == "a" else Identity()
        self.enter_b = copy_to_tp(mesh) if replicated == "b" else Identity()

    def _lora_delta(self, x):
        low = linear(x, self.enter_a(self.mindpet_delta_lora_a), self.compute_dtype)
        return linear(low, self.enter_b(self.mindpet_delta_lora_b), self.compute_dtype) * self.lora_scaling


class ColumnParallelLinear(_LoraLinear):
    """Output features split across TP ranks; the input must already be in the TP region."""

    def __init__(self, in_features, out_features, mesh, has_bias=False, param_dtype=ms.float32,
                 compute_dtype=ms.float32, init_std=0.02, lora=None):
        super().__init__()
        if out_features % mesh.tp:
            raise ValueError(f"out_features={out_features} is not divisible by model_parallel={mesh.tp}")
        local_out = out_features // mesh.tp
        self.compute_dtype = compute_dtype
        self.has_bias = has_bias
        self.weight = Parameter(initializer(_init(init_std), (local_out, in_features), param_dtype),
                                name="weight")
        if has_bias:
            self.bias = Parameter(initializer(Zero(), (local_out,), param_dtype), name="bias")
        self._add_lora(lora, in_features, local_out, mesh, param_dtype, replicated="a")

    def construct(self, x):
        y = linear(x, self.weight, self.compute_dtype)
        if self.lora_scaling:
            y = y + self._lora_delta(x)
        if self.has_bias:
            y = y + expand_as(ops.cast(self.bias, self.compute_dtype), y)
        return y


class RowParallelLinear(_LoraLinear):
    """Input features split across TP ranks; partial products are summed by `reduce_from_tp` (an adapter's
    too: x_k A_k^T B^T summed over ranks k is x A^T B^T, so it adds no collective)."""

    def __init__(self, in_features, out_features, mesh, has_bias=False, param_dtype=ms.float32,
                 compute_dtype=ms.float32, init_std=0.02, lora=None):
        super().__init__()
        if in_features % mesh.tp:
            raise ValueError(f"in_features={in_features} is not divisible by model_parallel={mesh.tp}")
        self.compute_dtype = compute_dtype
        self.has_bias = has_bias
        self.weight = Parameter(initializer(_init(init_std), (out_features, in_features // mesh.tp),
                                            param_dtype), name="weight")
        if has_bias:
            self.bias = Parameter(initializer(Zero(), (out_features,), param_dtype), name="bias")
        self.reduce = leave_tp(mesh)          # under sequence parallelism: reduce-scatter along the sequence
        self._add_lora(lora, in_features // mesh.tp, out_features, mesh, param_dtype, replicated="b")

    def construct(self, x):
        y = linear(x, self.weight, self.compute_dtype)
        if self.lora_scaling:
            y = y + self._lora_delta(x)
        y = self.reduce(y)
        if self.has_bias:
            y = y + expand_as(ops.cast(self.bias, self.compute_dtype), y)
        return y


class VocabParallelEmbedding(nn.Cell):
    """Each rank embeds the ids in its vocabulary range and zeros the rest; the sum is the full lookup."""

    def __init__(self, vocab_size, hidden_size, mesh, param_dtype=ms.float32, init_std=0.02):
        super().__init__()
        if vocab_size % mesh.tp:
            raise ValueError(f"vocab_size={vocab_size} is not divisible by model_parallel={mesh.tp}")
        local = vocab_size // mesh.tp
        self.vocab_start = mesh.tp_index * local
        self.vocab_local = local
        self.tp = mesh.tp
        self.embedding_weight = Parameter(initializer(_init(init_std), (local, hidden_size), param_dtype),
                                          name="embedding_weight")
        self.reduce = leave_tp(mesh)

    def construct(self, input_ids):
        if self.tp == 1:
            return ops.gather(self.embedding_weight, input_ids, 0)
        local_ids = input_ids - self.vocab_start
        in_range = ops.logical_and(local_ids >= 0, local_ids < self.vocab_local)
        safe_ids = ops.select(in_range, local_ids, ops.zeros_like(local_ids))
        emb = ops.gather(self.embedding_weight, safe_ids, 0)
        emb = emb * expand_as(ops.expand_dims(ops.cast(in_range, emb.dtype), -1), emb)
        return self.reduce(emb)


class HeadLogProb(nn.Cell):
    """log p(label) and entropy under softmax(hidden @ weight^T) over the whole vocabulary (one TP rank),
    with the backward written out.

    Autodiff would run LogSoftmaxGrad over the (tokens, vocab) logits, which MindSpore's CPU backend hands
    to oneDNN's scalar reference code (several times torch's time for the same op).
    Here d logp[label] / d logits = onehot - softmax is a scatter into the softmax the forward already took
    for the entropy (one exp over the logits for both), and each token's incoming gradient scales the
    hidden-sized rows around the two head matmuls instead of the vocabulary-sized ones. The entropy is a
    metric (no gradient) unless `entropy_grad` is set (CausalLM.differentiate_entropy: an entropy bonus): then
    d H / d logits = -p (log p + H) joins, per vocabulary entry.

    hidden (..., H), weight (V, H) as stored, labels (...). Returns (logprob, entropy, softmax (N, V)); the
    third output is for the backward only (its incoming gradient is ignored).
    """

    def __init__(self, compute_dtype=ms.float32):
        super().__init__()
        self.compute_dtype = compute_dtype
        self.matmul_tn = ops.MatMul(transpose_a=True)
        self.entropy_grad = False

    def construct(self, hidden, weight, labels):
        h, w = _rows_and_weight(hidden, weight, self.compute_dtype)
        logp_all = ops.log_softmax(ops.cast(_MATMUL_NT(h, w), ms.float32), -1)
        logprob = ops.gather_elements(logp_all, -1, ops.reshape(labels, (-1, 1)))
        probs = ops.exp(logp_all)
        entropy = -ops.sum(probs * logp_all, -1)
        return ops.reshape(logprob, labels.shape), ops.reshape(entropy, labels.shape), probs

    def bprop(self, hidden, weight, labels, out, dout):
        h, w = _rows_and_weight(hidden, weight, self.compute_dtype)
        idx = ops.reshape(labels, (-1, 1))
        neg_dy = ops.reshape(-dout[0], (-1, 1))
        if self.entropy_grad:
            # d loss / d logits = -dy (p - onehot) - d_ent p (log p + H) = p (-dy - d_ent H) - d_ent p log p + dy at
            # the label: four vocabulary-sized passes (xlogy: p log p, 0 at p = 0), the label's term scattered
            probs, d_ent = out[2], ops.reshape(dout[1], (-1, 1))
            row = neg_dy - d_ent * ops.reshape(out[1], (-1, 1))
            grad = probs * expand_as(row, probs) - ops.xlogy(probs, probs) * expand_as(d_ent, probs)
            grad = ops.cast(ops.tensor_scatter_elements(grad, idx, -neg_dy, -1, "add"), self.compute_dtype)
            return (ops.cast(ops.reshape(ops.matmul(grad, w), hidden.shape), hidden.dtype),
                    ops.cast(self.matmul_tn(grad, h), weight.dtype), ops.zeros_like(labels))
        # softmax - onehot = -(d logp[label] / d logits); each row's -dy scales the hidden-sized rows instead
        grad = ops.tensor_scatter_elements(out[2], idx, -ops.ones(idx.shape, ms.float32), -1, "add")
        grad = ops.cast(grad, self.compute_dtype)
        neg_dy = ops.cast(neg_dy, self.compute_dtype)
        dh = ops.matmul(grad, w)
        dh = dh * expand_as(neg_dy, dh)
        dw = self.matmul_tn(grad, h * expand_as(neg_dy, h))
        return (ops.cast(ops.reshape(dh, hidden.shape), hidden.dtype), ops.cast(dw, weight.dtype),
                ops.zeros_like(labels))


class VocabParallelLogProb(nn.Cell):
    """log p(label) and entropy from vocabulary-sharded logits, never gathering the full vocabulary (TP > 1;
    a rank holding the whole vocabulary uses HeadLogProb).

    logits: (..., vocab/tp) this rank's shard; labels: (...) global token ids.
    Returns (logprob (...), entropy (...)), both replicated across TP ranks.
    """

    def __init__(self, vocab_size, mesh):
        super().__init__()
        self.vocab_local = vocab_size // mesh.tp
        self.vocab_start = mesh.tp_index * self.vocab_local
        self.max_all = max_from_tp(mesh)
        self.sum_exp_all = reduce_from_tp(mesh)
        self.target_all = reduce_from_tp(mesh)
        self.plogit_all = reduce_from_tp(mesh)

    def construct(self, logits, labels):
        logits = ops.cast(logits, ms.float32)
        local_max = ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True)[0])
        shifted = logits - expand_as(self.max_all(local_max), logits)   # (..., V/tp)
        exp = ops.exp(shifted)
        sum_exp = self.sum_exp_all(ops.sum(exp, -1))                      # (...)
        local_ids = labels - self.vocab_start
        in_range = ops.logical_and(local_ids >= 0, local_ids < self.vocab_local)
        safe_ids = ops.select(in_range, local_ids, ops.zeros_like(local_ids))
        picked = ops.gather_elements(shifted, -1, ops.expand_dims(safe_ids, -1)).squeeze(-1)
        target = self.target_all(picked * ops.cast(in_range, ms.float32))
        log_z = ops.log(sum_exp)
        logprob = target - log_z
        # entropy = log Z - sum_v p_v * shifted_v
        p_shifted = self.plogit_all(ops.sum(exp * shifted, -1)) / sum_exp
        entropy = log_z - p_shifted
        return logprob, entropy
