"""Hugging Face <-> mindrlhf weights: names, files (single or sharded safetensors), config.json.

Our names are MindFormers' (`model.layers.0.attention.wq.weight`); the mapping is a fixed table per
parameter position, so it is exact in both directions (no substring guessing).
"""
from __future__ import annotations

import json
import os
import re
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from mindrlhf.checkpoint.safetensors_io import SafeTensorsFile, write_safetensors
from mindrlhf.configs.errors import CheckpointError
from mindrlhf.configs.model_config import ModelConfig
from mindrlhf.utils.atomic import write_json

_LAYER_MAP = [  # (our suffix, HF suffix) inside model.layers.N.
    ("attention_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("attention.wq.weight", "self_attn.q_proj.weight"),
    ("attention.wk.weight", "self_attn.k_proj.weight"),
    ("attention.wv.weight", "self_attn.v_proj.weight"),
    ("attention.wq.bias", "self_attn.q_proj.bias"),
    ("attention.wk.bias", "self_attn.k_proj.bias"),
    ("attention.wv.bias", "self_attn.v_proj.bias"),
    ("attention.wo.weight", "self_attn.o_proj.weight"),
    ("feed_forward.w1.weight", "mlp.gate_proj.weight"),
    ("feed_forward.w3.weight", "mlp.up_proj.weight"),
    ("feed_forward.w2.weight", "mlp.down_proj.weight"),
]
_GLOBAL_MAP = [
    ("model.tok_embeddings.embedding_weight", "model.embed_tokens.weight"),
    ("model.norm_out.weight", "model.norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
]
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_TO_HF = dict(_LAYER_MAP)
_TO_MS = {hf: ms for ms, hf in _LAYER_MAP}


def ms_to_hf_name(name: str) -> str:
    for ours, hf in _GLOBAL_MAP:
        if name == ours:
            return hf
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _TO_HF:
        return f"model.layers.{m.group(1)}.{_TO_HF[m.group(2)]}"
    raise CheckpointError(f"parameter {name}: no Hugging Face name is known for it")


def hf_to_ms_name(name: str) -> Optional[str]:
    """Our name for an HF tensor, or None for tensors we do not keep (e.g. rotary inv_freq buffers)."""
    for ours, hf in _GLOBAL_MAP:
        if name == hf:
            return ours
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _TO_MS:
        return f"model.layers.{m.group(1)}.{_TO_MS[m.group(2)]}"
    if name.endswith("rotary_emb.inv_freq"):
        return None
    raise CheckpointError(f"tensor {name}: not a Qwen2/Llama parameter name")


def hf_weight_files(path: str) -> List[str]:
    """The safetensors files of an HF checkpoint: a file, or a directory (sharded via the index)."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: no such checkpoint file or directory")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as fh:
            try:
                weight_map = json.load(fh)["weight_map"]
            except (ValueError, KeyError) as err:
                raise CheckpointError(f"{index}: not a safetensors index ({err})") from None
        files = sorted(set(weight_map.values()))
        for f in files:
            if not os.path.isfile(os.path.join(path, f)):
                raise CheckpointError(f"{index}: lists {f}, which is missing from {path}")
        return [os.path.join(path, f) for f in files]
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    raise CheckpointError(f"{path}: neither model.safetensors nor model.safetensors.index.json found")


def iter_hf_as_ms(path: str) -> Iterator[Tuple[str, np.ndarray]]:
    """(our name, array) for every kept tensor of an HF checkpoint, one at a time (memory-mapped)."""
    for file in hf_weight_files(path):
        f = SafeTensorsFile(file)
        for hf_name in f.keys():
            ours = hf_to_ms_name(hf_name)
            if ours is not None:
                yield ours, f.get(hf_name)


def export_hf(tensors: Dict[str, np.ndarray], out_dir: str, cfg: ModelConfig,
              max_shard_bytes: int = 4 << 30, torch_dtype: str = "float32"):
    """Write our full (unsharded) tensors as an HF Qwen2 checkpoint directory with config.json."""
    os.makedirs(out_dir, exist_ok=True)
    items = [(ms_to_hf_name(n), a) for n, a in tensors.items()
             if not (cfg.tie_word_embeddings and n == "lm_head.weight")]
    shards, current, size = [], [], 0
    for name, arr in items:
        if current and size + arr.nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((name, arr))
        size += arr.nbytes
    shards.append(current)
    if len(shards) == 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), shards[0], {"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(os.path.join(out_dir, fname), shard, {"format": "pt"})
            weight_map.update({n: fname for n, _ in shard})
        total = sum(a.nbytes for _, a in items)
        write_json(os.path.join(out_dir, "model.safetensors.index.json"),
                    {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    write_json(os.path.join(out_dir, "config.json"), hf_config_dict(cfg, torch_dtype), indent=2)


def hf_config_dict(cfg: ModelConfig, torch_dtype: str = "float32") -> dict:
    """A Qwen2 (qkv bias) or Llama (no bias) config.json for our model config."""
    common = {
        "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.n_kv_heads,
        "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.theta, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embedding, "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "torch_dtype": torch_dtype,
        "attention_dropout": 0.0,
    }
    if cfg.qkv_has_bias:
        return {**common, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                "use_sliding_window": False}
    return {**common, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
            "mlp_bias": False, "pad_token_id": cfg.pad_token_id}


def model_config_from_hf(path: str, **overrides) -> ModelConfig:
    """Our ModelConfig from an HF config.json (Qwen2 or Llama)."""
    cfg_path = os.path.join(path, "config.json") if os.path.isdir(path) else path
    with open(cfg_path, encoding="utf-8") as fh:
        hf = json.load(fh)
    is_qwen = hf.get("model_type") == "qwen2"
    kwargs = dict(
        hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
        n_kv_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
        intermediate_size=hf["intermediate_size"], vocab_size=hf["vocab_size"],
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), theta=float(hf.get("rope_theta", 10000.0)),
        qkv_has_bias=bool(is_qwen or hf.get("attention_bias", False)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embedding=hf.get("max_position_embeddings", 2048),
        seq_length=min(hf.get("max_position_embeddings", 2048), 4096),
        eos_token_id=hf.get("eos_token_id", 2), bos_token_id=hf.get("bos_token_id", 1) or 1,
    )
    kwargs.update(overrides)
    return ModelConfig(**kwargs)
