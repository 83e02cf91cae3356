"""Model and parallel configs, read from MindFormers-style YAML.

The YAML keeps MindFormers' field names (``model.model_config.*``, ``parallel_config.*``) so one file
serves both projects. Fields we use are typed dataclass fields; MindFormers fields that have no effect
here are accepted by name (listed in ``MINDFORMERS_INERT_FIELDS``) so existing configs load; anything
else is an error that names the field.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

import yaml

from mindrlhf.configs.coerce import coerce
from mindrlhf.configs.errors import ConfigError

DTYPES = ("float32", "float16", "bfloat16")

# MindFormers model_config fields we accept for compatibility but that change nothing in our model.
MINDFORMERS_INERT_FIELDS = frozenset({
    "type", "batch_size", "use_past", "use_flash_attention", "use_paged_attention", "block_size",
    "num_blocks", "emb_dropout_prob", "is_dynamic", "offset", "checkpoint_name_or_path", "repetition_penalty",
    "max_decode_length", "top_k", "top_p", "do_sample", "use_past_shard", "fine_grain_interleave",
    "use_rope_slice", "use_ring_attention", "use_attn_mask_compression", "scaling_factor", "extend_method",
    "qkv_concat", "user_defined_mask", "fused_rms_norm", "multiple_of", "ffn_dim_multiplier",
    "auto_map", "pretrain_seqlen", "input_sliced_sig", "use_flash_attention_in_eval", "init_method_std",
    "residual_dtype", "rotary_emb_base", "parallel_optimizer", "param_init_std", "compute_in_2d",
    "use_contiguous", "pp_interleave_num", "use_fused_rope", "use_fused_swiglu",
})
PARALLEL_INERT_FIELDS = frozenset({
    "use_seq_parallel", "micro_batch_num", "vocab_emb_dp", "gradient_aggregation_group",
    "micro_batch_interleave_num", "expert_parallel", "context_parallel", "optimizer_shard",
    "use_ring_attention",
})
# Top-level MindFormers sections that a model YAML may carry; we read only `model` and `parallel_config`.
MINDFORMERS_TOP_LEVEL = frozenset({
    "seed", "output_dir", "load_checkpoint", "src_strategy_path_or_dir", "auto_trans_ckpt",
    "only_save_strategy", "resume_training", "run_mode", "trainer", "runner_config", "runner_wrapper",
    "optimizer", "lr_schedule", "train_dataset", "train_dataset_task", "eval_dataset", "eval_dataset_task",
    "context", "parallel", "recompute_config", "callbacks", "processor", "model", "parallel_config",
    "moe_config", "micro_batch_interleave_num", "profile", "profile_start_step", "profile_stop_step",
    "init_start_profile", "profile_communication", "profile_memory", "layer_scale", "layer_decay",
    "lr_scale", "lr_scale_factor", "metric", "eval_callbacks", "use_parallel", "do_eval",
    "remote_save_url", "use_legacy", "load_ckpt_format", "eval_step_interval", "eval_epoch_interval",
    "swap_config", "wrapper",
})


@dataclass
class ModelConfig:
    """Decoder shape and numerics (MindFormers `model.model_config` names)."""
    hidden_size: int = 4096
    num_layers: int = 32
    num_heads: int = 32
    n_kv_heads: Optional[int] = None
    intermediate_size: int = 11008
    vocab_size: int = 32000
    rms_norm_eps: float = 1e-6
    theta: float = 10000.0
    qkv_has_bias: bool = False
    tie_word_embeddings: bool = False
    seq_length: int = 2048
    max_position_embedding: Optional[int] = None
    compute_dtype: str = "float32"
    param_init_type: str = "float32"
    layernorm_compute_type: str = "float32"
    softmax_compute_type: str = "float32"
    rotary_dtype: str = "float32"
    pad_token_id: int = 0
    bos_token_id: int = 1
    eos_token_id: Union[int, List[int]] = 2
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.num_heads
        if self.max_position_embedding is None:
            self.max_position_embedding = self.seq_length
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def weight_shapes(self) -> tuple:
        """What fixes the weights' shapes (two configs that agree here can hold the same weights)."""
        return (self.hidden_size, self.num_layers, self.num_heads, self.n_kv_heads, self.intermediate_size,
                self.vocab_size, self.qkv_has_bias, self.tie_word_embeddings)

    @property
    def eos_token_ids(self) -> List[int]:
        return list(self.eos_token_id) if isinstance(self.eos_token_id, (list, tuple)) else [self.eos_token_id]

    def validate(self, where: str = "model.model_config"):
        for name in ("hidden_size", "num_layers", "num_heads", "n_kv_heads", "intermediate_size",
                     "vocab_size", "seq_length", "max_position_embedding"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{where}.{name}: expected a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"{where}.hidden_size: {self.hidden_size} is not divisible by "
                              f"num_heads={self.num_heads}")
        if self.num_heads % self.n_kv_heads:
            raise ConfigError(f"{where}.n_kv_heads: num_heads={self.num_heads} is not a multiple of "
                              f"n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"{where}.hidden_size: head_dim {self.head_dim} must be even for RoPE")
        for name in ("compute_dtype", "param_init_type", "layernorm_compute_type", "softmax_compute_type",
                     "rotary_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ConfigError(f"{where}.{name}: expected one of {DTYPES}, got {getattr(self, name)!r}")
        if not self.rms_norm_eps > 0:
            raise ConfigError(f"{where}.rms_norm_eps: expected > 0, got {self.rms_norm_eps!r}")
        if not self.theta > 0:
            raise ConfigError(f"{where}.theta: expected > 0, got {self.theta!r}")


@dataclass
class ParallelConfig:
    """How one role's ranks are arranged (MindFormers `parallel_config` names)."""
    data_parallel: int = 1
    model_parallel: int = 1
    pipeline_stage: int = 1

    def __post_init__(self):
        self.validate()

    @property
    def world_size(self) -> int:
        return self.data_parallel * self.model_parallel * self.pipeline_stage

    def validate(self, where: str = "parallel_config"):
        for name in ("data_parallel", "model_parallel", "pipeline_stage"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{where}.{name}: expected a positive integer, got {value!r}")
        if self.pipeline_stage != 1:
            raise ConfigError(f"{where}.pipeline_stage: pipeline parallelism is not supported by mindrlhf "
                              f"yet; got {self.pipeline_stage}, expected 1 (use model_parallel/data_parallel)")

    def check_model(self, model: ModelConfig, where: str = "parallel_config"):
        tp = self.model_parallel
        for name in ("num_heads", "n_kv_heads", "intermediate_size", "vocab_size"):
            if getattr(model, name) % tp:
                raise ConfigError(f"{where}.model_parallel={tp} does not divide "
                                  f"model.model_config.{name}={getattr(model, name)}")


@dataclass
class ModelYaml:
    """What a model YAML file holds for us."""
    model: ModelConfig
    parallel: ParallelConfig
    path: Optional[str] = None


def _build(cls, raw: Dict[str, Any], inert: frozenset, where: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        if key in known:
            kwargs[key] = coerce(value, known[key], f"{where}.{key}")
        elif key not in inert:
            raise ConfigError(f"{where}.{key}: unknown field (known fields: {', '.join(sorted(known))})")
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise ConfigError(f"{err}") from None


def model_config_from_dict(raw: Dict[str, Any], where: str = "model.model_config") -> ModelConfig:
    return _build(ModelConfig, raw, MINDFORMERS_INERT_FIELDS, where)


def parallel_config_from_dict(raw: Dict[str, Any], where: str = "parallel_config") -> ParallelConfig:
    return _build(ParallelConfig, raw or {}, PARALLEL_INERT_FIELDS, where)


def load_model_yaml(path: str) -> ModelYaml:
    """Read a MindFormers-style model YAML; errors name the file and the field."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: model config file not found")
    with open(path, "r", encoding="utf-8") as fh:
        try:
            raw = yaml.safe_load(fh)
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    try:
        for key in raw:
            if key not in MINDFORMERS_TOP_LEVEL:
                raise ConfigError(f"{key}: unknown top-level section")
        model_section = raw.get("model")
        if not isinstance(model_section, dict) or "model_config" not in model_section:
            raise ConfigError("model.model_config: missing")
        model = model_config_from_dict(model_section["model_config"])
        parallel = parallel_config_from_dict(raw.get("parallel_config") or {})
        parallel.check_model(model)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return ModelYaml(model=model, parallel=parallel, path=path)
