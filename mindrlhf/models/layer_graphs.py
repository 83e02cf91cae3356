"""A decoder layer's execution paths as cells compiled once per model and reused by every layer
(utils/subgraph_reuse.py): most of a deep model's first step is otherwise spent compiling 30 copies of one
layer in the training graph, prefill and decode. The reuse reaches a cell's `construct` only, so each path
the model runs - whole rows, rows that share their group's prompt, prefill, decode - is a cell of its own
that calls that method of the layer. Compile times: docs/BENCHMARKS.md (bench_real_model.py, first step).

Under sequence parallelism DecoderModel runs its layers directly instead (see stage_forward).

The cells hold their layer as a child without a name prefix (its parameter names stay MindFormers') and are
kept outside the model's cell tree, so parameters, checkpoints and layouts see the layers only.
"""
from __future__ import annotations

from typing import Sequence

from mindspore import nn, ops

from mindrlhf.models.graph_ops import swap_middle, take
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

    def tokens(self, z):
        """(N, P + T) -> (Q*P + N*T,): each group's prompt once, then every response."""
        prompts = take(take(z, 0, 0, self.rows, self.group), 1, 0, self.prompt_len)
        responses = take(z, 1, self.prompt_len, self.prompt_len + self.response_len)
        return ops.concat((ops.reshape(prompts, (-1,)), ops.reshape(responses, (-1,))), 0)

    def prompt_heads(self, z):
        """(Q*P, heads, hd) -> (Q, heads, P, hd)."""
        return swap_middle(ops.reshape(z, (self.prompts, self.prompt_len, -1, self.head_dim)))

    def response_heads(self, z):
        """(N*T, heads, hd) -> (N, heads, T, hd)."""
        return swap_middle(ops.reshape(z, (self.rows, self.response_len, -1, self.head_dim)))


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


class SharedPromptRows(_LayerPath):
    """DecoderLayer.shared_prompt; the token matrix's layout (SharedPrompt) follows from the biases:
    bias_p (Q, 1, P, P), bias_r (N, 1, T, P + T)."""

    def construct(self, x, cos, sin, bias_p, bias_r):
        rows = bias_r.shape[0]
        split = SharedPrompt(rows, rows // bias_p.shape[0], bias_p.shape[2], bias_r.shape[2], cos.shape[-1])
        return self.layer.shared_prompt(x, cos, sin, bias_p, bias_r, split)


class Prefill(_LayerPath):
    """DecoderLayer.prefill; each prompt's cache rows are copied to cache rows / prompts samples."""

    def construct(self, x, cos, sin, bias, cache_k, cache_v):
        return self.layer.prefill(x, cos, sin, bias, cache_k, cache_v, cache_k.shape[0] // x.shape[0])


class Decode(_LayerPath):
    """DecoderLayer.decode."""

    def construct(self, x, cos, sin, bias, cache_k, cache_v, kv_index):
        return self.layer.decode(x, cos, sin, bias, cache_k, cache_v, kv_index)


class LayerGraphs:
    """The four paths of every layer of one model: `whole_rows[i]`, `shared_prompt[i]`, `prefill[i]`, `decode[i]`
    call layer i."""

    def __init__(self, layers: Sequence[nn.Cell]):
        key = new_key("decoder layers")       # the layers of one model share each path's subgraph
        self.whole_rows = tuple(WholeRows(layer, key) for layer in layers)
        self.shared_prompt = tuple(SharedPromptRows(layer, key) for layer in layers)
        self.prefill = tuple(Prefill(layer, key) for layer in layers)
        self.decode = tuple(Decode(layer, key) for layer in layers)
