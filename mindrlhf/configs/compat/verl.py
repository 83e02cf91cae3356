"""verl's GRPO command line in one table: every dotted override of its `ppo_trainer.yaml` this reads, and what
each does here (its Megatron backend's own keys, `--config-name ppo_megatron_trainer`: verl_megatron.py).
`python -m mindrlhf.verl_main key=value ...` (mindrlhf/verl_main.py) runs it.

Read from github.com/volcengine/verl for facts only:
  - the names and their defaults: verl/trainer/config/_generated_ppo_trainer.yaml (ppo_trainer.yaml flattened by
    its scripts/generate_trainer_config.sh; commit 035682e) - `data`, `actor_rollout_ref.{model,actor,ref,
    rollout}`, `critic`, `reward_model`, `custom_reward_function`, `algorithm`, `trainer`, `global_profiler`,
    `ray_kwargs`;
  - how its GRPO runs are written: examples/grpo_trainer/run_qwen2-7b.sh and the GSM8K quickstart's overrides;
  - the data: examples/data_preprocess/gsm8k.py (`data_source` openai/gsm8k, `prompt` [{role: user, content:
    question + instruction}], `ability`, `reward_model` {style: rule, ground_truth}, `extra_info` {split, index,
    answer, question}); the prompt is rendered with the tokenizer's chat template, add_generation_prompt on
    (verl/utils/dataset/rl_dataset.py);
  - the scorer of a row: verl/utils/reward_score/__init__.py default_compute_score (by data_source).

Statuses as in configs/compat/keys.py: mapped (our field, with any conversion), inert (reported at start-up with
the reason), checked (an error unless the value is one we implement; `default` is verl's value when the key is
absent, checked too, because that is what verl would run). A key in no table is an error naming it; a row
`prefix.*` covers every key under the prefix.

Units: verl's data.train_batch_size and actor.ppo_mini_batch_size count prompts over the whole job, its
ppo_micro_batch_size_per_gpu counts sequences on one GPU; ours count prompts per rollout replica (rl.batch_size),
sequences per train data-parallel rank (rl.mini_batch_size, engine.micro_batch_size). Every rank of our job trains
(data-parallel, as verl's FSDP actor) and the rollout replicas are ranks / rollout.tensor_model_parallel_size.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, List, Tuple

from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.compat import verl_megatron
from mindrlhf.configs.compat.keys import ABSENT as _ABSENT, CHECKED, INERT, MAPPED, Key, run_checks
from mindrlhf.configs.compat.keys import is_empty as _empty, is_false as _false, is_null as _null, is_true as _true

A, R, M, F = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.model.", "actor_rollout_ref.ref."
RC = "algorithm.rollout_correction."      # verl's rollout correction (docs/algo/rollout_corr.md, newer than 035682e)
DAPO_KW = "reward_model.reward_kwargs."     # keyword arguments of verl's reward manager (dapo reads these)
OVERLONG = DAPO_KW + "overlong_buffer_cfg."

# data_source -> (our verifiers, what verl runs for it, how ours differs); sources not here are refused at start-up
DATA_SOURCES: Dict[str, Tuple[List[str], str, str]] = {
    "openai/gsm8k": (["accuracy_reward"], "gsm8k.compute_score",
                     "verl reads only '#### <number>' and compares strings; ours also reads \\boxed{} or "
                     "<answer></answer> and compares numbers (72.0 = 72)"),
    "lighteval/MATH": (["accuracy_reward"], "math.compute_score",
                       "verl compares the last \\boxed{} as normalised strings; ours judges equivalence as "
                       "math-verify does"),
    "DigitalLearningGmbH/MATH-lighteval": (["accuracy_reward"], "math.compute_score",
                                           "verl compares the last \\boxed{} as normalised strings; ours judges "
                                           "equivalence as math-verify does"),
}


def data_source_line(name: str, rows: int) -> str:
    """rlhf_data.py's (and verl_main's) line for one data_source of verl rows: the verifier it gets here."""
    if name in DATA_SOURCES:
        ours, theirs, note = DATA_SOURCES[name]
        return f"data_source {name}: {rows} rows, scored by {', '.join(ours)} (verl: {theirs}; {note})"
    return (f"data_source {name}: {rows} rows, no verifier here stands for verl's scorer of it: "
            f"mindrlhf.verl_main refuses it unless --verifier_function names yours (--reward_module)")


def verifiers_for(sources: Dict[str, int], where: str) -> List[str]:
    """The verifier_function for a run over these data sources (one list scores every row here)."""
    unknown = [s for s in sources if s not in DATA_SOURCES]
    if unknown:
        raise ConfigError(f"{where}: data_source {unknown[0]!r} ({sources[unknown[0]]} rows): verl scores it with "
                          f"its own function (verl.utils.reward_score) and no verifier here is its equivalent "
                          f"(we have one for {', '.join(DATA_SOURCES)}); give --verifier_function with your "
                          f"verifier (--reward_module) to score it, or leave those rows out")
    chosen = {tuple(DATA_SOURCES[s][0]) for s in sources}
    if len(chosen) > 1:
        raise ConfigError(f"{where}: data sources {', '.join(sources)} need different verifiers; one list scores "
                          f"every row here: give --verifier_function")
    return list(next(iter(chosen))) if chosen else ["accuracy_reward"]


TABLE: Dict[str, Key] = {}
# key -> (ok(value, all overrides), what we implement, verl's default when absent or _ABSENT)
CHECKS: Dict[str, Tuple[Callable[[Any, Dict[str, Any]], bool], str, Any]] = {}


def _mapped(rows: Dict[str, str]):
    TABLE.update({k: Key(k, MAPPED, v) for k, v in rows.items()})


def _inert(names: str, reason: str, prefix: str = ""):
    TABLE.update({prefix + n: Key(prefix + n, INERT, reason) for n in names.split()})


def _checked(rows: Dict[str, tuple]):
    CHECKS.update(rows)
    TABLE.update({k: Key(k, CHECKED, expected) for k, (_, expected, _) in rows.items()})


# ---- renames: key -> (section, field), same meaning and unit ----------------------------------------------
RENAMES: Dict[str, Tuple[str, str]] = {
    A + "optim.lr": ("optim", "lr"), A + "optim.weight_decay": ("optim", "weight_decay"),
    A + "grad_clip": ("optim", "max_grad_norm"), A + "optim.clip_grad": ("optim", "max_grad_norm"),
    A + "ppo_epochs": ("rl", "num_iterations"), A + "ppo_micro_batch_size_per_gpu": ("engine", "micro_batch_size"),
    A + "entropy_coeff": ("rl", "entropy_coeff"),
    A + "use_dynamic_bsz": ("engine", "sequence_packing"),
    A + "policy_loss.loss_mode": ("rl", "loss_mode"), A + "policy_loss.clip_cov_ratio": ("rl", "clip_cov_ratio"),
    A + "policy_loss.clip_cov_lb": ("rl", "clip_cov_lb"), A + "policy_loss.clip_cov_ub": ("rl", "clip_cov_ub"),
    A + "policy_loss.kl_cov_ratio": ("rl", "kl_cov_ratio"), A + "policy_loss.ppo_kl_coef": ("rl", "ppo_kl_coef"),
    A + "fsdp_config.param_offload": ("swap", "offload_train_param"),
    A + "fsdp_config.optimizer_offload": ("swap", "offload_train_optimizer"),
    F + "fsdp_config.param_offload": ("swap", "offload_ref_param"),
    R + "n": ("rl", "num_generations"), R + "temperature": ("sampling", "temperature"),
    R + "top_p": ("sampling", "top_p"), R + "max_num_seqs": ("run", "max_num_seqs"),
    "algorithm.norm_adv_by_std_in_grpo": ("rl", "adv_norm_std"),
    M + "lora_rank": ("lora", "lora_rank"), M + "lora_alpha": ("lora", "lora_alpha"),
    M + "target_modules": ("lora", "target_modules"),
    "trainer.total_epochs": ("run", "epochs"), "trainer.total_training_steps": ("run", "total_steps"),
    "trainer.default_local_dir": ("run", "save_ckpt_dir"), "data.seed": ("run", "seed"),
    "data.shuffle": ("run", "shuffle"),
}
_mapped({k: f"{s}.{f}" for k, (s, f) in RENAMES.items()})
_mapped({
    "data.train_files": "converted at start-up (verl rows -> <default_local_dir>/verl_data/train.mindrecord, "
                        "rlhf_data.py --dataset_type verl) -> run.mind_dataset_dir; a list is read in order",
    "data.val_files": "converted likewise -> run.eval_dataset (accuracy, every row: run.eval_prompts)",
    "data.max_prompt_length": "the prompt column's width in the converted file",
    "data.max_response_length": "sampling.max_tokens",
    "data.train_batch_size": "rl.batch_size = train_batch_size / rollout replicas (prompts per step over the "
                             "job -> per rollout replica)",
    "data.tokenizer": "run.vocab_path (default: actor_rollout_ref.model.path)",
    "data.prompt_key": "the column of chat messages (rlhf_data.py --map_keys '{\"prompt\": <column>}')",
    "data.filter_overlong_prompts": "true: longer prompts are left out (--on_long_prompt skip)",
    "data.truncation": "error (verl's default) -> a longer prompt is an error naming its row; left -> truncate "
                       "(keeps the end); right and middle are refused",
    M + "path": "run.sft_path_train (a Hugging Face folder: its weights and tokenizer; chat template for "
                "the prompts)",
    A + "ppo_mini_batch_size": "rl.mini_batch_size = ppo_mini_batch_size x rollout.n / ranks (prompts per update "
                               "over the job -> sequences per update on one train data-parallel rank)",
    A + "ppo_micro_batch_size": "engine.micro_batch_size = ppo_micro_batch_size / ranks (verl's deprecated global "
                                "form)",
    A + "use_kl_loss": "false (verl's default): rl.beta = 0 (no reference model); true: rl.beta = kl_loss_coef",
    A + "kl_loss_coef": "rl.beta (with use_kl_loss)",
    A + "kl_loss_type": "rl.kl_estimator: kl/k1 -> k1, mse/k2 -> k2, low_var_kl/k3 -> k3 (verl also clamps k3 to "
                        "+-10; equal below); abs and the '+' straight-through forms are refused",
    A + "router_replay.mode": "rl.router_replay: disabled -> none, R2 -> r2, R3 -> r3 (our rollout records the "
                              "routing in memory: record_file / replay_file are refused)",
    A + "clip_ratio": "rl.clip_low and rl.clip_high",
    A + "clip_ratio_low": "rl.clip_low", A + "clip_ratio_high": "rl.clip_high",
    A + "loss_agg_mode": "rl.loss_agg: token-mean, seq-mean-token-mean, seq-mean-token-sum-norm "
                         "(seq-mean-token-sum is refused)",
    A + "optim.warmup_style": "optim.lr_schedule: constant -> constant (transformers' constant_with_warmup, as "
                              "verl), cosine -> cosine",
    A + "optim.lr_scheduler_type": "as optim.warmup_style (its newer name)",
    A + "optim.lr_warmup_steps": "optim.warmup_steps = lr_warmup_steps x updates per step (verl steps its "
                                 "scheduler once per step, we once per update); -1: lr_warmup_steps_ratio",
    A + "optim.lr_warmup_steps_ratio": "optim.warmup_steps = ratio x the run's updates",
    A + "optim.min_lr_ratio": "optim.min_lr = lr x min_lr_ratio (cosine)",
    A + "optim.betas": "optim.beta1, optim.beta2",
    R + "tensor_model_parallel_size": "the rollout layout's model_parallel; its replicas are ranks / this (with "
                                      "> 1 model YAMLs of both layouts are written from the HF folder)",
    R + "top_k": "sampling.top_k (-1 = off -> 0)",
    R + "response_length": "sampling.max_tokens (when data.max_response_length is not given)",
    R + "max_model_len": "run.max_model_len (null -> 0: the model's)",
    "algorithm.adv_estimator": "rl.adv_estimator: grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline "
                               "(gae needs a critic and is refused; absent, verl runs gae: refused)",
    "algorithm.filter_groups.enable": "rl.dynamic_sampling (DAPO's group filter)",
    "algorithm.filter_groups.max_num_gen_batches": "rl.max_num_gen_batches (0, verl's 'no limit', is refused)",
    "trainer.n_gpus_per_node": "ranks of the job = nnodes x n_gpus_per_node (msrun's workers; run.use_parallel "
                               "when > 1); absent: 1 (the job's size is msrun's here, not verl's default 8)",
    "trainer.nnodes": "ranks of the job = nnodes x n_gpus_per_node",
    "trainer.save_freq": "run.save_steps (-1 -> 0: we still save once at the end)",
    "trainer.test_freq": "run.eval_steps (-1 -> 0: off)",
    "trainer.val_before_train": "run.eval_at_start (with test_freq > 0; with test_freq -1 verl validates once "
                                "before training, here nothing is evaluated: said at conversion)",
    "trainer.max_actor_ckpt_to_keep": "run.keep_checkpoints (null: verl keeps all; ours keeps 2)",
    "trainer.project_name": "default_local_dir's default checkpoints/<project_name>/<experiment_name>",
    "trainer.experiment_name": "default_local_dir's default checkpoints/<project_name>/<experiment_name>",
    "trainer.rollout_data_dir": "run.rollout_log_file = <dir>/rollouts.mindrecord (every sample, as a MindRecord)",
    "trainer.resume_mode": "disable -> a fresh run; auto -> a fresh run too (say --resume True on a restart: "
                           "a fresh run refuses a directory holding another run); resume_path is refused",
})

# ---- checked: only the value we implement (verl's default, when absent, is checked too) ---------------------
_checked({
    A + "shuffle": (_false, "false (mini-batches in rollout order)", False),
    A + "router_replay.record_file": (_null, "null (the recorded routing stays in memory)", None),
    A + "router_replay.replay_file": (_null, "null (the routing replayed is this run's own)", None),
    A + "optim.num_cycles": (lambda v, ns: float(v) == 0.5, "0.5 (one half-cosine)", 0.5),
    A + "optim.total_training_steps": (lambda v, ns: int(v) == -1, "-1 (verl's trainer fills it in)", -1),
    M + "custom_chat_template": (_null, "null (the model folder's chat template renders the prompts)", None),
    M + "external_lib": (_null, "null (the built-in Qwen2/Llama decoder)", None),
    M + "override_config": (_empty, "{} (the folder's config.json is the model)", {}),
    M + "exclude_modules": (_null, "null (lora.target_modules names the adapted layers)", None),
    F + "model": (_null, "null (the reference is the initial policy)", None),
    R + "do_sample": (_true, "true (rollouts sample)", True),
    R + "ignore_eos": (_false, "false", False),
    R + "over_sample_rate": (lambda v, ns: float(v) == 0, "0", 0),
    R + "skip_rollout": (_false, "false", False),
    R + "multi_turn.enable": (_false, "false (single-turn rollouts)", False),
    "actor_rollout_ref.hybrid_engine": (_true, "true (every rank holds the policy and the rollout model)", True),
    "data.reward_fn_key": (lambda v, ns: v == "data_source", "data_source", "data_source"),
    "data.custom_cls.path": (_null, "null (the verl row schema)", None),
    "data.sampler.class_path": (_null, "null (shuffled by run.seed)", None),
    "data.datagen.path": (_null, "null", None),
    "data.apply_chat_template_kwargs": (_empty, "{} (the template renders with its defaults)", {}),
    "critic.enable": (lambda v, ns: not _true(v, ns), "null/false (GRPO has no critic)", None),
    "reward_model.reward_manager": (lambda v, ns: v in ("naive", "dapo"), "naive (each sample scored by its row's "
                                    "rule) or dapo (the same score plus reward_kwargs.overlong_buffer_cfg's "
                                    "penalty: rl.overlong_buffer_len / overlong_penalty_factor)", "naive"),
    DAPO_KW + "max_resp_len": (lambda v, ns: int(v) == int(ns.get("data.max_response_length", v)),
                               "data.max_response_length (the overlong penalty ends at sampling.max_tokens here)",
                               _ABSENT),
    "algorithm.use_kl_in_reward": (_false, "false (the KL term is in the loss: actor.use_kl_loss)", False),
    "algorithm.use_pf_ppo": (_false, "false", False),
    "trainer.default_hdfs_dir": (_null, "null (checkpoints stay in default_local_dir)", None),
    "trainer.resume_from_path": (lambda v, ns: _null(v, ns) or
                                 ns.get("trainer.resume_mode", "auto") != "resume_path",
                                 "null, or a path verl does not read (resume_mode auto or disable); --resume "
                                 "continues from default_local_dir's newest checkpoint", None),
    "trainer.val_only": (_false, "false (mindrlhf.eval evaluates a policy)", False),
    RC + "rollout_is": (lambda v, ns: _null(v, ns) or v == "token", "null (off) or token: verl's decoupled "
                        "Token-TIS, min(pi_old / pi_rollout, rollout_is_threshold) per token, is rl.tis (sequence "
                        "level is not implemented)", None),
    RC + "rollout_rs": (_null, "null (no rejection sampling)", None),
    RC + "bypass_mode": (_false, "false (decoupled: the old policy's log-probs come from their own pass, as here)",
                         False),
    RC + "rollout_is_batch_normalize": (_false, "false (the truncated weights as they are)", False),
    R + "data_parallel_size": (lambda v, ns: int(v) == 1, "1 (a rollout replica is tensor_model_parallel_size "
                               "ranks; the job's other ranks are more replicas)", 1),
    R + "expert_parallel_size": (lambda v, ns: int(v) == 1, "1 (a MoE rollout's experts split over "
                                 "parallel.infer_expert_parallel / infer_moe_tp_extend_ep: give those flags)", 1),
    A + "freeze_vision_tower": (_false, "false (text models only: no vision tower)", False),
    M + "lora_adapter_path": (_null, "null (LoRA starts from zero adapters on the base; merge a trained adapter "
                                     "into the folder to start from it)", None),
})
_mapped({A + "ulysses_sequence_parallel_size": "N > 1 (FSDP backend): the train layout's tensor parallelism N with "
                                              "Megatron sequence parallelism (parallel.train_model_parallel, "
                                              "train_use_seq_parallel): a group of N ranks shares each row's tokens "
                                              "as Ulysses' does, another split of the same math; the batch sizes "
                                              "divide by world / N, as verl's"})
_mapped({RC + "rollout_is_threshold": "rl.tis_cap (with rollout_is token; unused without it)",
         OVERLONG + "enable": "with reward_manager dapo, true: DAPO's overlong penalty (rl.overlong_buffer_len = "
                              "len, rl.overlong_penalty_factor = penalty_factor)",
         OVERLONG + "len": "rl.overlong_buffer_len (with overlong_buffer_cfg.enable)",
         OVERLONG + "penalty_factor": "rl.overlong_penalty_factor (with overlong_buffer_cfg.enable)"})
_inert(OVERLONG + "log", "logs verl's overlong_reward; here the penalty is in the reward metrics")

# ---- inert -------------------------------------------------------------------------------------------------
_inert("strategy", "training backend (FSDP / Megatron); here MindSpore's layouts, same update", A)
_inert("strategy", "backend of the reference pass; same log-probs", F)
_inert("fsdp_config.*", "FSDP wrapping / resharding / prefetch; same update", A)
_inert("fsdp_config.*", "FSDP wrapping of the reference; same log-probs", F)
_inert("use_torch_compile use_fused_kernels entropy_from_logits_with_chunking entropy_checkpointing "
       "use_remove_padding", "kernel / memory choice; same values", A)
_inert("use_torch_compile entropy_from_logits_with_chunking entropy_checkpointing ulysses_sequence_parallel_size",
       "kernel / memory choice of the reference pass; same log-probs", F)
_inert("log_prob_micro_batch_size log_prob_micro_batch_size_per_gpu log_prob_use_dynamic_bsz "
       "log_prob_max_token_len_per_gpu", "batching of the reference pass; same log-probs", F)
_inert("log_prob_micro_batch_size log_prob_micro_batch_size_per_gpu log_prob_use_dynamic_bsz "
       "log_prob_max_token_len_per_gpu", "batching of the old-policy log-prob pass; same log-probs", R)
_inert("ppo_max_token_len_per_gpu", "use_dynamic_bsz's token budget; packed micro-batches here hold one padded "
       "row's width of tokens unless --max_packing_token_size is given", A)
_inert("clip_ratio_c", "verl's dual clip bounds a negative-advantage token's loss at clip_ratio_c x |A|; not "
       "implemented: it acts only where a ratio exceeds clip_ratio_c (3), never on one on-policy pass", A)
_inert("checkpoint.*", "what a checkpoint holds: here always the model, optimizer and run state", A)
_inert("profiler.*", "profiling", A)
_inert("profiler.*", "profiling", F)
_inert("profiler.*", "profiling", R)
_inert("global_profiler.*", "profiling")
_inert("ray_kwargs.*", "Ray start-up; msrun launches the ranks here")
_inert("optim._target_", "the optimizer class: AdamW here (decoupled decay, none on norms and biases)", A)
_inert("_target_", "config class name", A)
_inert("policy_loss._target_", "config class name", A)
_inert("router_replay._target_", "config class name", A)
_inert("name mode", "the rollout engine (vLLM / SGLang); here the built-in MindSpore engine (run.rollout_backend), "
       "same samples for the same weights and seed", R)
_inert("gpu_memory_utilization enforce_eager cudagraph_capture_sizes free_cache_engine max_num_batched_tokens "
       "disable_log_stats multi_stage_wake_up engine_kwargs.* enable_chunked_prefill load_format layered_summon "
       "update_weights_bucket_megabytes _target_ agent.* trace.* skip_dump_dir calculate_log_probs",
       "inference-engine knob; same samples", R)
_inert("dtype", "vLLM's weight dtype; the rollout here computes in the policy's float32 (bf16 approximates it)", R)
_inert("prompt_length", "data.max_prompt_length is read (Hydra interpolates this from it)", R)
_mapped({R + "val_kwargs.do_sample": "true: a sampled eval (run.eval_temperature, eval_top_p, eval_top_k, eval_n "
                                     "from val_kwargs; eval_accuracy is verl's mean@n); false (verl's default): "
                                     "greedy, one answer per prompt (verl's n equal greedy answers score as one)",
         R + "val_kwargs.temperature": "run.eval_temperature (with do_sample; 0: greedy)",
         R + "val_kwargs.top_p": "run.eval_top_p (with do_sample)",
         R + "val_kwargs.top_k": "run.eval_top_k (with do_sample; -1 = off -> 0)",
         R + "val_kwargs.n": "run.eval_n (with do_sample and temperature > 0; also gives eval_pass@n)"})
_inert("val_kwargs._target_", "config class name", R)
_inert("multi_turn.*", "multi-turn rollouts; multi_turn.enable is false", R)
_inert("enable_gradient_checkpointing enable_activation_offload use_remove_padding use_liger use_fused_kernels "
       "fused_kernel_options.* use_shm trust_remote_code", "memory / kernel / loading choice; same model", M)
_inert("actor_rollout_ref.nccl_timeout", "collective timeout; run.watchdog_timeout bounds a stuck phase here")
_inert("use_shm trust_remote_code dataloader_num_workers filter_overlong_prompts_workers return_raw_input_ids "
       "return_raw_chat return_full_prompt return_multi_modal_inputs image_key video_key custom_cls.name "
       "sampler.class_name datagen.name", "data loading detail; the converted MindRecord holds the same prompts",
       "data.")
_inert("data.val_batch_size", "batching of validation; every validation row is evaluated")
_inert("data.validation_shuffle", "order of validation; accuracy is over every row")
_inert("critic.*", "the critic (PPO's GAE); GRPO has none")
_mapped({"reward_model.enable": "true: reward.reward_model = reward_model.model.path (a sequence-classification "
                                 "folder) and, as verl's naive reward manager returns the reward model's score alone "
                                 "when one runs, no rule verifiers (--verifier_function adds them); false: the "
                                 "data_source's verifier",
         "reward_model.model.path": "reward.reward_model (with reward_model.enable)",
         "reward_model.micro_batch_size_per_gpu": "reward.reward_model_batch_size (with reward_model.enable)"})
_inert("reward_model.*", "the reward-model worker's engine and placement (FSDP, offload, dynamic batching, its own "
       "tokenizer: ours scores the policy's tokens, in the train layout, and its tokenizer must equal the policy's, "
       "checked at start-up); unused when reward_model.enable is false")
_mapped({"custom_reward_function.path": "reward.custom_reward_function = path:name, and reward.verifier_function "
                                        "that name alone: as in verl, the function scores every row (called with "
                                        "the row's data_source, ground truth and extra_info, which the converted "
                                        "files keep; reward/custom_function.py)",
         "custom_reward_function.name": "the function in custom_reward_function.path (verl's default compute_score)",
         "custom_reward_function.reward_kwargs": "reward.custom_reward_kwargs (JSON): the function's keyword "
                                                 "arguments",
         "custom_reward_function.reward_kwargs.*": "one keyword argument of the function "
                                                   "(reward.custom_reward_kwargs)"})
_inert("algorithm.gamma algorithm.lam", "GAE discounting; grpo-type estimators do not use it")
_inert("algorithm.kl_penalty algorithm.kl_ctrl.*", "the in-reward KL; algorithm.use_kl_in_reward is false (the KL "
       "weight is actor.kl_loss_coef)")
_inert("algorithm.pf_ppo.* algorithm._target_", "unused here (use_pf_ppo is false)")
_inert("algorithm.filter_groups.metric algorithm.filter_groups._target_",
       "filter_groups drops groups whose rewards are all equal (the reward is the metric here)")
_inert("trainer.logger trainer.log_val_generations trainer.validation_data_dir",
       "logging backend; metrics.jsonl and TensorBoard in default_local_dir here")
_inert(RC + "rollout_rs_threshold " + RC + "loss_type", "rejection sampling's threshold and bypass mode's loss: "
       "rollout_rs is null and bypass_mode false")
_inert("checkpoint_engine.*", "how verl moves the weights into its rollout engine; here the online re-layout does "
       "(run.reshard_transport)", R)
_inert("trainer.balance_batch", "reorders sequences between data-parallel ranks to even their tokens")
_inert("trainer.critic_warmup", "critic only")
_inert("trainer.device trainer.use_legacy_worker_impl trainer.ray_wait_register_center_timeout "
       "trainer.esi_redundant_time trainer.del_local_ckpt_after_load trainer.max_critic_ckpt_to_keep",
       "verl's worker / device / elastic setting; none here")

# ppo_megatron_trainer.yaml's own keys (--config-name ppo_megatron_trainer): configs/compat/verl_megatron.py
TABLE.update(verl_megatron.ROWS)
CHECKS.update(verl_megatron.CHECKS)

KL_TYPES = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
ROUTER_REPLAY = {"disabled": "none", "R2": "r2", "R3": "r3"}
LOSS_AGG = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
LOSS_MODES = ("vanilla", "gspo", "kl_cov", "clip_cov")

# Our defaults are MindRLHF's (configs/compat/mindrlhf_grpo.RUN_DEFAULTS); where a verl command leaves a field
# out, verl's own default applies when it differs: (section, field) -> (value, whose default).
ABSENT_DEFAULTS = {
    ("optim", "lr"): (1e-6, "verl's actor.optim.lr default"),
    ("optim", "lr_schedule"): ("constant", "verl's optim.warmup_style default"),
    ("optim", "warmup_steps"): (0, "verl's default: no warm-up"),
    ("optim", "min_lr"): (0.0, "verl's min_lr_ratio default 0"),
    ("optim", "beta2"): (0.999, "verl's AdamW betas (0.9, 0.999)"),
    ("optim", "max_grad_norm"): (1.0, "verl's actor.grad_clip default"),
    ("rl", "loss_agg"): ("token-mean", "verl's actor.loss_agg_mode default"),
    ("rl", "ref_sync_steps"): (0, "verl never re-syncs its reference"),
    ("rl", "ppo_kl_coef"): (0.1, "verl's policy_loss.ppo_kl_coef default"),
    ("run", "epochs"): (30, "verl's trainer.total_epochs default"),
    ("run", "save_steps"): (0, "verl's save_freq default -1 (we save once at the end)"),
    ("run", "eval_steps"): (0, "verl's test_freq default -1"),
    ("reward", "verifier_weight"): ([1.0], "one verl score per row"),
}


def lookup(key: str) -> Key:
    """The table's row for a dotted key: its own, else the nearest `prefix.*` above it."""
    if key in TABLE:
        return TABLE[key]
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        row = TABLE.get(".".join(parts[:i]) + ".*")
        if row is not None:
            return row
    raise ConfigError(f"{key}: unknown verl key (neither in verl's ppo_trainer.yaml as this reads it nor ours; "
                      f"docs/UPSTREAM.md's verl table lists every accepted name)")


def parse_overrides(args: List[str]) -> Dict[str, Any]:
    """Hydra's `key=value` overrides -> {key: value}, values read as YAML (true, null, [a,b], 1e-6 stays a string
    for coerce()); `+key=` and `++key=` (Hydra's add / force-add) as `key=`; `~key` is refused."""
    import yaml
    out: Dict[str, Any] = {}
    for arg in args:
        if arg.startswith("~"):
            raise ConfigError(f"{arg}: Hydra's delete override is not supported (leave the key out)")
        if "=" not in arg:
            raise ConfigError(f"{arg}: expected a verl override key=value (then our --flags)")
        key, text = arg.split("=", 1)
        key = key.lstrip("+")
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            value = text
        out[key] = value
    return out


@dataclasses.dataclass
class DataPlan:
    """What verl_main converts at start-up: verl's parquet -> prompt MindRecords."""
    train_files: List[str]
    val_files: List[str]
    max_prompt_length: int
    max_response_length: int
    on_long_prompt: str
    prompt_key: str
    tokenizer: str
    out_dir: str


@dataclasses.dataclass
class Translation:
    sections: Dict[str, Dict[str, Any]]
    mapped: List[Tuple[str, str]]        # (verl key, what it set here)
    ignored: List[Tuple[str, str]]       # (verl key, reason)
    derived: List[str]
    data: DataPlan
    world: int
    infer_tp: int


def _files(value) -> List[str]:
    if value is None or value == "":
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def translate(ov: Dict[str, Any], field_of: Callable[[str, str], dataclasses.Field],
              config_name: str = "ppo_trainer") -> Translation:
    """verl's overrides -> our sections, what each key did, and the data to convert. Keys the command does not
    give keep our defaults, except where verl's own default differs (ABSENT_DEFAULTS, said at start-up).
    `config_name`: Hydra's --config-name, ppo_trainer (FSDP) or ppo_megatron_trainer (verl_megatron.py)."""
    from mindrlhf.configs.coerce import coerce, coerce_kind
    backend = verl_megatron.config_name(config_name)
    verl_megatron.check_backend(ov, backend)
    megatron = backend == "ppo_megatron_trainer"
    rows = {k: lookup(k) for k in ov}
    run_checks(ov, CHECKS, ov, "verl", lambda k: k)

    sections: Dict[str, Dict[str, Any]] = {}
    mapped: List[Tuple[str, str]] = []
    derived: List[str] = []

    def put(sec: str, fld: str, value, key: str):
        sections.setdefault(sec, {})[fld] = coerce(value, field_of(sec, fld), key)
        mapped.append((key, f"{sec}.{fld} = {sections[sec][fld]!r}"))

    def num(key: str, kind: str, default=None):
        value = ov.get(key, default)
        return coerce_kind(kind, value, key)

    def flag(key: str, default: bool) -> bool:
        return coerce_kind("flag", ov.get(key, default), key)

    # the job: ranks and the rollout layout
    nodes = num("trainer.nnodes", "integer", 1)
    per_node = num("trainer.n_gpus_per_node", "integer", 1)
    infer_tp = num(R + "tensor_model_parallel_size", "integer", 1)
    for key, v in (("trainer.nnodes", nodes), ("trainer.n_gpus_per_node", per_node),
                   (R + "tensor_model_parallel_size", infer_tp)):
        if v <= 0:
            raise ConfigError(f"{key}: expected a positive integer, got {v}")
    world = nodes * per_node
    if world % infer_tp:
        raise ConfigError(f"{R}tensor_model_parallel_size: {world} ranks (nnodes x n_gpus_per_node) do not split "
                          f"into rollout replicas of {infer_tp}")
    replicas = world // infer_tp
    if world > 1:
        put("run", "use_parallel", True, "trainer.n_gpus_per_node")
    if megatron and num(A + "ulysses_sequence_parallel_size", "integer", 1) != 1:
        raise ConfigError(f"{A}ulysses_sequence_parallel_size: read with the FSDP backend only (under "
                          f"ppo_megatron_trainer give actor.megatron.tensor_model_parallel_size and sequence_parallel)")
    layout = verl_megatron.train_layout(ov, num, flag, put, derived, world) if megatron else \
        _ulysses_layout(num, put, derived, world)
    train_dp = world // layout.cell          # train replicas holding distinct rows
    if "trainer.n_gpus_per_node" not in ov:
        derived.append("ranks: 1 (trainer.n_gpus_per_node not given; verl's default is 8 GPUs, the job's size is "
                       "msrun's here)")

    for key, (sec, fld) in RENAMES.items():
        if ov.get(key) is not None:          # null: verl's "unset", our default stands
            put(sec, fld, ov[key], key)

    # the model, its tokenizer and where the run writes
    if M + "path" not in ov:
        raise ConfigError(f"{M}path: missing (the Hugging Face folder of the policy)")
    model = str(ov[M + "path"])
    put("run", "sft_path_train", model, M + "path")
    tokenizer = str(ov.get("data.tokenizer") or model)
    put("run", "vocab_path", tokenizer, "data.tokenizer" if ov.get("data.tokenizer") else M + "path")
    if "trainer.default_local_dir" not in ov:
        out = f"checkpoints/{ov.get('trainer.project_name', 'verl_examples')}/" \
              f"{ov.get('trainer.experiment_name', 'gsm8k')}"
        put("run", "save_ckpt_dir", out, "trainer.default_local_dir")
        derived.append(f"run.save_ckpt_dir: {out} (verl's default_local_dir: checkpoints/<project_name>/"
                       f"<experiment_name>)")
    out_dir = sections["run"]["save_ckpt_dir"]

    # data
    train = _files(ov.get("data.train_files"))
    if not train:
        raise ConfigError("data.train_files: missing (verl's RL parquet: examples/data_preprocess/gsm8k.py writes it)")
    val = _files(ov.get("data.val_files"))
    truncation = str(ov.get("data.truncation", "error"))
    if truncation not in ("error", "left"):
        raise ConfigError(f"data.truncation: {truncation!r} is not supported (we implement error and left: a "
                          f"prompt keeps its end)")
    on_long = "skip" if flag("data.filter_overlong_prompts", False) else \
        {"error": "error", "left": "truncate"}[truncation]
    prompt_len = num("data.max_prompt_length", "integer", 512)
    response_len = num("data.max_response_length", "integer", ov.get(R + "response_length", 512))
    plan = DataPlan(train, val, prompt_len, response_len, on_long, str(ov.get("data.prompt_key", "prompt")),
                    tokenizer, out_dir)
    put("sampling", "max_tokens", response_len,
        "data.max_response_length" if "data.max_response_length" in ov or R + "response_length" not in ov
        else R + "response_length")
    if val:
        test_freq = num("trainer.test_freq", "integer", -1)
        if test_freq <= 0:
            derived.append("data.val_files converted but not evaluated: trainer.test_freq is -1 (verl's default)"
                           + ("; verl would validate once before training (trainer.val_before_train): give "
                              "trainer.test_freq N to evaluate before the first step, every N steps and at the end"
                              if flag("trainer.val_before_train", True) else ""))
    if "trainer.val_before_train" in ov:
        put("run", "eval_at_start", flag("trainer.val_before_train", True), "trainer.val_before_train")
    _validation_sampling(ov, num, flag, put, derived)
    for key, fld in (("trainer.test_freq", "eval_steps"), ("trainer.save_freq", "save_steps")):
        if key in ov:
            put("run", fld, max(num(key, "integer"), 0), key)
    if ov.get("trainer.max_actor_ckpt_to_keep") not in (None, ""):
        put("run", "keep_checkpoints", ov["trainer.max_actor_ckpt_to_keep"], "trainer.max_actor_ckpt_to_keep")
    if ov.get("trainer.rollout_data_dir"):
        put("run", "rollout_log_file", f"{ov['trainer.rollout_data_dir']}/rollouts.mindrecord",
            "trainer.rollout_data_dir")
    mode = str(ov.get("trainer.resume_mode", "auto"))
    if mode not in ("auto", "disable"):
        raise ConfigError(f"trainer.resume_mode: {mode!r} is not supported (auto or disable; --resume True "
                          f"continues from default_local_dir's newest checkpoint)")

    # batch sizes: verl's prompts over the job -> ours per rank
    n = num(R + "n", "integer", 1)
    if n < 2:
        raise ConfigError(f"{R}n: {n} sample(s) per prompt{'' if R + 'n' in ov else ' (verl default)'}; GRPO "
                          f"compares a prompt's samples with each other: give actor_rollout_ref.rollout.n >= 2")
    tbs = num("data.train_batch_size", "integer", 1024)
    if tbs <= 0 or tbs % replicas:
        raise ConfigError(f"data.train_batch_size: {tbs} prompts do not split over the {replicas} rollout replicas "
                          f"(ranks / rollout.tensor_model_parallel_size)")
    put("rl", "batch_size", tbs // replicas, "data.train_batch_size")
    derived.append(f"rl.batch_size: {tbs // replicas} (data.train_batch_size {tbs} / {replicas} rollout replicas)")
    mini = num(A + "ppo_mini_batch_size", "integer", 256)
    if mini <= 0 or tbs % mini:
        raise ConfigError(f"{A}ppo_mini_batch_size: {mini}{'' if A + 'ppo_mini_batch_size' in ov else ' (verl default)'}"
                          f" must divide data.train_batch_size {tbs} (as verl asserts)")
    ranks = f"{world} ranks" if train_dp == world else f"{train_dp} train data-parallel group(s)"
    if mini * n % train_dp or tbs % train_dp:
        raise ConfigError(f"{A}ppo_mini_batch_size: {mini} prompts x rollout.n {n} (and data.train_batch_size {tbs}) "
                          f"do not split over {ranks}")
    put("rl", "mini_batch_size", mini * n // train_dp, A + "ppo_mini_batch_size")
    derived.append(f"rl.mini_batch_size: {mini * n // train_dp} (ppo_mini_batch_size {mini} x rollout.n {n} / "
                   f"{ranks})")
    if A + "ppo_micro_batch_size" in ov and ov[A + "ppo_micro_batch_size"] is not None:
        micro = num(A + "ppo_micro_batch_size", "integer")
        if micro % train_dp:
            raise ConfigError(f"{A}ppo_micro_batch_size: {micro} sequences do not split over {ranks}")
        put("engine", "micro_batch_size", micro // train_dp, A + "ppo_micro_batch_size")

    # the loss
    if flag(A + "use_kl_loss", False):
        put("rl", "beta", ov.get(A + "kl_loss_coef", 0.001), A + "kl_loss_coef")
        kl_type = str(ov.get(A + "kl_loss_type", "low_var_kl"))
        if kl_type not in KL_TYPES:
            raise ConfigError(f"{A}kl_loss_type: {kl_type!r} is not supported (we implement "
                              f"{', '.join(KL_TYPES)})")
        put("rl", "kl_estimator", KL_TYPES[kl_type], A + "kl_loss_type")
    else:
        put("rl", "beta", 0.0, A + "use_kl_loss")
        derived.append("rl.beta: 0 (actor.use_kl_loss is false, verl's default: no KL term, no reference model)")
    if A + "router_replay.mode" in ov:
        mode = str(ov[A + "router_replay.mode"])
        if mode not in ROUTER_REPLAY:
            raise ConfigError(f"{A}router_replay.mode: {mode!r} is not supported (we implement "
                              f"{', '.join(ROUTER_REPLAY)})")
        put("rl", "router_replay", ROUTER_REPLAY[mode], A + "router_replay.mode")
    estimator = str(ov.get("algorithm.adv_estimator", "gae"))
    if estimator not in ESTIMATORS:
        given = "algorithm.adv_estimator" in ov
        raise ConfigError(f"algorithm.adv_estimator: {estimator!r}{'' if given else ' (verl default: not given)'} is "
                          f"not supported (we implement {', '.join(ESTIMATORS)}; gae needs a critic)")
    put("rl", "adv_estimator", estimator, "algorithm.adv_estimator")
    if A + "loss_agg_mode" in ov:
        if ov[A + "loss_agg_mode"] not in LOSS_AGG:
            raise ConfigError(f"{A}loss_agg_mode: {ov[A + 'loss_agg_mode']!r} is not supported (we implement "
                              f"{', '.join(LOSS_AGG)})")
        put("rl", "loss_agg", ov[A + "loss_agg_mode"], A + "loss_agg_mode")
    if ov.get(A + "policy_loss.loss_mode", "vanilla") not in LOSS_MODES:
        raise ConfigError(f"{A}policy_loss.loss_mode: {ov[A + 'policy_loss.loss_mode']!r} is not supported (we "
                          f"implement {', '.join(LOSS_MODES)})")
    clip = ov.get(A + "clip_ratio", 0.2)
    for side, fld in (("low", "clip_low"), ("high", "clip_high")):
        key = A + f"clip_ratio_{side}"
        put("rl", fld, ov.get(key, clip), key if key in ov else A + "clip_ratio")

    # sampling
    if R + "top_k" in ov:
        top_k = num(R + "top_k", "integer")
        if top_k < -1:
            raise ConfigError(f"{R}top_k: expected -1 (off) or >= 0, got {top_k}")
        put("sampling", "top_k", max(top_k, 0), R + "top_k")
    bounds = [(num(k, "integer"), k) for k in (R + "max_model_len", verl_megatron.MAX_POSITIONS)
              if ov.get(k) not in (None, "")]
    for bound, key in bounds:
        if bound <= 0:
            raise ConfigError(f"{key}: expected a positive number of tokens, got {bound}")
    if bounds:
        put("run", "max_model_len", *min(bounds))

    # the learning-rate schedule: verl steps it once per step, we once per optimizer update
    if megatron:
        verl_megatron.schedule(ov, num, put, derived, tbs // mini * max(num(A + "ppo_epochs", "integer", 1), 1))
    else:
        _schedule(ov, put, derived, num, tbs, mini, sections)
    if A + "optim.betas" in ov:
        betas = ov[A + "optim.betas"]
        if not isinstance(betas, list) or len(betas) != 2:
            raise ConfigError(f"{A}optim.betas: expected [beta1, beta2], got {betas!r}")
        put("optim", "beta1", betas[0], A + "optim.betas")
        put("optim", "beta2", betas[1], A + "optim.betas")

    # dynamic sampling (DAPO)
    if flag("algorithm.filter_groups.enable", False):
        put("rl", "dynamic_sampling", True, "algorithm.filter_groups.enable")
        if "algorithm.filter_groups.max_num_gen_batches" in ov:
            batches = num("algorithm.filter_groups.max_num_gen_batches", "integer")
            if batches <= 0:
                raise ConfigError(f"algorithm.filter_groups.max_num_gen_batches: {batches} (verl's 'no limit') is "
                                  f"not supported; give a positive bound")
            put("rl", "max_num_gen_batches", batches, "algorithm.filter_groups.max_num_gen_batches")

    _dapo_reward(ov, num, flag, put)
    if ov.get(RC + "rollout_is") == "token":         # verl's decoupled Token-TIS
        put("rl", "tis", True, RC + "rollout_is")
        put("rl", "tis_cap", num(RC + "rollout_is_threshold", "number", 2.0), RC + "rollout_is_threshold")

    _custom_reward_function(ov, put)
    if flag("reward_model.enable", False):
        _reward_model(ov, put, derived)
    ignored = [(k, row.ours) for k, row in rows.items() if row.status == INERT]
    reported = {k for k, _ in mapped}
    for k, row in rows.items():          # every given key is said at start-up, the ones read above by their row
        if row.status == MAPPED and k not in reported and k not in ("data.train_files", "data.val_files",
                                                                    "data.max_prompt_length"):
            mapped.append((k, f"{ov[k]!r}: {row.ours}"))
        elif row.status == CHECKED:
            mapped.append((k, f"{ov[k]!r} (checked: we implement {row.ours})"))
    for (sec, fld), (value, why) in ABSENT_DEFAULTS.items():
        if fld not in sections.get(sec, {}):
            sections.setdefault(sec, {})[fld] = coerce(value, field_of(sec, fld), why)
            derived.append(f"{sec}.{fld}: {value!r} ({why}; the command leaves it out)")
    return Translation(sections, mapped, ignored, derived, plan, world, infer_tp)


def _custom_reward_function(ov, put):
    """custom_reward_function (path, name, reward_kwargs, or its reward_kwargs.<key> overrides) -> ours: the function
    registered as a verifier and the only one, as verl's reward manager calls it for every row."""
    key = "custom_reward_function."
    if _null(ov.get(key + "path"), ov):
        return
    name = str(ov.get(key + "name") or "compute_score")
    put("reward", "custom_reward_function", f"{ov[key + 'path']}:{name}", key + "path")
    kwargs = ov.get(key + "reward_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{key}reward_kwargs: expected a mapping of keyword arguments, got {kwargs!r}")
    kwargs = dict(kwargs, **{k[len(key + "reward_kwargs."):]: v for k, v in ov.items()
                             if k.startswith(key + "reward_kwargs.")})
    if kwargs:
        put("reward", "custom_reward_kwargs", json.dumps(kwargs), key + "reward_kwargs")
    put("reward", "verifier_function", [name], key + "path")


def _ulysses_layout(num, put, derived, world: int) -> "verl_megatron.TrainLayout":
    """verl's FSDP actor with Ulysses sequence parallelism N (a group of N ranks splits each row's sequence, its
    attention all-to-all over heads) as our train layout: tensor parallelism N with Megatron sequence parallelism,
    whose N ranks also share each row's tokens (the sequence split between the attention and MLP, the heads and MLP
    width inside them). The same math; the data-parallel groups, world / N, are verl's."""
    key = A + "ulysses_sequence_parallel_size"
    sp = num(key, "integer", 1)
    if sp < 1 or world % sp:
        raise ConfigError(f"{key}: {sp} must be a positive size dividing the {world} rank(s) (nnodes x "
                          f"n_gpus_per_node)")
    if sp == 1:
        return verl_megatron.TrainLayout()
    put("parallel", "train_model_parallel", sp, key)
    put("parallel", "train_use_seq_parallel", True, key)
    derived.append(f"{key} {sp}: train layout tensor {sp} with sequence parallelism (each row's tokens shared by "
                   f"{sp} ranks, as Ulysses shares them; data_parallel {world // sp})")
    return verl_megatron.TrainLayout(tp=sp)


def _validation_sampling(ov, num, flag, put, derived):
    """verl's val_kwargs: do_sample true samples each validation prompt n times with its temperature / top_p /
    top_k (verl's mean@n is our eval_accuracy); false, its default, decodes greedily, and its n answers of a
    prompt, all equal, score as one."""
    v = R + "val_kwargs."
    n = num(v + "n", "integer", 1)
    if n < 1:
        raise ConfigError(f"{v}n: expected >= 1, got {n}")
    sample = flag(v + "do_sample", False)
    temperature = num(v + "temperature", "number", 0) if sample else 0.0
    if temperature < 0:
        raise ConfigError(f"{v}temperature: expected >= 0, got {temperature}")
    if temperature == 0:
        if n > 1:
            derived.append(f"run.eval_n: 1 ({v}n {n} greedy answers of a prompt are all equal: verl's mean@{n} is "
                           f"the greedy accuracy)")
        return
    put("run", "eval_temperature", temperature, v + "temperature")
    put("run", "eval_n", n, v + "n")
    if ov.get(v + "top_p") is not None:
        put("run", "eval_top_p", ov[v + "top_p"], v + "top_p")
    if ov.get(v + "top_k") is not None:
        top_k = num(v + "top_k", "integer")
        if top_k < -1:
            raise ConfigError(f"{v}top_k: expected -1 (off) or >= 0, got {top_k}")
        put("run", "eval_top_k", max(top_k, 0), v + "top_k")


def _dapo_reward(ov, num, flag, put):
    """verl's DAPO reward manager: the row's score plus, with overlong_buffer_cfg.enable, min(-(length - (max_resp_len
    - len)) / len x penalty_factor, 0): our rl.overlong_buffer_len / overlong_penalty_factor (max_resp_len is
    max_tokens, checked). verl's naive manager takes no such keyword arguments, and with a reward model's scores
    the dapo manager returns them unpenalised."""
    given = [k for k in ov if k.startswith(DAPO_KW)]
    if ov.get("reward_model.reward_manager", "naive") != "dapo":
        if given:
            raise ConfigError(f"{given[0]}: read by reward_model.reward_manager=dapo only (verl's naive manager "
                              f"takes no reward_kwargs)")
        return
    if flag(OVERLONG + "enable", False):
        if flag("reward_model.enable", False):
            raise ConfigError(f"{OVERLONG}enable: with reward_model.enable verl's dapo manager returns the reward "
                              f"model's scores as they are, without the overlong penalty, and ours would add it: "
                              f"turn one of them off")
        put("rl", "overlong_buffer_len", num(OVERLONG + "len", "integer"), OVERLONG + "len")
        put("rl", "overlong_penalty_factor", num(OVERLONG + "penalty_factor", "number", 1.0),
            OVERLONG + "penalty_factor")


def _reward_model(ov, put, derived):
    """reward_model.enable: the folder scores every sample, and (verl's naive reward manager returns rm_scores
    unchanged when they exist) it alone: no rule verifiers unless the command line adds them."""
    if not ov.get("reward_model.model.path"):
        raise ConfigError("reward_model.model.path: missing with reward_model.enable=True (the reward model's "
                          "Hugging Face sequence-classification folder)")
    put("reward", "reward_model", str(ov["reward_model.model.path"]), "reward_model.model.path")
    if ov.get("reward_model.micro_batch_size_per_gpu") is not None:
        put("reward", "reward_model_batch_size", ov["reward_model.micro_batch_size_per_gpu"],
            "reward_model.micro_batch_size_per_gpu")
    put("reward", "verifier_function", [], "reward_model.enable")
    put("reward", "verifier_weight", [], "reward_model.enable")
    put("reward", "reward_model_weight", 1.0, "reward_model.enable")
    derived.append("reward: the reward model's score alone (verl returns rm_scores as the reward when a reward model "
                   "runs); --verifier_function / --verifier_weight add rule verifiers")


def _schedule(ov, put, derived, num, tbs, mini, sections):
    lr = num(A + "optim.lr", "number", 1e-6)
    style = str(ov.get(A + "optim.lr_scheduler_type", ov.get(A + "optim.warmup_style", "constant")))
    key = A + ("optim.lr_scheduler_type" if A + "optim.lr_scheduler_type" in ov else "optim.warmup_style")
    if style not in ("constant", "cosine"):
        raise ConfigError(f"{key}: {style!r} is not supported (we implement constant and cosine)")
    if key in ov:
        put("optim", "lr_schedule", style, key)
    epochs = max(num(A + "ppo_epochs", "integer", 1), 1)
    per_step = tbs // mini * epochs
    steps = num(A + "optim.lr_warmup_steps", "integer", -1)
    ratio = num(A + "optim.lr_warmup_steps_ratio", "number", 0.0)
    if steps > 0:
        put("optim", "warmup_steps", steps * per_step, A + "optim.lr_warmup_steps")
        derived.append(f"optim.warmup_steps: {steps * per_step} updates (lr_warmup_steps {steps} x {per_step} updates "
                       f"a step; verl holds the lr within a step, we move it every update)")
    elif ratio > 0:
        raise ConfigError(f"{A}optim.lr_warmup_steps_ratio: {ratio} needs the run's length in updates, which is "
                          f"known only once the data is read; give optim.lr_warmup_steps (in steps) instead")
    if A + "optim.min_lr_ratio" in ov and ov[A + "optim.min_lr_ratio"] is not None:
        put("optim", "min_lr", lr * num(A + "optim.min_lr_ratio", "number"), A + "optim.min_lr_ratio")


GROUPS = ("data", "actor_rollout_ref.model", "actor_rollout_ref.actor", "actor_rollout_ref.ref",
          "actor_rollout_ref.rollout", "actor_rollout_ref", "algorithm", "trainer", "critic", "reward_model",
          "custom_reward_function", "global_profiler", "ray_kwargs")


def group_of(key: str) -> str:
    return next(g for g in GROUPS if key == g or key.startswith(g + "."))


def startup_lines(tr: Translation) -> List[str]:
    """One line per key group: what its keys became here, and the inert ones with their reasons."""
    lines = []
    for group in GROUPS:
        done = [(k, what) for k, what in tr.mapped if group_of(k) == group]
        idle = [(k, why) for k, why in tr.ignored if group_of(k) == group]
        if not done and not idle:
            continue
        parts = []
        if done:
            parts.append("mapped " + ", ".join(f"{k[len(group) + 1:]} -> {what}" for k, what in done))
        if idle:
            by_reason: Dict[str, List[str]] = {}
            for k, why in idle:
                by_reason.setdefault(why, []).append(k[len(group) + 1:])
            parts.append("inert " + "; ".join(f"{', '.join(ks)} ({why})" for why, ks in by_reason.items()))
        lines.append(f"verl {group}: " + " | ".join(parts))
    return lines


def table_markdown() -> str:
    """docs/UPSTREAM.md's verl table (generated: scripts/gen_config_reference.py; tests/test_docs.py)."""
    n = counts()
    out = [f"{n[MAPPED]} mapped, {n[CHECKED]} checked, {n[INERT]} inert; any other key is an error naming it.", ""]
    for group in GROUPS:
        keys = [k for k in TABLE.values() if group_of(k.name.rstrip("*").rstrip(".")) == group]
        if not keys:
            continue
        out += [f"#### {group}", "", "| key | status | here |", "| --- | --- | --- |"]
        for k in sorted(keys, key=lambda k: ({MAPPED: 0, CHECKED: 1, INERT: 2}[k.status], k.name)):
            text = k.ours
            if k.name in CHECKS and CHECKS[k.name][2] not in (_ABSENT, None):
                text += f"; verl's default {CHECKS[k.name][2]!r} is checked when absent"
            out.append(f"| `{k.name[len(group) + 1:] or k.name}` | {k.status} | {text} |")
        out.append("")
    out += ["#### data_source (the verifier of a row)", "", "| data_source | here | verl | how ours differs |",
            "| --- | --- | --- | --- |"]
    out += [f"| `{s}` | {', '.join(v)} | {theirs} | {note} |" for s, (v, theirs, note) in DATA_SOURCES.items()]
    out += ["| any other | refused at start-up | its own function | give --verifier_function (and --reward_module) |"]
    return "\n".join(out)


def counts() -> Dict[str, int]:
    out = {MAPPED: 0, INERT: 0, CHECKED: 0}
    for k in TABLE.values():
        out[k.status] += 1
    return out
