"""verl's Megatron backend: the keys `--config-name ppo_megatron_trainer` adds to verl's command line (its
Megatron scripts: examples/grpo_trainer/*megatron*.sh, every Qwen3-MoE one among them), and the train layout
they give. configs/compat/verl.py merges these rows into its table and calls `train_layout`.

Read from github.com/volcengine/verl for facts only: verl/trainer/config/_generated_ppo_megatron_trainer.yaml (the
names and defaults), verl/utils/megatron/optimizer.py (the learning-rate scheduler: Megatron's
OptimizerParamScheduler with lr_decay_steps defaulting to the run's steps and lr_warmup_steps_ratio x
lr_decay_steps when lr_warmup_steps is not positive).

The actor's Megatron layout is our train layout: tensor_model_parallel_size -> parallel.train_model_parallel,
pipeline_model_parallel_size -> train_pipeline_stage, expert_model_parallel_size -> train_expert_parallel (the EP
ranks taken from the data-parallel ones, as Megatron takes them; with expert_tensor_parallel_size 1, Megatron's
expert ranks run over the tensor ranks first: train_moe_tp_extend_ep, whole experts over TP x EP / TP data-parallel
ranks), sequence_parallel -> train_use_seq_parallel; the data-parallel size is what they leave. The reference runs
in the train layout here, so its Megatron sizes must equal the actor's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

from mindrlhf.configs.compat.keys import ABSENT, CHECKED, INERT, MAPPED, Key
from mindrlhf.configs.compat.keys import is_false as _false, is_null as _null
from mindrlhf.configs.errors import ConfigError

CONFIG_NAMES = ("ppo_trainer", "ppo_megatron_trainer")
ACTOR, REF, MODEL = "actor_rollout_ref.actor.", "actor_rollout_ref.ref.", "actor_rollout_ref.model."
AM, RM = ACTOR + "megatron.", REF + "megatron."

# keys only ppo_megatron_trainer.yaml has (verl refuses them under ppo_trainer), and the FSDP keys it lacks
MEGATRON_ONLY = (AM, RM, MODEL + "lora.", MODEL + "override_config.model_config", MODEL + "override_config.moe_config",
                 ACTOR + "optim.lr_decay_", ACTOR + "optim.min_lr", ACTOR + "optim.lr_warmup_init",
                 ACTOR + "optim.weight_decay_incr_style", ACTOR + "optim.lr_wsd_",
                 ACTOR + "optim.use_checkpoint_opt_param_scheduler", ACTOR + "load_weight", REF + "load_weight",
                 "actor_rollout_ref.rollout.layer_name_map.")
FSDP_ONLY = (ACTOR + "fsdp_config.", REF + "fsdp_config.", ACTOR + "optim.warmup_style",
             ACTOR + "optim.lr_scheduler_type", ACTOR + "optim.min_lr_ratio", ACTOR + "optim.num_cycles")

# the layout: key under actor.megatron -> (our parallel field, verl's default)
LAYOUT = {"tensor_model_parallel_size": ("train_model_parallel", 1),
          "pipeline_model_parallel_size": ("train_pipeline_stage", 1),
          "expert_model_parallel_size": ("train_expert_parallel", 1)}
DECAY_STYLES = {"constant": "megatron_constant", "linear": "megatron_linear", "cosine": "megatron_cosine"}

ROWS: Dict[str, Key] = {}
# key -> (ok(value, all overrides), what we implement, verl's default when absent or ABSENT)
CHECKS: Dict[str, Tuple[Callable[[Any, Dict[str, Any]], bool], str, Any]] = {}


def _rows(status: str, names: str, text: str, prefix: str = ""):
    ROWS.update({prefix + n: Key(prefix + n, status, text) for n in names.split()})


def _check(key: str, ok: Callable[[Any, Dict[str, Any]], bool], expected: str, default: Any):
    CHECKS[key] = (ok, expected, default)
    ROWS[key] = Key(key, CHECKED, expected)


def _no_overrides(v, ns) -> bool:
    """An override mapping left empty (as verl's YAML has it)."""
    return v in (None, {}, "", "{}")


def _same_as_actor(name: str, default):
    return lambda v, ns: _null(v, ns) or str(v) == str(ns.get(AM + name, default))


for _name, (_field, _default) in LAYOUT.items():
    ROWS[AM + _name] = Key(AM + _name, MAPPED, f"parallel.{_field} (the train layout; data-parallel: the ranks the "
                                               f"tensor, pipeline and expert sizes leave)")
    _check(RM + _name, _same_as_actor(_name, _default), "the actor's value (the reference runs in the train layout)",
           ABSENT)
ROWS[AM + "sequence_parallel"] = Key(AM + "sequence_parallel", MAPPED, "parallel.train_use_seq_parallel (with "
                                     "tensor_model_parallel_size > 1; verl's default true)")
ROWS[AM + "param_offload"] = Key(AM + "param_offload", MAPPED, "swap.offload_train_param")
ROWS[AM + "optimizer_offload"] = Key(AM + "optimizer_offload", MAPPED, "swap.offload_train_optimizer")
ROWS[RM + "param_offload"] = Key(RM + "param_offload", MAPPED, "swap.offload_ref_param")
for _name, _default in (("context_parallel_size", 1), ("virtual_pipeline_model_parallel_size", None)):
    _check(AM + _name, (lambda d: lambda v, ns: (_null(v, ns) if d is None else int(v) == d))(_default),
           "1 (no context parallelism)" if _default else "null (no virtual pipeline stages)", _default)
    _check(RM + _name, _same_as_actor(_name, _default), "the actor's value", ABSENT)
_check(AM + "expert_tensor_parallel_size", lambda v, ns: _null(v, ns) or int(v) >= 1, "null or a positive size: "
       "null (Megatron's default: tensor_model_parallel_size) splits each expert's width over the TP ranks; 1 (with "
       "EP > 1) holds whole experts, split over the TP ranks times expert_model_parallel_size / TP data-parallel ones "
       "(parallel.train_moe_tp_extend_ep); another size is run as null, another layout of the same experts and "
       "math, said at start-up", None)
_check(RM + "expert_tensor_parallel_size", _same_as_actor("expert_tensor_parallel_size", None), "the actor's value",
       ABSENT)
for _m in (AM, RM):
    _check(_m + "use_dist_checkpointing", _false, "false (the weights load from actor_rollout_ref.model.path, a "
           "Hugging Face folder: convert a Megatron dist checkpoint to HF first)", False)
    _check(_m + "override_mcore_model_config", _no_overrides, "{} (the folder's "
           "config.json is the model)", {})
    _rows(INERT, "dist_checkpointing_path dist_checkpointing_prefix", "use_dist_checkpointing is false", _m)
    _rows(INERT, "use_mbridge vanilla_mbridge", "the HF <-> Megatron weight bridge; the HF folder loads directly "
          "here", _m)
    _rows(INERT, "use_distributed_optimizer override_ddp_config.* use_remove_padding forward_only _target_",
          "Megatron's optimizer sharding, DDP buckets, padding removal or config class; same update", _m)
    _rows(INERT, "dtype", "Megatron's compute dtype (bf16); here the model computes in float32, which bf16 "
          "approximates", _m)
    _rows(INERT, "seed", "Megatron's RNG (initialisation, dropout): weights are loaded and nothing drops out here; "
          "run.seed seeds the rollout", _m)
    _rows(INERT, "grad_offload", "gradients live only inside the update here (no buffer between steps to move)", _m)
_rows(INERT, "override_transformer_config.recompute_granularity override_transformer_config.recompute_method "
      "override_transformer_config.recompute_num_layers override_transformer_config.recompute_modules",
      "activation recomputation (memory); same update", AM)
_rows(INERT, "override_transformer_config.attention_backend override_transformer_config.apply_rope_fusion "
      "override_transformer_config.masked_softmax_fusion override_transformer_config.bias_activation_fusion "
      "override_transformer_config.bias_dropout_fusion override_transformer_config.gradient_accumulation_fusion "
      "override_transformer_config.persist_layer_norm override_transformer_config.deallocate_pipeline_outputs "
      "override_transformer_config.moe_grouped_gemm override_transformer_config.moe_permute_fusion "
      "override_transformer_config.moe_enable_deepep override_transformer_config.moe_token_dispatcher_type "
      "override_transformer_config.moe_shared_expert_overlap",
      "kernel, fusion or token-dispatch choice (GPU / Ascend); the same routing and math", AM)
_rows(INERT, "override_transformer_config.moe_router_dtype", "the router's dtype: its logits are float32 here "
      "(transformers' Qwen3-MoE)", AM)
_rows(MAPPED, "override_transformer_config.account_for_embedding_in_pipeline_split "
      "override_transformer_config.account_for_loss_in_pipeline_split", "true: the embedding (loss) counts as a "
      "layer of the first (last) pipeline stage, as Megatron splits them: parallel.train_offset (num_layers + the "
      "counted ones must divide over the stages, checked once the model's depth is read; one stage: no effect)", AM)
for _name in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"):
    _check(AM + "override_transformer_config." + _name, _null, "null (pipeline stages split the layers as "
           "MindFormers does: give the model YAML's offset instead)", ABSENT)
ROWS[REF + "megatron.override_transformer_config"] = Key(REF + "megatron.override_transformer_config", INERT,
                                                         "the reference's kernel / recompute choices; same log-probs")
_rows(INERT, "override_transformer_config.*", "the reference's kernel / recompute choice; same log-probs", RM)

# the optimizer and its schedule (Megatron's OptimizerParamScheduler)
ROWS[ACTOR + "optim.lr_decay_style"] = Key(ACTOR + "optim.lr_decay_style", MAPPED, "optim.lr_schedule: constant, "
                                           "linear, cosine -> megatron_constant, megatron_linear, megatron_cosine "
                                           "(Megatron's scheduler; verl's default constant)")
ROWS[ACTOR + "optim.lr_decay_steps"] = Key(ACTOR + "optim.lr_decay_steps", MAPPED, "optim.decay_steps = steps x the "
                                           "updates of a step (null: the run's updates, as verl's total steps)")
ROWS[ACTOR + "optim.min_lr"] = Key(ACTOR + "optim.min_lr", MAPPED, "optim.min_lr")
_check(ACTOR + "optim.lr_warmup_init", lambda v, ns: float(v) == 0.0, "0.0 (the warm-up starts at lr 0)", 0.0)
_check(ACTOR + "optim.weight_decay_incr_style", lambda v, ns: v == "constant", "constant", "constant")
_check(ACTOR + "optim.optimizer", lambda v, ns: str(v).lower() in ("adam", "adamw"), "adam / AdamW (AdamW: "
       "decoupled decay, none on norms and biases)", ABSENT)
_rows(INERT, "optim.lr_wsd_decay_style optim.lr_wsd_decay_steps", "the WSD schedule's; lr_decay_style is not WSD",
      ACTOR)
_rows(INERT, "optim.use_checkpoint_opt_param_scheduler", "where a resumed schedule comes from: --resume restores "
      "ours from the step", ACTOR)
_rows(INERT, "optim.override_optimizer_config optim.override_optimizer_config.*", "Megatron's optimizer options "
      "(CPU offload of the optimizer step, precision-aware moments): here AdamW runs on the host in float32", ACTOR)
for _r in (ACTOR, REF):
    _check(_r + "load_weight", lambda v, ns: not _false(v, ns), "true (the weights load from model.path)", ABSENT)
_rows(INERT, "actor_rollout_ref.rollout.layer_name_map.*", "Megatron -> rollout weight names; the rollout here "
      "takes the policy's own")

# Megatron's LoRA: one adapter on the fused q/k/v (linear_qkv) and one on the fused gate/up (linear_fc1)
_check(MODEL + "lora.rank", lambda v, ns: int(v) == 0, "0: Megatron's LoRA adapts the fused q/k/v and gate/up "
       "projections with one adapter each, another model than ours (an adapter per projection, as PEFT and verl's "
       "FSDP actor): give actor_rollout_ref.model.lora_rank / lora_alpha / target_modules instead", 0)
_rows(INERT, "lora.*", "Megatron's LoRA setting; model.lora.rank is 0", MODEL)
_check(MODEL + "override_config.moe_config.freeze_moe_router", _false, "false (the routers train)", False)
_check(MODEL + "override_config.model_config", _no_overrides,
       "{} (the folder's config.json is the model: edit it there)", {})
# the one model override verl's scripts give (its Qwen3-30B-A3B script: prompt + response length)
MAX_POSITIONS = MODEL + "override_config.model_config.max_position_embeddings"
ROWS[MAX_POSITIONS] = Key(MAX_POSITIONS, MAPPED, "run.max_model_len (the smaller with rollout.max_model_len): the "
                          "bound it sets on prompt + response; no logit depends on it here (the RoPE kinds "
                          "implemented, default and Llama 3 scaling, read their own fields)")


@dataclass
class TrainLayout:
    tp: int = 1
    pp: int = 1
    ep: int = 1         # our expert_parallel: the EP ranks taken from the data-parallel ones
    experts_over_tp: bool = False       # expert_tensor_parallel_size 1: Megatron's EP folded onto the TP ranks

    @property
    def cell(self) -> int:
        """Ranks holding one copy of the rows: tensor x pipeline x expert (the EP ranks share their rows)."""
        return self.tp * self.pp * self.ep


def config_name(name: str) -> str:
    """Hydra's --config-name as verl's scripts give it (with or without .yaml), checked."""
    bare = name[:-len(".yaml")] if name.endswith(".yaml") else name
    if bare not in CONFIG_NAMES:
        raise ConfigError(f"--config-name {name}: not supported (we read verl's {' and '.join(CONFIG_NAMES)})")
    return bare


def check_backend(keys, name: str):
    """verl refuses a key its config does not have: Megatron's under ppo_trainer, FSDP's under
    ppo_megatron_trainer. A key under model.override_config.model_config would change the model here."""
    megatron = name == "ppo_megatron_trainer"
    for key in keys:
        if key.startswith(MODEL + "override_config.model_config.") and key != MAX_POSITIONS:
            raise ConfigError(f"{key}: not supported (the folder's config.json is the model: edit it there)")
        if not megatron and key.startswith(MEGATRON_ONLY):
            raise ConfigError(f"{key}: a key of verl's ppo_megatron_trainer.yaml (its Megatron backend): give "
                              f"--config-name ppo_megatron_trainer first, as verl's Megatron scripts do")
        if megatron and key.startswith(FSDP_ONLY):
            raise ConfigError(f"{key}: a key of verl's FSDP backend (ppo_trainer.yaml), not of "
                              f"ppo_megatron_trainer.yaml (--config-name): use its actor_rollout_ref.actor.megatron "
                              f"/ optim keys")


def train_layout(ov: Dict[str, Any], num: Callable, flag: Callable, put: Callable, derived: List[str],
                 world: int) -> TrainLayout:
    """The actor's Megatron sizes as our train layout (put into the parallel section)."""
    sizes = {}
    for name, (fld, default) in LAYOUT.items():
        sizes[name] = num(AM + name, "integer", default)
        if sizes[name] <= 0:
            raise ConfigError(f"{AM}{name}: expected a positive integer, got {sizes[name]}")
        if AM + name in ov and name != "expert_model_parallel_size":
            put("parallel", fld, sizes[name], AM + name)
    tp, pp, ep = (sizes[k] for k in LAYOUT)
    etp = ov.get(AM + "expert_tensor_parallel_size")
    etp = None if _null(etp, ov) else int(etp)
    layout = TrainLayout(tp, pp, ep)
    if etp == 1 and tp > 1 and ep > 1:
        # Megatron's expert ranks with ETP 1 run over the tensor ranks first, then the data-parallel ones
        if ep % tp:
            raise ConfigError(f"{AM}expert_model_parallel_size: {ep} expert ranks with expert_tensor_parallel_size "
                              f"1 and tensor {tp}: Megatron would hold whole experts on part of each tensor group; "
                              f"here the experts split over all of its {tp} ranks times data-parallel ones "
                              f"(parallel.train_moe_tp_extend_ep): give a multiple of {tp}")
        layout = TrainLayout(tp, pp, ep // tp, experts_over_tp=True)
        put("parallel", "train_moe_tp_extend_ep", True, AM + "expert_tensor_parallel_size")
        derived.append(f"{AM}expert_tensor_parallel_size 1: whole experts, split over the {ep} expert ranks as "
                       f"tensor {tp} x {ep // tp} data-parallel rank(s) (parallel.train_moe_tp_extend_ep, "
                       f"train_expert_parallel {ep // tp})")
    elif etp is not None and etp != tp:
        derived.append(f"{AM}expert_tensor_parallel_size {etp}: each expert's width is split over the "
                       f"{tp} tensor-parallel rank(s) here (another layout of the same experts, the same "
                       f"routing and math)")
    if AM + "expert_model_parallel_size" in ov:
        put("parallel", "train_expert_parallel", layout.ep, AM + "expert_model_parallel_size")
    if world % (tp * pp) or (world // (tp * pp)) % layout.ep:
        raise ConfigError(f"{AM}*: tensor {tp} x pipeline {pp} x expert {ep} does not divide the {world} rank(s) "
                          f"(nnodes x n_gpus_per_node): the expert ranks are taken from the data-parallel ones "
                          f"here" + (" after the tensor ones" if layout.experts_over_tp else
                                     " (with expert_tensor_parallel_size 1 they run over the tensor ranks first)") +
                          "; give more ranks or smaller sizes")
    if tp > 1 and flag(AM + "sequence_parallel", True):
        put("parallel", "train_use_seq_parallel", True, AM + "sequence_parallel")
    _pipeline_split(ov, flag, put, derived, pp)
    derived.append(f"train layout: data_parallel {world // (tp * pp)} (of which expert {layout.ep}) x tensor {tp}"
                   f"{' (whole experts over them)' if layout.experts_over_tp else ''} x pipeline {pp} "
                   f"(actor.megatron)")
    for key, fld in ((AM + "param_offload", "offload_train_param"), (AM + "optimizer_offload",
                                                                    "offload_train_optimizer"),
                     (RM + "param_offload", "offload_ref_param")):
        if ov.get(key) is not None:
            put("swap", fld, flag(key, False), key)
    return layout


def megatron_offset(pp: int, embedding: bool, loss: bool) -> List[int]:
    """Megatron's split with the embedding (loss) counted as a layer of the first (last) stage, as MindFormers'
    per-stage offset: each stage holds (num_layers + counted) / pp layer slots, the first one fewer with the
    embedding, the last one fewer with the loss. Megatron requires num_layers + counted divisible by pp, and then
    num_layers // pp is that quotient minus 1 (counted is 1 or 2 <= pp), so the offset is the same for every depth:
    [1 - embedding, 1, ..., 1, 1 - loss]; a depth Megatron refuses leaves offsets that do not add up, which
    configs.model_config.layer_split refuses."""
    offset = [1] * pp
    offset[0] -= int(embedding)
    offset[-1] -= int(loss)
    return offset


def _pipeline_split(ov: Dict[str, Any], flag: Callable, put: Callable, derived: List[str], pp: int):
    """account_for_embedding / loss_in_pipeline_split (null: false) -> parallel.train_offset (megatron_offset)."""
    keys = [AM + "override_transformer_config.account_for_" + k + "_in_pipeline_split" for k in ("embedding", "loss")]
    embedding, loss = (not _null(ov.get(k), ov) and flag(k, False) for k in keys)
    if not (embedding or loss):
        return
    if pp == 1:
        derived.append(f"{keys[0 if embedding else 1]}: no effect with one pipeline stage (it holds every layer)")
        return
    offset = megatron_offset(pp, embedding, loss)
    put("parallel", "train_offset", offset, keys[0] if embedding else keys[1])
    derived.append(f"parallel.train_offset {offset}: Megatron's pipeline split counting the "
                   f"{' and '.join(n for n, on in (('embedding', embedding), ('loss', loss)) if on)} as a layer "
                   f"(num_layers + {int(embedding) + int(loss)} must divide over the {pp} stages)")


def schedule(ov: Dict[str, Any], num: Callable, put: Callable, derived: List[str], per_step: int):
    """Megatron's OptimizerParamScheduler as verl builds it, in our updates (verl steps it once per step)."""
    style = str(ov.get(ACTOR + "optim.lr_decay_style", "constant"))
    if style not in DECAY_STYLES:
        raise ConfigError(f"{ACTOR}optim.lr_decay_style: {style!r} is not supported (we implement "
                          f"{', '.join(DECAY_STYLES)})")
    put("optim", "lr_schedule", DECAY_STYLES[style], ACTOR + "optim.lr_decay_style")
    decay = ov.get(ACTOR + "optim.lr_decay_steps")
    decay = None if _null(decay, ov) else num(ACTOR + "optim.lr_decay_steps", "integer")
    put("optim", "decay_steps", decay * per_step if decay else 0, ACTOR + "optim.lr_decay_steps")
    steps = num(ACTOR + "optim.lr_warmup_steps", "integer", -1)
    ratio = num(ACTOR + "optim.lr_warmup_steps_ratio", "number", 0.0)
    if steps <= 0 and ratio > 0:
        if decay is None:
            raise ConfigError(f"{ACTOR}optim.lr_warmup_steps_ratio: {ratio} x the run's steps is known only once the "
                              f"data is read; give optim.lr_warmup_steps or optim.lr_decay_steps")
        steps = int(ratio * decay)
    put("optim", "warmup_steps", max(steps, 0) * per_step, ACTOR + "optim.lr_warmup_steps")
    derived.append(f"optim: {DECAY_STYLES[style]}, warm-up {max(steps, 0)} step(s), decay over "
                   f"{decay if decay else 'the run'}'s steps, x {per_step} updates a step (verl holds the lr within a "
                   f"step, we move it every update)")
    if ov.get(ACTOR + "optim.min_lr") is not None:
        put("optim", "min_lr", num(ACTOR + "optim.min_lr", "number"), ACTOR + "optim.min_lr")
