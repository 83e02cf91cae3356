"""GRPO run configuration: one dataclass per section, every field typed, defaulted and documented.

The CLI and docs/CONFIG.md's config reference are both generated from these dataclasses, so they cannot
drift; configs/grpo_load.py fills them from a file (ours or another tool's, through configs/compat/) and flags.
"""
from __future__ import annotations

import dataclasses
import math
import types
from dataclasses import dataclass, field
from typing import Any, Dict, List

from mindrlhf.configs import choices
from mindrlhf.configs.coerce import type_name
from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.fields import default_of, help_field as _f


class _Section:
    """A config section; after `GRPOConfig.freeze()` assigning a field raises (a resolved run's config
    does not change)."""
    _frozen = False

    def __setattr__(self, name, value):
        if self._frozen:
            raise dataclasses.FrozenInstanceError(f"{type(self).__name__}.{name}: the config is resolved "
                                                  f"(trainer/resolve.py) and frozen")
        object.__setattr__(self, name, value)


@dataclass
class RunConfig(_Section):
    """Files and run control (names as in MindRLHF's qwen_grpo_tutorial)."""
    sft_path_train: str = _f("", "model YAML of the policy (train layout), or a Hugging Face model folder "
                             "(config.json; every rank data-parallel; its weights and tokenizer are then the "
                             "defaults of load_sft_checkpoint_train and vocab_path)")
    sft_path_infer: str = _f("", "model YAML of the rollout model (infer layout); default: same as train. Its "
                             "generation fields (max_decode_length, top_k, top_p, temperature, ...) drive sampling "
                             "unless this config sets them")
    sft_path_ref: str = _f("", "model YAML of the reference model (MindRLHF's flag): must describe the policy's "
                           "model; the reference runs in the train layout")
    vocab_path: str = _f("", "tokenizer vocab.json, or a model folder holding tokenizer.json, vocab.json + "
                            "merges.txt or tokenizer.model")
    merges_file_path: str = _f("", "tokenizer merges.txt")
    mind_dataset_dir: str = _f("", "prompt MindRecord written by rlhf_data.py")
    eval_dataset: str = _f("", "held-out prompt MindRecord for the accuracy eval (optional)")
    save_ckpt_dir: str = _f("./ckpt", "where checkpoints, metrics and the exported policy go")
    save_data_file: str = _f("", "write each step's experience to this MindRecord in MindRLHF's schema "
                             "(prompt_completion_ids, prompts_mask, responses_mask, ref_per_token_logps, "
                             "advantages; one row per sample), replaced atomically every step by rank 0")
    rollout_log_file: str = _f("", "the readable rollout log: every sample (step, prompt, response, reward, "
                               "solution) as a MindRecord; each checkpoint appends the steps since the previous one "
                               "(before it is marked complete), so only those are held in memory; resume keeps the "
                               "rows of the steps it resumes from")
    load_sft_checkpoint_train: str = _f("", "policy weights: HF dir/safetensors or MindSpore .ckpt/.safetensors")
    load_sft_checkpoint_infer: str = _f("", "rollout weights (default: the policy's; they are synced each step)")
    load_ref_checkpoint: str = _f("", "reference weights (default: the initial policy's)")
    use_parallel: bool = _f(False, "run under msrun with the layouts of the model YAMLs")
    only_save_strategy: bool = _f(False, "write the train and infer strategy files, then exit")
    save_strategy_dir: str = _f("", "where strategy files go (default: save_ckpt_dir/strategy)")
    cpu_threads: int = _f(0, "CPU kernel threads per rank (MindSpore's op_tuning.threads_num, whose default is 25); 0: "
                             "the cores this process may use divided by the ranks on its node, at least 1 "
                             "(utils/cpu_threads.py says why). Ignored on Ascend")
    enable_compile_cache: bool = _f(False, "cache compiled graphs in save_ckpt_dir/compile_cache/<job key> "
                                     "(MindSpore enable_compile_cache) so the same job starts faster next time; "
                                     "another config, model, tokenizer, dataset or resume step gets its own key. "
                                     "Refused with pipeline stages (a re-run from the cache is tested for "
                                     "every other way of running the update). Off: MindSpore's cache is off too "
                                     "(MS_COMPILER_CACHE_ENABLE is ignored, with a note)")
    resume: bool = _f(False, "continue from the newest checkpoint complete on every node (agreed by all ranks)")
    watchdog_timeout: float = _f(1800.0, "under msrun: a rank that reaches no collective for this many seconds "
                                 "ends the job, naming its rank, node and phase (parallel/watchdog.py); set it "
                                 "above the longest phase (the first step compiles); 0: off")
    overwrite_ckpt_dir: bool = _f(False, "start afresh in a save_ckpt_dir that holds another run: its checkpoints, "
                                  "RUN, hf_policy, metrics, TensorBoard events and rollout log are deleted first "
                                  "(without it such a directory is refused unless resume)")
    checkpoint_storage: str = _f("shared", "shared: save_ckpt_dir is one filesystem seen by every node (rank 0 marks "
                                 "steps complete); node_local: each node's own disk, each node writes its ranks' "
                                 "shards and marks them, a step counts once every node has marked it",
                                 choices=choices.CHECKPOINT_STORAGE)
    seed: int = _f(1, "seed for sampling, data order and init")
    shuffle: bool = _f(True, "shuffle the prompts each epoch (a permutation keyed by seed and epoch); false: the "
                         "prompt file's own order every epoch (MindSpeed-RL's no_shuffle)")
    total_steps: int = _f(100, "GRPO steps (each: rollout, rewards, updates, weight sync); given, it wins over "
                          "epochs")
    epochs: int = _f(10, "passes over the prompt dataset (MindRLHF's epochs): > 0 sets the run to epochs x "
                      "(prompts // prompts per step) steps, unless total_steps is given explicitly; 0: total_steps")
    save_steps: int = _f(50, "save a checkpoint every N steps (and at the end); 0 = only at the end")
    keep_checkpoints: int = _f(2, "keep the last K complete checkpoints")
    eval_steps: int = _f(0, "accuracy eval on eval_dataset every N steps (and at start/end); 0 = off")
    eval_at_start: bool = _f(True, "with eval_steps > 0: also evaluate before the first step (verl's "
                             "val_before_train); false: the first eval comes after step eval_steps")
    eval_prompts: int = _f(64, "how many eval prompts (per run, split over DP)")
    eval_temperature: float = _f(0.0, "0: greedy eval (one answer per prompt); > 0: sampled (verl's val_kwargs "
                                 "do_sample), eval_n completions per prompt, eval_accuracy their mean score "
                                 "(verl's mean@n); the rest of sampling (max_tokens, min_p, repetition_penalty) is "
                                 "the rollout's")
    eval_top_p: float = _f(1.0, "nucleus sampling of a sampled eval")
    eval_top_k: int = _f(0, "top-k of a sampled eval (0 = off)")
    eval_n: int = _f(1, "completions per eval prompt (> 1 needs eval_temperature > 0); also reports eval_pass@n, the "
                        "share of prompts with a correct one")
    log_dir: str = _f("", "metrics JSONL / TensorBoard directory (default: save_ckpt_dir)")
    tensorboard: bool = _f(True, "also write TensorBoard events when a writer is installed (torch's, else "
                                 "tensorboardX); torch's costs ~200 MB of memory on rank 0 for the import alone")
    export_hf: bool = _f(True, "export the final policy as HF safetensors to save_ckpt_dir/hf_policy")
    progress: bool = _f(True, "show a progress bar over steps (rank 0)")
    rollout_backend: str = _f("mindspore", "rollout engine: mindspore (built in, any device); "
                              "vllm_mindspore is refused on every host (its adapter needs Ascend to be written)", choices=choices.ROLLOUT_BACKENDS)
    max_num_seqs: int = _f(0, "most sequences a rollout replica decodes at once (vLLM's max_num_seqs): its "
                           "prompts are generated in chunks of max_num_seqs // num_generations, with the same "
                           "samples as all at once; 0 = all at once")
    max_model_len: int = _f(0, "bound on prompt + response tokens (vLLM's max_model_len), checked at start-up; "
                            "0 = the model's seq_length")
    reshard_transport: str = _f("auto", "train->infer weight transport: shm (same host), collective, or auto",
                                choices=choices.RESHARD_TRANSPORTS)


@dataclass
class EngineConfig(_Section):
    """How the update and the log-prob passes run: each choice changes speed and memory, never the trajectory."""
    share_prompt: bool = _f(True, "log-prob and training forwards run each prompt once for its num_generations "
                            "responses (same values; layouts with pipeline stages or sequence parallelism, or "
                            "mini-/micro-batches that split a group, run every row whole, and say so)")
    layerwise_update: bool = _f(False, "compile the policy update as one graph per decoder layer, driven layer "
                                "by layer (trainer/update/layerwise.py): first-step compile time and update memory "
                                "stop growing with depth, and each layer's forward runs again in its backward "
                                "(docs/BENCHMARKS.md); whole model per rank: no pipeline stages or sequence "
                                "parallelism")
    micro_batch_size: int = _f(0, "sequences per forward/backward pass within an update on each train-DP rank "
                               "(verl's ppo_micro_batch_size_per_gpu; MindSpeed-RL's micro_batch_size): the "
                               "update's gradients are summed over its micro-batches, the same update with a smaller activation peak; 0 = the whole "
                               "mini-batch (or the model YAML's micro_batch_num x micro_batch_interleave_num)")
    sequence_packing: bool = _f(False, "the training, old and reference log-prob forwards run on rows packed with "
                                "several sequences (attention within each, positions restarting) instead of one "
                                "padded row per sequence: the same loss and gradients with the padding not computed "
                                "(NeMo-RL's sequence_packing, verl's use_dynamic_bsz, MindSpeed-RL's "
                                "use_remove_padding). Needs loss_agg token-mean and a token-level loss_mode")
    max_packing_token_size: int = _f(0, "sequence_packing: tokens per packed micro-batch on each train-DP rank "
                                     "(MindSpeed-RL's name; verl's ppo_max_token_len_per_gpu), in rows of the "
                                     "padded row's width (prompt + response - 1); 0 = one such row per "
                                     "micro-batch")


@dataclass
class RLConfig(_Section):
    """GRPO algorithm."""
    num_generations: int = _f(8, "G: completions per prompt (one group)")
    batch_size: int = _f(4, "prompts per rollout-DP rank per step")
    mini_batch_size: int = _f(0, "sequences per optimizer update on each train-DP rank (a global mini-batch is "
                              "this x train data_parallel); 0 = all at once")
    num_iterations: int = _f(1, "passes over each rollout; the ratio's denominator is always the log-probs of the "
                             "policy before the step's first update (PPO's old policy): with one update per "
                             "rollout (1 pass, one mini-batch) the train forward's own, detached, with no extra pass")
    beta: float = _f(0.01, "KL coefficient to the reference model; 0 disables the reference model entirely")
    kl_estimator: str = _f("k3", "k1, k2 or k3", choices=choices.KL_ESTIMATORS)
    clip_low: float = _f(0.2, "ratio clip below 1 - clip_low")
    clip_high: float = _f(0.2, "ratio clip above 1 + clip_high (clip-higher: > clip_low)")
    loss_agg: str = _f("seq-mean-token-mean", "token-mean (DAPO), seq-mean-token-mean (GRPO), "
                       "seq-mean-token-sum-norm (Dr.GRPO)", choices=choices.LOSS_AGGREGATIONS)
    adv_norm_std: bool = _f(True, "divide advantages by the group std (False: Dr.GRPO)")
    ref_sync_steps: int = _f(50, "copy the policy into the reference model every N steps (MindRLHF's "
                             "sync_ref_model + ref_model_sync_steps); 0 = never; under LoRA always 0")
    dynamic_sampling: bool = _f(False, "DAPO's dynamic sampling: drop prompt groups whose rewards are all equal "
                                "(no policy gradient) and sample more prompts until the step holds batch_size x "
                                "infer data_parallel informative groups (verl's filter_groups)")
    max_num_gen_batches: int = _f(4, "dynamic sampling: at most this many rollout rounds per step; if still short, "
                                  "the missing groups are filled with dropped ones whose loss is masked out "
                                  "(dynamic_sampling/masked_groups); a step with no informative group skips its "
                                  "update")
    overlong_buffer_len: int = _f(0, "DAPO's soft overlong punishment: a reward penalty rising linearly from 0 to "
                                  "overlong_penalty_factor over the last overlong_buffer_len tokens before "
                                  "max_tokens; 0 = off")
    overlong_penalty_factor: float = _f(1.0, "the overlong penalty at max_tokens")
    mask_truncated_completions: bool = _f(False, "completions cut at max_tokens (no EOS) contribute no loss (TRL's "
                                          "name); they still count in their group's advantages")
    tis: bool = _f(False, "truncated importance sampling against a rollout/train mismatch (slime --use-tis, "
                   "TRL vllm_importance_sampling_correction): weight each token's policy-gradient term by "
                   "min(exp(train old log-prob - rollout log-prob), tis_cap)")
    tis_cap: float = _f(2.0, "TIS truncation C (slime --tis-clip, TRL vllm_importance_sampling_cap)")
    adv_estimator: str = _f("grpo", "advantages from the rewards (verl's algorithm.adv_estimator): grpo (reward "
                            "minus group mean, over group std unless adv_norm_std is false: GRPO, Dr.GRPO); rloo "
                            "(minus the mean of the prompt's other samples: RLOO, Ahmadian et al. 2024); "
                            "reinforce_plus_plus (reward whitened over the step's batch, KL stays in the loss via "
                            "beta: REINFORCE++, Hu 2025); reinforce_plus_plus_baseline (minus group mean, then "
                            "whitened over the batch)", choices=choices.ADVANTAGE_ESTIMATORS)
    loss_mode: str = _f("vanilla", "policy-gradient term (verl's actor.policy_loss.loss_mode): vanilla (PPO clip per "
                        "token); gspo (one ratio per sequence, the geometric mean of its token ratios, clipped whole: "
                        "GSPO, Zheng et al. 2025, TRL importance_sampling_level=sequence; unless set, clip_low/"
                        "clip_high become the paper's 3e-4/4e-4 and loss_agg seq-mean-token-mean); cispo "
                        "(-sg(min(ratio, 1 + clip_high)) x A x log-prob on every token: CISPO, MiniMax-M1 2025, "
                        "TRL loss_type=cispo); kl_cov (no clip; a KL penalty on the kl_cov_ratio share of tokens of "
                        "highest covariance of log-prob and advantage) / clip_cov (PPO clip, and no gradient for a "
                        "random clip_cov_ratio share of tokens whose covariance is in (clip_cov_lb, clip_cov_ub)): Cui "
                        "et al. 2025, verl's names",
                        choices=choices.POLICY_LOSSES)
    top_entropy_quantile: float = _f(1.0, "keep the policy-gradient term only on the tokens whose entropy is in the "
                                     "top quantile of the micro-batch's (this rank's) tokens: 0.2 = the 80/20 rule "
                                     "(Wang et al. 2025, TRL's name); 1 = every token, 0 = the highest only. The KL "
                                     "term keeps every token")
    entropy_coeff: float = _f(0.0, "entropy bonus: the loss subtracts entropy_coeff x the token entropy of "
                              "softmax(logits / temperature), aggregated as loss_agg says (verl's and MindSpeed-RL's "
                              "entropy_coeff; its gradient flows through every logit); 0 = none")
    kl_cov_ratio: float = _f(2e-4, "loss_mode kl_cov: share of the micro-batch's tokens that get the KL penalty "
                             "(verl's policy_loss.kl_cov_ratio)")
    ppo_kl_coef: float = _f(1.0, "loss_mode kl_cov: coefficient of abs(log-prob - old log-prob) on those tokens "
                            "(verl's policy_loss.ppo_kl_coef)")
    clip_cov_ratio: float = _f(2e-4, "loss_mode clip_cov: share of the micro-batch's tokens whose gradient is cut "
                               "(verl's policy_loss.clip_cov_ratio)")
    clip_cov_lb: float = _f(1.0, "loss_mode clip_cov: only tokens whose covariance exceeds this are cut (verl's "
                            "policy_loss.clip_cov_lb)")
    clip_cov_ub: float = _f(5.0, "loss_mode clip_cov: only tokens whose covariance is below this are cut (verl's "
                            "policy_loss.clip_cov_ub)")
    router_replay: str = _f("none", "Qwen3-MoE: whose expert choices the policy's training passes replay instead "
                            "of their routers' top-k (verl's and slime's names): r3 the rollout's (recorded as it "
                            "samples), r2 the policy's own before the step's first update (a routing pass over the "
                            "samples); none: each pass routes itself. The routing weights still come from the "
                            "training router's probabilities, so it keeps learning. The reference model routes "
                            "itself", choices=choices.ROUTER_REPLAY)


@dataclass
class SamplingConfig(_Section):
    """Rollout sampling (the rollout's SamplingParams extends this: one definition, one validation)."""
    temperature: float = _f(1.0, "0 = greedy. Rollout, old, current and reference log-probs are all "
                            "log softmax(logits / temperature) (1 when greedy), before top-k/top-p/min-p")
    top_k: int = _f(0, "0 = off")
    top_p: float = _f(1.0, "nucleus sampling")
    min_p: float = _f(0.0, "drop tokens below min_p x the top probability")
    repetition_penalty: float = _f(1.0, "HF definition; 1 = off")
    max_tokens: int = _f(64, "max new tokens per completion")
    min_tokens: int = _f(0, "EOS suppressed before this many tokens")

    def validate(self, where: str = "sampling."):
        if self.max_tokens <= 0:
            raise ConfigError(f"{where}max_tokens: expected > 0, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ConfigError(f"{where}min_tokens: expected 0 <= min_tokens <= max_tokens={self.max_tokens}, "
                              f"got {self.min_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"{where}temperature: expected >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"{where}top_p: expected in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ConfigError(f"{where}min_p: expected in [0, 1), got {self.min_p}")
        if self.top_k < 0:
            raise ConfigError(f"{where}top_k: expected >= 0, got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise ConfigError(f"{where}repetition_penalty: expected > 0, got {self.repetition_penalty}")


@dataclass
class OptimConfig(_Section):
    """AdamW and its learning-rate schedule."""
    lr: float = _f(5e-7, "peak learning rate")
    min_lr: float = _f(1e-10, "learning rate at the end of the decay")
    warmup_steps: int = _f(10, "linear warmup, in optimizer updates")
    lr_schedule: str = _f("mindrlhf_cosine", "cosine: warmup, then cosine to min_lr at the run's last update; "
                          "constant: lr x t / warmup_steps while t < warmup_steps (update t from 0), then lr "
                          "(transformers' constant_with_warmup); "
                          "mindrlhf_cosine / mindrlhf_polynomial: MindRLHF's LearningRate (update t from 0: "
                          "lr x t / warmup_steps while t < warmup_steps, else min_lr + (lr - min_lr) x "
                          "decay(min(t, decay_steps) / decay_steps), decay = (1 + cos(pi x p)) / 2 or 1 - p); "
                          "megatron_constant / megatron_linear / megatron_cosine: Megatron's scheduler "
                          "(MindSpeed-RL's; lr x t / warmup_steps while t <= warmup_steps, then the decay from "
                          "the warmup's end to decay_steps, then min_lr)",
                          choices=choices.LR_SCHEDULES)
    decay_steps: int = _f(200000, "mindrlhf_* and megatron_* schedules: updates over which lr decays to min_lr; "
                          "0 = the run's updates")
    weight_decay: float = _f(0.01, "decoupled weight decay (not on norms/biases)")
    beta1: float = _f(0.9, "Adam beta1")
    beta2: float = _f(0.95, "Adam beta2")
    eps: float = _f(1e-8, "Adam epsilon")
    max_grad_norm: float = _f(1.0, "global gradient-norm clip; 0 = off")


@dataclass
class RewardConfig(_Section):
    """Rewards: rule verifiers and, optionally, a reward model, combined by weight."""
    verifier_function: List[str] = _f(["accuracy_reward", "format_reward"], "names from mindrlhf.reward.verifiers: "
                                      "accuracy_reward (answers judged as math-verify judges them), format_reward "
                                      "(R1 format), "
                                      "answer_format_reward; MindSpeed-RL's acc, format, step, strict_format, "
                                      "base_acc, math_17k_acc, acc_for_dapo, acc_for_ppo, math_verify_reward and "
                                      "MindRLHF's qwen_accuracy_reward (mindrlhf.reward.compat)")
    verifier_weight: List[float] = _f([1.0, 1.0], "one weight per verifier_function")
    reward_module: str = _f("", "your verifiers: a .py file or an importable module whose @register_verifier "
                            "functions (mindrlhf.reward.verifiers) become names for verifier_function")
    custom_reward_function: str = _f("", "a verl-style reward function, file.py or file.py:name (default name "
                                     "compute_score), called as verl calls it: (data_source, solution_str, "
                                     "ground_truth, extra_info, **custom_reward_kwargs) -> float, or a dict with "
                                     "'score'; registered as a verifier under its name, for verifier_function "
                                     "(verl's custom_reward_function; data_source and extra_info come from a file "
                                     "converted from verl's parquet)")
    custom_reward_kwargs: str = _f("", "custom_reward_function's keyword arguments, a JSON object (verl's "
                                   "custom_reward_function.reward_kwargs)")
    verifier_timeout: float = _f(5.0, "seconds one verifier may spend on one completion (timer signal, main "
                                 "thread); past it the completion scores 0 for that verifier, counted in "
                                 "reward/errors. Each completion is scored once, on one rank, and shared. 0: no "
                                 "limit")
    reward_model: str = _f("", "a Hugging Face sequence-classification folder (Qwen2/LlamaForSequenceClassification, "
                           "num_labels 1) scoring each sample's prompt + response tokens; frozen, in the train "
                           "layout or its own (reward_model_parallel); its tokenizer must equal the policy's. "
                           "Empty: no reward model")
    reward_model_parallel: int = _f(0, "the reward model's own layout: tensor-parallel ranks, the other ranks "
                                    "data-parallel (world / this replicas); 0: the train layout (its TP x DP)")
    reward_model_weight: float = _f(1.0, "the reward model's score enters the reward times this, added to the "
                                    "weighted verifiers")
    reward_model_batch_size: int = _f(0, "rows per reward-model forward on one train-DP replica; 0: the train "
                                      "mini-batch (rl.mini_batch_size)")


@dataclass
class SwapConfig(_Section):
    """Host-memory swap per phase. Ascend: MindSpore's parameter offload (unverified here). CPU: a host copy
    and the buffer's pages released to the OS, exact and without recompiling (see parallel/swap.py)."""
    offload_train_param: bool = _f(False, "policy weights to host during rollout (needs a separate rollout model)")
    offload_train_optimizer: bool = _f(False, "optimizer state to host outside the train phase")
    offload_infer_param: bool = _f(False, "free rollout weights during training (the sync rewrites them; no host copy)")
    offload_kv_cache: bool = _f(False, "free the KV cache between rollouts (no host copy: prefill rewrites it)")
    offload_ref_param: bool = _f(False, "reference weights to host outside their phase")
    offload_reward_model_param: bool = _f(False, "reward-model weights to host outside their phase")


@dataclass
class LoraConfig(_Section):
    """LoRA adapters on the policy (mindrlhf/models/lora.py): only they train, the base weights are frozen, the
    reference model is the policy with its adapters off, checkpoints hold the adapters and their optimizer
    state. Names as verl's and OpenRLHF's."""
    lora_rank: int = _f(0, "adapter rank r; 0 = full fine-tuning (no adapters)")
    lora_alpha: float = _f(16.0, "adapter scale alpha: the update is (alpha / r) B A, as PEFT's")
    lora_dropout: float = _f(0.0, "only 0: dropout on the adapter's input would make the train step's log-probs "
                             "differ from the rollout's for the same weights")
    target_modules: List[str] = _f(["all-linear"], "layers that get adapters: all-linear, or names from q_proj "
                                   "k_proj v_proj o_proj gate_proj up_proj down_proj (Hugging Face) or wq wk wv wo "
                                   "w1 w3 w2 (MindFormers)")
    lora_export: str = _f("both", "what run.export_hf writes under LoRA: merged (one Hugging Face folder with W + "
                          "scale B A), adapter (PEFT's adapter_config.json + adapter_model.safetensors, loaded "
                          "with peft.PeftModel.from_pretrained on the base) or both",
                          choices=("merged", "adapter", "both"))


@dataclass
class LayoutConfig(_Section):
    """The train and infer layouts' sizes, as flags or in the GRPO config; 0 keeps the model YAML's
    parallel_config (an HF folder's: every rank data-parallel). Given here they win over the YAML, said at
    start-up; data_parallel left at 0 becomes the ranks the other sizes leave (world / (tp x pp))."""
    train_data_parallel: int = _f(0, "train layout: data-parallel replicas (parallel_config.data_parallel of "
                                  "sft_path_train)")
    train_model_parallel: int = _f(0, "train layout: tensor-parallel ranks (parallel_config.model_parallel)")
    train_pipeline_stage: int = _f(0, "train layout: pipeline stages (parallel_config.pipeline_stage)")
    train_offset: List[int] = _f([], "train layout: decoder layers per pipeline stage beyond num_layers // "
                                 "pipeline_stage, one integer per stage (MindFormers' model_config.offset as a list; "
                                 "verl's Megatron account_for_embedding / loss_in_pipeline_split give it); empty: the "
                                 "model YAML's")
    train_micro_batch_num: int = _f(0, "train layout: pipeline micro-batches per mini-batch "
                                    "(parallel_config.micro_batch_num; with pipeline stages)")
    train_expert_parallel: int = _f(0, "train layout, MoE models: expert-parallel ranks (parallel_config."
                                    "expert_parallel; taken from data_parallel)")
    train_moe_token_dispatcher_type: str = _f("", "train layout, MoE models with expert parallelism: allgather (the "
                                              "EP ranks share their rows) or alltoall (each its own rows; parallel_"
                                              "config.moe_token_dispatcher_type); empty: the model YAML's",
                                              choices=("", "allgather", "alltoall"))
    train_use_seq_parallel: bool = _f(False, "train layout: Megatron sequence parallelism over the model_parallel "
                                      "ranks (parallel_config.use_seq_parallel; true turns it on)")
    train_moe_tp_extend_ep: bool = _f(False, "train layout, MoE models: the model_parallel ranks hold other whole "
                                      "experts, not a share of each one's width (parallel_config.moe_tp_extend_ep; "
                                      "true turns it on)")
    infer_data_parallel: int = _f(0, "infer (rollout) layout: data-parallel replicas (parallel_config."
                                  "data_parallel of sft_path_infer, or of sft_path_train when none)")
    infer_model_parallel: int = _f(0, "infer (rollout) layout: tensor-parallel ranks")
    infer_expert_parallel: int = _f(0, "infer (rollout) layout, MoE models: expert-parallel ranks")
    infer_moe_tp_extend_ep: bool = _f(False, "infer (rollout) layout, MoE models: the model_parallel ranks hold "
                                      "other whole experts (parallel_config.moe_tp_extend_ep)")

    def given(self, role: str) -> Dict[str, Any]:
        """The fields set for `role` (train or infer) by their MindFormers names: ParallelConfig's, and the
        model's pipeline `offset` (a list)."""
        prefix = role + "_"
        return {f.name[len(prefix):]: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name.startswith(prefix) and getattr(self, f.name)}


@dataclass
class ToolsConfig(_Section):
    """Multi-turn tool-use episodes (docs/TOOLS.md): the model calls tools between turns, the results are appended
    to its sequence (attended to, not trained) and decoding continues from the KV cache. max_tool_calls 0 = one
    turn per sample (no tools). Names as MindSpeed-RL's multi-turn keys."""
    tool_module: str = _f("", "your tools: a .py file or an importable module whose @register_tool functions, or "
                          "the functions in its TOOLS = [...] list, become tools (type hints and a docstring give "
                          "each its JSON schema; mindrlhf.tools.load_tool_module)")
    tool_config_path: str = _f("", "a MindSpeed-RL / verl tool config file (tools: - class_name / config / "
                               "tool_schema), e.g. the built-in code_interpreter")
    tool_parser_format: str = _f("hermes", "how tool calls are written in a turn: hermes (<tool_call>{json}"
                                 "</tool_call>, the Qwen2.5 / Qwen3 form)", choices=("hermes",))
    max_tool_calls: int = _f(0, "most tool calls per episode; 0 = single-turn (no tools). A turn's calls past the "
                             "limit are not run and the episode ends")
    max_parallel_calls: int = _f(4, "tool calls running at once (the worker pool), and most calls run from one turn")
    tool_timeout: float = _f(30.0, "seconds one tool call may take (a tool's own timeout wins); past it the model "
                             "reads an error")
    max_tool_response_length: int = _f(256, "a tool's response is cut to this many tokens (0: no limit)")
    tool_response_truncate_side: str = _f("middle", "the part of a cut response that is kept: left (start), middle "
                                          "(both ends) or right (end)", choices=("left", "middle", "right"))
    max_total_response_length: int = _f(0, "most tokens of a whole episode (the model's and the tools', template "
                                        "tokens included); 0: sampling.max_tokens, which is the response width; an "
                                        "episode that would pass it is cut and marked unfinished")

    @property
    def enabled(self) -> bool:
        return self.max_tool_calls > 0


@dataclass
class GRPOConfig(_Section):
    run: RunConfig = field(default_factory=RunConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    swap: SwapConfig = field(default_factory=SwapConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    parallel: LayoutConfig = field(default_factory=LayoutConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)

    def __post_init__(self):
        self.explicit = set()      # "section.field" set by the config file or a flag (the rest are defaults)
        self.origin = {}           # "section.field" -> where its value came from, for every field not a default
        self.ignored = []          # (source, key, reason): accepted MindRLHF keys that change nothing here
        self.derived = []          # "field: value (why)": defaults filled from other fields, said at start-up

    def set_from(self, key: str, value, origin: str, explicit: bool = False):
        """Set "section.field" and record where the value came from (a file, a flag, or what derived it)."""
        sec, name = key.split(".")
        setattr(getattr(self, sec), name, value)
        self.origin[key] = origin
        if explicit:
            self.explicit.add(key)

    def freeze(self) -> "GRPOConfig":
        """From here on every field assignment raises; `explicit`/`ignored`/`derived` become tuples."""
        for name in ("explicit", "ignored", "derived"):
            setattr(self, name, frozenset(self.explicit) if name == "explicit" else tuple(getattr(self, name)))
        self.origin = types.MappingProxyType(dict(self.origin))
        for sec in SECTIONS:
            object.__setattr__(getattr(self, sec), "_frozen", True)
        object.__setattr__(self, "_frozen", True)
        return self

    def validate(self):
        for sec, f in _section_fields():       # NaN passes every `< 0` check below
            value = getattr(getattr(self, sec), f.name)
            if type_name(f) == "float" and not math.isfinite(value):
                raise ConfigError(f"{sec}.{f.name}: expected a finite number, got {value}")
            if f.metadata.get("choices") and value not in f.metadata["choices"]:
                raise ConfigError(f"{sec}.{f.name}: expected one of {list(f.metadata['choices'])}, got {value!r}")
        if self.rl.num_generations < 2:
            raise ConfigError(f"rl.num_generations: {self.rl.num_generations} sample(s) per prompt; GRPO compares "
                              f"the samples of a prompt with each other, so a group needs at least 2 (with 1 every "
                              f"advantage is 0 and nothing trains)")
        positive = [("rl.num_generations", self.rl.num_generations), ("rl.batch_size", self.rl.batch_size),
                    ("rl.num_iterations", self.rl.num_iterations), ("run.total_steps", self.run.total_steps),
                    ("run.keep_checkpoints", self.run.keep_checkpoints)]
        for name, value in positive:
            if value <= 0:
                raise ConfigError(f"{name}: expected > 0, got {value}")
        if self.rl.beta < 0:
            raise ConfigError(f"rl.beta: expected >= 0, got {self.rl.beta}")
        for f in dataclasses.fields(self.parallel):
            value = getattr(self.parallel, f.name)      # offsets may be negative; the dispatcher is a name
            if f.name != "train_offset" and isinstance(value, (int, float)) and value < 0:
                raise ConfigError(f"parallel.{f.name}: expected >= 0 (0: the model YAML's), got {value}")
        if not 0 <= self.rl.clip_low < 1 or self.rl.clip_high < 0:
            raise ConfigError(f"rl.clip_low/clip_high: expected 0 <= clip_low < 1 and clip_high >= 0, got "
                              f"{self.rl.clip_low}/{self.rl.clip_high}")
        if self.optim.lr <= 0:
            raise ConfigError(f"optim.lr: expected > 0, got {self.optim.lr}")
        nonneg = [("optim.warmup_steps", self.optim.warmup_steps), ("optim.decay_steps", self.optim.decay_steps),
                  ("run.epochs", self.run.epochs), ("run.max_num_seqs", self.run.max_num_seqs),
                  ("run.max_model_len", self.run.max_model_len), ("rl.mini_batch_size", self.rl.mini_batch_size),
                  ("engine.micro_batch_size", self.engine.micro_batch_size),
                  ("engine.max_packing_token_size", self.engine.max_packing_token_size),
                  ("rl.ref_sync_steps", self.rl.ref_sync_steps), ("run.cpu_threads", self.run.cpu_threads),
                  ("reward.verifier_timeout", self.reward.verifier_timeout),
                  ("run.watchdog_timeout", self.run.watchdog_timeout)]
        for name, value in nonneg:
            if value < 0:
                raise ConfigError(f"{name}: expected >= 0, got {value}")
        if self.optim.lr_schedule.startswith("mindrlhf") and self.optim.min_lr >= self.optim.lr:
            raise ConfigError(f"optim.min_lr (end_lr): expected < lr (start_lr) as MindRLHF requires, got "
                              f"{self.optim.min_lr} >= {self.optim.lr}")
        if self.rl.max_num_gen_batches < 1:
            raise ConfigError(f"rl.max_num_gen_batches: expected >= 1, got {self.rl.max_num_gen_batches}")
        if not 0 <= self.rl.overlong_buffer_len < self.sampling.max_tokens:
            raise ConfigError(f"rl.overlong_buffer_len: expected 0 <= overlong_buffer_len < sampling.max_tokens="
                              f"{self.sampling.max_tokens}, got {self.rl.overlong_buffer_len}")
        if self.rl.overlong_penalty_factor < 0:
            raise ConfigError(f"rl.overlong_penalty_factor: expected >= 0, got {self.rl.overlong_penalty_factor}")
        if self.rl.tis_cap < 1:
            raise ConfigError(f"rl.tis_cap: expected >= 1 (a cap below 1 shrinks every on-policy token), got "
                              f"{self.rl.tis_cap}")
        if not 0 <= self.rl.top_entropy_quantile <= 1:
            raise ConfigError(f"rl.top_entropy_quantile: expected in [0, 1] (1 = every token), got "
                              f"{self.rl.top_entropy_quantile}")
        for name in ("kl_cov_ratio", "clip_cov_ratio"):
            if not 0 < getattr(self.rl, name) <= 1:
                raise ConfigError(f"rl.{name}: expected a share of tokens in (0, 1], got {getattr(self.rl, name)}")
        if self.rl.ppo_kl_coef < 0:
            raise ConfigError(f"rl.ppo_kl_coef: expected >= 0, got {self.rl.ppo_kl_coef}")
        if self.rl.clip_cov_lb >= self.rl.clip_cov_ub:
            raise ConfigError(f"rl.clip_cov_lb/clip_cov_ub: expected lb < ub, got {self.rl.clip_cov_lb}/"
                              f"{self.rl.clip_cov_ub}")
        self._validate_lora()
        self._validate_tools()
        if self.run.max_num_seqs and self.run.max_num_seqs < self.rl.num_generations:
            raise ConfigError(f"run.max_num_seqs: {self.run.max_num_seqs} cannot hold one prompt's "
                              f"num_generations={self.rl.num_generations} samples")
        self.sampling.validate()
        self._validate_eval()
        if len(self.reward.verifier_function) != len(self.reward.verifier_weight):
            raise ConfigError(f"reward.verifier_weight: {len(self.reward.verifier_weight)} weights for "
                              f"{len(self.reward.verifier_function)} verifier_function entries")
        if not self.reward.verifier_function and not self.reward.reward_model:
            raise ConfigError("reward.verifier_function: empty and no reward.reward_model: nothing would score "
                              "the samples")
        if self.reward.reward_model_parallel < 0:
            raise ConfigError(f"reward.reward_model_parallel: expected >= 0 (0 = the train layout), got "
                              f"{self.reward.reward_model_parallel}")
        if self.reward.reward_model_batch_size < 0:
            raise ConfigError(f"reward.reward_model_batch_size: expected >= 0, got "
                              f"{self.reward.reward_model_batch_size}")
        return self

    def _validate_eval(self):
        run = self.run
        dataclasses.replace(self.sampling, temperature=run.eval_temperature, top_p=run.eval_top_p,
                            top_k=run.eval_top_k).validate("run.eval_")
        if run.eval_n < 1:
            raise ConfigError(f"run.eval_n: expected >= 1, got {run.eval_n}")
        if run.eval_n > 1 and run.eval_temperature == 0:
            raise ConfigError(f"run.eval_n: {run.eval_n} completions per prompt with a greedy eval "
                              f"(run.eval_temperature 0) would all be equal; give eval_temperature > 0 to sample")

    def _validate_tools(self):
        t = self.tools
        for name in ("max_tool_calls", "max_tool_response_length", "max_total_response_length"):
            if getattr(t, name) < 0:
                raise ConfigError(f"tools.{name}: expected >= 0, got {getattr(t, name)}")
        if t.max_parallel_calls < 1:
            raise ConfigError(f"tools.max_parallel_calls: expected >= 1, got {t.max_parallel_calls}")
        if t.tool_timeout <= 0:
            raise ConfigError(f"tools.tool_timeout: expected > 0 seconds, got {t.tool_timeout}")
        if t.max_total_response_length > self.sampling.max_tokens:
            raise ConfigError(f"tools.max_total_response_length: {t.max_total_response_length} exceeds "
                              f"sampling.max_tokens={self.sampling.max_tokens}, the response width every episode "
                              f"is laid out in; raise sampling.max_tokens or lower max_total_response_length")
        if not t.enabled and (t.tool_module or t.tool_config_path):
            raise ConfigError(f"tools.max_tool_calls: 0 (single-turn) but tools are given "
                              f"(tool_module {t.tool_module!r}, tool_config_path {t.tool_config_path!r}); set "
                              f"max_tool_calls > 0 to let the model call them")
        if t.enabled and not (t.tool_module or t.tool_config_path):
            raise ConfigError(f"tools.max_tool_calls: {t.max_tool_calls} but no tools: give tools.tool_module "
                              f"and/or tools.tool_config_path")

    def _validate_lora(self):
        from mindrlhf.configs.lora import parse_targets, require_no_dropout
        lora = self.lora
        if lora.lora_rank < 0:
            raise ConfigError(f"lora.lora_rank: expected >= 0 (0 = no adapters), got {lora.lora_rank}")
        if not lora.lora_rank:
            return
        if lora.lora_alpha <= 0:
            raise ConfigError(f"lora.lora_alpha: expected > 0, got {lora.lora_alpha}")
        require_no_dropout(lora.lora_dropout)
        parse_targets(lora.target_modules)
        if self.rl.ref_sync_steps:
            raise ConfigError(f"rl.ref_sync_steps: {self.rl.ref_sync_steps} with lora.lora_rank "
                              f"{lora.lora_rank}; under LoRA the reference model is the frozen base (the policy "
                              f"with its adapters off), so there is nothing to sync: set ref_sync_steps 0")


SECTIONS = [f.name for f in dataclasses.fields(GRPOConfig)]
# fields that changed section: the earlier "section.field" -> today's; a file's earlier spelling still loads,
# with a one-line note (configs/grpo_load.py); flags are field names and never changed
MOVED_FIELDS = {"run.layerwise_update": "engine.layerwise_update", "run.share_prompt": "engine.share_prompt",
                "rl.micro_batch_size": "engine.micro_batch_size", "rl.sequence_packing": "engine.sequence_packing",
                "rl.max_packing_token_size": "engine.max_packing_token_size"}


def _section_fields():
    for sec in dataclasses.fields(GRPOConfig):
        for f in dataclasses.fields(sec.default_factory()):
            yield sec.name, f


def _field_of(section: str, name: str) -> dataclasses.Field:
    return next(f for sec, f in _section_fields() if sec == section and f.name == name)


def config_reference_markdown() -> str:
    """docs/CONFIG.md's config reference table, generated from the dataclasses."""
    lines = ["| section | field | default | meaning |", "| --- | --- | --- | --- |"]
    for sec, f in _section_fields():
        default = default_of(f)
        lines.append(f"| {sec} | `{f.name}` | `{default!r}` | {f.metadata['help']} |")
    return "\n".join(lines)


def field_defaults() -> Dict[str, Any]:
    """"section.field" -> its dataclass default."""
    return {f"{sec}.{f.name}": default_of(f) for sec, f in _section_fields()}
