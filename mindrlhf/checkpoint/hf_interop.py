"""Hugging Face <-> mindrlhf weights: names, files (single or sharded safetensors), config.json.

Our names are MindFormers' (`model.layers.0.attention.wq.weight`); the mapping is a fixed table per
parameter position, so it is exact in both directions (no substring guessing).
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from mindrlhf.checkpoint.safetensors_io import (ITEMSIZE, SafeTensorsFile, SafeTensorsStreamWriter, require_float,
                                                tensor_stream, write_safetensors)
from mindrlhf.configs.errors import CheckpointError
from mindrlhf.configs.compat.hf import hf_config_dict
from mindrlhf.configs.model_config import ModelConfig
from mindrlhf.utils.atomic import write_json
from mindrlhf.utils.output_dir import owned_output_dir

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
    ("attention.q_layernorm.weight", "self_attn.q_norm.weight"),     # Qwen3 (qk_layernorm)
    ("attention.k_layernorm.weight", "self_attn.k_norm.weight"),
    ("feed_forward.w1.weight", "mlp.gate_proj.weight"),
    ("feed_forward.w3.weight", "mlp.up_proj.weight"),
    ("feed_forward.w2.weight", "mlp.down_proj.weight"),
]
_GLOBAL_MAP = [
    ("model.tok_embeddings.embedding_weight", "model.embed_tokens.weight"),
    ("model.norm_out.weight", "model.norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
    ("score.weight", "score.weight"),       # a sequence classifier's head (models/reward_model.py)
]
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Qwen3-MoE (models/moe.py). Ours: one stacked tensor per projection, MindFormers' (E, H, I) / (E, I, H).
# HF, as hub checkpoints and transformers 5.24's save_pretrained write it: one (out, in) tensor per expert,
# mlp.experts.N.{gate,up,down}_proj.weight; transformers' in-memory layout (a state_dict() saved as is) fuses
# them: mlp.experts.gate_up_proj (E, 2I, H) (gate rows first) and mlp.experts.down_proj (E, H, I). Both read,
# the hub layout written.
_MOE = "feed_forward.routed_experts."
_MOE_ROUTER = (_MOE + "router.dense.weight", "mlp.gate.weight")
_MOE_EXPERT = {_MOE + "ffn.w1.weight": "gate_proj", _MOE + "ffn.w3.weight": "up_proj",
               _MOE + "ffn.w2.weight": "down_proj"}
_EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_LAYER_MAP.append(_MOE_ROUTER)
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
    raise CheckpointError(f"tensor {name}: not a Qwen2/Qwen3/Llama parameter name (causal LM or sequence classifier)")


def is_expert_name(name: str) -> bool:
    """Our stacked-experts parameter (one tensor here, one per expert in the hub layout)."""
    m = _LAYER_RE.match(name)
    return bool(m) and m.group(2) in _MOE_EXPERT


def ms_to_hf_tensors(name: str, arr):
    """(HF name, array) pairs for one of our tensors: itself renamed, or a stacked expert tensor split into
    the hub layout's per-expert (out, in) tensors."""
    if not is_expert_name(name):
        return [(ms_to_hf_name(name), arr)]
    m = _LAYER_RE.match(name)
    proj = _MOE_EXPERT[m.group(2)]
    return [(f"model.layers.{m.group(1)}.mlp.experts.{e}.{proj}.weight", _like(arr, arr[e].T))
            for e in range(arr.shape[0])]


def ms_to_hf_specs(name: str, shape):
    """(HF name, shape) pairs ms_to_hf_tensors writes for a tensor of `shape`."""
    if not is_expert_name(name):
        return [(ms_to_hf_name(name), tuple(shape))]
    m = _LAYER_RE.match(name)
    proj = _MOE_EXPERT[m.group(2)]
    return [(f"model.layers.{m.group(1)}.mlp.experts.{e}.{proj}.weight", (shape[2], shape[1]))
            for e in range(shape[0])]


class _ExpertStacker:
    """Collects the hub layout's per-expert tensors and stacks them into ours once a layer's projection is
    complete (experts 0..E-1; E from the largest index seen at the end). Holds the expert tensors of the
    checkpoint until the end (fine for the models tested here; a 30B-A3B would want per-layer flushing)."""
    _OURS = {hf: ours for ours, hf in _MOE_EXPERT.items()}

    def __init__(self):
        self.parts = {}

    def add(self, hf_name: str, arr) -> bool:
        m = _EXPERT_RE.match(hf_name)
        if not m:
            return False
        layer, e, proj = int(m.group(1)), int(m.group(2)), m.group(3)
        self.parts.setdefault((layer, proj), {})[e] = arr
        return True

    def stacked(self, where: str):
        for (layer, proj), experts in sorted(self.parts.items()):
            if sorted(experts) != list(range(len(experts))):
                raise CheckpointError(f"{where}: model.layers.{layer}.mlp.experts.*.{proj}.weight: experts "
                                      f"{sorted(experts)} are not 0..{len(experts) - 1}")
            stack = np.stack([np.asarray(experts[e]) for e in range(len(experts))])     # (E, out, in)
            yield f"model.layers.{layer}.{self._OURS[proj]}", _like(experts[0], np.swapaxes(stack, 1, 2))


def _fused_as_ms(hf_name: str, arr):
    """transformers' fused expert tensors as ours: gate_up_proj (E, 2I, H) -> w1, w3 (E, H, I);
    down_proj (E, H, I) -> w2 (E, I, H)."""
    m = _FUSED_RE.match(hf_name)
    p = f"model.layers.{m.group(1)}.{_MOE}ffn."
    if m.group(2) == "down_proj":
        return [(p + "w2.weight", _like(arr, np.swapaxes(arr, 1, 2)))]
    i = arr.shape[1] // 2
    return [(p + "w1.weight", _like(arr, np.swapaxes(arr[:, :i], 1, 2))),
            (p + "w3.weight", _like(arr, np.swapaxes(arr[:, i:], 1, 2)))]


def _like(source, arr):
    """A C-contiguous copy of `arr` with the array type of `source` (bfloat16 bits stay marked as such)."""
    out = np.ascontiguousarray(arr)
    return out.view(type(source)) if isinstance(source, np.ndarray) and type(source) is not np.ndarray else out


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
    experts = _ExpertStacker()
    for file in hf_weight_files(path):
        f = SafeTensorsFile(file)
        for hf_name in f.keys():
            if experts.add(hf_name, require_float(f.get(hf_name), hf_name, file) if _EXPERT_RE.match(hf_name)
                           else None):
                continue
            if _FUSED_RE.match(hf_name):
                yield from _fused_as_ms(hf_name, require_float(f.get(hf_name), hf_name, file))
                continue
            ours = hf_to_ms_name(hf_name)
            if ours is not None:
                yield ours, require_float(f.get(hf_name), hf_name, file)
    yield from experts.stacked(path)


EXPORT_TOOL = "hf_export"

# what makes an HF folder usable beyond its weights: copied from the tokenizer folder on export
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "generation_config.json", "vocab.json", "merges.txt", "tokenizer.model")


def export_hf(tensors, out_dir: str, cfg: ModelConfig, max_shard_bytes: int = 4 << 30, torch_dtype: str = "float32",
              tokenizer_dir: str = "", overwrite: bool = False, flag: str = "HF export folder"):
    """Write our full (unsharded) tensors - a {name: array} dict, or a safetensors_io.TensorStream, written as
    it is produced, one tensor held at a time - as an HF Qwen2/Llama checkpoint directory with config.json,
    and the tokenizer files (TOKENIZER_FILES) of `tokenizer_dir` when it is a folder. Written to a temp folder
    and swapped in whole: a crash mid-export, or files of an earlier export (a stale shard index), never make
    a mixed model; a folder holding files we did not write is refused (utils/output_dir) unless `overwrite`."""
    stream = tensor_stream(tensors)
    dropped = "lm_head.weight" if cfg.tie_word_embeddings else None
    shards, size = [[]], 0
    for name, code, shape in stream.specs:
        if name == dropped:
            continue
        for hf_name, hf_shape in ms_to_hf_specs(name, shape):     # a stacked expert tensor: one per expert
            nbytes = math.prod(hf_shape) * ITEMSIZE[code]
            if shards[-1] and size + nbytes > max_shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append((hf_name, code, hf_shape))
            size += nbytes
    files = ["model.safetensors"] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    with owned_output_dir(out_dir, EXPORT_TOOL, flag, overwrite) as tmp:
        if tokenizer_dir and os.path.isdir(tokenizer_dir):
            for name in TOKENIZER_FILES:
                if os.path.isfile(os.path.join(tokenizer_dir, name)):
                    shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(tmp, name))
        shard, writer, written = 0, None, 0
        try:
            for name, arr in stream:
                if name == dropped:
                    continue
                for hf_name, hf_arr in ms_to_hf_tensors(name, arr):
                    if writer is None:
                        writer = SafeTensorsStreamWriter(os.path.join(tmp, files[shard]), shards[shard],
                                                         {"format": "pt"})
                    writer.write(hf_name, hf_arr)
                    written += 1
                    if written == len(shards[shard]):
                        writer.close()
                        shard, writer, written = shard + 1, None, 0
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        if shard != len(shards):
            raise CheckpointError(f"{out_dir}: the tensors ended before {files[shard]} was complete")
        if len(shards) > 1:
            weight_map = {n: files[i] for i, specs in enumerate(shards) for n, _, _ in specs}
            total = sum(math.prod(s) * ITEMSIZE[c] for specs in shards for _, c, s in specs)
            write_json(os.path.join(tmp, "model.safetensors.index.json"),
                       {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        write_json(os.path.join(tmp, "config.json"), hf_config_dict(cfg, torch_dtype), indent=2)


PEFT_PREFIX = "base_model.model."


def peft_adapter_name(name: str) -> str:
    """Our adapter name -> PEFT's: model.layers.0.attention.wq.mindpet_delta_lora_a ->
    base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight."""
    from mindrlhf.models.lora import ADAPTER_A, ADAPTER_B
    layer, factor = name.rsplit(".", 1)
    if factor not in (ADAPTER_A, ADAPTER_B):
        raise CheckpointError(f"parameter {name}: not a LoRA adapter factor")
    hf = ms_to_hf_name(layer + ".weight")[:-len("weight")]
    return f"{PEFT_PREFIX}{hf}{'lora_A' if factor == ADAPTER_A else 'lora_B'}.weight"


_EXPERTS_RE = re.compile(r"^model\.layers\.(\d+)\.feed_forward\.routed_experts\.ffn\.(w1|w2|w3)\."
                         r"(mindpet_delta_lora_[ab])$")
# PEFT's target_parameters on transformers' stacked experts, in this order: with both adapted, PEFT wraps gate_up_proj
# first, so its factors sit one level down (experts.base_layer.lora_A) and down_proj's at experts.lora_A
PEFT_EXPERT_PARAMETERS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
PEFT_GATE_UP_PATTERN = ".*\\.gate_up_proj"      # its rank_pattern / alpha_pattern key: rank 2r, alpha 2 alpha


def peft_adapter_tensors(tensors, lora) -> List[Tuple[str, np.ndarray]]:
    """Full adapter tensors (our names; a dict or a TensorStream) -> PEFT's (name, tensor) pairs. A linear
    layer's A and B keep their shapes. A sparse layer's experts become PEFT's target_parameters adapters, its
    factors stacked expert-major: A (E, r, in) -> (E r, in), rows e r + j; B (E, out, r) -> (out, r E), columns
    j E + e. gate_up_proj (transformers' fused [gate; up]) takes gate's and up's adapters as one of rank 2r
    (PEFT's own packing of per-projection adapters): A_e = [A_gate; A_up], B_e = [[B_gate, 0], [0, B_up]], with
    alpha 2 alpha so the scale stays alpha / r; a projection without an adapter contributes zeros."""
    gate_up, down = _expert_targets(lora)
    out, pending, dense_mlp = [], {}, []
    for name, a in tensor_stream(tensors):
        m = _EXPERTS_RE.match(name)
        if not m:
            out.append((peft_adapter_name(name), a))
            if ".feed_forward." in name:
                dense_mlp.append(name)
            continue
        layer, module, factor = m.groups()
        where = f"{PEFT_PREFIX}model.layers.{layer}.mlp.experts.{'base_layer.' if module != 'w2' and down else ''}"
        if module != "w2":
            pending.setdefault(layer, {})[(module, factor)] = a
            if len(pending[layer]) < 2 * len(gate_up):
                continue
            a, b = _gate_up_factors(pending.pop(layer), gate_up)
            out += [(where + "lora_A.weight", a), (where + "lora_B.weight", b)]
        elif factor.endswith("a"):
            out.append((where + "lora_A.weight", a.reshape(-1, a.shape[-1])))
        else:
            out.append((where + "lora_B.weight", np.ascontiguousarray(a.transpose(1, 2, 0)).reshape(a.shape[1], -1)))
    if pending:
        raise CheckpointError(f"PEFT export: layers {sorted(pending)}: an expert's gate/up adapter is incomplete")
    if dense_mlp and any(".mlp.experts." in n for n, _ in out):
        raise CheckpointError(f"PEFT export: {dense_mlp[0]}: {PEFT_DENSE_MLP_ON_MOE}")
    return out


PEFT_DENSE_MLP_ON_MOE = ("PEFT (0.17 and later, on transformers 5) turns gate_proj / up_proj / down_proj targets of a "
                         "Qwen3-MoE model into its experts' target_parameters, so the MLP adapters of its dense layers "
                         "(mlp_only_layers, decoder_sparse_step) cannot load from a PEFT folder")


def peft_export_refusal(cfg: ModelConfig, lora) -> str:
    """Why `lora` on `cfg` cannot go out as a PEFT folder ("" when it can): a MoE model with dense layers whose MLP
    carries adapters (checked at start-up, so a run does not learn it at its export)."""
    sparse = [cfg.is_moe_layer(n) for n in range(cfg.num_layers)]
    mlp = [m for m in ("w1", "w3", "w2") if m in lora.targets]
    if any(sparse) and not all(sparse) and mlp:
        return f"{PEFT_DENSE_MLP_ON_MOE}; targets {', '.join(mlp)} with dense layers " \
               f"{[n for n, s in enumerate(sparse) if not s]}"
    return ""


def _expert_targets(lora) -> Tuple[Tuple[str, ...], bool]:
    """(the gate/up projections adapted, of w1 and w3; whether down (w2) is)."""
    return tuple(m for m in ("w1", "w3") if m in lora.targets), "w2" in lora.targets


def _gate_up_factors(parts: Dict, adapted: Tuple[str, ...]) -> Tuple[np.ndarray, np.ndarray]:
    """PEFT's rank-2r gate_up_proj factors from our {(w1 | w3, factor): tensor} of one layer."""
    from mindrlhf.models.lora import ADAPTER_A, ADAPTER_B
    like_a, like_b = (parts[(adapted[0], f)] for f in (ADAPTER_A, ADAPTER_B))
    e, r, fan_in = like_a.shape
    width = like_b.shape[1]
    a = np.zeros((e, 2 * r, fan_in), like_a.dtype)
    b = np.zeros((e, 2 * width, 2 * r), like_b.dtype)
    for k, module in enumerate(("w1", "w3")):
        if module in adapted:
            a[:, k * r:(k + 1) * r] = parts[(module, ADAPTER_A)]
            b[:, k * width:(k + 1) * width, k * r:(k + 1) * r] = parts[(module, ADAPTER_B)]
    return a.reshape(e * 2 * r, fan_in), np.ascontiguousarray(b.transpose(1, 2, 0)).reshape(2 * width, -1)


def export_peft_adapter(tensors: Dict[str, np.ndarray], out_dir: str, lora, base_model: str = "",
                        overwrite: bool = False, flag: str = "PEFT adapter folder"):
    """Write full adapter tensors (our names; a dict or a TensorStream) as PEFT's LoRA folder: adapter_config.json and
    adapter_model.safetensors with PEFT's key names, for peft.PeftModel.from_pretrained(base, out_dir).
    `lora`: the run's configs.lora.LoraSpec. A MoE model's experts go out as target_parameters (PEFT >= 0.17)."""
    from mindrlhf.configs.lora import MODULES
    pairs = peft_adapter_tensors(tensors, lora)
    moe = any(".mlp.experts." in n for n, _ in pairs)
    gate_up, down = _expert_targets(lora) if moe else ((), False)
    # a MoE model's MLP targets are its experts' target_parameters: listed as modules, PEFT would convert them itself
    modules = [MODULES[m] for m in lora.targets if not (moe and m in ("w1", "w3", "w2"))]
    with owned_output_dir(out_dir, EXPORT_TOOL, flag, overwrite) as tmp:
        write_safetensors(os.path.join(tmp, "adapter_model.safetensors"), pairs, {"format": "pt"})
        write_json(os.path.join(tmp, "adapter_config.json"), {
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha,
            "lora_dropout": 0.0, "target_modules": modules, "bias": "none",
            "target_parameters": [p for p, on in zip(PEFT_EXPERT_PARAMETERS, (bool(gate_up), down)) if on] or None,
            "rank_pattern": {PEFT_GATE_UP_PATTERN: 2 * lora.rank} if gate_up else {},
            "alpha_pattern": {PEFT_GATE_UP_PATTERN: 2 * lora.alpha} if gate_up else {},
            "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "modules_to_save": None,
            "init_lora_weights": True, "inference_mode": True, "base_model_name_or_path": base_model}, indent=2)
