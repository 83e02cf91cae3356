"""Every parameter of the decoder without building it: full shapes, how each is split over the mesh, which
pipeline stage holds it, and the layouts that follow (strategy files, checkpoint slicing, re-layout). A test
checks the list against the built model."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from mindrlhf.configs.lora import LoraSpec
from mindrlhf.configs.model_config import ModelConfig, layer_split
from mindrlhf.models.lora import adapter_specs
from mindrlhf.parallel.layouts import (EXPERTS_IN, EXPERTS_OUT, REPLICATED, TP_COLS, TP_ROWS, Layout,
                                       experts_split_over, role_layouts)
from mindrlhf.parallel.mesh import Mesh


def param_specs(cfg: ModelConfig, lora: Optional[LoraSpec] = None) -> Dict[str, Tuple[Tuple[int, ...], Dict[int, str]]]:
    """Every parameter's full shape and which mesh axis splits which dimension ({} = replicated; {0: "tp"}: the
    first dimension over the TP ranks); with `lora`, the adapters' too (after their layer's weight).

    The one place that knows the parameter list without building the model."""
    h, hd, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    specs: Dict[str, Tuple[Tuple[int, ...], Dict[int, str]]] = {
        "model.tok_embeddings.embedding_weight": ((cfg.vocab_size, h), TP_ROWS)}
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        specs[p + "attention_norm.weight"] = ((h,), REPLICATED)
        specs[p + "attention.wq.weight"] = ((cfg.num_heads * hd, h), TP_ROWS)
        specs[p + "attention.wk.weight"] = ((cfg.n_kv_heads * hd, h), TP_ROWS)
        specs[p + "attention.wv.weight"] = ((cfg.n_kv_heads * hd, h), TP_ROWS)
        if cfg.qkv_has_bias:
            specs[p + "attention.wq.bias"] = ((cfg.num_heads * hd,), TP_ROWS)
            specs[p + "attention.wk.bias"] = ((cfg.n_kv_heads * hd,), TP_ROWS)
            specs[p + "attention.wv.bias"] = ((cfg.n_kv_heads * hd,), TP_ROWS)
        specs[p + "attention.wo.weight"] = ((h, cfg.num_heads * hd), TP_COLS)
        if cfg.qk_layernorm:
            specs[p + "attention.q_layernorm.weight"] = ((hd,), REPLICATED)
            specs[p + "attention.k_layernorm.weight"] = ((hd,), REPLICATED)
        specs[p + "ffn_norm.weight"] = ((h,), REPLICATED)
        if cfg.is_moe_layer(n):     # Qwen3-MoE (models/moe.py): the router replicated, the experts split over ep
            e, mi = cfg.num_experts, cfg.moe_intermediate_size     # and each expert's width over tp
            specs[p + "feed_forward.routed_experts.router.dense.weight"] = ((e, h), REPLICATED)
            specs[p + "feed_forward.routed_experts.ffn.w1.weight"] = ((e, h, mi), EXPERTS_IN)
            specs[p + "feed_forward.routed_experts.ffn.w3.weight"] = ((e, h, mi), EXPERTS_IN)
            specs[p + "feed_forward.routed_experts.ffn.w2.weight"] = ((e, mi, h), EXPERTS_OUT)
            continue
        specs[p + "feed_forward.w1.weight"] = ((i, h), TP_ROWS)
        specs[p + "feed_forward.w3.weight"] = ((i, h), TP_ROWS)
        specs[p + "feed_forward.w2.weight"] = ((h, i), TP_COLS)
    specs["model.norm_out.weight"] = ((h,), REPLICATED)
    if not cfg.tie_word_embeddings:
        specs["lm_head.weight"] = ((cfg.vocab_size, h), TP_ROWS)
    return adapter_specs(specs, lora) if lora else specs


def param_stages(cfg: ModelConfig, pp: int, lora: Optional[LoraSpec] = None) -> Dict[str, int]:
    """The pipeline stage that holds each parameter: the embedding on the first, the final norm and LM head on
    the last, each decoder layer where layer_split puts it."""
    split = layer_split(cfg.num_layers, pp, cfg.offset)
    stage_of_layer = {layer: s for s, layers in enumerate(split) for layer in layers}
    out = {}
    for name in param_specs(cfg, lora):
        if name.startswith("model.layers."):
            out[name] = stage_of_layer[int(name.split(".")[2])]
        else:
            out[name] = 0 if name.startswith("model.tok_embeddings") else pp - 1
    return out


def mesh_layouts(cfg: ModelConfig, mesh: Mesh, lora: Optional[LoraSpec] = None) -> Dict[str, Layout]:
    """Every parameter's layout for a role on `mesh` (strategy files, slicing, re-layout)."""
    specs = param_specs(cfg, lora)
    if mesh.experts_over_tp:
        specs = {name: (shape, experts_split_over(split, mesh.expert_axes)) for name, (shape, split) in specs.items()}
    return role_layouts(specs, mesh, param_stages(cfg, mesh.pp, lora) if mesh.pp > 1 else None)


def layouts_for(cfg: ModelConfig, dp: int, tp: int, pp: int = 1, lora: Optional[LoraSpec] = None,
                ep: int = 1, experts_over_tp: bool = False) -> Dict[str, Layout]:
    """mesh_layouts for a role arranged [pp, dp, tp] (a layout read from a config or a checkpoint); `dp` counts
    the EP ranks too (parallel_config.data_parallel), as `ep` divides it; `experts_over_tp`: moe_tp_extend_ep."""
    return mesh_layouts(cfg, Mesh(dp=dp // ep, tp=tp, pp=pp, extra_axes=(("ep", ep),) if ep > 1 else (),
                                  experts_over_tp=experts_over_tp), lora)
