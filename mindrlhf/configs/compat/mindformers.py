"""The MindFormers model YAML (`model.model_config`, `parallel_config`, its other top-level sections) read into
configs/model_config.py's dataclasses: the keys we use are fields; the generation keys (max_decode_length,
top_k, ...) go to the rollout's sampling; every other MindFormers key is inert (reported at start-up, with the
reason) or checked (an error unless it has the value we implement); anything else is an error naming the field.
MindRLHF's own model YAMLs load as they are. docs/UPSTREAM.md's model tables are generated from here.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from mindrlhf.configs.coerce import coerce
from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.model_config import ModelConfig, ModelYaml, ParallelConfig

# ---- model YAML (MindFormers) ------------------------------------------------------------------------------
TOP_LEVEL_INERT: Dict[str, str] = {}
for _names, _why in (
        ("seed output_dir load_checkpoint src_strategy_path_or_dir auto_trans_ckpt only_save_strategy "
         "resume_training run_mode use_parallel load_ckpt_format use_legacy",
         "MindFormers run setting; mindrlhf takes it from its own flags"),
        ("trainer runner_config runner_wrapper optimizer lr_schedule train_dataset train_dataset_task "
         "eval_dataset eval_dataset_task do_eval eval_step_interval eval_epoch_interval callbacks metric "
         "eval_callbacks processor wrapper layer_scale layer_decay lr_scale lr_scale_factor",
         "MindFormers trainer setting; the GRPO config sets the optimizer, schedule, data and tokenizer"),
        ("context parallel recompute_config swap_config moe_config",
         "Ascend graph/memory setting; results are the same without it"),
        ("profile profile_start_step profile_stop_step init_start_profile profile_communication profile_memory "
         "auto_tune filepath_prefix autotune_per_step remote_save_url",
         "profiling / auto-tuning / cloud setting")):
    TOP_LEVEL_INERT.update(dict.fromkeys(_names.split(), _why))

# model.model_config keys that drive sampling (read from the infer YAML): upstream name -> sampling field
GENERATION_KEYS = {"max_decode_length": "max_tokens", "min_decode_length": "min_tokens", "temperature": "temperature",
                   "top_k": "top_k", "top_p": "top_p", "repetition_penalty": "repetition_penalty"}
MODEL_INERT: Dict[str, str] = {}
for _names, _why in (
        ("type batch_size checkpoint_name_or_path auto_map", "MindFormers bookkeeping"),
        ("use_past use_flash_attention use_paged_attention block_size num_blocks is_dynamic use_past_shard "
         "fine_grain_interleave use_rope_slice use_ring_attention use_attn_mask_compression qkv_concat "
         "user_defined_mask fused_rms_norm compute_in_2d use_contiguous use_fused_rope use_fused_swiglu "
         "use_flash_attention_in_eval input_sliced_sig pp_interleave_num residual_dtype parallel_optimizer",
         "kernel / cache implementation choice; same results"),
        ("emb_dropout_prob", "dropout is off in RL fine-tuning"),
        ("do_sample", "rollouts always sample, as upstream's generate(do_sample=True); temperature 0 is greedy"),
        ("max_position_embeddings", "HF spelling that MindFormers' LlamaConfig does not read "
                                    "(it reads max_position_embedding)"),
        ("multiple_of ffn_dim_multiplier", "intermediate_size is given"),
        ("pretrain_seqlen init_method_std param_init_std", "initialisation detail; weights are loaded")):
    MODEL_INERT.update(dict.fromkeys(_names.split(), _why))
# keys that would change the model if they differed from what we implement: name -> (check(value, cfg), expected)
MODEL_CHECKED = {
    "rotary_pct": (lambda v, raw: float(v) == 1.0, "1.0 (RoPE on the whole head)"),
    "kv_channels": (lambda v, raw: int(v) == int(raw.get("head_dim") or int(raw.get("hidden_size", 0)) //
                                                  int(raw.get("num_heads", 0) or 1)),
                    "head_dim (default hidden_size / num_heads): Megatron's name for the head width"),
    "rotary_emb_base": (lambda v, raw: "theta" not in raw or float(v) == float(raw["theta"]), "theta"),
    "pet_config": (lambda v, raw: not v, "unset: LoRA is the GRPO config's lora section (lora_rank, lora_alpha, "
                   "target_modules, which takes pet_config's '.*wq|.*wv' form)"),
}
PARALLEL_INERT: Dict[str, str] = {
    "vocab_emb_dp": "embedding placement; the embedding is vocab-split over model_parallel either way",
    "gradient_aggregation_group": "Ascend gradient fusion; same results",
    "optimizer_shard": "parallel-optimizer sharding on Ascend; same results",
}
# keys that our model/parallel config fields read under their MindFormers names (listed for the reference table)
MAPPED_PARALLEL = {
    "model.model_config.offset": "decoder layers per pipeline stage, as MindFormers splits them (configs.model_config."
                                 "layer_split); reported as inert when pipeline_stage is 1",
    "parallel_config.expert_parallel": "MoE models: each EP rank holds num_experts / expert_parallel of every "
                                       "sparse layer's experts; it divides data_parallel as in MindFormers",
    "parallel_config.moe_token_dispatcher_type": "MoE models (Megatron's key): allgather (default; the EP ranks "
                                                 "share their rows) or alltoall (train layout: each EP rank its own "
                                                 "rows; the rollout keeps allgather)",
    "parallel_config.pipeline_stage": "pipeline stages of the train layout (1F1B schedule); the infer layout must be 1",
    "parallel_config.micro_batch_num": "micro-batches per mini-batch through the pipeline; reported as inert when "
                                       "pipeline_stage is 1",
    "micro_batch_interleave_num": "(top level or parallel_config) each micro-batch cut into that many parts run "
                                  "one after another, gradients summed: the same update, a smaller activation "
                                  "peak; Ascend's overlap of one part's communication with the other's compute "
                                  "is not done (CPU collectives are synchronous)",
    "parallel_config.use_seq_parallel": "Megatron sequence parallelism over model_parallel ranks in the train "
                                        "layout (and the reference model); the rollout layout keeps whole "
                                        "activations (reported); nothing to split when model_parallel is 1",
}
PARALLEL_CHECKED = {"context_parallel": (lambda v, raw: int(v) == 1, "1"),
                    "use_ring_attention": (lambda v, raw: not v, "False")}


def _build(cls, raw: Dict[str, Any], inert: Dict[str, str], checked: Dict, where: str, ignored: list):
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        if key in known:
            kwargs[key] = coerce(value, known[key], f"{where}.{key}")
        elif key in checked:
            ok, expected = checked[key]
            try:
                good = ok(value, raw)
            except (TypeError, ValueError):
                good = False
            if not good:
                raise ConfigError(f"{where}.{key}: {value!r} is not supported (expected {expected}); it would "
                                  f"change the model, so it cannot be ignored")
        elif key in inert:
            ignored.append((f"{where}.{key}", inert[key]))
        else:
            raise ConfigError(f"{where}.{key}: unknown field (known fields: {', '.join(sorted(known))}; the "
                              f"MindFormers keys accepted are listed in docs/UPSTREAM.md)")
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise ConfigError(f"{err}") from None


def _generation_fields(raw: Dict[str, Any], where: str) -> Dict[str, Any]:
    """model_config's generation keys, as sampling fields (types checked by the sampling config later)."""
    out = {}
    for key, ours in GENERATION_KEYS.items():
        if key in raw and raw[key] is not None:
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
            out[ours] = value
    return out


def model_config_from_dict(raw: Dict[str, Any], where: str = "model.model_config",
                           ignored: Optional[list] = None) -> ModelConfig:
    body = {k: v for k, v in (raw or {}).items() if k not in GENERATION_KEYS}
    return _build(ModelConfig, body, MODEL_INERT, MODEL_CHECKED, where,
                  ignored if ignored is not None else [])


def parallel_config_from_dict(raw: Dict[str, Any], where: str = "parallel_config",
                              ignored: Optional[list] = None) -> ParallelConfig:
    return _build(ParallelConfig, raw or {}, PARALLEL_INERT, PARALLEL_CHECKED, where,
                  ignored if ignored is not None else [])




def model_yaml_from_raw(raw: Dict[str, Any], path: str) -> ModelYaml:
    """A MindFormers-style model YAML's contents (`model.model_config`, `parallel_config`); errors name the file
    and the field. compat/sources.load_model_yaml tells this form from the others."""
    ignored: List[Tuple[str, str]] = []
    try:
        for key in raw:
            if key in ("model", "parallel_config", "micro_batch_interleave_num"):
                continue
            if key not in TOP_LEVEL_INERT:
                raise ConfigError(f"{key}: unknown top-level section (the MindFormers sections accepted are "
                                  f"listed in docs/UPSTREAM.md)")
            ignored.append((key, TOP_LEVEL_INERT[key]))
        model_section = raw.get("model")
        if not isinstance(model_section, dict) or "model_config" not in model_section:
            raise ConfigError("model.model_config: missing")
        model_raw = model_section["model_config"]
        model = model_config_from_dict(model_raw, ignored=ignored)
        generation = _generation_fields(model_raw, "model.model_config")
        parallel_raw = dict(raw.get("parallel_config") or {})
        if "micro_batch_interleave_num" in raw:       # MindFormers' place for it: the top level
            if parallel_raw.get("micro_batch_interleave_num", raw["micro_batch_interleave_num"]) != \
                    raw["micro_batch_interleave_num"]:
                raise ConfigError("micro_batch_interleave_num: given at the top level and in parallel_config "
                                  "with different values")
            parallel_raw["micro_batch_interleave_num"] = raw["micro_batch_interleave_num"]
        parallel = parallel_config_from_dict(parallel_raw, ignored=ignored)
        parallel.check_model(model)
        if parallel.use_seq_parallel and parallel.model_parallel == 1:
            ignored.append(("parallel_config.use_seq_parallel", "splits the sequence over model_parallel ranks; "
                                                                 "model_parallel is 1"))
        if parallel.pipeline_stage == 1:      # pipeline settings mean nothing without stages (as in MindFormers)
            if "micro_batch_num" in (raw.get("parallel_config") or {}):
                ignored.append(("parallel_config.micro_batch_num", "pipeline micro-batches; pipeline_stage is 1"))
            if "offset" in model_raw and model_raw["offset"] not in (0, None):
                ignored.append(("model.model_config.offset", "layer split between pipeline stages; "
                                                              "pipeline_stage is 1"))
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return ModelYaml(model=model, parallel=parallel, path=path, generation=generation, ignored=ignored)


def table_markdown() -> str:
    """docs/UPSTREAM.md's model YAML tables."""
    out = ["### model YAML: model.model_config", "", "| key | status | here |", "| --- | --- | --- |"]
    out += [f"| `{k}` | mapped | sampling.{v} (infer YAML; the GRPO config wins when it sets it) |"
            for k, v in GENERATION_KEYS.items()]
    out += [f"| `{k}` | checked | must be {exp} |" for k, (_, exp) in MODEL_CHECKED.items()]
    out += [f"| `{k}` | inert | {why} |" for k, why in MODEL_INERT.items()]
    out += ["", "### model YAML: parallel_config", "", "| key | status | here |", "| --- | --- | --- |"]
    out += [f"| `{k.split('.')[-1]}` | mapped | {why} |" for k, why in MAPPED_PARALLEL.items()]
    out += [f"| `{k}` | inert | {why} |" for k, why in PARALLEL_INERT.items()]
    out += [f"| `{k}` | checked | must be {exp} |" for k, (_, exp) in PARALLEL_CHECKED.items()]
    out += ["", "### model YAML: top-level sections", "", "| key | status | here |", "| --- | --- | --- |"]
    out += [f"| `{k}` | inert | {why} |" for k, why in TOP_LEVEL_INERT.items()]
    return "\n".join(out)
