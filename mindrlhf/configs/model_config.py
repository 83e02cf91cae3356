"""Model and parallel configs: the decoder's shape and numerics and the layout, as typed dataclasses.

The field names are MindFormers' (``model.model_config.*``, ``parallel_config.*``) so one YAML serves both
projects; reading that YAML, with the MindFormers keys we accept but do not use, is
configs/compat/mindformers.py. This module knows no file format beyond a YAML mapping.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import yaml

from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.fields import help_field as _f

# Megatron's / MindSpeed's moe_token_dispatcher_type names for the two expert-parallel token dispatchers
# (models/moe.py): the EP ranks share their rows, or hold distinct ones
EP_DISPATCHERS = ("allgather", "alltoall")

DTYPES = ("float32", "float16", "bfloat16")
# how a sparse layer computes its experts (models/moe.ExpertsFFN): every expert on every token, or sorted by expert
EXPERT_COMPUTE = ("auto", "dense", "sorted")
EXTEND_METHODS = ("None", "LLAMA3")


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
    offset: Union[int, List[int]] = 0      # MindFormers' layer split between pipeline stages (layer_split)
    extend_method: str = "None"            # RoPE scaling: "None" or "LLAMA3" (MindFormers' names)
    scaling_factor: Optional[Dict[str, float]] = None   # LLAMA3: factor, low/high_freq_factor, original_max_...
    head_dim: Optional[int] = None         # per-head width (MindFormers' Qwen3Config); None: hidden_size / num_heads
    qk_layernorm: bool = False             # RMSNorm on each head of q and k before RoPE (Qwen3; MindFormers' name)
    # Mixture of experts (Qwen3-MoE; the config.json / MindFormers mcore names). num_experts 0: every layer dense.
    num_experts: int = 0                   # routed experts per sparse layer
    num_experts_per_tok: int = 1           # top-k experts each token is routed to (MindSpeed-RL: moe_router_topk)
    moe_intermediate_size: int = 0         # each expert's SwiGLU width (MindSpeed-RL: moe_ffn_hidden_size)
    norm_topk_prob: bool = False           # the top-k routing weights renormalised to sum to 1
    decoder_sparse_step: int = 1           # layer l is sparse when (l + 1) % decoder_sparse_step == 0 ...
    mlp_only_layers: List[int] = dataclasses.field(default_factory=list)   # ... and l is not listed here
    router_aux_loss_coef: float = 0.0      # load-balancing loss weight (MindSpeed-RL: moe_aux_loss_coeff); 0 allowed
    moe_expert_compute: str = "auto"       # "dense" | "sorted" | "auto" (the cheaper per call): models/moe.py

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.num_heads
        if self.max_position_embedding is None:
            self.max_position_embedding = self.seq_length
        if self.extend_method in ("", "none", None):      # MindFormers writes "None"; YAML may give null
            self.extend_method = "None"
        if self.head_dim is None and isinstance(self.num_heads, int) and self.num_heads > 0:
            if isinstance(self.hidden_size, int) and self.hidden_size % self.num_heads:
                raise ConfigError(f"model.model_config.hidden_size: {self.hidden_size} is not divisible by "
                                  f"num_heads={self.num_heads} (or give head_dim)")
            self.head_dim = self.hidden_size // self.num_heads
        self.validate()

    def is_moe_layer(self, layer: int) -> bool:
        """Decoder layer `layer` (global index) has routed experts instead of the dense MLP (transformers'
        Qwen3MoeDecoderLayer rule: num_experts > 0, not in mlp_only_layers, (layer + 1) % decoder_sparse_step 0)."""
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    @property
    def sparse_layers(self) -> list:
        """The global indices of the decoder layers with routed experts, in order (the routing axis of router
        replay)."""
        return [n for n in range(self.num_layers) if self.is_moe_layer(n)]

    @property
    def head_dim_is_derived(self) -> bool:
        """head_dim is hidden_size / num_heads (what a config without the field means)."""
        return self.head_dim * self.num_heads == self.hidden_size

    def weight_shapes(self) -> tuple:
        """What fixes the weights' shapes (two configs that agree here can hold the same weights)."""
        return (self.hidden_size, self.num_layers, self.num_heads, self.n_kv_heads, self.intermediate_size,
                self.vocab_size, self.qkv_has_bias, self.tie_word_embeddings, self.head_dim, self.qk_layernorm) + \
            ((self.num_experts, self.moe_intermediate_size, self.decoder_sparse_step, tuple(self.mlp_only_layers))
             if self.num_experts else ())

    @property
    def eos_token_ids(self) -> List[int]:
        return list(self.eos_token_id) if isinstance(self.eos_token_id, (list, tuple)) else [self.eos_token_id]

    def validate(self, where: str = "model.model_config"):
        for name in ("hidden_size", "num_layers", "num_heads", "n_kv_heads", "intermediate_size",
                     "vocab_size", "seq_length", "max_position_embedding", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{where}.{name}: expected a positive integer, got {value!r}")
        if self.num_heads % self.n_kv_heads:
            raise ConfigError(f"{where}.n_kv_heads: num_heads={self.num_heads} is not a multiple of "
                              f"n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"{where}.head_dim: {self.head_dim} must be even for RoPE")
        self._validate_moe(where)
        for name in ("compute_dtype", "param_init_type", "layernorm_compute_type", "softmax_compute_type",
                     "rotary_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ConfigError(f"{where}.{name}: expected one of {DTYPES}, got {getattr(self, name)!r}")
        if not self.rms_norm_eps > 0:
            raise ConfigError(f"{where}.rms_norm_eps: expected > 0, got {self.rms_norm_eps!r}")
        if not self.theta > 0:
            raise ConfigError(f"{where}.theta: expected > 0, got {self.theta!r}")
        if self.extend_method not in EXTEND_METHODS:
            raise ConfigError(f"{where}.extend_method: {self.extend_method!r} is not supported (expected one of "
                              f"{EXTEND_METHODS}: no RoPE scaling, or Llama 3's)")
        if self.extend_method == "LLAMA3":
            keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            given = self.scaling_factor if isinstance(self.scaling_factor, dict) else {}
            bad = [k for k in keys if isinstance(given.get(k), bool) or not isinstance(given.get(k), (int, float))
                   or not given.get(k) > 0]
            if bad or set(given) - set(keys):
                raise ConfigError(f"{where}.scaling_factor: extend_method LLAMA3 needs positive numbers for exactly "
                                  f"{', '.join(keys)}; got {self.scaling_factor!r}")
            if given["high_freq_factor"] <= given["low_freq_factor"]:
                raise ConfigError(f"{where}.scaling_factor: high_freq_factor must exceed low_freq_factor, got "
                                  f"{self.scaling_factor!r}")

    def _validate_moe(self, where: str):
        ints = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step")
        for name in ints:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{where}.{name}: expected a non-negative integer, got {value!r}")
        if not self.num_experts:
            return
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ConfigError(f"{where}.num_experts_per_tok: expected 1..num_experts={self.num_experts}, got "
                              f"{self.num_experts_per_tok!r}")
        for name in ("moe_intermediate_size", "decoder_sparse_step"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{where}.{name}: expected a positive integer with num_experts > 0, got "
                                  f"{getattr(self, name)!r}")
        if not isinstance(self.mlp_only_layers, (list, tuple)) or \
                not all(isinstance(x, int) and not isinstance(x, bool) for x in self.mlp_only_layers):
            raise ConfigError(f"{where}.mlp_only_layers: expected a list of layer indices, got "
                              f"{self.mlp_only_layers!r}")
        if self.moe_expert_compute not in EXPERT_COMPUTE:
            raise ConfigError(f"{where}.moe_expert_compute: expected one of {', '.join(EXPERT_COMPUTE)}, got "
                              f"{self.moe_expert_compute!r}")
        if isinstance(self.router_aux_loss_coef, bool) or not isinstance(self.router_aux_loss_coef, (int, float)) \
                or self.router_aux_loss_coef < 0:
            raise ConfigError(f"{where}.router_aux_loss_coef: expected a number >= 0, got "
                              f"{self.router_aux_loss_coef!r}")


def layer_split(num_layers: int, pp: int, offset: Union[int, List[int]] = 0,
                where: str = "model.model_config.offset") -> List[range]:
    """The decoder layers each pipeline stage holds, as MindFormers assigns them: with a list `offset`, stage
    s holds num_layers // pp + offset[s] layers (the list must add up to num_layers); with an int, layer l
    goes to stage floor((l + offset) / (num_layers / pp)), clipped to [0, pp - 1]. So 5 layers over 2
    stages with offset 0 split 3 + 2. Every stage must hold at least one layer."""
    if pp == 1:
        return [range(num_layers)]
    if isinstance(offset, (list, tuple)):
        if len(offset) != pp or not all(isinstance(o, int) and not isinstance(o, bool) for o in offset):
            raise ConfigError(f"{where}: expected {pp} integers (one per pipeline stage), got {offset!r}")
        counts = [num_layers // pp + o for o in offset]
        if sum(counts) != num_layers:
            raise ConfigError(f"{where}: {offset!r} gives stages {counts} layers, {sum(counts)} in all, but "
                              f"num_layers is {num_layers} (the offsets must add up to num_layers - "
                              f"{pp} x {num_layers // pp} = {num_layers - pp * (num_layers // pp)})")
    elif isinstance(offset, int) and not isinstance(offset, bool):
        counts = [0] * pp
        for layer in range(num_layers):
            counts[min(max(int((layer + offset) // (num_layers / pp)), 0), pp - 1)] += 1
    else:
        raise ConfigError(f"{where}: expected an integer or a list of {pp} integers, got {offset!r}")
    if min(counts) < 1:
        raise ConfigError(f"{where}: {offset!r} leaves a pipeline stage without decoder layers (stages get "
                          f"{counts} of num_layers={num_layers}); every stage needs at least one")
    starts = np.cumsum([0] + counts)
    return [range(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]


@dataclass
class ParallelConfig:
    """How one role's ranks are arranged (MindFormers `parallel_config` names). `micro_batch_num`: pipeline
    micro-batches per mini-batch (used when pipeline_stage > 1, as in MindFormers). `use_seq_parallel`: the
    activations outside attention and MLP are split along the sequence over the model_parallel ranks
    (training layouts; used when model_parallel > 1). `micro_batch_interleave_num` (MindFormers' top-level key,
    also accepted here): each micro-batch is cut into that many parts that run one after another, gradients
    summed - the same update with a smaller activation peak. MindSpore on Ascend also overlaps one part's
    communication with the other's compute; here collectives are synchronous, so there is no overlap."""
    data_parallel: int = _f(1, "data-parallel replicas: each holds the model (split by the other axes) and a share "
                            "of the batch")
    model_parallel: int = _f(1, "tensor-parallel ranks (Megatron column/row splits of attention heads, MLP and "
                             "vocabulary)")
    pipeline_stage: int = _f(1, "pipeline stages: contiguous layer ranges on successive ranks, 1F1B schedule "
                             "(training layouts)")
    micro_batch_num: int = _f(1, "pipeline micro-batches per mini-batch (used when pipeline_stage > 1)")
    use_seq_parallel: bool = _f(False, "Megatron sequence parallelism over the model_parallel ranks (training "
                                "layouts; used when model_parallel > 1)")
    micro_batch_interleave_num: int = _f(1, "each micro-batch cut in this many parts, run one after another, "
                                         "gradients summed (a smaller activation peak)")
    expert_parallel: int = _f(1, "MoE models: expert-parallel ranks, each holding num_experts / expert_parallel of "
                              "every sparse layer's experts. As in MindFormers it divides data_parallel; with the "
                              "all-gather dispatcher the EP ranks see the same tokens, so data_parallel / "
                              "expert_parallel groups hold distinct rows; with all-to-all every rank does")
    moe_token_dispatcher_type: str = _f("allgather", "MoE models with expert_parallel > 1 (Megatron's name): "
                                        "allgather, the EP ranks share their rows and each runs its experts on "
                                        "all of them; alltoall, every EP rank its own rows, sent to the ranks "
                                        "holding their experts and back (the train layout only; the rollout "
                                        "keeps allgather)", choices=EP_DISPATCHERS)
    moe_tp_extend_ep: bool = _f(False, "MoE models (MindSpeed's name; Megatron's expert_tensor_parallel_size 1): the "
                                "model_parallel ranks hold other whole experts instead of a share of every "
                                "expert's width, so experts split over expert_parallel x model_parallel ranks")

    def __post_init__(self):
        self.validate()

    @property
    def world_size(self) -> int:
        return self.data_parallel * self.model_parallel * self.pipeline_stage

    @property
    def distinct_ep_rows(self) -> bool:
        """Whether the EP ranks hold distinct rows: the all-to-all dispatcher with expert_parallel > 1."""
        return self.moe_token_dispatcher_type == "alltoall" and self.expert_parallel > 1

    def validate(self, where: str = "parallel_config"):
        for name in ("data_parallel", "model_parallel", "pipeline_stage", "micro_batch_num",
                     "micro_batch_interleave_num", "expert_parallel"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{where}.{name}: expected a positive integer, got {value!r}")
        if self.moe_token_dispatcher_type not in EP_DISPATCHERS:
            raise ConfigError(f"{where}.moe_token_dispatcher_type: expected one of {list(EP_DISPATCHERS)}, got "
                              f"{self.moe_token_dispatcher_type!r}")

    def check_model(self, model: ModelConfig, where: str = "parallel_config",
                    names: Optional[Dict[str, str]] = None):
        """Whether `model` can be laid out this way; the errors name each layout key as `names` gives it (a
        command's flags, e.g. python -m mindrlhf.sft's) or as `where`.key."""
        def name(key: str) -> str:
            return (names or {}).get(key, f"{where}.{key}")
        tp = self.model_parallel
        if self.pipeline_stage > 1:
            if model.tie_word_embeddings:
                raise ConfigError(f"{name('pipeline_stage')}: {self.pipeline_stage} stages with "
                                  f"model.model_config.tie_word_embeddings True is not supported (the first and "
                                  f"last stage would share the embedding); use pipeline_stage 1")
            layer_split(model.num_layers, self.pipeline_stage, model.offset)
        if self.moe_tp_extend_ep and not model.num_experts:
            raise ConfigError(f"{name('moe_tp_extend_ep')}: the model has no experts (model.model_config.num_experts "
                              f"is 0, a dense model); use false")
        if self.moe_tp_extend_ep and model.num_experts % (self.expert_parallel * tp):
            raise ConfigError(f"{name('moe_tp_extend_ep')}: expert_parallel x model_parallel = "
                              f"{self.expert_parallel} x {tp} does not divide model.model_config.num_experts="
                              f"{model.num_experts} (each rank holds an equal share of every layer's whole experts)")
        if model.num_experts and not self.moe_tp_extend_ep and model.moe_intermediate_size % tp:
            raise ConfigError(f"{name('model_parallel')}={tp} does not divide model.model_config."
                              f"moe_intermediate_size={model.moe_intermediate_size} (each TP rank holds an equal "
                              f"share of every expert's intermediate width)")
        ep = self.expert_parallel
        if self.distinct_ep_rows:
            for key, on in (("pipeline_stage", self.pipeline_stage > 1),
                            ("use_seq_parallel", self.use_seq_parallel and tp > 1)):
                if on:
                    raise ConfigError(f"{name('moe_token_dispatcher_type')}: alltoall with {name(key)} "
                                      f"{getattr(self, key)} is not supported (the all-to-all dispatcher runs on "
                                      f"whole rows of one stage); use allgather")
        if ep > 1:
            if not model.num_experts:
                raise ConfigError(f"{name('expert_parallel')}={ep}: the model has no experts (model.model_config."
                                  f"num_experts is 0, a dense model); use expert_parallel 1")
            if model.num_experts % ep:
                raise ConfigError(f"{name('expert_parallel')}={ep} does not divide model.model_config.num_experts="
                                  f"{model.num_experts} (each EP rank holds an equal share of every layer's experts)")
            if self.data_parallel % ep:
                raise ConfigError(f"{name('expert_parallel')}={ep} does not divide {name('data_parallel')}="
                                  f"{self.data_parallel} (as in MindFormers, the EP ranks are taken from the "
                                  f"data-parallel ones)")
        split = ("num_heads", "n_kv_heads", "intermediate_size", "vocab_size")
        bad = [f"{key}={getattr(model, key)}" for key in split if getattr(model, key) % tp]
        if bad:
            ok = [d for d in range(1, model.num_heads + 1) if all(getattr(model, n) % d == 0 for n in split)]
            raise ConfigError(f"{name('model_parallel')}={tp} does not divide model.model_config.{', '.join(bad)} "
                              f"(each TP rank holds whole heads and equal shares; model_parallel "
                              f"{' or '.join(map(str, ok))} would)")


@dataclass
class ModelYaml:
    """What a model YAML file holds for us."""
    model: ModelConfig
    parallel: ParallelConfig
    path: Optional[str] = None
    generation: Dict[str, Any] = dataclasses.field(default_factory=dict)   # sampling field -> value
    ignored: List[Tuple[str, str]] = dataclasses.field(default_factory=list)  # (key, reason), reported at start-up

def read_yaml_mapping(path: str) -> Dict[str, Any]:
    """A YAML file whose top level is a mapping; errors name the file."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: model config file not found")
    with open(path, "r", encoding="utf-8") as fh:
        try:
            raw = yaml.safe_load(fh)
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return raw
