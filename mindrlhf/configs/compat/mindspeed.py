"""MindSpeed-RL's GRPO (and DAPO: stage ray_dapo) YAML, in one table: every key its trainers accept, and what each
does here.

Read from github.com/Ascend/MindSpeed-RL (commit 05a90d7, April 2026), for facts only:
  - the file's shape: configs/grpo_qwen25_7b_A3.yaml, configs/grpo_qwen25_32b_A3.yaml,
    tests/st/configs/test_grpo_trainer_qwen25_7b_integrated.yaml and docs/zh/features/grpo_yaml.md: top-level
    `defaults` (Hydra list `- model: [qwen25_7b]`), `megatron_training`, `actor_config`, `rl_config`,
    `generate_config` (with `sampling_config`), and `ref_config` / `reward_config` (refused by its
    cli/train_grpo.py parse_training_config while `use_integrated_worker` is on), `profiler_config`,
    `msprobe_config`;
  - the model files: configs/model/qwen25_7b.yaml, qwen3_8b.yaml, tests/st/configs/model/llama32-1b.yaml
    (`qwen25_7b: {num_layers, hidden_size, ffn_hidden_size, num_attention_heads, group_query_attention,
    num_query_groups, padded_vocab_size, rotary_base, norm_epsilon, ...}`);
  - the accepted names and their defaults: mindspeed_rl/config_cls/megatron_config.py (MegatronConfig:
    model[<name>] < megatron_training < actor_config, merged by BaseConfig.update, '-' read as '_'),
    rl_config.py (RLConfig), generate_config.py (GenerateConfig and its sampling_config);
  - their meaning: cli/train_grpo.py, mindspeed_rl/config_cls/validate_config.py (data-parallel sizes from
    actor_resource.num_npus), models/loss/grpo_actor_loss_func.py (clip_ratio, kl_penalty, entropy_coeff,
    init_kl_coef through kl_ctrl), utils/compute.py (compute_kl_penalty), trainer/utils/compute_utils.py
    (group_norm advantages: std with ddof 1 + 1e-6), models/base/base_training_engine.py (epochs passes
    over mini_batch_size x n_samples_per_prompt sequences per update), models/rule_verifier.py (the
    overlong buffer);
  - the outcome reward model: configs/grpo_trainer_qwen25_7b.yaml (`reward_config` {model, load,
    tensor_model_parallel_size, ...}, `rl_config.reward_resource: {num_npus}`, `rule_reward: false`),
    cli/train_grpo.py (a RewardWorker when reward_resource is set, a RuleReward when rule_reward is true),
    workers/reward_woker.py (its score at the last token, prompt_length + response_length - 1, written as
    the samples' rm_scores, as workers/rule_reward.py writes its own).

Statuses as in configs/compat/keys.py: mapped (our field), inert (reported at start-up with the reason),
checked (an error unless the value is one we implement; `default` is MindSpeed-RL's value when the key is
absent, checked too, because that is what it would run). A key in no table is an error naming the file
and the key. The model entry is mapped onto our ModelConfig, so the file alone describes the policy:
the loader sets sft_path_train and sft_path_infer to the file, and load_model_yaml builds the train
layout (tensor/pipeline sizes) or the infer layout (infer_tensor_parallel_size) from it.
"""
from __future__ import annotations

import dataclasses
import glob
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import yaml

from mindrlhf.configs.coerce import coerce, coerce_kind
from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.compat.hf import read_json_object
from mindrlhf.configs.model_config import ModelConfig, ModelYaml, ParallelConfig
from mindrlhf.configs.compat.keys import ABSENT as _ABSENT, CHECKED, INERT, MAPPED, Key, run_checks

SECTIONS = ("defaults", "model", "megatron_training", "actor_config", "ref_config", "reward_config", "rl_config",
            "generate_config", "profiler_config", "msprobe_config")
MARKERS = ("defaults", "megatron_training", "actor_config", "rl_config", "generate_config")


def is_mindspeed(raw: Dict[str, Any]) -> bool:
    """A file with MindSpeed-RL's own top-level sections (none of them is a MindRLHF or MindFormers name)."""
    return any(k in raw for k in MARKERS)


def _inert(table: Dict[str, Key], names: str, reason: str):
    table.update({n: Key(n, INERT, reason) for n in names.split()})


def _checked(table: Dict[str, Key], checks: Dict[str, tuple]):
    """A CHECKED row per check (key -> (test, the value we implement, upstream's default))."""
    table.update({k: Key(k, CHECKED, expected) for k, (_, expected, _) in checks.items()})


# ---- megatron_training, actor_config and the model entries (one MegatronConfig namespace) ---------------
MODEL_MAPPED = {
    "num_layers": "num_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "intermediate_size",
    "num_attention_heads": "num_heads", "padded_vocab_size": "vocab_size", "seq_length": "seq_length",
    "rotary_base": "theta (Megatron's default 10000)", "norm_epsilon": "rms_norm_eps (Megatron's default 1e-5)",
    "max_position_embeddings": "max_position_embedding (default: seq_length)",
    "add_qkv_bias": "qkv_has_bias", "untie_embeddings_and_output_weights": "tie_word_embeddings = not this "
                                                                            "(Megatron's default: tied)",
    "group_query_attention": "n_kv_heads = num_query_groups if true, else num_attention_heads",
    "num_query_groups": "n_kv_heads (with group_query_attention)",
    "rope_scaling_type": "extend_method: unset -> None, llama3 -> LLAMA3 (yarn and linear are refused)",
    "rope_scaling_factor": "scaling_factor.factor (with rope_scaling_type llama3)",
    "low_freq_factor": "scaling_factor.low_freq_factor (llama3)",
    "high_freq_factor": "scaling_factor.high_freq_factor (llama3)",
    "original_max_position_embeddings": "scaling_factor.original_max_position_embeddings (llama3)",
    "num_layer_list": "offset: layers per pipeline stage, e.g. \"4,4,4,4\" (with pipeline_model_parallel_size > 1)",
    "noop_layers": "num_layers minus these (MindSpeed's identity layers, padding the depth for the pipeline; "
                   "no weights in HF checkpoints), each stage's real layers kept as offset",
    "qk_layernorm": "qk_layernorm (Qwen3's per-head RMSNorm on q and k before RoPE)",
    "kv_channels": "head_dim (Megatron's default: hidden_size / num_attention_heads)",
    # Qwen3-MoE (models/moe.py): every layer sparse (moe_layer_freq 1, first_k_dense_replace unset)
    "num_experts": "num_experts (unset: a dense model)",
    "moe_router_topk": "num_experts_per_tok (Megatron's default 2)",
    "moe_ffn_hidden_size": "moe_intermediate_size (Megatron's default: ffn_hidden_size)",
    "norm_topk_prob": "norm_topk_prob (default false)",
    "moe_aux_loss_coeff": "router_aux_loss_coef (Megatron's default 0.0; our loss is transformers' form, over "
                          "all sparse layers and the global mini-batch together; Megatron's is per layer and "
                          "micro-batch)",
}
MODEL_REQUIRED = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "padded_vocab_size",
                  "seq_length")
MEGATRON_RENAMES: Dict[str, Tuple[str, str]] = {
    "lr": ("optim", "lr"), "min_lr": ("optim", "min_lr"), "weight_decay": ("optim", "weight_decay"),
    "clip_grad": ("optim", "max_grad_norm"), "adam_beta1": ("optim", "beta1"), "adam_beta2": ("optim", "beta2"),
    "train_iters": ("run", "total_steps"), "save_interval": ("run", "save_steps"), "save": ("run", "save_ckpt_dir"),
    "seed": ("run", "seed"), "micro_batch_size": ("engine", "micro_batch_size"),
}
MEGATRON: Dict[str, Key] = {k: Key(k, MAPPED, f"{s}.{f}") for k, (s, f) in MEGATRON_RENAMES.items()}
MEGATRON.update({k: Key(k, MAPPED, f"model: {v}") for k, v in MODEL_MAPPED.items()})
for _k, _v in {
        "model": "which entry of the model section is the policy (actor_config's name wins over megatron_training's)",
        "global_batch_size": "rl.batch_size = global_batch_size / infer data_parallel (prompts per step over all "
                             "rollout replicas)",
        "tensor_model_parallel_size": "train layout model_parallel; its data_parallel is actor_resource.num_npus / "
                                      "(tensor x pipeline)",
        "pipeline_model_parallel_size": "train layout pipeline_stage",
        "sequence_parallel": "train layout use_seq_parallel",
        "lr_decay_style": "optim.lr_schedule: megatron_constant, megatron_linear (Megatron's default) or "
                          "megatron_cosine",
        "lr_warmup_fraction": "optim.warmup_steps = fraction x optim.decay_steps (a whole number of updates)",
        "load": "run.load_sft_checkpoint_train: an HF folder / safetensors or a MindSpore checkpoint (a Megatron "
                "checkpoint folder is refused: convert it to HF first)",
        "data_path": "run.mind_dataset_dir: a prompt MindRecord from rlhf_data.py (a Megatron .bin/.idx prefix from "
                     "preprocess_data.py is refused)",
        "tokenizer_name_or_path": "run.vocab_path (a folder with tokenizer.json, or vocab.json + merges.txt); its "
                                  "config.json / generation_config.json give the model's token ids",
        "no_shared_storage": "run.checkpoint_storage: true -> node_local, false -> shared",
        "stage": "ray_grpo (also when absent): the GRPO trainer, as these tables say; ray_dapo: MindSpeed-RL's DAPO "
                 "trainer (cli/train_dapo.py): rl.beta 0 (its loss has no KL term: init_kl_coef and kl_penalty are "
                 "inert), and rl_config's DAPO keys below (token_level_loss, clip_higher_enable, filter_groups_*) "
                 "are read; each value so set is said at start-up. Other stages are refused",
        "finetune": "true: load gives the initial weights. false: Megatron would also read load's iteration and "
                    "(without no_load_optim / no_load_rng) its optimizer and RNG state; load is weights only here "
                    "(HF / safetensors / MindSpore; a Megatron checkpoint is refused), which, as Megatron's "
                    "release checkpoints, carries none of them, so the run starts at iteration 0 either way (said "
                    "at start-up). Continuing one of our own runs is run.resume (--resume: save_ckpt_dir's newest "
                    "checkpoint)",
        "no_shuffle": "run.shuffle = not no_shuffle (true: the prompts in the file's order every epoch; false, "
                      "upstream's default: shuffled by seed)",
}.items():
    MEGATRON[_k] = Key(_k, MAPPED, _v)
MEGATRON["expert_model_parallel_size"] = Key("expert_model_parallel_size", MAPPED, "train layout expert_parallel: "
                                             "each EP rank holds num_experts / this of every layer's experts, the "
                                             "EP ranks taken from the data-parallel ones (Megatron's rule)")
MEGATRON["moe_tp_extend_ep"] = Key("moe_tp_extend_ep", MAPPED, "train layout moe_tp_extend_ep: the tensor-parallel "
                                   "ranks hold other whole experts instead of a share of each one's width, the "
                                   "experts split over expert_model_parallel_size x tensor_model_parallel_size "
                                   "(models/moe.py)")
MEGATRON["train_iters"] = Key("train_iters", MAPPED, "run.total_steps; optim.decay_steps = train_iters x "
                                                     "global_batch_size / rl_config.mini_batch_size updates")

# the Qwen3 layer spec MindSpeed-RL's Qwen3-235B-A22B entry names (its other Qwen3 entries give qk_layernorm alone)
QWEN3_SPEC = ["mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec"]

# name -> (ok(value, namespace), what we implement, MindSpeed-RL's default when absent or _ABSENT)
MEGATRON_CHECKS: Dict[str, Tuple[Callable[[Any, Dict[str, Any]], bool], str, Any]] = {
    "optimizer": (lambda v, ns: v == "adam", "adam (AdamW: decoupled weight decay, none on biases and norms)",
                  "adam"),
    "context_parallel_size": (lambda v, ns: int(v) == 1, "1", 1),
    "num_layers_per_virtual_pipeline_stage": (lambda v, ns: v is None, "unset (no virtual pipeline stages)", None),
    "position_embedding_type": (lambda v, ns: v == "rope", "rope", "learned_absolute"),
    "normalization": (lambda v, ns: v == "RMSNorm", "RMSNorm", "LayerNorm"),
    "swiglu": (lambda v, ns: v is True, "true (SwiGLU MLP)", False),
    "disable_bias_linear": (lambda v, ns: v is True, "true (no bias but add_qkv_bias's)", False),
    "attention_bias": (lambda v, ns: v is False, "false (only add_qkv_bias's q/k/v bias)", False),
    "multi_latent_attention": (lambda v, ns: v is False, "false", False),
    "n_shared_experts": (lambda v, ns: v in (None, 0), "unset (no shared experts: Qwen3-MoE)", None),
    "moe_layer_freq": (lambda v, ns: v in (None, 1), "1 (every layer sparse)", 1),
    "first_k_dense_replace": (lambda v, ns: v in (None, 0), "unset (every layer sparse)", None),
    "moe_router_score_function": (lambda v, ns: v in (None, "softmax"), "softmax", "softmax"),
    "moe_router_load_balancing_type": (lambda v, ns: v in ("aux_loss", "none"), "aux_loss or none", "aux_loss"),
    "moe_router_enable_expert_bias": (lambda v, ns: not v, "false", False),
    "moe_router_num_groups": (lambda v, ns: v is None, "unset (no group-limited routing)", None),
    "moe_router_group_topk": (lambda v, ns: v is None, "unset (no group-limited routing)", None),
    "moe_router_topk_scaling_factor": (lambda v, ns: v in (None, 1, 1.0), "unset (weights not scaled)", None),
    "seq_aux": (lambda v, ns: not v, "false (the batch-level aux loss)", False),
    "attention_dropout": (lambda v, ns: float(v) == 0.0, "0.0 (no dropout)", 0.1),
    "hidden_dropout": (lambda v, ns: float(v) == 0.0, "0.0 (no dropout)", 0.1),
    "lora_target_modules": (lambda v, ns: not v, "unset (MindSpeed-RL's Megatron LoRA keys are not translated; "
                            "Megatron fuses q/k/v and gate/up into one adapter each: set our lora section instead)", None),
    "mm_model": (lambda v, ns: v is None, "unset (text models only)", None),
    "spec": (lambda v, ns: v is None or (list(v) == QWEN3_SPEC and bool(ns.get("qk_layernorm"))),
             f"unset (the built-in Qwen2/Llama decoder), or {QWEN3_SPEC} with qk_layernorm true (MindSpeed-LLM's "
             f"Qwen3 layer: the decoder with q/k RMSNorm that qk_layernorm builds)", None),
    "split": (lambda v, ns: v is None or [float(x) for x in str(v).split(",")][1:] in ([], [0.0], [0.0, 0.0]),
              "train only, e.g. 100,0,0 (the GRPO trainer reads only the train split)", None),
}
_checked(MEGATRON, MEGATRON_CHECKS)
_inert(MEGATRON, "use_flash_attn use_fused_rmsnorm use_fused_swiglu use_fused_rotary_pos_emb no_masked_softmax_fusion "
       "no_gradient_accumulation_fusion gemm_gradient_accumulation_fusion no_bias_dropout_fusion shape_order "
       "use_ascend_coc coc_mode coc_parallel_num coc_fused_kernel use_mcore_models transformer_impl use_kv_cache "
       "use_tp_pp_dp_mapping attention_mask_type use_cp_send_recv_overlap use_fused_ring_attention_update "
       "context_parallel_algo overlap_grad_reduce overlap_param_gather accumulate_allreduce_grads_in_fp32 "
       "ddp_bucket_size distributed_backend npu_deterministic ai_framework use_rotary_position_embeddings",
       "Ascend kernel, fusion or communication choice; same results")
_inert(MEGATRON, "use_distributed_optimizer reuse_fp32_param swap_optimizer swap_attention recompute_granularity "
       "recompute_method recompute_num_layers recompute_activation_function",
       "memory saving (optimizer sharding, recomputation, swapping); same update")
_inert(MEGATRON, "bf16 initial_loss_scale attention_softmax_in_fp32",
       "NPU mixed precision; here the model computes in float32 (softmax included), which bf16 approximates")
_inert(MEGATRON, "no_check_for_nan_in_loss_and_grad", "a NaN loss stops the run here either way")
_inert(MEGATRON, "init_method_std", "initialisation detail; weights are loaded (or seeded)")
_inert(MEGATRON, "make_vocab_size_divisible_by vocab_extra_ids", "padded_vocab_size gives the vocabulary size")
_inert(MEGATRON, "reset_attention_mask reset_position_ids no_pad_to_seq_lengths variable_seq_lengths "
       "pad_to_multiple_of", "packing / padding detail; the same values on padded rows")
_inert(MEGATRON, "tokenizer_type tokenizer_not_use_fast tokenizer_padding_side prompt_type prompt_type_path "
       "dataset_additional_keys is_instruction_dataset is_pairwise_dataset dataloader_type num_workers "
       "full_shuffle_instruction_dataset", "data preparation; the prompt MindRecord (rlhf_data.py, "
                                          "--prompt_template) fixes the prompts")
_inert(MEGATRON, "no_load_optim no_load_rng no_save_optim no_save_rng load_checkpoint_loosely pretrained_checkpoint "
       "enable_high_availability", "checkpoint detail: load gives weights only (no optimizer or RNG state to read, "
                                   "finetune true or false); --resume restores a whole run of ours")
_inert(MEGATRON, "log_interval log_throughput eval_interval eval_iters skip_train",
       "logging / evaluation cadence; metrics are written every step")
_inert(MEGATRON, "dpo_loss_type ref_model refer_model_iter algorithm", "not read by the GRPO trainer")
_inert(MEGATRON, "do_sample", "rollouts always sample (sampling_config temperature 0 is greedy)")
_inert(MEGATRON, "moe_grouped_gemm moe_permutation_async_comm moe_alltoall_overlap_comm "
       "use_fused_moe_token_permute_and_unpermute moe_token_dispatcher_type",
       "MoE kernel or token-dispatch choice (Ascend); the same routing and expert math")
_inert(MEGATRON, "qk_pos_emb_head_dim qk_head_dim q_lora_rank kv_lora_rank v_head_dim",
       "multi-latent-attention setting; multi_latent_attention is false")
_inert(MEGATRON, "beta_fast beta_slow rope_scaling_mscale rope_scaling_mscale_all_dim "
       "rope_scaling_original_max_position_embeddings", "yarn RoPE setting; rope_scaling_type is not yarn")
_inert(MEGATRON, "lora_r lora_alpha lora_fusion lora_ckpt_filter", "LoRA setting; lora_target_modules is unset")

# ---- rl_config --------------------------------------------------------------------------------------------
RL_RENAMES: Dict[str, Tuple[str, str]] = {
    "n_samples_per_prompt": ("rl", "num_generations"), "epochs": ("rl", "num_iterations"),
    "init_kl_coef": ("rl", "beta"), "verifier_function": ("reward", "verifier_function"),
    "verifier_weight": ("reward", "verifier_weight"), "use_tensorboard": ("run", "tensorboard"),
    "entropy_coeff": ("rl", "entropy_coeff"),
}
KL_PENALTIES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
RL: Dict[str, Key] = {k: Key(k, MAPPED, f"{s}.{f}") for k, (s, f) in RL_RENAMES.items()}
RL["epochs"] = Key("epochs", MAPPED, "rl.num_iterations (passes over each rollout, as upstream's update loop)")
RL["verifier_function"] = Key("verifier_function", MAPPED, "reward.verifier_function: names of our verifiers or "
                              "of --reward_module's (upstream's math_17k_acc, base_acc, ... are its own code)")
for _k, _v in {
        "mini_batch_size": "rl.mini_batch_size = mini_batch_size x n_samples_per_prompt / train data_parallel "
                           "(prompts per update -> sequences per update on one train-DP rank)",
        "clip_ratio": "rl.clip_low and rl.clip_high",
        "kl_penalty": "rl.kl_estimator: kl -> k1, mse -> k2, low_var_kl -> k3 (upstream also clamps k3's log-ratio "
                      "to +-20 and its value to +-10; equal below); abs is refused",
        "overlong_buffer_enable": "true: rl.overlong_buffer_len = overlong_buffer (the reward penalty of "
                                  "models/rule_verifier.py)",
        "overlong_buffer": "rl.overlong_buffer_len (with overlong_buffer_enable)",
        "overlong_buffer_penalty_factor": "rl.overlong_penalty_factor (with overlong_buffer_enable)",
        "integrated_mode_config": "ref_model_load_path -> run.load_ref_checkpoint",
        "actor_resource": "num_npus: the ranks of the job (msrun's); use_parallel when > 1; splits into the "
                          "train and infer data_parallel",
        "reward_resource": "given (use_integrated_worker false, as upstream requires): the outcome reward model; "
                           "reward_config.load -> reward.reward_model (weight 1; its num_npus is not read: the "
                           "reward model runs on the job's ranks here). Needs rule_reward false: upstream's reward "
                           "model and rule reward each write the samples' rm_scores (the later write wins, not a "
                           "sum)",
}.items():
    RL[_k] = Key(_k, MAPPED, _v)
RL_CHECKS: Dict[str, Tuple[Callable[[Any, Dict[str, Any]], bool], str, Any]] = {
    "adv_estimator": (lambda v, c: v == "group_norm", "group_norm (GRPO's group advantages)", "group_norm"),
    "kl_ctrl_type": (lambda v, c: v == "fixed", "fixed (init_kl_coef throughout)", "fixed"),
    "use_kl_in_reward": (lambda v, c: v is False, "false (the KL term is in the loss)", False),
    "rule_reward": (lambda v, c: v is True or bool(c.get("reward_resource")),
                    "true (the verifiers), or false with reward_resource (the reward model alone: no verifier)", True),
    "shuffle_mini_batch": (lambda v, c: v is False, "false (mini-batches in rollout order)", False),
    "is_multimodal": (lambda v, c: v is False, "false (text models only)", False),
    "share_backbone": (lambda v, c: v is False, "false (under our lora section the reference is always the base: "
                                                    "set that instead)", False),
    "partial_rollout_max_split": (lambda v, c: int(v) == 1, "1 (every rollout finishes in its step)", 1),
    "rollout_max_tokens": (lambda v, c: not c.get("overlong_buffer_enable") or int(v) == c["max_tokens"],
                           "sampling_config.max_tokens when overlong_buffer_enable is true (the penalty is "
                           "measured from max_tokens)", 2048),
}
_checked(RL, RL_CHECKS)
_inert(RL, "gamma lam cliprange_value critic_resource", "GAE / critic setting (PPO); group_norm does not use it")
_inert(RL, "kl_horizon kl_target", "adaptive KL controller only; kl_ctrl_type is fixed")
_inert(RL, "beta", "stored by upstream's actor but never read by the GRPO loss (its KL weight is init_kl_coef)")
_inert(RL, "verifier_timeout num_samples_per_step advantage_whiten", "declared but never read upstream")
_inert(RL, "max_prompt_length", "the prompt MindRecord fixes prompt length (rlhf_data.py --max_prompt_length)")
_inert(RL, "reference_resource use_integrated_worker",
       "placement: every rank holds the policy, rollout and reference models here (upstream's integrated worker)")
_inert(RL, "shuffle_minibatch", "declared by upstream's RLConfig until commit acb2c70 (June 2025) but never read "
       "(the spelling read is shuffle_mini_batch); files of that time still carry it")
# read by the DAPO trainer only (stage ray_dapo); under ray_grpo each is reported inert, as upstream's GRPO ignores it
DAPO_ONLY = ("token_level_loss", "clip_higher_enable", "clip_ratio_low", "clip_ratio_high", "filter_groups_enable",
             "filter_groups_max_batches", "filter_groups_train_batch_size")
for _k, _v in {
        "token_level_loss": "stage ray_dapo: rl.loss_agg token-mean when true (upstream's default), seq-mean-token-mean "
                            "when false",
        "clip_higher_enable": "stage ray_dapo: true -> rl.clip_low = clip_ratio_low, rl.clip_high = clip_ratio_high "
                              "(upstream's defaults 0.1 each when absent); false -> clip_ratio on both sides",
        "clip_ratio_low": "rl.clip_low (stage ray_dapo with clip_higher_enable)",
        "clip_ratio_high": "rl.clip_high (stage ray_dapo with clip_higher_enable)",
        "filter_groups_enable": "stage ray_dapo: rl.dynamic_sampling (groups whose rewards are all equal are dropped "
                                "and more prompts sampled). Upstream filters on the verifier's metric_for_dapo, here on "
                                "the reward: the two differ only for a group of equal scores that the overlong penalty "
                                "tells apart",
        "filter_groups_max_batches": "rl.max_num_gen_batches when > 0; -1 (upstream's 'no limit') keeps our bound "
                                     "(said at start-up). Past the bound upstream stops the run, here the step is "
                                     "topped up with masked groups",
        "filter_groups_train_batch_size": "must equal global_batch_size with filter_groups_enable (the informative "
                                          "prompts a step holds: rl.batch_size x infer data_parallel here)",
}.items():
    RL[_k] = Key(_k, MAPPED, _v)
_inert(RL, "filter_groups_metric", "not read: the DAPO group filter is on the reward (all equal: dropped); upstream's "
       "metric_for_dapo (the verifier's score) differs only where the overlong penalty tells equal scores apart")
_inert(RL, "blocking async_engine guarantee_order zmq_communication num_cpus_for_local_task "
       "num_cpus_for_placement_group hccl_buffersize runtime_env_path data_strategy transfer_queue_data_shard_num "
       "transfer_queue_data_shard_port_base require_max_age_all_finished verifier_parallel",
       "Ray scheduling / transfer setting; same samples and updates")
_inert(RL, "actor_rollout_dispatch_size actor_logprob_dispatch_size ref_dispatch_size reward_dispatch_size "
       "dynamic_sampling_dispatch_size adv_dispatch_size actor_update_dispatch_size critic_update_dispatch_size "
       "critic_value_dispatch_size kl_dispatch_size actor_forward_micro_batch_size ref_forward_micro_batch_size "
       "use_dp_batch_balance use_remove_padding use_dynamic_bsz max_packing_token_size ref_max_packing_token_size "
       "actor_max_packing_token_size update_max_packing_token_size dynamic_max_batch_size "
       "ref_dynamic_max_batch_size actor_dynamic_max_batch_size update_dynamic_max_batch_size",
       "batching / packing of a phase, not read; the same log-probs (the update's micro-batches are "
       "micro_batch_size; engine.sequence_packing and engine.max_packing_token_size pack here)")
_inert(RL, "tp_split_expert", "MoE setting; dense models")
_inert(RL, "vit_resource vit_forward_micro_batch_size actor_image_embeds_dispatch_size reuse_image_embeds "
       "colocate_actor_and_vit", "multimodal setting; is_multimodal is false")
MULTI_TURN = ("tool_config_path", "max_tool_calls", "max_parallel_calls", "max_total_response_length",
              "max_tool_response_length", "tool_response_truncate_side", "tool_parser_format")
RL["multi_turn_enable"] = Key("multi_turn_enable", MAPPED, "true: multi-turn tool-use episodes (the tools section; "
                              "rl_config.max_tool_calls must be given); false: the tool keys below are inert")
for _k in MULTI_TURN:
    RL[_k] = Key(_k, MAPPED, f"tools.{_k} (with multi_turn_enable)" + (
        "; also sampling.max_tokens, the response width that holds the whole episode (sampling_config.max_tokens "
        "is not a per-turn limit here)" if _k == "max_total_response_length" else ""))
_inert(RL, "use_wandb wandb_project wandb_exp_name wandb_save_dir use_swanlab swanlab_mode swanlab_project "
       "swanlab_exp_name swanlab_save_dir log_max_throughput", "logging backend; metrics.jsonl and TensorBoard here")
RESOURCE = {"num_npus": Key("num_npus", MAPPED, "ranks of the job")}
INTEGRATED_MODE = {"ref_model_load_path": Key("ref_model_load_path", MAPPED, "run.load_ref_checkpoint")}

# ---- generate_config and its sampling_config -------------------------------------------------------------
GENERATE_RENAMES: Dict[str, Tuple[str, str]] = {
    "max_num_seqs": ("run", "max_num_seqs"), "max_model_len": ("run", "max_model_len"),
    "offload_train_optimizer": ("swap", "offload_train_optimizer"),
    "offload_train_param": ("swap", "offload_train_param"),
}
GENERATE: Dict[str, Key] = {k: Key(k, MAPPED, f"{s}.{f}") for k, (s, f) in GENERATE_RENAMES.items()}
GENERATE["infer_tensor_parallel_size"] = Key("infer_tensor_parallel_size", MAPPED, "infer layout model_parallel "
                                             "(default: tensor_model_parallel_size); its data_parallel is "
                                             "num_npus / this")
GENERATE["infer_expert_parallel_size"] = Key("infer_expert_parallel_size", MAPPED, "infer layout expert_parallel "
                                             "(taken from its data-parallel ranks)")
GENERATE["sampling_config"] = Key("sampling_config", MAPPED, "table below")
GENERATE_CHECKS: Dict[str, Tuple[Callable[[Any, Dict[str, Any]], bool], str, Any]] = {
    "infer_pipeline_parallel_size": (lambda v, c: int(v) == 1, "1 (the rollout layout has no pipeline stages)", 1),
}
_checked(GENERATE, GENERATE_CHECKS)
_inert(GENERATE, "max_num_batched_tokens gpu_memory_utilization dtype enforce_eager torchair_graph "
       "enable_prefix_caching num_scheduler_steps ascend_scheduler_config_enabled trust_remote_code",
       "vLLM engine knob; the built-in engine has no equivalent (same samples)")
_inert(GENERATE, "offload_train_grad", "gradients are not kept between updates here")
_inert(GENERATE, "data_parallel_size", "derived upstream too: num_npus / infer_tensor_parallel_size")
_inert(GENERATE, "tokenizer_name_or_path", "megatron_training's tokenizer_name_or_path is the one read")
_inert(GENERATE, "limit_mm_image_per_prompt limit_mm_video_per_prompt", "multimodal setting; text models only")
_inert(GENERATE, "eplb_token_collects eplb_token_save_path expert_map_path enable_expert_parallel",
       "MoE expert placement; dense models")
SAMPLING_RENAMES = {"max_tokens": "max_tokens", "top_p": "top_p", "min_p": "min_p", "temperature": "temperature"}
SAMPLING: Dict[str, Key] = {k: Key(k, MAPPED, f"sampling.{v}") for k, v in SAMPLING_RENAMES.items()}
SAMPLING["top_k"] = Key("top_k", MAPPED, "sampling.top_k (vLLM's -1 = off -> 0)")
_inert(SAMPLING, "logprobs", "the rollout's log-probs are always kept")
_inert(SAMPLING, "detokenize", "completions are decoded for the verifiers anyway")
_inert(SAMPLING, "seed", "samples are keyed by megatron_training.seed, step, prompt and sample")

TOP: Dict[str, Key] = {
    "defaults": Key("defaults", MAPPED, "Hydra list: `- model: [NAME, ...]` reads model/NAME.yaml in the file's folder "
                                        "into the model section (the file's own model entries win); `_self_` is "
                                        "accepted; other groups are refused"),
    "model": Key("model", MAPPED, "model entries {NAME: {Megatron keys}}, table below"),
    "megatron_training": Key("megatron_training", MAPPED, "Megatron keys, table below"),
    "actor_config": Key("actor_config", MAPPED, "Megatron keys, table below (they win over megatron_training's)"),
    "rl_config": Key("rl_config", MAPPED, "table below"),
    "generate_config": Key("generate_config", MAPPED, "table below"),
    "ref_config": Key("ref_config", CHECKED, "only with use_integrated_worker false (as upstream): Megatron keys; "
                                             "load -> run.load_ref_checkpoint, model must be the actor's, the rest "
                                             "inert (the reference runs in the train layout here)"),
    "reward_config": Key("reward_config", CHECKED, "only with use_integrated_worker false (as upstream): Megatron "
                                                   "keys; with rl_config.reward_resource, load -> reward.reward_model "
                                                   "(a Hugging Face sequence-classification folder; a Megatron "
                                                   "checkpoint is refused), tensor_model_parallel_size -> "
                                                   "reward.reward_model_parallel (its own layout), the rest inert "
                                                   "(its architecture is its config.json's)"),
    "profiler_config": Key("profiler_config", INERT, "profiling; the whole section"),
    "msprobe_config": Key("msprobe_config", INERT, "debug dumps; the whole section"),
}
assert set(TOP) == set(SECTIONS)


# ---- reading the file ---------------------------------------------------------------------------------------
def _norm(key) -> str:
    return str(key).replace("-", "_")


def _mapping(value, where: str) -> Dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return {_norm(k): v for k, v in value.items()}


def resolve(raw: Dict[str, Any], path: str) -> Dict[str, Any]:
    """The file with its `defaults` read: each `- model: [name]` entry is <folder>/model/<name>.yaml, whose
    `name: {...}` joins the model section; the file's own model entries win key by key (Hydra's order)."""
    doc = {_norm(k): v for k, v in raw.items()}
    unknown = [k for k in doc if k not in SECTIONS]
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: unknown top-level section (MindSpeed-RL's are "
                          f"{', '.join(SECTIONS)}; docs/UPSTREAM.md lists every key)")
    defaults = doc.get("defaults") or []
    if not isinstance(defaults, list):
        raise ConfigError(f"{path}: defaults: expected a list (Hydra's `- model: [name]`), got {defaults!r}")
    models: Dict[str, Dict[str, Any]] = {}
    folder = os.path.dirname(os.path.abspath(path))
    for i, entry in enumerate(defaults):
        if entry == "_self_":
            continue
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ConfigError(f"{path}: defaults[{i}]: {entry!r} is not supported (only `- model: [name, ...]` and "
                              f"`- _self_`)")
        group, names = next(iter(entry.items()))
        if group != "model":
            raise ConfigError(f"{path}: defaults[{i}].{group}: only the model group is read")
        for name in names if isinstance(names, list) else [names]:
            file = os.path.join(folder, "model", f"{name}.yaml")
            if not os.path.isfile(file):
                raise ConfigError(f"{path}: defaults[{i}].model: {name}: {file} not found (Hydra reads it from the "
                                  f"config folder's model/)")
            with open(file, encoding="utf-8") as fh:
                try:
                    body = yaml.safe_load(fh) or {}
                except yaml.YAMLError as err:
                    raise ConfigError(f"{file}: not valid YAML: {err}") from None
            for model_name, keys in _mapping(body, file).items():
                keys = _mapping(keys, f"{file}: {model_name}")
                _check_known(keys, MEGATRON, model_name, file)
                models.setdefault(model_name, {}).update(keys)
    for model_name, keys in _mapping(doc.get("model"), f"{path}: model").items():
        keys = _mapping(keys, f"{path}: model.{model_name}")
        _check_known(keys, MEGATRON, f"model.{model_name}", path)
        models.setdefault(model_name, {}).update(keys)
    doc["model"] = models
    for sec in ("megatron_training", "actor_config", "rl_config", "generate_config", "ref_config", "reward_config"):
        if sec in doc:
            doc[sec] = _mapping(doc[sec], f"{path}: {sec}")
    return doc


def _check_known(values: Dict[str, Any], table: Dict[str, Key], where: str, path: str):
    for key in values:
        if key not in table:
            raise ConfigError(f"{path}: {where}.{key}: unknown field (neither ours nor MindSpeed-RL's; "
                              f"docs/UPSTREAM.md lists every accepted name)")


def _validate_keys(doc: Dict[str, Any], path: str):
    """Every key of every section is in its table; an unknown one is an error naming its dotted path (the
    model entries were checked as resolve() read them, naming their own files)."""
    for sec in ("megatron_training", "actor_config", "ref_config", "reward_config"):
        _check_known(doc.get(sec, {}), MEGATRON, sec, path)
    rl = doc.get("rl_config", {})
    _check_known(rl, RL, "rl_config", path)
    _check_known(_mapping(rl.get("actor_resource"), f"{path}: rl_config.actor_resource"), RESOURCE,
                 "rl_config.actor_resource", path)
    _check_known(_mapping(rl.get("reward_resource"), f"{path}: rl_config.reward_resource"), RESOURCE,
                 "rl_config.reward_resource", path)
    _check_known(_mapping(rl.get("integrated_mode_config"), f"{path}: rl_config.integrated_mode_config"),
                 INTEGRATED_MODE, "rl_config.integrated_mode_config", path)
    gen = doc.get("generate_config", {})
    _check_known(gen, GENERATE, "generate_config", path)
    _check_known(_mapping(gen.get("sampling_config"), f"{path}: generate_config.sampling_config"), SAMPLING,
                 "generate_config.sampling_config", path)


def _namespace(doc: Dict[str, Any], path: str) -> Tuple[Dict[str, Any], Dict[str, str], str]:
    """The actor's MegatronConfig as upstream merges it: model[<name>] < megatron_training < actor_config.
    Returns (values, dotted origin of each value, the model's name)."""
    training = {**doc.get("megatron_training", {}), **doc.get("actor_config", {})}
    name = training.get("model")
    if name is None:
        raise ConfigError(f"{path}: megatron_training.model: missing (the name of the model entry to train)")
    if name not in doc["model"]:
        where = "actor_config" if "model" in doc.get("actor_config", {}) else "megatron_training"
        found = ", ".join(doc["model"]) or "none; add `defaults: [{model: [" + str(name) + "]}]`"
        raise ConfigError(f"{path}: {where}.model: {name!r} is not in the model section (entries: {found})")
    values, origin = {}, {}
    for sec, keys in ((f"model.{name}", doc["model"][name]), ("megatron_training", doc.get("megatron_training", {})),
                      ("actor_config", doc.get("actor_config", {}))):
        for k, v in keys.items():
            values[k], origin[k] = v, f"{sec}.{k}"
    return values, origin, name


def _as(kind: str, value, where: str):
    return coerce_kind(kind, value, where)


@dataclasses.dataclass
class Layouts:
    """What the file says about ranks: the job's size and the two layouts' data-parallel sizes."""
    world: int
    tp: int
    pp: int
    infer_tp: int
    seq_parallel: bool
    ep: int = 1             # expert_model_parallel_size: taken from the train data-parallel ranks (Megatron's)
    infer_ep: int = 1       # generate_config.infer_expert_parallel_size
    tp_extend_ep: bool = False      # moe_tp_extend_ep: the train TP ranks hold other whole experts

    @property
    def train_row_groups(self) -> int:
        """Train ranks holding distinct rows: the EP ranks share theirs (all-gather dispatcher, models/moe.py)."""
        return self.train_dp // self.ep

    @property
    def infer_row_groups(self) -> int:
        return self.infer_dp // self.infer_ep

    @property
    def train_dp(self) -> int:
        return self.world // (self.tp * self.pp)

    @property
    def infer_dp(self) -> int:
        return self.world // self.infer_tp


def layouts(doc: Dict[str, Any], path: str) -> Layouts:
    values, origin, _ = _namespace(doc, path)
    rl, gen = doc.get("rl_config", {}), doc.get("generate_config", {})
    resource = _mapping(rl.get("actor_resource"), f"{path}: rl_config.actor_resource")
    world = _as("integer", resource.get("num_npus") or 1, f"{path}: rl_config.actor_resource.num_npus")
    tp = _as("integer", values.get("tensor_model_parallel_size", 1), f"{path}: tensor_model_parallel_size")
    pp = _as("integer", values.get("pipeline_model_parallel_size", 1), f"{path}: pipeline_model_parallel_size")
    infer_tp = _as("integer", gen.get("infer_tensor_parallel_size", tp), f"{path}: generate_config."
                                                                         f"infer_tensor_parallel_size")
    seq_parallel = _as("flag", values.get("sequence_parallel", False), f"{path}: sequence_parallel")
    ep = _as("integer", values.get("expert_model_parallel_size", 1), f"{path}: expert_model_parallel_size")
    infer_ep = _as("integer", gen.get("infer_expert_parallel_size", 1), f"{path}: generate_config."
                                                                        f"infer_expert_parallel_size")
    for name, v in (("rl_config.actor_resource.num_npus", world), ("tensor_model_parallel_size", tp),
                    ("pipeline_model_parallel_size", pp), ("generate_config.infer_tensor_parallel_size", infer_tp),
                    ("expert_model_parallel_size", ep), ("generate_config.infer_expert_parallel_size", infer_ep)):
        if v <= 0:
            raise ConfigError(f"{path}: {origin.get(name, name)}: expected a positive integer, got {v}")
    if world % (tp * pp):
        raise ConfigError(f"{path}: rl_config.actor_resource.num_npus: {world} ranks do not split into "
                          f"tensor_model_parallel_size {tp} x pipeline_model_parallel_size {pp}")
    if world % infer_tp:
        raise ConfigError(f"{path}: rl_config.actor_resource.num_npus: {world} ranks do not split into "
                          f"generate_config.infer_tensor_parallel_size {infer_tp}")
    for name, dp, e in (("expert_model_parallel_size", world // (tp * pp), ep),
                        ("generate_config.infer_expert_parallel_size", world // infer_tp, infer_ep)):
        if dp % e:
            raise ConfigError(f"{path}: {origin.get(name, name)}: {e} does not divide the {dp} data-parallel ranks "
                              f"(the expert-parallel ranks are taken from them)")
    tp_extend_ep = _as("flag", values.get("moe_tp_extend_ep", False), f"{path}: moe_tp_extend_ep")
    return Layouts(world, tp, pp, infer_tp, seq_parallel, ep, infer_ep, tp_extend_ep)


def _token_ids(folder: Optional[str]) -> Dict[str, Any]:
    """bos/eos/pad ids from the tokenizer's HF folder (config.json, then generation_config.json's eos, as
    configs/compat/hf.py reads them); without them the tokenizer's own EOS and pad are used (eos [])."""
    ids: Dict[str, Any] = {"eos_token_id": []}
    if not folder or not os.path.isdir(folder):
        return ids
    for name in ("config.json", "generation_config.json"):
        file = os.path.join(folder, name)
        if os.path.isfile(file):
            raw = read_json_object(file)
            ids.update({k: raw[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                        if isinstance(raw.get(k), (int, list))})
    return ids


def _moe_fields(values: Dict[str, Any], ffn_hidden_size: int, where) -> Dict[str, Any]:
    """Qwen3-MoE's ModelConfig fields from Megatron's MoE keys (none for a dense model)."""
    if not values.get("num_experts"):
        return {}
    ffn = values.get("moe_ffn_hidden_size")
    return dict(
        num_experts=_as("integer", values["num_experts"], where("num_experts")),
        num_experts_per_tok=_as("integer", values.get("moe_router_topk", 2), where("moe_router_topk")),
        moe_intermediate_size=_as("integer", ffn, where("moe_ffn_hidden_size")) if ffn is not None
        else ffn_hidden_size,
        norm_topk_prob=_as("flag", values.get("norm_topk_prob", False), where("norm_topk_prob")),
        router_aux_loss_coef=_as("number", values.get("moe_aux_loss_coeff", 0.0), where("moe_aux_loss_coeff")))


def _int_list(value, where: str) -> List[int]:
    """"5,95" or [5, 95] -> [5, 95] (MindSpeed writes both)."""
    parts = value if isinstance(value, list) else str(value).split(",")
    return [_as("integer", str(c).strip(), where) for c in parts]


def _without_noop_layers(value, num_layers: int, pp: int, counts: Optional[List[int]], where: str) -> List[int]:
    """MindSpeed's noop_layers: identity layers at these global indices pad the depth to a multiple of the
    pipeline stages (Qwen3-235B-A22B: 94 layers as 96 over 16 stages, "5,95"). They hold no weights (HF
    checkpoints have the real layers only), so the model has the real layers, and each stage keeps the real
    layers it holds in MindSpeed (the no-op ones of its range removed) -> the real layers per stage."""
    noop = _int_list(value, where)
    if len(set(noop)) != len(noop) or not all(0 <= i < num_layers for i in noop):
        raise ConfigError(f"{where}: {value!r} must name distinct layer indices in [0, num_layers={num_layers})")
    if counts is None:
        if num_layers % pp:
            raise ConfigError(f"{where}: num_layers={num_layers} is not divisible by pipeline_model_parallel_size="
                              f"{pp} (give num_layer_list)")
        counts = [num_layers // pp] * pp
    starts = [sum(counts[:s]) for s in range(len(counts))]
    real = [c - sum(1 for i in noop if s <= i < s + c) for s, c in zip(starts, counts)]
    if min(real) < 1:
        raise ConfigError(f"{where}: {value!r} leaves pipeline stage {real.index(min(real))} without a real layer "
                          f"(layers per stage {counts})")
    return real


def _model_config(values: Dict[str, Any], origin: Dict[str, str], name: str, pp: int, path: str):
    where = lambda k: f"{path}: {origin.get(k, f'model.{name}.{k}')}"  # noqa: E731
    for key in MODEL_REQUIRED:
        if values.get(key) is None:
            raise ConfigError(f"{where(key)}: missing (Megatron derives no default we reproduce; give it)")
    num = {k: _as("integer", values[k], where(k)) for k in MODEL_REQUIRED}
    gqa = _as("flag", values.get("group_query_attention", False), where("group_query_attention"))
    kv = _as("integer", values.get("num_query_groups", 1), where("num_query_groups")) if gqa \
        else num["num_attention_heads"]
    kwargs = dict(
        num_layers=num["num_layers"], hidden_size=num["hidden_size"], intermediate_size=num["ffn_hidden_size"],
        num_heads=num["num_attention_heads"], n_kv_heads=kv, vocab_size=num["padded_vocab_size"],
        seq_length=num["seq_length"],
        theta=_as("number", values.get("rotary_base", 10000), where("rotary_base")),
        rms_norm_eps=_as("number", values.get("norm_epsilon", 1e-5), where("norm_epsilon")),
        max_position_embedding=_as("integer", values.get("max_position_embeddings") or num["seq_length"],
                                   where("max_position_embeddings")),
        qkv_has_bias=_as("flag", values.get("add_qkv_bias", False), where("add_qkv_bias")),
        qk_layernorm=_as("flag", values.get("qk_layernorm", False), where("qk_layernorm")),
        head_dim=_as("integer", values["kv_channels"], where("kv_channels")) if values.get("kv_channels") is not None
        else None,
        tie_word_embeddings=not _as("flag", values.get("untie_embeddings_and_output_weights", False),
                                    where("untie_embeddings_and_output_weights")),
        **_moe_fields(values, num["ffn_hidden_size"], where),
        **_token_ids(values.get("tokenizer_name_or_path")))
    scaling = values.get("rope_scaling_type")
    if scaling not in (None, "llama3"):
        raise ConfigError(f"{where('rope_scaling_type')}: {scaling!r} is not supported (we implement unset or "
                          f"llama3)")
    if scaling == "llama3":
        kwargs["extend_method"] = "LLAMA3"
        kwargs["scaling_factor"] = {
            "factor": _as("number", values.get("rope_scaling_factor", 1.0), where("rope_scaling_factor")),
            **{k: _as("number", values.get(k), where(k))
               for k in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}}
    counts = None                      # layers per pipeline stage, no-op layers included
    if pp > 1 and values.get("num_layer_list") is not None:
        counts = _int_list(values["num_layer_list"], where("num_layer_list"))
        if len(counts) != pp or sum(counts) != num["num_layers"]:
            raise ConfigError(f"{where('num_layer_list')}: {values['num_layer_list']!r} must give {pp} stage sizes "
                              f"adding up to num_layers={num['num_layers']}")
    if values.get("noop_layers") is not None:
        counts = _without_noop_layers(values["noop_layers"], num["num_layers"], pp, counts, where("noop_layers"))
        kwargs["num_layers"] = sum(counts)
    if pp > 1 and counts is not None:
        kwargs["offset"] = [c - kwargs["num_layers"] // pp for c in counts]
    try:
        return ModelConfig(**kwargs)
    except ConfigError as err:
        raise ConfigError(f"{path}: model.{name}: {err}") from None


def model_yaml(raw: Dict[str, Any], path: str, role: str = "train"):
    """The policy's ModelYaml from the file: its model entry, and the train layout (tensor/pipeline sizes,
    sequence_parallel) or the infer layout (infer_tensor_parallel_size); data_parallel fills num_npus.
    Inert keys of the selected model entry are reported with it (the rest of the file with the config)."""
    doc = resolve(raw, path)
    _validate_keys(doc, path)
    values, origin, name = _namespace(doc, path)
    lay = layouts(doc, path)
    run_checks(values, MEGATRON_CHECKS, values, "MindSpeed-RL",
               lambda k: f"{path}: {origin.get(k, f'model.{name}.{k}')}")
    model = _model_config(values, origin, name, lay.pp, path)
    if role == "infer":
        parallel = ParallelConfig(data_parallel=lay.infer_dp, model_parallel=lay.infer_tp,
                                  expert_parallel=lay.infer_ep)
    else:
        parallel = ParallelConfig(data_parallel=lay.train_dp, model_parallel=lay.tp, pipeline_stage=lay.pp,
                                  use_seq_parallel=lay.seq_parallel, expert_parallel=lay.ep,
                                  moe_tp_extend_ep=lay.tp_extend_ep)
    try:
        parallel.check_model(model, "layout")
    except ConfigError as err:
        raise ConfigError(f"{path}: {role} {err}") from None
    ignored = [(f"model.{name}.{k}", MEGATRON[k].ours) for k in doc["model"][name] if MEGATRON[k].status == INERT]
    ignored += [(f"model.{other}", f"not the trained model (actor_config.model is {name})")
                for other in doc["model"] if other != name]
    return ModelYaml(model=model, parallel=parallel, path=path, ignored=ignored)


# ---- the translation into our sections -------------------------------------------------------------------
def _reward_model(doc: Dict[str, Any], path: str, put, ignored: List[Tuple[str, str]]):
    """MindSpeed-RL's outcome reward model (rl_config.reward_resource + reward_config.load) as reward.reward_model;
    with rule_reward false it scores alone."""
    rl, rm = doc.get("rl_config", {}), doc.get("reward_config", {})
    if not rl.get("reward_resource"):
        ignored.extend((f"reward_config.{k}", "rl_config.reward_resource is unset: upstream builds no reward-model "
                                             "worker either") for k in rm)
        return
    if not rm.get("load"):
        raise ConfigError(f"{path}: rl_config.reward_resource: given without reward_config.load (the reward model's "
                          f"weights: here a Hugging Face sequence-classification folder)")
    load = _weights_path(str(rm["load"]), f"{path}: reward_config.load")
    if not os.path.isfile(os.path.join(load, "config.json")):
        raise ConfigError(f"{path}: reward_config.load: {load} is not a Hugging Face folder with config.json (the "
                          f"reward model is read as a *ForSequenceClassification folder)")
    if rl.get("rule_reward", True) is not False:
        raise ConfigError(f"{path}: rl_config.rule_reward: {rl.get('rule_reward', True)!r} with reward_resource is not "
                          f"supported: upstream's reward model and rule reward each write the samples' rm_scores "
                          f"(the later write wins); set rule_reward: false to score with the reward model alone (our "
                          f"own config adds verifiers to it: reward.reward_model_weight)")
    put("reward", "reward_model", load, "reward_config.load")
    put("reward", "reward_model_weight", 1.0, "rl_config.reward_resource")
    put("reward", "verifier_function", [], "rl_config.rule_reward")
    put("reward", "verifier_weight", [], "rl_config.rule_reward")
    if "tensor_model_parallel_size" in rm:
        put("reward", "reward_model_parallel", rm["tensor_model_parallel_size"],
            "reward_config.tensor_model_parallel_size")
    ignored.extend((f"reward_config.{k}", "reward-model worker's Megatron setting; the reward model runs in its "
                                         "layout (tensor_model_parallel_size, the rest data-parallel) and its "
                                         "architecture is its folder's config.json")
                   for k in rm if k not in ("load", "tensor_model_parallel_size"))
    ignored.extend((f"rl_config.reward_resource.{k}", "placement; the reward model runs on the job's ranks here")
                   for k in _mapping(rl.get("reward_resource"), f"{path}: rl_config.reward_resource"))


def _weights_path(value: str, where: str) -> str:
    if os.path.isfile(os.path.join(value, "latest_checkpointed_iteration.txt")):
        raise ConfigError(f"{where}: {value} is a Megatron checkpoint, which is not read here; give the model's "
                          f"Hugging Face folder (or safetensors / a MindSpore checkpoint)")
    return value


def _data_path(value: str, where: str) -> str:
    if glob.glob(f"{glob.escape(value)}*.idx"):
        raise ConfigError(f"{where}: {value} is a Megatron indexed dataset (preprocess_data.py), which is not read "
                          f"here; write a prompt MindRecord with rlhf_data.py and give its path")
    return value


def tokenizer_flags(value: str) -> Dict[str, str]:
    """tokenizer_name_or_path -> our tokenizer fields: the folder (tokenizer.json), else its vocab.json + merges.txt."""
    if os.path.isdir(value) and not os.path.isfile(os.path.join(value, "tokenizer.json")) and \
            os.path.isfile(os.path.join(value, "vocab.json")):
        return {"vocab_path": os.path.join(value, "vocab.json"), "merges_file_path": os.path.join(value, "merges.txt")}
    return {"vocab_path": value}


def translate(raw: Dict[str, Any], path: str, field_of: Callable[[str, str], dataclasses.Field]
              ) -> Tuple[Dict[str, Dict[str, Any]], List[Tuple[str, str]], List[str]]:
    """MindSpeed-RL's GRPO YAML -> ({section: {field: value}}, [(dotted key, reason) ignored], [derived
    values, said at start-up]). `field_of(section, name)` is our field, for each value's type. Keys the file
    does not give keep our defaults, except partners of a given key (the Megatron schedule, clip_ratio's
    two sides), which take MindSpeed-RL's."""
    doc = resolve(raw, path)
    _validate_keys(doc, path)
    values, origin, name = _namespace(doc, path)
    rl = doc.get("rl_config", {})
    gen = doc.get("generate_config", {})
    smp = _mapping(gen.get("sampling_config"), f"{path}: generate_config.sampling_config")
    sections: Dict[str, Dict[str, Any]] = {}
    ignored: List[Tuple[str, str]] = []
    derived: List[str] = []

    def put(sec: str, fld: str, value, key: str):
        sections.setdefault(sec, {})[fld] = field_value(sec, fld, value, key)

    def field_value(sec: str, fld: str, value, key: str):
        return coerce(value, field_of(sec, fld), f"{path}: {key}")

    # what cannot be honoured, before anything else
    if _as("flag", rl.get("use_integrated_worker", True), f"{path}: rl_config.use_integrated_worker"):
        for sec in ("ref_config", "reward_config"):
            if sec in doc:
                raise ConfigError(f"{path}: {sec}: given while rl_config.use_integrated_worker is true; MindSpeed-RL "
                                  f"refuses that too (the actor's settings serve the reference)")
    model_yaml(raw, path, "train")            # the Megatron keys' checks and the model's errors now, not at start-up
    max_tokens = smp.get("max_tokens", field_of("sampling", "max_tokens").default)
    run_checks(rl, RL_CHECKS,
               {**rl, "max_tokens": _as("integer", max_tokens, f"{path}: generate_config.sampling_config.max_tokens")},
               "MindSpeed-RL", lambda k: f"{path}: rl_config.{k}")
    run_checks(gen, GENERATE_CHECKS, gen, "MindSpeed-RL", lambda k: f"{path}: generate_config.{k}")
    lay = layouts(doc, path)

    # the Megatron namespace
    for key, (sec, fld) in MEGATRON_RENAMES.items():
        if key in values:
            put(sec, fld, values[key], origin[key])
    run = sections.setdefault("run", {})
    run["sft_path_train"] = run["sft_path_infer"] = path
    run["use_parallel"] = lay.world > 1
    if "load" in values:
        put("run", "load_sft_checkpoint_train", _weights_path(str(values["load"]), f"{path}: {origin['load']}"),
            origin["load"])
    if "data_path" in values:
        put("run", "mind_dataset_dir", _data_path(str(values["data_path"]), f"{path}: {origin['data_path']}"),
            origin["data_path"])
    if "tokenizer_name_or_path" in values:
        for fld, v in tokenizer_flags(str(values["tokenizer_name_or_path"])).items():
            put("run", fld, v, origin["tokenizer_name_or_path"])
    if "no_shared_storage" in values:
        node_local = _as("flag", values["no_shared_storage"], f"{path}: {origin['no_shared_storage']}")
        put("run", "checkpoint_storage", "node_local" if node_local else "shared", origin["no_shared_storage"])
    gbs = _as("integer", values["global_batch_size"], f"{path}: {origin['global_batch_size']}") \
        if "global_batch_size" in values else None
    if gbs is not None:
        dp = lay.infer_row_groups
        if gbs <= 0 or gbs % dp:
            raise ConfigError(f"{path}: {origin['global_batch_size']}: {gbs} prompts do not split over the "
                              f"{dp} rollout replicas (num_npus / infer_tensor_parallel_size"
                              f"{' / infer_expert_parallel_size' if lay.infer_ep > 1 else ''})")
        put("rl", "batch_size", gbs // dp, origin["global_batch_size"])
        derived.append(f"rl.batch_size: {gbs // dp} (global_batch_size {gbs} / infer data_parallel {dp})")

    stage = values.get("stage", "ray_grpo")
    if stage not in STAGES:
        raise ConfigError(f"{path}: {origin['stage']}: {stage!r} is not supported (we implement "
                          f"{' and '.join(STAGES)})")
    dapo = stage == "ray_dapo"
    if "finetune" in values and "load" in values and \
            not _as("flag", values["finetune"], f"{path}: {origin['finetune']}"):
        derived.append(f"{origin['finetune']}: false read as true: {origin['load']} is weights only, with no "
                       f"iteration, optimizer or RNG state to continue from (as a Megatron release checkpoint); the "
                       f"run starts at iteration 0. To continue a run of ours: --resume (run.resume)")
    if "no_shuffle" in values:
        put("run", "shuffle", not _as("flag", values["no_shuffle"], f"{path}: {origin['no_shuffle']}"),
            origin["no_shuffle"])

    # rl_config
    for key, (sec, fld) in RL_RENAMES.items():
        if key in rl and not (dapo and key == "init_kl_coef"):
            put(sec, fld, rl[key], f"rl_config.{key}")
    if dapo:
        ignored.extend((f"rl_config.{k}", "stage ray_dapo: upstream's DAPO loss has no KL term (rl.beta 0)")
                       for k in ("init_kl_coef", "kl_penalty") if k in rl)
    elif "kl_penalty" in rl:
        if rl["kl_penalty"] not in KL_PENALTIES:
            raise ConfigError(f"{path}: rl_config.kl_penalty: {rl['kl_penalty']!r} is not supported (we implement "
                              f"{', '.join(KL_PENALTIES)})")
        put("rl", "kl_estimator", KL_PENALTIES[rl["kl_penalty"]], "rl_config.kl_penalty")
    if "clip_ratio" in rl:
        put("rl", "clip_low", rl["clip_ratio"], "rl_config.clip_ratio")
        put("rl", "clip_high", rl["clip_ratio"], "rl_config.clip_ratio")
    if dapo:
        _dapo(rl, gbs, path, put, ignored, derived, field_of)
    else:
        ignored.extend((f"rl_config.{k}", f"read by upstream's DAPO trainer only (stage ray_dapo); this file's "
                                          f"stage is {stage}") for k in DAPO_ONLY if k in rl)
    n = sections.get("rl", {}).get("num_generations", field_of("rl", "num_generations").default)
    if "mini_batch_size" in rl:
        prompts = _as("integer", rl["mini_batch_size"], f"{path}: rl_config.mini_batch_size")
        dp = lay.train_row_groups
        if prompts <= 0 or prompts * n % dp:
            raise ConfigError(f"{path}: rl_config.mini_batch_size: {prompts} prompts x {n} samples do not split over "
                              f"the {dp} train data-parallel ranks")
        put("rl", "mini_batch_size", prompts * n // dp, "rl_config.mini_batch_size")
        derived.append(f"rl.mini_batch_size: {prompts * n // dp} (mini_batch_size {prompts} x "
                       f"n_samples_per_prompt {n} / train data_parallel {dp})")
    overlong = _as("flag", rl.get("overlong_buffer_enable", False), f"{path}: rl_config.overlong_buffer_enable")
    for key, fld in (("overlong_buffer", "overlong_buffer_len"), ("overlong_buffer_penalty_factor",
                                                                   "overlong_penalty_factor")):
        if key in rl and overlong:
            put("rl", fld, rl[key], f"rl_config.{key}")
        elif key in rl:
            ignored.append((f"rl_config.{key}", "overlong_buffer_enable is false"))
    if "rollout_max_tokens" in rl and not overlong:
        ignored.append(("rl_config.rollout_max_tokens", "overlong_buffer_enable is false"))
    mode = _mapping(rl.get("integrated_mode_config"), f"{path}: rl_config.integrated_mode_config")
    if mode.get("ref_model_load_path"):
        put("run", "load_ref_checkpoint", _weights_path(str(mode["ref_model_load_path"]), f"{path}: rl_config."
                                                         f"integrated_mode_config.ref_model_load_path"),
            "rl_config.integrated_mode_config.ref_model_load_path")

    _multi_turn(rl, path, put, ignored, derived)

    # the learning-rate schedule: always Megatron's (its default style is linear)
    _schedule(values, origin, rl, gbs, path, put, derived)

    # generate_config
    for key, (sec, fld) in GENERATE_RENAMES.items():
        if key in gen:
            put(sec, fld, gen[key], f"generate_config.{key}")
    for key, fld in SAMPLING_RENAMES.items():
        if key in smp:
            put("sampling", fld, smp[key], f"generate_config.sampling_config.{key}")
    if "top_k" in smp:
        top_k = _as("integer", smp["top_k"], f"{path}: generate_config.sampling_config.top_k")
        if top_k < -1:
            raise ConfigError(f"{path}: generate_config.sampling_config.top_k: expected -1 (off) or >= 0, got {top_k}")
        put("sampling", "top_k", max(top_k, 0), "generate_config.sampling_config.top_k")

    if rl.get("multi_turn_enable") and "max_total_response_length" in rl:    # the episode's width
        put("sampling", "max_tokens", rl["max_total_response_length"], "rl_config.max_total_response_length")
        derived.append(f"sampling.max_tokens: {rl['max_total_response_length']} (rl_config.max_total_response_length"
                       f": the response width holds the whole episode; generate_config.sampling_config.max_tokens "
                       f"{smp.get('max_tokens', 'unset')} is not a per-turn limit here)")

    # ref_config / reward_config (only reached with use_integrated_worker false)
    ref = doc.get("ref_config", {})
    if ref.get("model", name) != name:
        raise ConfigError(f"{path}: ref_config.model: {ref['model']!r} is not the actor's model {name!r} (the "
                          f"reference is the policy's initial model here)")
    if "load" in ref:
        put("run", "load_ref_checkpoint", _weights_path(str(ref["load"]), f"{path}: ref_config.load"),
            "ref_config.load")
    ignored += [(f"ref_config.{k}", "separate reference worker's setting; the reference runs in the train layout "
                                    "here") for k in ref if k not in ("load", "model")]
    _reward_model(doc, path, put, ignored)

    # inert keys, each where the file gives it (the model entry's are reported with the model)
    for sec in ("megatron_training", "actor_config"):
        ignored += [(f"{sec}.{k}", MEGATRON[k].ours) for k in doc.get(sec, {}) if MEGATRON[k].status == INERT]
    ignored += [(f"rl_config.{k}", RL[k].ours) for k in rl if RL[k].status == INERT]
    ignored += [(f"generate_config.{k}", GENERATE[k].ours) for k in gen if GENERATE[k].status == INERT]
    ignored += [(f"generate_config.sampling_config.{k}", SAMPLING[k].ours) for k in smp if SAMPLING[k].status == INERT]
    ignored += [(sec, TOP[sec].ours) for sec in doc if TOP[sec].status == INERT]
    for (sec, fld), (value, why) in ABSENT_DEFAULTS.items():
        if fld not in sections.get(sec, {}):
            put(sec, fld, value, why)
            derived.append(f"{sec}.{fld}: {value} ({why}; the file leaves it out)")
    return sections, ignored, derived


# Our defaults are MindRLHF's (configs/compat/mindrlhf_grpo.RUN_DEFAULTS); where a MindSpeed-RL file leaves a
# field out, MindSpeed-RL's own default applies instead when it differs: (section, field) -> (value, whose default).
ABSENT_DEFAULTS = {
    ("optim", "beta2"): (0.999, "Megatron's adam_beta2 default"),
    ("optim", "min_lr"): (0.0, "Megatron's min_lr default"),
    ("optim", "warmup_steps"): (0, "Megatron's default: no lr_warmup_fraction"),
    ("optim", "decay_steps"): (0, "Megatron's default: the decay spans the run"),
    ("rl", "loss_agg"): ("token-mean", "MindSpeed-RL's GRPO loss: a token mean"),
    ("rl", "ref_sync_steps"): (0, "MindSpeed-RL never re-syncs its reference"),
    ("run", "epochs"): (0, "MindSpeed-RL's run length is train_iters"),
    ("reward", "verifier_function"): (["base_acc"], "MindSpeed-RL's rl_config.verifier_function default"),
    ("reward", "verifier_weight"): ([1.0], "MindSpeed-RL's rl_config.verifier_weight default"),
}


STAGES = ("ray_grpo", "ray_dapo")


def _dapo(rl, gbs, path, put, ignored, derived, field_of):
    """stage ray_dapo: MindSpeed-RL's DAPO trainer as our rl fields (each said at start-up): no KL term, the
    token-level loss, clip-higher, and dynamic sampling (filter_groups)."""
    said = ["rl.beta 0 (the DAPO loss has no KL term)"]
    put("rl", "beta", 0.0, "megatron_training.stage")
    token_level = _as("flag", rl.get("token_level_loss", True), f"{path}: rl_config.token_level_loss")
    agg = "token-mean" if token_level else "seq-mean-token-mean"
    put("rl", "loss_agg", agg, "rl_config.token_level_loss")
    said.append(f"rl.loss_agg {agg} (token_level_loss {token_level})")
    if _as("flag", rl.get("clip_higher_enable", False), f"{path}: rl_config.clip_higher_enable"):
        low, high = rl.get("clip_ratio_low", 0.1), rl.get("clip_ratio_high", 0.1)
        put("rl", "clip_low", low, "rl_config.clip_ratio_low")
        put("rl", "clip_high", high, "rl_config.clip_ratio_high")
        said.append(f"rl.clip_low {low} / rl.clip_high {high} (clip_higher_enable)")
    else:
        ignored.extend((f"rl_config.{k}", "clip_higher_enable is false (clip_ratio clips both sides)")
                       for k in ("clip_ratio_low", "clip_ratio_high") if k in rl)
    if _as("flag", rl.get("filter_groups_enable", False), f"{path}: rl_config.filter_groups_enable"):
        put("rl", "dynamic_sampling", True, "rl_config.filter_groups_enable")
        said.append("rl.dynamic_sampling true (filter_groups_enable)")
        size = rl.get("filter_groups_train_batch_size", 1)
        if gbs is None or _as("integer", size, f"{path}: rl_config.filter_groups_train_batch_size") != gbs:
            raise ConfigError(f"{path}: rl_config.filter_groups_train_batch_size: {size!r} is not supported (we "
                              f"implement megatron_training.global_batch_size's value, {gbs}: a step holds that many "
                              f"informative prompts)")
        batches = _as("integer", rl.get("filter_groups_max_batches", 1), f"{path}: rl_config.filter_groups_max_batches")
        if batches > 0:
            put("rl", "max_num_gen_batches", batches, "rl_config.filter_groups_max_batches")
            said.append(f"rl.max_num_gen_batches {batches} (filter_groups_max_batches)")
        else:
            bound = field_of("rl", "max_num_gen_batches").default
            said.append(f"rl.max_num_gen_batches {bound} (filter_groups_max_batches {batches} is upstream's 'no "
                        f"limit'; our bound, then a step is topped up with masked groups: --max_num_gen_batches "
                        f"raises it)")
    else:
        ignored.extend((f"rl_config.{k}", "filter_groups_enable is false") for k in
                       ("filter_groups_max_batches", "filter_groups_train_batch_size") if k in rl)
    derived.append("stage ray_dapo (MindSpeed-RL's DAPO trainer): " + "; ".join(said))


def _multi_turn(rl, path, put, ignored, derived):
    """multi_turn_enable: the tool keys become the tools section (rl_config.max_tool_calls required: 0 would
    be single-turn); without it they are inert, each reported."""
    enabled = _as("flag", rl.get("multi_turn_enable", False), f"{path}: rl_config.multi_turn_enable")
    given = [k for k in MULTI_TURN if k in rl]
    if not enabled:
        ignored.extend((f"rl_config.{k}", "multi-turn tool setting; multi_turn_enable is false") for k in given)
        return
    if "max_tool_calls" not in rl:
        raise ConfigError(f"{path}: rl_config.multi_turn_enable is true but rl_config.max_tool_calls is not given "
                          f"(the most tool calls per episode; > 0)")
    for key in given:
        put("tools", key, rl[key], f"rl_config.{key}")
    derived.append(f"tools: multi-turn episodes from rl_config.multi_turn_enable ({', '.join(given)})")


def _schedule(values, origin, rl, gbs, path, put, derived):
    """Megatron's OptimizerParamScheduler in optimizer updates: the decay spans train_iters x (updates per
    pass over a rollout) = train_iters x global_batch_size / mini_batch_size (upstream counts samples, mini-
    batch by mini-batch; with epochs > 1 the later passes run at min_lr once the decay is over), the warmup
    lr_warmup_fraction of it."""
    style = values.get("lr_decay_style", "linear")
    if style not in ("constant", "linear", "cosine"):
        raise ConfigError(f"{path}: {origin.get('lr_decay_style', 'lr_decay_style')}: {style!r} is not supported "
                          f"(we implement constant, linear and cosine)")
    put("optim", "lr_schedule", f"megatron_{style}", origin.get("lr_decay_style", "lr_decay_style"))
    decay = 0
    if "train_iters" in values:
        iters = _as("integer", values["train_iters"], f"{path}: {origin['train_iters']}")
        per_pass = 1
        if "mini_batch_size" in rl and gbs is not None:
            mbs = _as("integer", rl["mini_batch_size"], f"{path}: rl_config.mini_batch_size")
            if gbs % mbs:
                raise ConfigError(f"{path}: rl_config.mini_batch_size: {mbs} does not divide "
                                  f"{origin['global_batch_size']}={gbs}")
            per_pass = gbs // mbs
        decay = iters * per_pass
        put("optim", "decay_steps", decay, origin["train_iters"])
    fraction = _as("number", values.get("lr_warmup_fraction") or 0.0, f"{path}: lr_warmup_fraction")
    if fraction:
        where = origin["lr_warmup_fraction"]
        warmup = fraction * decay
        if not decay or abs(warmup - round(warmup)) > 1e-9 or not 0 <= warmup < decay:
            raise ConfigError(f"{path}: {where}: {fraction} x {decay} decay updates (train_iters x global_batch_size / "
                              f"mini_batch_size) = {warmup:g} is not supported (we implement a whole number of "
                              f"warmup updates below the decay's)")
        put("optim", "warmup_steps", int(round(warmup)), where)
    span = f"{decay} updates (train_iters x updates per pass)" if decay else "the run's updates"
    derived.append(f"optim.lr_schedule: megatron_{style}, its decay over {span}")


def table_markdown() -> str:
    """docs/UPSTREAM.md's MindSpeed-RL tables (generated: scripts/gen_config_reference.py)."""
    out: List[str] = []

    def table(title: str, keys: Dict[str, Key], checks=None):
        out.extend([f"### {title}", "", "| key | status | here |", "| --- | --- | --- |"])
        for k in sorted(keys.values(), key=lambda k: ({MAPPED: 0, CHECKED: 1, INERT: 2}[k.status], k.name)):
            text = k.ours
            if checks and k.name in checks and checks[k.name][2] not in (_ABSENT, None):
                text += f"; MindSpeed-RL's default {checks[k.name][2]!r} is checked when absent"
            out.append(f"| `{k.name}` | {k.status} | {text} |")
        out.append("")

    n = counts()
    out.extend([f"{n[MAPPED]} mapped, {n[CHECKED]} checked, {n[INERT]} inert.", ""])
    table("top-level sections", TOP)
    table("megatron_training, actor_config, model.&lt;name&gt; (Megatron keys)", MEGATRON, MEGATRON_CHECKS)
    table("rl_config", RL, RL_CHECKS)
    table("rl_config.actor_resource, rl_config.reward_resource", RESOURCE)
    table("rl_config.integrated_mode_config", INTEGRATED_MODE)
    table("generate_config", GENERATE, GENERATE_CHECKS)
    table("generate_config.sampling_config", SAMPLING)
    return "\n".join(out).rstrip()


def counts() -> Dict[str, int]:
    """How many keys each status holds, over all the tables."""
    out = {MAPPED: 0, INERT: 0, CHECKED: 0}
    for table in (TOP, MEGATRON, RL, RESOURCE, INTEGRATED_MODE, GENERATE, SAMPLING):
        for k in table.values():
            out[k.status] += 1
    return out
