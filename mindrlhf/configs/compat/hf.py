"""A Hugging Face model folder as a model config: config.json <-> ModelConfig, key by key.

A user with an HF folder (config.json, safetensors, tokenizer.json) passes the folder where a MindFormers
model YAML is expected (`--sft_path_train DIR`), or writes the YAML once with
`python -m mindrlhf.configs.hf_config DIR --data_parallel 2 -o finetune.yaml` to edit its layout.

Every config.json key is in one of the tables below: mapped to a ModelConfig field, inert (reported once,
with the reason) or checked (an error unless it has the value we implement). An unknown key is an error
naming it: it may change the model, and we would rather say so than train something else.
generation_config.json's eos_token_id (an instruct model's end-of-turn token) is read as well.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

import yaml

from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.model_config import ModelConfig, ModelYaml, ParallelConfig

# architecture -> (its model_type, the ModelConfig fields it fixes that config.json does not state): Qwen2's
# q/k/v always carry a bias (transformers' Qwen2Attention ignores attention_bias), Qwen3 norms q and k per head
ARCHITECTURES = {"LlamaForCausalLM": ("llama", {}), "Qwen2ForCausalLM": ("qwen2", {"qkv_has_bias": True}),
                 "Qwen3ForCausalLM": ("qwen3", {"qk_layernorm": True}),
                 "Qwen3MoeForCausalLM": ("qwen3_moe", {"qk_layernorm": True})}
# config.json keys of a sequence classifier (the reward-model role) beside the decoder's: read by
# classifier_config_from_hf, refused for a causal LM as any unknown key is
CLASSIFIER_KEYS = ("id2label", "label2id", "num_labels")


def sequence_classifiers() -> Dict[str, Tuple[str, Dict]]:
    """<Decoder>ForSequenceClassification for every causal LM we implement (the decoder plus a score head):
    the architectures the reward-model role reads, and only that role."""
    return {a.replace("ForCausalLM", "ForSequenceClassification"): v for a, v in ARCHITECTURES.items()}

# config.json key -> ModelConfig field
HF_MAPPED = {
    "hidden_size": "hidden_size", "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
    "num_key_value_heads": "n_kv_heads", "intermediate_size": "intermediate_size", "vocab_size": "vocab_size",
    "rms_norm_eps": "rms_norm_eps", "rope_theta": "theta", "attention_bias": "qkv_has_bias",
    "tie_word_embeddings": "tie_word_embeddings", "max_position_embeddings": "max_position_embedding",
    "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "pad_token_id": "pad_token_id",
    "initializer_range": "initializer_range", "head_dim": "head_dim (default: hidden_size / num_attention_heads)",
    "rope_scaling": "extend_method / scaling_factor (rope_type default or llama3)",
    "rope_parameters": "theta, extend_method / scaling_factor (transformers 5's spelling of rope_theta + "
                       "rope_scaling)",
    # Qwen3-MoE (models/moe.py)
    "num_experts": "num_experts", "num_local_experts": "num_experts (transformers 5's save_pretrained spelling)",
    "num_experts_per_tok": "num_experts_per_tok", "moe_intermediate_size": "moe_intermediate_size",
    "norm_topk_prob": "norm_topk_prob", "decoder_sparse_step": "decoder_sparse_step",
    "mlp_only_layers": "mlp_only_layers", "router_aux_loss_coef": "router_aux_loss_coef",
}
_MOE_KEYS = ("num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
             "mlp_only_layers", "router_aux_loss_coef")
HF_INERT: Dict[str, str] = {}
for _names, _why in (
        ("transformers_version _name_or_path _model_name_or_path name_or_path transformers.js_config "
         "is_llama_config auto_map tokenizer_class unk_token_id output_attentions output_hidden_states "
         "return_dict problem_type", "bookkeeping; no effect on the weights or the math"),
        ("torch_dtype dtype", "the weights load into the model config's dtypes (float32 by default)"),
        ("use_cache", "the rollout always uses its KV cache"),
        ("attention_dropout hidden_dropout embd_pdrop resid_pdrop", "dropout is off in RL fine-tuning"),
        ("pretraining_tp", "a matmul split of the pretraining run; the same math"),
        ("max_window_layers", "sliding-window attention is off (use_sliding_window false)"),
        ("sliding_window", "sliding-window attention is off (use_sliding_window false)"),
        ("bos_token", "token strings live in the tokenizer files"),
        ("output_router_logits", "the load-balancing loss joins the GRPO update whenever router_aux_loss_coef "
                                 "is above 0 (trainer/aux_loss.py)")):
    HF_INERT.update(dict.fromkeys(_names.split(), _why))
# key -> (check(value, raw), what is expected)
HF_CHECKED = {
    "hidden_act": (lambda v, raw: v == "silu", "\"silu\" (SwiGLU MLP)"),
    "mlp_bias": (lambda v, raw: not v, "false"),
    "use_sliding_window": (lambda v, raw: not v, "false"),
    "rope_interleaved": (lambda v, raw: not v, "false (rotate-half RoPE)"),
    "layer_types": (lambda v, raw: all(t == "full_attention" for t in v), "full_attention in every layer"),
}
ROPE_TYPES = ("default", "llama3")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def is_hf_folder(path: str) -> bool:
    return bool(path) and os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))


HF_FOLDER = "an HF model folder: config.json, safetensors weights, tokenizer files"


def check_model_folder(path: str, yaml_too: bool = False):
    """A ConfigError saying what was expected when `path` is missing or a folder without config.json
    (`yaml_too`: a model YAML file is accepted there as well)."""
    expected = f"a model YAML file or {HF_FOLDER}" if yaml_too else HF_FOLDER
    if not os.path.exists(path):
        raise ConfigError(f"{path}: not found (expected {expected})")
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(f"{path}: a folder without config.json (expected {expected})")


def read_json_object(path: str, what: str = "JSON") -> Dict[str, Any]:
    """A JSON file holding an object (an HF folder's config files, vocab.json); errors name the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not readable {what} ({err})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return raw


def _rope(raw: Dict[str, Any], where: str) -> Dict[str, Any]:
    """theta and RoPE scaling from rope_theta + rope_scaling (transformers 4) or rope_parameters (5)."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling")
    if scaling:
        params.update(scaling)
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    out: Dict[str, Any] = {"theta": float(theta)}
    if rope_type not in ROPE_TYPES:
        raise ConfigError(f"{where}: rope_scaling rope_type {rope_type!r} is not supported (supported: "
                          f"{', '.join(ROPE_TYPES)})")
    if rope_type == "llama3":
        missing = [k for k in LLAMA3_KEYS if k not in params]
        if missing:
            raise ConfigError(f"{where}: rope_scaling (llama3) misses {', '.join(missing)}")
        out["extend_method"] = "LLAMA3"
        out["scaling_factor"] = {k: float(params[k]) for k in LLAMA3_KEYS}
    return out


def _moe(raw: Dict[str, Any], where: str) -> Dict[str, Any]:
    """Qwen3-MoE's keys (num_experts, or num_local_experts as transformers 5 writes it; its defaults where a
    key is absent, as Qwen3MoeConfig's)."""
    experts = [raw[k] for k in ("num_experts", "num_local_experts") if raw.get(k) is not None]
    if len(set(map(str, experts))) > 1:
        raise ConfigError(f"{where}: num_experts {experts[0]!r} and num_local_experts {experts[1]!r} differ")
    if not experts:
        present = [k for k in _MOE_KEYS if k in raw]
        if present:
            raise ConfigError(f"{where}: {present[0]} given without num_experts")
        return {}
    return dict(num_experts=experts[0], num_experts_per_tok=raw.get("num_experts_per_tok", 8),
                moe_intermediate_size=raw.get("moe_intermediate_size", 768),
                norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
                decoder_sparse_step=raw.get("decoder_sparse_step", 1),
                mlp_only_layers=list(raw.get("mlp_only_layers") or []),
                router_aux_loss_coef=float(raw.get("router_aux_loss_coef", 0.001)))


def model_config_from_hf(path: str, ignored: Optional[list] = None, classifier: bool = False,
                         **overrides) -> ModelConfig:
    """Our ModelConfig from an HF folder (or its config.json); inert keys are appended to `ignored` as
    (key, reason), unsupported values and unknown keys raise ConfigError naming the file and key.
    `classifier`: the folder is a sequence classifier (the reward-model role) instead of a causal LM."""
    check_model_folder(path)
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    cfg_path = os.path.join(path, "config.json") if os.path.isdir(path) else path
    raw = read_json_object(cfg_path)
    ignored = ignored if ignored is not None else []
    arch = raw.get("architectures") or []
    if not classifier and len(arch) == 1 and arch[0] in sequence_classifiers():
        raise ConfigError(f"{cfg_path}: architectures {arch[0]} is a sequence classifier (a reward model: set "
                          f"the folder as reward.reward_model); a policy, rollout or reference model must be a "
                          f"causal LM ({', '.join(ARCHITECTURES)})")
    known = sequence_classifiers() if classifier else ARCHITECTURES
    if len(arch) != 1 or arch[0] not in known:
        raise ConfigError(f"{cfg_path}: architectures {arch!r} is not supported (supported: "
                          f"{', '.join(known)})")
    model_type, fixed = known[arch[0]]
    if raw.get("model_type") != model_type:
        raise ConfigError(f"{cfg_path}: model_type {raw.get('model_type')!r} does not match {arch[0]} "
                          f"(expected {model_type!r})")
    for key, value in raw.items():
        if key in HF_MAPPED or key in ("architectures", "model_type") or (classifier and key in CLASSIFIER_KEYS):
            continue
        if key in HF_CHECKED:
            ok, expected = HF_CHECKED[key]
            try:
                good = ok(value, raw)
            except (TypeError, ValueError, KeyError):
                good = False
            if not good:
                raise ConfigError(f"{cfg_path}: {key}: {value!r} is not supported (expected {expected})")
        elif key in HF_INERT:
            ignored.append((key, HF_INERT[key]))
        else:
            raise ConfigError(f"{cfg_path}: {key}: unknown config.json key; it may change the model, so it is "
                              f"not ignored (the keys read are listed in docs/UPSTREAM.md)")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        if key not in raw:
            raise ConfigError(f"{cfg_path}: {key}: missing")
    eos = raw.get("eos_token_id") if raw.get("eos_token_id") is not None else 2    # transformers 5 writes null
    gen_path = os.path.join(folder, "generation_config.json")
    if os.path.isfile(gen_path):
        generation = read_json_object(gen_path)
        eos = generation.get("eos_token_id", eos)     # an instruct model's end-of-turn token(s)
        ignored += [(f"generation_config.json {k}", "sampling is set by the GRPO config's sampling section")
                    for k in generation if k not in ("eos_token_id", "bos_token_id", "pad_token_id",
                                                     "transformers_version", "_from_model_config")]
    pad = raw.get("pad_token_id")
    positions = int(raw.get("max_position_embeddings", 2048))
    kwargs = dict(
        hidden_size=raw["hidden_size"], num_layers=raw["num_hidden_layers"], num_heads=raw["num_attention_heads"],
        n_kv_heads=raw.get("num_key_value_heads") or raw["num_attention_heads"],
        intermediate_size=raw["intermediate_size"], vocab_size=raw["vocab_size"],
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        qkv_has_bias=bool(raw.get("attention_bias", False)), head_dim=raw.get("head_dim"),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        max_position_embedding=positions, seq_length=min(positions, 4096),
        eos_token_id=eos, bos_token_id=raw.get("bos_token_id") if raw.get("bos_token_id") is not None else 1,
        pad_token_id=pad if isinstance(pad, int) else 0,
        initializer_range=float(raw.get("initializer_range", 0.02)),
        **_rope(raw, cfg_path), **_moe(raw, cfg_path))
    kwargs.update(fixed)
    kwargs.update(overrides)
    try:
        return ModelConfig(**kwargs)
    except ConfigError as err:
        raise ConfigError(f"{cfg_path}: {err}") from None


def classifier_config_from_hf(path: str, ignored: Optional[list] = None) -> Tuple[ModelConfig, int]:
    """(decoder config, num_labels) of an HF sequence-classification folder (a reward model): the score head
    is (num_labels, hidden), without bias. num_labels as transformers reads it: id2label's size, else
    num_labels, else 2."""
    cfg_path = os.path.join(path, "config.json") if os.path.isdir(path) else path
    raw = read_json_object(cfg_path)
    labels = raw.get("id2label")
    num_labels = len(labels) if isinstance(labels, dict) and labels else raw.get("num_labels", 2)
    if not isinstance(num_labels, int) or num_labels < 1:
        raise ConfigError(f"{cfg_path}: num_labels: expected a positive integer, got {num_labels!r}")
    eos = {} if raw.get("eos_token_id") is not None else {"eos_token_id": 2}    # unused by a classifier
    return model_config_from_hf(path, ignored, classifier=True, **eos), num_labels


def model_yaml_from_hf(path: str, parallel: Optional[ParallelConfig] = None) -> ModelYaml:
    """An HF folder as what a model YAML holds: its model, the given layout (default: one rank)."""
    ignored: List[Tuple[str, str]] = []
    model = model_config_from_hf(path, ignored)
    parallel = parallel or ParallelConfig()
    try:
        parallel.check_model(model)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return ModelYaml(model=model, parallel=parallel, path=path, ignored=ignored)


def model_yaml_text(model: ModelConfig, parallel: ParallelConfig, source: str) -> str:
    """A MindFormers-style model YAML for `model` in `parallel`'s layout (what load_model_yaml reads back)."""
    fields = {k: v for k, v in vars(model).items() if v is not None}
    if fields.get("extend_method", "None") == "None":
        fields.pop("extend_method", None)
        fields.pop("scaling_factor", None)
    if model.head_dim_is_derived:          # the YAML of a model without the fields stays as it was
        fields.pop("head_dim")
    if not model.qk_layernorm:
        fields.pop("qk_layernorm")
    if not model.num_experts:               # a dense model's YAML stays as it was
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                     "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef"):
            fields.pop(name, None)
    body = {"model": {"model_config": fields},
            "parallel_config": {"data_parallel": parallel.data_parallel, "model_parallel": parallel.model_parallel,
                                "pipeline_stage": parallel.pipeline_stage}}
    if parallel.expert_parallel > 1:
        body["parallel_config"]["expert_parallel"] = parallel.expert_parallel
    if parallel.moe_tp_extend_ep:
        body["parallel_config"]["moe_tp_extend_ep"] = True
    return f"# written by mindrlhf.configs.compat.hf from {source}\n" + yaml.safe_dump(body, sort_keys=False)


def hf_config_dict(cfg: ModelConfig, torch_dtype: str = "float32") -> dict:
    """A Qwen3 (qk_layernorm), Qwen2 (qkv bias) or Llama (neither) config.json for our model config (what
    model_config_from_hf reads back to the same config)."""
    common = {
        "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.n_kv_heads,
        "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.theta, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embedding, "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "torch_dtype": torch_dtype,
        "attention_dropout": 0.0, "initializer_range": cfg.initializer_range,
    }
    if cfg.extend_method == "LLAMA3":
        common["rope_scaling"] = {"rope_type": "llama3", **cfg.scaling_factor}
    if not cfg.head_dim_is_derived:
        common["head_dim"] = cfg.head_dim
    if cfg.num_experts:
        return {**common, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                "head_dim": cfg.head_dim, "attention_bias": cfg.qkv_has_bias, "use_sliding_window": False,
                "pad_token_id": cfg.pad_token_id, "num_experts": cfg.num_experts,
                "num_experts_per_tok": cfg.num_experts_per_tok, "moe_intermediate_size": cfg.moe_intermediate_size,
                "norm_topk_prob": cfg.norm_topk_prob, "decoder_sparse_step": cfg.decoder_sparse_step,
                "mlp_only_layers": list(cfg.mlp_only_layers), "router_aux_loss_coef": cfg.router_aux_loss_coef}
    if cfg.qk_layernorm:
        return {**common, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": cfg.head_dim,
                "attention_bias": cfg.qkv_has_bias, "use_sliding_window": False, "pad_token_id": cfg.pad_token_id}
    if cfg.qkv_has_bias:
        return {**common, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                "use_sliding_window": False}
    return {**common, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
            "mlp_bias": False, "pad_token_id": cfg.pad_token_id}


def table_markdown() -> str:
    """docs/UPSTREAM.md's config.json table (generated: scripts/gen_config_reference.py)."""
    out = ["| key | status | here |", "| --- | --- | --- |"]
    out += [f"| `{k}` | mapped | {v} |" for k, v in HF_MAPPED.items()]
    out += [f"| `architectures` | checked | must be one of {', '.join(ARCHITECTURES)} |",
            f"| `model_type` | checked | must match architectures "
            f"({', '.join(t for t, _ in ARCHITECTURES.values())}) |",
            f"| `architectures` (reward.reward_model) | checked | must be one of {', '.join(sequence_classifiers())} "
            f"(refused for the policy, rollout and reference); `id2label`, `label2id`, `num_labels` give the score "
            f"head's size, 1 for a reward model |"]
    out += [f"| `{k}` | checked | must be {exp} |" for k, (_, exp) in HF_CHECKED.items()]
    out += [f"| `{k}` | inert | {why} |" for k, why in HF_INERT.items()]
    out += ["| any other key | refused | an error naming it: it may change the model |"]
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Write a MindFormers-style model YAML for an HF model folder.")
    p.add_argument("hf_dir", help="folder with config.json")
    p.add_argument("-o", "--output", default="-", help="YAML to write (default: stdout)")
    p.add_argument("--data_parallel", type=int, default=None, help="default: --expert_parallel (else 1)")
    p.add_argument("--model_parallel", type=int, default=1)
    p.add_argument("--pipeline_stage", type=int, default=1)
    p.add_argument("--expert_parallel", type=int, default=1,
                   help="MoE models: ranks splitting the experts, taken from data_parallel (as in MindFormers)")
    p.add_argument("--moe_tp_extend_ep", action="store_true",
                   help="MoE models: the model_parallel ranks hold other whole experts instead of a share of each "
                        "one's width (MindSpeed's name; Megatron's expert_tensor_parallel_size 1)")
    args = p.parse_args(argv)
    try:
        par = ParallelConfig(data_parallel=args.data_parallel or args.expert_parallel,
                             model_parallel=args.model_parallel, pipeline_stage=args.pipeline_stage,
                             expert_parallel=args.expert_parallel, moe_tp_extend_ep=args.moe_tp_extend_ep)
        spec = model_yaml_from_hf(args.hf_dir, par)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = model_yaml_text(spec.model, spec.parallel, args.hf_dir)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        from mindrlhf.utils.atomic import write_text
        write_text(args.output, text)
        print(f"wrote {args.output}")
    return 0

