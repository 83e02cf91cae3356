"""MindRLHF's GRPO names, in one table: every `grpo_config.yaml` field and `grpo_one_stage.py` / `main.py` flag
of MindRLHF's Qwen-GRPO tutorial (github.com/mindspore-ai/mindrlhf, Feb-May 2025), and what each does here
(mapped / inert / checked: compat/keys.py). The model YAML's MindFormers keys are compat/mindformers.py.

configs/grpo_load.py reads this module for the flat file and the flags; docs/UPSTREAM.md is generated from it
(scripts/gen_config_reference.py), so the documented table is the enforced one.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from mindrlhf.configs.compat.keys import CHECKED, INERT, MAPPED, Key, inert
from mindrlhf.configs.errors import ConfigError

# ---- grpo_config.yaml (flat; upstream's GRPOConfig dataclass in mindrlhf/configs/grpo_configs.py) ----------
# name -> (section, field) of ours, same meaning
GRPO_RENAMES: Dict[str, Tuple[str, str]] = {
    "beta": ("rl", "beta"), "num_generations": ("rl", "num_generations"),
    "num_iterations": ("rl", "num_iterations"), "epsilon_low": ("rl", "clip_low"),
    "epsilon_high": ("rl", "clip_high"), "batch_size": ("rl", "mini_batch_size"),
    "epochs": ("run", "epochs"), "start_lr": ("optim", "lr"), "end_lr": ("optim", "min_lr"),
    "warmup_step": ("optim", "warmup_steps"), "decay_steps": ("optim", "decay_steps"),
    "beta1": ("optim", "beta1"), "beta2": ("optim", "beta2"), "eps": ("optim", "eps"),
    "weight_decay": ("optim", "weight_decay"), "opt_offload": ("swap", "offload_train_optimizer"),
    "mind_dataset_dir": ("run", "mind_dataset_dir"), "save_ckpt_dir": ("run", "save_ckpt_dir"),
    "save_data_file": ("run", "save_data_file"), "save_strategy_dir": ("run", "save_strategy_dir"),
    "only_save_strategy": ("run", "only_save_strategy"), "use_parallel": ("run", "use_parallel"),
    "tensorboard_dir": ("run", "log_dir"), "max_num_seqs": ("run", "max_num_seqs"),
    "max_model_len": ("run", "max_model_len"),
}
# upstream's defaults for the keys that combine (used only when the file gives one part of a pair)
UPSTREAM_DEFAULTS = {"chunk_size": 1, "num_rollouts": 4, "sync_ref_model": False, "ref_model_sync_steps": 50,
                     "start_lr": 5e-7, "end_lr": 1e-10, "warmup_step": 10, "decay_steps": 200000}
_SCHEDULE_KEYS = ("start_lr", "end_lr", "warmup_step", "decay_steps")

GRPO_KEYS: List[Key] = (
    [Key(k, MAPPED, f"{s}.{f}") for k, (s, f) in GRPO_RENAMES.items()]
    + [Key("chunk_size", MAPPED, "rl.batch_size = chunk_size x num_rollouts (prompts per rollout replica per "
                                  "step; upstream generates them in num_rollouts rounds of chunk_size)"),
       Key("num_rollouts", MAPPED, "rl.batch_size = chunk_size x num_rollouts"),
       Key("sync_ref_model", MAPPED, "rl.ref_sync_steps = ref_model_sync_steps if sync_ref_model else 0"),
       Key("ref_model_sync_steps", MAPPED, "rl.ref_sync_steps (with sync_ref_model)"),
       Key("use_vllm", MAPPED, "run.rollout_backend: 0 -> mindspore; 1 (vLLM) and 2 (vLLM init, MindFormers "
                               "generate) -> vllm_mindspore, refused (not implemented)"),
       Key("save_prompt_completions_data", MAPPED, "true -> run.rollout_log_file = "
                                                   "<save_prompt_completions_dir>/prompt_completions.mindrecord"),
       Key("save_prompt_completions_dir", MAPPED, "directory of run.rollout_log_file (with "
                                                  "save_prompt_completions_data)"),
       Key("optimizer", CHECKED, "adamw only (upstream's other choice, lamb, is not implemented)")]
    + inert("grpo_epochs", "declared but never read by upstream's trainer; passes over a rollout are "
                            "num_iterations")
    + inert("lr", "never read by upstream's optimizer, whose schedule runs from start_lr to end_lr")
    + inert("total_steps", "never read upstream; the run length is epochs (or our --total_steps)")
    + inert("scheduler_name sceduler_name t_max eta_min", "never read upstream; the schedule is start_lr, "
                                                           "end_lr, warmup_step, decay_steps")
    + inert("model_name align_type checkpoint_interval eval_interval sft_model_path critic_model_path "
             "reward_model_path is_shared_backbone", "never read by upstream's GRPO trainer")
    + inert("ppo_epochs init_kl_coef kl_coef target horizon gamma lam cliprange cliprange_value vf_coef "
             "pretrain_coef scale_reward ref_mean ref_std gen_experience_kwargs", "PPO field; GRPO does not use it")
    + inert("sink_size device_target parallel_mode full_batch enable_alltoall micro_batch_interleaved "
             "inference_micro_size enable_reshard_optimizer reshard_mem_opt_level",
             "Ascend graph-execution / memory knob; results are the same without it")
    + inert("packing packing_sample_length pack_num", "upstream's Ascend packing layout, not read; the log-probs "
                                                       "and loss are the same padded (engine.sequence_packing packs "
                                                       "here)")
    + inert("ref_model_batch_size", "batching of the reference pass; the reference log-probs are the same "
                                     "(ours runs it per mini-batch)")
    + inert("performance_stats", "phase times are always logged (metrics.jsonl time_*)")
    + inert("tensorboard_queue_size save_prompt_completions_interval", "logging cadence; ours writes every step")
    + inert("hf_config_path max_num_batched_tokens num_scheduler_steps gpu_memory_utilization detokenize",
             "vLLM engine knob; the built-in engine has no equivalent (same samples)")
)
GRPO_TABLE: Dict[str, Key] = {k.name: k for k in GRPO_KEYS}


def flat_grpo_sections(raw: Dict[str, Any], where: str) -> Tuple[Dict[str, Dict[str, Any]], List[Tuple[str, str]]]:
    """Upstream's flat grpo_config.yaml -> ({section: {field: value}}, [(key, reason) ignored]).

    Only the keys the file gives are set (everything else keeps our defaults); a key that combines with
    another (chunk_size x num_rollouts, sync_ref_model + ref_model_sync_steps, the LR schedule's four) takes
    upstream's default for a missing partner, because that is what upstream would have run."""
    sections: Dict[str, Dict[str, Any]] = {}
    ignored: List[Tuple[str, str]] = []

    def put(sec: str, fld: str, value):
        sections.setdefault(sec, {})[fld] = value

    for key, value in raw.items():
        entry = GRPO_TABLE.get(key)
        if entry is None:
            raise ConfigError(f"{where}: {key}: unknown field (neither ours nor MindRLHF's; docs/UPSTREAM.md "
                              f"lists every accepted name)")
        if entry.status == INERT:
            ignored.append((key, entry.ours))
        elif key in GRPO_RENAMES:
            put(*GRPO_RENAMES[key], value)
    given = lambda k: raw.get(k, UPSTREAM_DEFAULTS.get(k))  # noqa: E731
    if "chunk_size" in raw or "num_rollouts" in raw:
        chunk, rounds = given("chunk_size"), given("num_rollouts")
        for name, v in (("chunk_size", chunk), ("num_rollouts", rounds)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"{where}: {name}: expected a positive integer, got {v!r}")
        put("rl", "batch_size", chunk * rounds)
    if "sync_ref_model" in raw or "ref_model_sync_steps" in raw:
        sync = given("sync_ref_model")
        if not isinstance(sync, bool):
            raise ConfigError(f"{where}: sync_ref_model: expected true/false, got {sync!r}")
        put("rl", "ref_sync_steps", given("ref_model_sync_steps") if sync else 0)
    if any(k in raw for k in _SCHEDULE_KEYS):
        put("optim", "lr_schedule", "mindrlhf_cosine")
        for k in _SCHEDULE_KEYS:
            put(*GRPO_RENAMES[k], given(k))
    if "use_vllm" in raw:
        mode = raw["use_vllm"]
        if mode not in (0, 1, 2) or isinstance(mode, bool):
            raise ConfigError(f"{where}: use_vllm: expected 0 (MindFormers), 1 (vLLM) or 2 (debug), got {mode!r}")
        put("run", "rollout_backend", "mindspore" if mode == 0 else "vllm_mindspore")
    if "optimizer" in raw and str(raw["optimizer"]).lower() != "adamw":
        raise ConfigError(f"{where}: optimizer: {raw['optimizer']!r} is not implemented (adamw is)")
    if raw.get("save_prompt_completions_data") is True:
        put("run", "rollout_log_file", f"{raw.get('save_prompt_completions_dir') or '.'}/prompt_completions.mindrecord")
    return sections, ignored


# ---- our defaults against what upstream's GRPOConfig runs ----------------------------------------------------
# "section.field" -> (the value upstream runs when the file and flags leave it out, why ours differs; "" = same).
# Upstream is MindRLHF's flat GRPOConfig (mindrlhf/configs/grpo_configs.py) with grpo_one_stage.py's rewards,
# Feb-May 2025; the values upstream's code hard-codes count, not the declared ones it never reads.
RUN_DEFAULTS: Dict[str, Tuple[Any, str]] = {
    "run.epochs": (10, ""),
    "rl.num_generations": (8, ""),
    "rl.batch_size": (4, ""),                 # chunk_size 1 x num_rollouts 4
    "rl.beta": (0.01, ""),
    "rl.kl_estimator": ("k3", ""),
    "rl.clip_low": (0.2, ""),
    "rl.clip_high": (0.2, ""),
    "rl.loss_agg": ("seq-mean-token-mean", ""),
    "rl.adv_norm_std": (True, ""),
    "rl.ref_sync_steps": (50, ""),            # sync_ref_model True, ref_model_sync_steps 50
    "optim.lr": (5e-7, ""),                   # start_lr
    "optim.min_lr": (1e-10, ""),              # end_lr
    "optim.warmup_steps": (10, ""),
    "optim.decay_steps": (200000, ""),
    "optim.lr_schedule": ("mindrlhf_cosine", ""),
    "optim.beta1": (0.9, ""),
    "optim.beta2": (0.95, ""),
    "optim.eps": (1e-8, ""),
    "reward.verifier_function": (["accuracy_reward", "format_reward"], ""),
    "reward.verifier_weight": ([1.0, 1.0], ""),
    "rl.mini_batch_size": (1, "upstream's batch_size 1 is one sequence per optimizer update per data-parallel "
                              "rank, sized for Ascend memory at 7B; ours (0) is one update over the step's "
                              "samples (on-policy, no old-policy pass), and engine.micro_batch_size bounds memory "
                              "without changing the update. Set mini_batch_size 1 (batch_size: 1) for upstream's"),
    "rl.num_iterations": (2, "one pass per rollout, as upstream before May 2025 (its second pass came with the "
                             "ratio clip): a second pass doubles the train phase"),
    "optim.weight_decay": (0.1, "upstream declares 0.01 but its optimizer hard-codes 0.1 (on every parameter but "
                                "layernorm and bias); ours applies the field's 0.01"),
    "optim.max_grad_norm": (10.0, "upstream clips the global norm at 10 without pipeline stages and at 1 with "
                                  "them; one value for every layout keeps the trajectory the same on any layout"),
    "run.seed": (None, "upstream leaves it unset (each run samples differently); ours repeats a run exactly"),
}


def upstream_default_note(key: str, value) -> str:
    """', MindRLHF runs X' when our default `value` of "section.field" is not what upstream runs."""
    entry = RUN_DEFAULTS.get(key)
    if entry is None or entry[0] == value:
        return ""
    return f"; MindRLHF runs {entry[0]!r} (docs/UPSTREAM.md, Defaults)"


def defaults_markdown(ours: Dict[str, Any]) -> str:
    """docs/UPSTREAM.md's defaults table; `ours`: "section.field" -> our default."""
    lines = ["| field | ours | MindRLHF | why they differ |", "| --- | --- | --- | --- |"]
    for key, (theirs, why) in RUN_DEFAULTS.items():
        lines.append(f"| `{key}` | `{ours[key]!r}` | `{theirs!r}` | {why or 'same'} |")
    return "\n".join(lines)


# ---- flags of grpo_one_stage.py / main.py that are not our field names --------------------------------------
# flag -> (our field or None, note); nargs lists for the two list flags
FLAG_ALIASES: Dict[str, Tuple[Optional[str], str]] = {
    "use_vllm": ("rollout_backend", "0 -> mindspore, 1/2 -> vllm_mindspore (refused: not implemented)"),
    "reward_funcs": ("verifier_function", "reward function names (space-separated)"),
    "reward_weights": ("verifier_weight", "one weight per reward function"),
    "tensorboard_dir": ("log_dir", "metrics JSONL and TensorBoard directory"),
    "load_ckpt_format": (None, "the format is detected from each checkpoint's files"),
    "pre_num_generations": (None, "upstream's compile warm-up size; nothing is pre-generated here"),
    "pre_store_data": (None, "upstream's compile warm-up size; nothing is pre-generated here"),
    "tensorboard_queue_size": (None, "logging cadence; ours writes every step"),
}
FLAG_NARGS = {"reward_funcs": "*", "reward_weights": "*"}
FLAG_CHECKS = {"custom_model_name": ("qwen", "the model family (Qwen2, Qwen2.5, Qwen3, Qwen3-MoE) is read from the "
                                             "model folder or YAML")}


def translate_flags(ns: Dict[str, Any]) -> Tuple[Dict[str, Any], List[Tuple[str, str]]]:
    """Upstream-only flags -> our field overrides and the (flag, reason) list of inert ones."""
    out, ignored = dict(ns), []
    for flag, (ours, note) in FLAG_ALIASES.items():
        if flag not in out:
            continue
        value = out.pop(flag)
        if ours is None:
            ignored.append((f"--{flag}", note))
        elif flag == "use_vllm":
            if str(value) not in ("0", "1", "2"):
                raise ConfigError(f"--use_vllm: expected 0, 1 or 2, got {value!r}")
            out[ours] = "mindspore" if str(value) == "0" else "vllm_mindspore"
        else:
            out[ours] = value
    for flag, (allowed, why) in FLAG_CHECKS.items():
        if flag in out:
            value = out.pop(flag)
            if str(value).lower() != allowed:
                raise ConfigError(f"--{flag}: {value!r} is not supported ({why}); expected {allowed!r}")
    return out, ignored


def table_markdown() -> str:
    """docs/UPSTREAM.md's tables."""
    out = ["### grpo_config.yaml (flat form)", "", "| key | status | here |", "| --- | --- | --- |"]
    out += [f"| `{k.name}` | {k.status} | {k.ours} |" for k in GRPO_KEYS]
    out += ["", "### grpo_one_stage.py / main.py flags that are not our field names", "",
            "| flag | status | here |", "| --- | --- | --- |"]
    for flag, (ours, note) in FLAG_ALIASES.items():
        out.append(f"| `--{flag}` | {'mapped' if ours else 'inert'} | {('`' + ours + '`: ') if ours else ''}{note} |")
    out += [f"| `--{f}` | checked | {allowed!r} only: {why} |" for f, (allowed, why) in FLAG_CHECKS.items()]
    return "\n".join(out)
