"""LoRA adapters on the decoder's linear layers: y = x W^T + (alpha / r) x A^T B^T (Hu et al. 2021).

A (r, in) starts uniform in +-1/sqrt(in) (PEFT's kaiming_uniform(a=sqrt(5)) bound), B (out, r) at zero, so
step 0 is the base model. Parameter names are MindFormers' (mindpet's LoRADense):
`model.layers.0.attention.wq.mindpet_delta_lora_a`. Under tensor parallelism an adapter follows its layer:
a column-parallel layer splits B on the output dim (A replicated), a row-parallel one A on the input dim (B
replicated); the replicated factor enters through copy_to_tp, whose backward sums its partial gradients over
the TP ranks. Under pipeline parallelism an adapter lives on its layer's stage (its name says the layer).

The base weights are frozen: only adapters train. Three things follow, all here:
- the reference model is the policy with its adapters off (`adapters_off`: B zeroed in place for the pass,
  then restored), so there is no reference copy and its log-probs reuse the policy's compiled graph;
- a rollout model of another layout or dtype receives merged weights W + scale B A through the ordinary
  re-layout (`merged_weights`); a policy that serves rollout itself runs with its adapters;
- A is drawn from (seed, name) at its full shape and each rank keeps its slice: the same adapters on any
  layout.
"""
from __future__ import annotations

import contextlib
import zlib
from typing import Dict

import numpy as np
import mindspore as ms

from mindrlhf.configs.lora import ROW_PARALLEL, LoraSpec
from mindrlhf.parallel.layouts import (EXPERTS_IN, EXPERTS_ONLY, EXPERTS_OUT, REPLICATED, TP_COLS, TP_ROWS,
                                       RoleWeights)
from mindrlhf.utils.params import param_as_f32, param_to_numpy, wait_for_graphs, write_param

ADAPTER_A, ADAPTER_B = "mindpet_delta_lora_a", "mindpet_delta_lora_b"


def is_adapter(name: str) -> bool:
    return name.endswith((ADAPTER_A, ADAPTER_B))


def adapter_specs(base_specs: Dict, spec: LoraSpec) -> Dict:
    """The adapters' entries for models.specs.param_specs: full shape and split, after their layer."""
    out = {}
    for name, (shape, split) in base_specs.items():
        out[name] = (shape, split)
        module = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
        if not (name.startswith("model.layers.") and spec.on(module)):
            continue
        prefix = name[:-len("weight")]
        if len(shape) == 3:
            out.update({prefix + f: s for f, s in _expert_adapter_specs(module, shape, spec).items()})
            continue
        out_dim, in_dim = shape
        row = module in ROW_PARALLEL
        out[prefix + ADAPTER_A] = ((spec.rank, in_dim), TP_COLS if row else REPLICATED)
        out[prefix + ADAPTER_B] = ((out_dim, spec.rank), REPLICATED if row else TP_ROWS)
    return out


def _expert_adapter_specs(module: str, shape, spec: LoraSpec) -> Dict:
    """A stacked expert weight's factors (models/moe.ExpertsFFN), W (E, in, out) -> A (E, r, in), B (E, out, r),
    every factor split over ep with its experts; the TP split follows the weight's: gate / up split out (B's dim
    1), down splits in (A's dim 2); the other factor is whole on every TP rank."""
    e, fan_in, fan_out = shape
    row = module in ROW_PARALLEL
    return {ADAPTER_A: ((e, spec.rank, fan_in), EXPERTS_IN if row else EXPERTS_ONLY),
            ADAPTER_B: ((e, fan_out, spec.rank), EXPERTS_ONLY if row else EXPERTS_OUT)}


def init_adapters(model, spec: LoraSpec):
    """A ~ U(-1/sqrt(in), 1/sqrt(in)) drawn at full shape from (seed, name), this rank's slice kept; B = 0."""
    layouts = model.layouts()
    for p in model.get_parameters():
        if p.name.endswith(ADAPTER_A):
            layout = layouts[p.name]
            rng = np.random.default_rng([spec.seed, zlib.crc32(p.name.encode())])
            bound = 1.0 / np.sqrt(layout.full_shape[-1])      # (r, in), or (E, r, in) per expert
            full = rng.uniform(-bound, bound, layout.full_shape).astype(np.float32)
            write_param(p, layout.shard(full, model.mesh.rank))


def freeze_base(model):
    """Only adapters train: every other parameter gets requires_grad False (trainable_params() skips it)."""
    for p in model.get_parameters():
        if not is_adapter(p.name):
            p.requires_grad = False


def adapter_params(model) -> list:
    return [p for p in model.get_parameters() if is_adapter(p.name)]


def saved_names(model):
    """The parameters a training checkpoint holds: a LoRA policy's adapters (the base is the run's
    load_sft_checkpoint_train, unchanged); None (all) without LoRA."""
    return {p.name for p in adapter_params(model)} if getattr(model, "lora", None) else None


@contextlib.contextmanager
def adapters_off(model):
    """The base model for the duration: every B zeroed in place (x A^T 0 adds exactly 0), restored after.
    No graph may run meanwhile on these parameters but the caller's."""
    saved = [(p, param_to_numpy(p)) for p in model.get_parameters() if p.name.endswith(ADAPTER_B)]
    wait_for_graphs()
    try:
        for p, value in saved:
            write_param(p, np.zeros_like(value))
        yield model
    finally:
        wait_for_graphs()
        for p, value in saved:
            write_param(p, value)


class BaseModelLogProb:
    """A log-prob cell of the policy run with its adapters off: the reference model of a LoRA run."""

    def __init__(self, logprob_cell, model):
        self.cell, self.model = logprob_cell, model

    def __call__(self, *inputs):
        with adapters_off(self.model):            # which waits for the pass before restoring them
            return self.cell(*inputs)


class MergedWeight:
    """W + scale B A of one adapted layer on this rank, computed when read (float32): the weight a rollout
    model without adapters receives. Column-parallel: B's rows and W's are the same output slice; row-parallel:
    A's columns and W's the same input slice; either way the product is W's shard, no communication. Stacked
    experts (E, in, out): per expert (B A)^T, each factor this rank's experts and width."""

    dtype = ms.float32

    def __init__(self, weight, a, b, scaling: float):
        self.name, self.shape = weight.name, tuple(weight.shape)
        self._w, self._a, self._b, self._scaling = weight, a, b, np.float32(scaling)

    def asnumpy(self) -> np.ndarray:
        w = param_as_f32(self._w).astype(np.float32, copy=True)
        update = param_as_f32(self._b) @ param_as_f32(self._a)           # (out, in), or (E, out, in)
        w += self._scaling * (update if w.ndim == 2 else update.transpose(0, 2, 1))   # experts: x @ W layout
        return w


def merged_weights(model) -> RoleWeights:
    """The model's weights as a model without adapters has them, adapted layers merged on read: the source of
    the weight sync to a separate rollout model and of a merged export (a model without adapters: its own)."""
    if getattr(model, "lora", None) is None:
        return model.weights()
    params = {p.name: p for p in model.get_parameters()}
    out = {}
    for name, p in params.items():
        if is_adapter(name):
            continue
        prefix = name[:-len("weight")]
        if name.endswith(".weight") and prefix + ADAPTER_A in params:
            out[name] = MergedWeight(p, params[prefix + ADAPTER_A], params[prefix + ADAPTER_B], model.lora.scaling)
        else:
            out[name] = p
    base_layouts = {n: lay for n, lay in model.layouts().items() if not is_adapter(n)}
    return RoleWeights(out, base_layouts, model.mesh.rank)


def adapter_weights(model) -> RoleWeights:
    """Only the adapters, with their layouts: what a PEFT export gathers."""
    layouts = model.layouts()
    return RoleWeights({p.name: p for p in adapter_params(model)},
                       {n: lay for n, lay in layouts.items() if is_adapter(n)}, model.mesh.rank)
