"""The policy update with one compiled graph per decoder layer instead of one for the model.

A graph holding the whole model's loss and backward compiles in time proportional to its depth (~0.3 s per
layer on CPU: MindSpore inlines the reused layer before differentiating it, so every layer's backward is
optimised and emitted again) and keeps a transient compile heap of the same order. Here the host drives the
layers: a template DecoderLayer, outside the model, receives layer k's weights (copied in place, 14 MB per
layer of a 135M model) and runs its forward on the whole mini-batch, then, from the last layer down, the
backward: the layer's forward recomputed and differentiated (the gradient of <layer(x), dy>), its parameter
gradients added into the update's buffers. Micro-batches bound only the loss, the final norm and the LM head
(one graph per micro-batch, HeadPieces): their logits are vocabulary-sized, while a layer's activations are
small and one call per layer over all rows keeps the matmuls large and the calls few (packed rows, whose
count varies by update, call the layers per packed micro-batch). The log-prob passes (LayerwiseLogProb) run
the same template and forward graph. Each graph compiles once, whatever the depth; what persists between
layers is the residual stream. Same operations per layer as the one-graph step; the update itself is
update/accumulate.py. The price: every layer's forward runs twice per update (docs/BENCHMARKS.md,
bench_real_model.py).

Whole model on one rank only (no pipeline stages, no sequence parallelism: resolve.py checks); TP runs inside
the layer graphs as in the model's own. A Qwen3-MoE model's routing inputs (router replay, the aux loss's gradient:
LossInputs.routing / router_grad) enter every layer graph of a sparse layer; one template serves one kind of
layer, so a model mixing dense and sparse layers is refused (LayerTemplate.sources).
"""
from __future__ import annotations

from typing import List

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindrlhf.models.layer_graphs import (embed, final_hidden, layer_inputs, layer_routing, shared_prompt_layer,
                                          shared_prompt_routing)
from mindrlhf.models.lora import freeze_base
from mindrlhf.models.qwen2 import DecoderLayer
from mindrlhf.trainer.optim import aliases, zeros_like
from mindrlhf.trainer.update.accumulate import AccumulatedUpdate, ApplyAccumulated, micro_batch_stats
from mindrlhf.trainer.update.grad_norm import split_axes
from mindrlhf.trainer.update.loss import GRPOLossCell
from mindrlhf.trainer.update.loss_inputs import LossInputs
from mindrlhf.utils.params import hold_reads


class _Inputs(nn.Cell):
    """(token ids, cos, sin, bias, bias_r) of a micro-batch (layer_graphs.layer_inputs), no gradient."""

    def __init__(self, decoder, group: int, prompt_len: int):
        super().__init__(auto_prefix=False)
        object.__setattr__(self, "decoder", decoder)
        self.group, self.prompt_len = group, prompt_len

    @ms.jit
    def construct(self, input_ids, position_ids, bias):
        return ops.stop_gradient(layer_inputs(self.decoder, input_ids, position_ids, bias, self.group,
                                              self.prompt_len))


class _Routing(nn.Cell):
    """A layer call's routing inputs (LossInputs.routing / router_grad, DecoderModel.routing_inputs) in its token
    order: whole rows as they are; a shared-prompt token matrix's (SharedPrompt.tokens, the aux gradient summed
    over each group's rows, as layer_graphs.shared_prompt_forward does). No gradient."""

    def __init__(self, group: int, prompt_len: int):
        super().__init__(auto_prefix=False)
        self.group, self.prompt_len = group, prompt_len

    @ms.jit
    def construct(self, routing, router_grad):
        if self.group:
            routing, router_grad = shared_prompt_routing(routing, router_grad, self.group, self.prompt_len)
        return ops.stop_gradient(routing), ops.stop_gradient(router_grad)


def _layer_route(routes, call: int, sparse_index: int) -> tuple:
    """The routing inputs of layer call `call` for the sparse layer `sparse_index`: () without routing inputs."""
    if routes is None or sparse_index < 0:
        return ()
    routing, router_grad = routes[call]
    return layer_routing(routing, sparse_index), router_grad


class _Embed(nn.Cell):
    def __init__(self, decoder):
        super().__init__(auto_prefix=False)
        self.embedding = decoder.tok_embeddings
        object.__setattr__(self, "decoder", decoder)

    def construct(self, tokens):
        return embed(self.decoder, tokens)


class _EmbedForward(nn.Cell):
    def __init__(self, fn):
        super().__init__(auto_prefix=False)
        self.fn = fn

    @ms.jit
    def construct(self, tokens):
        return ops.stop_gradient(self.fn(tokens))


class _EmbedBackward(nn.Cell):
    """The embedding weight's gradient from the first layer's input gradient, added into its buffer."""

    def __init__(self, fn, weight, acc):
        super().__init__(auto_prefix=False)
        self.fn, self.weights, self.acc = fn, ms.ParameterTuple([weight]), acc
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    @ms.jit
    def construct(self, tokens, dx):
        grads = self.grad(self.fn, self.weights)(tokens, dx)
        ops.assign_add(self.acc, grads[0])
        return dx


class _LayerFn(nn.Cell):
    """The template layer on whole rows or on a shared-prompt token matrix (layer_graphs' paths); `route`: a
    sparse layer's routing inputs (replay, router_grad), or none."""

    def __init__(self, layer, shared: bool):
        super().__init__(auto_prefix=False)
        self.layer, self.shared = layer, shared

    def construct(self, x, cos, sin, bias, bias_r, *route):
        if self.shared:
            return shared_prompt_layer(self.layer, x, cos, sin, bias, bias_r, *route)
        return self.layer(x, cos, sin, bias, *route)


class _LayerForward(nn.Cell):
    def __init__(self, fn):
        super().__init__(auto_prefix=False)
        self.fn = fn

    @ms.jit
    def construct(self, x, cos, sin, bias, bias_r, *route):
        return ops.stop_gradient(self.fn(x, cos, sin, bias, bias_r, *route))


class _Contracted(nn.Cell):
    """<fn(x, ...), dy>: its gradient is the vector-Jacobian product with dy, taken here by position (the
    input gradients of the other inputs are neither wanted nor, for the shared-prompt path's biases,
    compilable: MindSpore 2.10 fails with "func graph is empty" in the softmax backward)."""

    def __init__(self, fn):
        super().__init__(auto_prefix=False)
        self.fn = fn

    def construct(self, x, cos, sin, bias, bias_r, dy, *route):
        return ops.reduce_sum(self.fn(x, cos, sin, bias, bias_r, *route) * ops.stop_gradient(dy))


class _LayerBackward(nn.Cell):
    """Recompute the template layer's forward, back-propagate `dy`, add its trainable parameters' gradients
    into `acc` (Tensors on the layer's gradient buffers); returns the input gradient."""

    def __init__(self, fn, trainable):
        super().__init__(auto_prefix=False)
        self.grad_fn = ms.value_and_grad(_Contracted(fn), 0, ms.ParameterTuple(trainable))
        hold_reads(self, fn.get_parameters())

    @ms.jit
    def construct(self, x, cos, sin, bias, bias_r, dy, acc, *route):
        _, (dx, grads) = self.grad_fn(x, cos, sin, bias, bias_r, dy, *route)
        done = dy
        for i in range(len(acc)):
            done = ops.assign_add(acc[i], ops.depend(grads[i], done))
        return ops.depend(dx, done)


class _Load(nn.Cell):
    """Copy a layer's weights (Tensors on its parameters) into the template's, in place."""

    def __init__(self, template_params):
        super().__init__(auto_prefix=False)
        self.dst = ms.ParameterTuple(template_params)

    @ms.jit
    def construct(self, src):
        done = ops.zeros((), ms.float32)
        for i in range(len(self.dst)):
            done = ops.depend(done, ops.assign(self.dst[i], src[i]))
        return done


def _head_logprobs(model, x, labels, group: int, prompt_len: int, response_len: int, temperature: float):
    """The last layer's stream -> final norm, LM head: (log-probs, entropies) of the labels' last
    `response_len` positions (whole rows, or a shared-prompt token matrix when `group`)."""
    hidden = final_hidden(model.model, x, labels.shape[0], group, prompt_len)
    return model.logprobs_of_hidden(hidden, labels, response_len, temperature)


class _HeadLoss(nn.Cell):
    """The last layer's stream -> final norm, LM head, log-probs and the GRPO loss (GRPOLossCell.terms)."""

    def __init__(self, loss_cell: GRPOLossCell):
        super().__init__(auto_prefix=False)
        self.loss_cell = loss_cell
        self.group, self.prompt_len = loss_cell.shared_prompt

    def construct(self, x, labels, *loss_inputs):
        cell = self.loss_cell
        logp, ent = _head_logprobs(cell.model, x, labels, self.group, self.prompt_len, cell.response_len,
                                   cell.temperature)
        return cell.terms(logp, ent, loss_inputs)


class _HeadStep(nn.Cell):
    """Loss of one micro-batch and its backward to the last layer's stream; the head's trainable parameters'
    gradients added into `acc`. Returns (loss, statistics, stream gradient)."""

    def __init__(self, loss_cell: GRPOLossCell, trainable, acc):
        super().__init__(auto_prefix=False)
        self.head = _HeadLoss(loss_cell)
        self.acc = acc
        self.with_params = bool(trainable)
        self.grad_fn = ms.value_and_grad(self.head, 0, ms.ParameterTuple(trainable) if trainable else None,
                                         has_aux=True)

    @ms.jit
    def construct(self, x, labels, *loss_inputs):
        if self.with_params:
            (loss, aux), (dx, grads) = self.grad_fn(x, labels, *loss_inputs)
            for i in range(len(self.acc)):
                ops.assign_add(self.acc[i], grads[i])
        else:
            (loss, aux), dx = self.grad_fn(x, labels, *loss_inputs)
        return loss, aux, dx


class LayerTemplate:
    """A decoder layer outside every model, and the graphs that run it: `load` copies a model's layer k
    into it (in place; the graphs keep its buffers), `forward` runs it without gradient. One per run: the
    policy's update and log-probs and the reference's log-probs share its compiled graphs."""

    def __init__(self, model, shared_prompt: bool):
        layer = DecoderLayer(model.config, model.mesh, model.lora, random_init=False)
        if model.lora is not None:
            freeze_base(layer)
        self.layer = layer
        self.names = [p.name for p in layer.get_parameters()]
        self.trainable = [p for p in layer.get_parameters() if p.requires_grad]
        self.fn = _LayerFn(layer, shared_prompt)
        self.forward = _LayerForward(self.fn)
        self._load = _Load(list(layer.get_parameters()))

    def sources(self, model) -> List[list]:
        """Per decoder layer of `model`, its parameters in the template's order."""
        out = []
        for layer in model.model.layers:
            by_suffix = {p.name.split(".", 3)[3]: p for p in layer.get_parameters()}   # model.layers.K.<name>
            if sorted(by_suffix) != sorted(self.names):
                raise ValueError(f"engine.layerwise_update: a layer of this model has parameters "
                                 f"{sorted(by_suffix)}, the template {sorted(self.names)}")
            out.append([by_suffix[n] for n in self.names])
        return out

    def load(self, params):
        self._load(aliases(params, range(len(params))))


class LayerwiseTrainStep(AccumulatedUpdate):
    """PolicyTrainStep with a graph per decoder layer (the module docstring says how and why). One optimizer
    update per call; the mini-batch cut into `micro_batches` micro-batches, or of `micro_rows` rows each."""

    def __init__(self, loss_cell: GRPOLossCell, optimizer, mesh, max_grad_norm: float, micro_batches: int,
                 template: LayerTemplate, micro_rows: int = 0):
        self.mesh, self.micro_batches, self.micro_rows = mesh, micro_batches, micro_rows
        model = loss_cell.model
        decoder = model.model
        params = list(optimizer.params)
        self.acc = zeros_like(optimizer.params, "grad_acc")
        index = {p.name: i for i, p in enumerate(params)}
        self.template = template
        self.sources = template.sources(model)
        trained = [template.names.index(p.name) for p in template.trainable]
        self.acc_ids = [tuple(index[layer[j].name] for j in trained) for layer in self.sources]
        layer_names = {p.name for layer in self.sources for p in layer}
        self.shared_prompt = group, prompt_len = loss_cell.shared_prompt
        self.inputs = _Inputs(decoder, group, prompt_len)
        self.routing, self.sparse_index = _Routing(group, prompt_len), decoder.sparse_index
        self.backward = _LayerBackward(template.fn, template.trainable)
        embed_fn = _Embed(decoder)
        self.embed = _EmbedForward(embed_fn)
        weight = decoder.tok_embeddings.embedding_weight
        self.embed_backward = _EmbedBackward(embed_fn, weight, self.acc[index[weight.name]]) \
            if weight.name in index else None
        # the head's trainable parameters: the final norm, the LM head or (tied) the embedding
        head_ids = [i for i, p in enumerate(params) if p.name not in layer_names and
                    (p.name != weight.name or model.tie)]
        self.head = _HeadStep(loss_cell, [params[i] for i in head_ids],
                              ms.ParameterTuple([self.acc[i] for i in head_ids]))
        self.apply = ApplyAccumulated(optimizer, self.acc, mesh, split_axes(model, params), max_grad_norm)

    def accumulate(self, input_ids, position_ids, bias, labels, loss_inputs: LossInputs) -> np.ndarray:
        """The mini-batch's gradients summed into `self.acc`, layer by layer (each layer's weights copied into
        the template once per pass), the head in micro-batches; returns (loss, LOSS_STATS)."""
        rows = input_ids.shape[0]
        cuts = layer_calls(rows, self.micro_rows)
        ins = [self.inputs(input_ids[c], position_ids[c], bias[c]) for c in cuts]
        routes = None if loss_inputs.routing is None else \
            [self.routing(loss_inputs.routing[c], loss_inputs.router_grad[c]) for c in cuts]
        streams: List[list] = [[self.embed(tokens)] for tokens, *_ in ins]
        layers = len(self.sources)
        for k in range(layers):
            self.template.load(self.sources[k])
            for j, (x, args) in enumerate(zip(streams, ins)):
                x.append(self.template.forward(x[-1], *args[1:], *_layer_route(routes, j, self.sparse_index[k])))
        per_micro, grads = [], []
        head = HeadPieces(self.micro_rows or rows // self.micro_batches, *self.shared_prompt)
        for c, x in zip(cuts, streams):
            pieces = []
            total = c.stop - c.start
            for h, piece in zip(head.cuts(c), head.cut(x.pop(), total)):
                loss, aux, dx = self.head(piece, labels[h], *loss_inputs.rows(h).without_routing().args())
                per_micro.append([float(loss.asnumpy())] + [float(a.asnumpy()) for a in aux])
                pieces.append(dx)
            grads.append(head.join(pieces, total))
        for k in reversed(range(layers)):
            self.template.load(self.sources[k])
            acc = aliases(self.acc, self.acc_ids[k])
            for j, (x, args) in enumerate(zip(streams, ins)):
                grads[j] = self.backward(x.pop(), *args[1:], grads[j], acc,
                                         *_layer_route(routes, j, self.sparse_index[k]))
        if self.embed_backward is not None:
            for (tokens, *_), dx in zip(ins, grads):
                self.embed_backward(tokens, dx)
        return micro_batch_stats(per_micro, self.mesh)


def layer_calls(rows: int, micro_rows: int) -> List[slice]:
    """The rows each layer graph call takes: all of them (a layer's activations are small; one call per layer
    keeps the matmuls large and the calls few), or micro-batches of `micro_rows` (packed rows, whose count
    varies by update: a fixed shape compiles once)."""
    n = micro_rows or rows
    return [slice(i, i + n) for i in range(0, rows, n)]


class HeadPieces:
    """The head's micro-batches of `rows` rows within a layer call: its vocabulary-sized logits are what
    micro-batches bound. Cuts the last layer's stream of a call over `total` rows and joins the head's input
    gradients back: whole rows (B, T, H) by rows; a shared-prompt token matrix (layer_graphs.SharedPrompt) by
    groups, each piece its groups' prompt tokens, then their responses' tokens."""

    def __init__(self, rows: int, group: int = 0, prompt_len: int = 0):
        self.rows, self.group, self.prompt_len = rows, group, prompt_len

    def cuts(self, call: slice) -> List[slice]:
        """The batch rows of each piece of the layer call over rows `call`."""
        return [slice(call.start + i, call.start + j) for i, j in self._bounds(call.stop - call.start)]

    def _bounds(self, total: int) -> list:
        """(first, end) rows of each piece within a call over `total` rows."""
        return [(i, min(i + self.rows, total)) for i in range(0, total, self.rows)]

    def cut(self, x, total: int) -> list:
        if total <= self.rows:
            return [x]
        if not self.group:
            return [x[i:j] for i, j in self._bounds(total)]
        prompt_tokens = total // self.group * self.prompt_len
        per_row = (x.shape[0] - prompt_tokens) // total
        return [ops.concat((x[i // self.group * self.prompt_len:j // self.group * self.prompt_len],
                            x[prompt_tokens + i * per_row:prompt_tokens + j * per_row]), 0)
                for i, j in self._bounds(total)]

    def join(self, pieces: list, total: int):
        """The pieces' gradients as one stream gradient, laid out as the stream `cut` cut."""
        if len(pieces) == 1:
            return pieces[0]
        if not self.group:
            return ops.concat(pieces, 0)
        heads = [(j - i) // self.group * self.prompt_len for i, j in self._bounds(total)]
        return ops.concat([p[:h] for p, h in zip(pieces, heads)] + [p[h:] for p, h in zip(pieces, heads)], 0)


class _HeadLogProb(nn.Cell):
    """The last layer's stream -> log-probs of the labels' last `response_len` positions, no gradient."""

    def __init__(self, model, response_len: int, temperature: float, group: int, prompt_len: int):
        super().__init__(auto_prefix=False)
        self.model = model
        self.response_len, self.temperature = response_len, temperature
        self.group, self.prompt_len = group, prompt_len

    @ms.jit
    def construct(self, x, labels):
        logp, _ = _head_logprobs(self.model, x, labels, self.group, self.prompt_len, self.response_len,
                                 self.temperature)
        return ops.stop_gradient(logp)


class LayerwiseLogProb:
    """ResponseLogProb run through the template one layer at a time (its compiled forward, shared with the
    update), each layer called on `layer_rows` rows at a time (the update's mini-batch or packed micro-batch:
    the update's shapes, so its compiled graphs serve), the head on `head_rows` (the update's micro-batches:
    the vocabulary-sized logits exist for one at a time). The log-prob passes compile no model-deep graph
    either."""

    def __init__(self, model, template: LayerTemplate, response_len: int, temperature: float = 1.0,
                 shared_prompt=(0, 0), head_rows: int = 0, layer_rows: int = 0):
        group, prompt_len = self.shared_prompt = shared_prompt
        self.template, self.sources = template, template.sources(model)
        self.head_rows, self.layer_rows = head_rows, layer_rows
        self.inputs = _Inputs(model.model, group, prompt_len)
        self.routing, self.sparse_index = _Routing(group, prompt_len), model.model.sparse_index
        self.num_experts = model.config.num_experts
        self.embed = _EmbedForward(_Embed(model.model))
        self.head = _HeadLogProb(model, response_len, temperature, group, prompt_len)

    def __call__(self, input_ids, position_ids, bias, labels, routing=None):
        """(N, R) log-probs; `routing` (N, T, sparse layers, k): the experts to replay (router replay)."""
        rows = input_ids.shape[0]
        cuts = layer_calls(rows, self.layer_rows if self.layer_rows and rows % self.layer_rows == 0 else 0)
        ins = [self.inputs(input_ids[c], position_ids[c], bias[c]) for c in cuts]
        routes = None if routing is None else [self.routing(routing[c], Tensor(np.zeros(
            (c.stop - c.start, routing.shape[1], self.num_experts), np.float32))) for c in cuts]
        xs = [self.embed(tokens) for tokens, *_ in ins]
        for k, params in enumerate(self.sources):
            self.template.load(params)
            xs = [self.template.forward(x, *args[1:], *_layer_route(routes, j, self.sparse_index[k]))
                  for j, (x, args) in enumerate(zip(xs, ins))]
        out = []
        for c, x in zip(cuts, xs):
            total = c.stop - c.start
            head = HeadPieces(self.head_rows if self.head_rows and total % self.head_rows == 0 else total,
                              *self.shared_prompt)
            out += [self.head(piece, labels[h]).asnumpy() for h, piece in zip(head.cuts(c), head.cut(x, total))]
        return Tensor(np.concatenate(out, 0))
