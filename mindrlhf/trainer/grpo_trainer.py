"""The GRPO loop. One process group; every rank holds the policy (train layout), the rollout model (infer
layout; the policy object itself when the layouts match) and, when beta > 0, a frozen reference model.

One step: rollout -> gather samples -> rewards -> group advantages -> old/ref logprobs -> updates ->
weight sync -> metrics / checkpoint / eval. Each phase is one method below. Set-up is elsewhere: the process
(startup), the config resolved against its files (resolve), the models and compiled steps (build); the math
lives in grpo_math, every exchange between ranks in exchange, the swap policy in swap_schedule.

Layout invariance: a step's prompts are the dataset's global batch, sample j of prompt i draws from a
random stream keyed by (seed, step, i, j), every rank holds the whole batch's scores, the train-DP ranks split each
global mini-batch (not the step) and losses are normalised over the global mini-batch. So a seed gives the
same trajectory on any train/infer layout, up to float reassociation in TP reductions.
"""
from __future__ import annotations

import os
import time
from typing import Dict, List

import numpy as np
import mindspore as ms

from mindrlhf.checkpoint.hf_interop import export_hf, export_peft_adapter
from mindrlhf.configs.grpo_config import GRPOConfig
from mindrlhf.models.lora import adapter_weights, merged_weights
from mindrlhf.parallel import watchdog
from mindrlhf.reward.custom_function import references
from mindrlhf.trainer import checkpointing, evaluation, exchange, run_dir, startup
from mindrlhf.trainer.build import build_models, build_training, compile_train_step
from mindrlhf.trainer.experience_file import write_step_experience
from mindrlhf.trainer.grpo_math import compute_advantages, informative_groups, overlong_penalty
from mindrlhf.trainer.metrics import MetricsLogger, PhaseClocks, logprob_gap_sum_count, sample_metrics, update_metrics
from mindrlhf.trainer.optim import scheduled_lr
from mindrlhf.trainer.resolve import resolve
from mindrlhf.trainer.rollout_log import RolloutLog
from mindrlhf.trainer.router_replay import StepRouting
from mindrlhf.trainer.samples import SampleBatch, ScoredBatch
from mindrlhf.trainer.update.loss import UPDATE_STATS, reduce_updates
from mindrlhf.trainer.update.loss_inputs import LossInputs
from mindrlhf.utils.params import copy_params


class TrainingError(RuntimeError):
    """The run cannot continue (e.g. the loss became NaN); raised on every rank together."""


class GRPOTrainer:
    def __init__(self, cfg: GRPOConfig, log=print):
        proc = startup.start(cfg, log)
        self.rank, self.world, self.nodes, self.log, self.run_id = proc.rank, proc.world, proc.nodes, proc.log, \
            proc.run_id
        self.marks_checkpoints = proc.marks_checkpoints
        ms.set_seed(cfg.run.seed)
        self.run = run = resolve(cfg, self.rank, self.world, self.log)   # every check; cheap, the same on every rank
        startup.set_compile_cache(run, self.log)
        run_dir.write_resolved_config(run.cfg, self.rank)
        self.cfg, self.dataset, self.eval_dataset, self.geometry = run.cfg, run.dataset, run.eval_dataset, run.geometry
        self.train_mesh, self.infer_mesh = run.train_mesh, run.infer_mesh
        models = build_models(run, self.log)      # only now the expensive part: build and load weights, first sync
        self.policy, self.rollout_model, self.ref_model = models.policy, models.rollout_model, models.ref_model
        self.weight_sync = models.weight_sync
        training = build_training(run, models, self.log)
        self.engine, self.optimizer, self.train_step = training.engine, training.optimizer, training.train_step
        self.policy_logprob, self.ref_logprob, self.swap = training.policy_logprob, training.ref_logprob, training.swap
        # padded or packed rows (samples.PaddedRows, packing.PackedRowLayout), the reward-model scorer and the
        # policy's own routing pass (router replay), each None when unused
        self.rows, self.reward_model, self.policy_routing = training.rows, training.reward_model, training.policy_routing
        self.step, self.phase_clocks = 0, PhaseClocks(self.log)
        log_dir = self.cfg.run.log_dir or self.cfg.run.save_ckpt_dir
        self.metrics = MetricsLogger(log_dir, enabled=self.rank == 0, tensorboard=self.cfg.run.tensorboard)
        self.rollout_log = RolloutLog(self.cfg.run.rollout_log_file if self.rank == 0 else "")
        if self.cfg.run.resume:
            self._resume()
        compile_train_step(run, training, self.log)

    # ---- phases ---------------------------------------------------------------------------------------
    def rollout(self, batch, round_index: int = 0) -> SampleBatch:
        """This infer-DP replica's prompts; prompt i of the step's global batch is sampled with key (step, i),
        and of a dynamic-sampling round r > 0 with key (step, r x prompts per round + i)."""
        prompts = [row[:n].tolist() for row, n in zip(batch["prompt_ids"], batch["prompt_length"])]
        offset = self.infer_mesh.dp_index * len(prompts)
        first = round_index * len(prompts) * self.infer_mesh.dp
        keys = [(self.step, first + offset + i) for i in range(len(prompts))]
        with self.swap.generating(self.engine):
            out = self.engine.generate(prompts, self.run.sampling(), keys)
        return SampleBatch.of_rollout(out, self.run.prompt_width, self.run.pad_id, offset)

    def score(self, samples: SampleBatch, solutions: List[str]):
        texts = self.run.tokenizer.decode_batch([r[m == 1].tolist() for r, m in zip(samples.response_ids,
                                                                                   samples.response_mask)])
        sols = [solutions[i] for i in samples.solution_index]
        # each sample is scored once, by one rank, and every rank uses those numbers: a verifier near its
        # time limit, or one that differs by host, cannot give TP peers different rewards
        mine, reward_fn = range(self.rank, len(texts), self.world), self.run.reward_fn
        table = np.zeros((len(texts), reward_fn.columns), np.float32)
        table[mine] = reward_fn.score_rows(*([x[i] for i in mine] for x in (texts, sols, samples.tool_calls)))
        result = reward_fn.scores_of(exchange.rows_of_all_ranks(table))
        result = self.reward_model.join(samples, result) if self.reward_model else result
        return np.array(result.total, np.float32), result, texts

    def logprobs(self, cell, samples: SampleBatch, routing=None) -> np.ndarray:
        return self.rows.logprobs(cell, samples, routing)

    def update(self, samples: SampleBatch, train_mask, old_logp, ref_logp, advantages, token_norms,
               routing: StepRouting) -> np.ndarray:
        """num_iterations passes over this rank's mini-batches; returns UPDATE_STATS over the updates (MAX_STATS
        by max, the rest by mean). `train_mask` is the response mask the loss sees (masked groups and, with
        mask_truncated_completions, truncated rows zeroed); `routing`: the update's routing inputs."""
        stats, mb = [], self.geometry.mini_batch
        for _ in range(self.cfg.rl.num_iterations):
            for k in range(self.geometry.minibatches):
                sl = slice(k * mb, (k + 1) * mb)
                update_index = int(self.optimizer.step.asnumpy()[0])
                lr = scheduled_lr(update_index, self.cfg.optim, self.run.total_updates)
                rows = samples.rows(sl.start, sl.stop)
                loss_inputs = LossInputs(train_mask[sl], old_logp[sl], rows.rollout_logp, ref_logp[sl],
                                         advantages[sl], token_norms[k], *routing.rows(sl))
                out = self.train_step(*self.rows.step_inputs(rows, loss_inputs, lr))
                stats.append([float(x.asnumpy()) for x in out] + [lr])
        return reduce_updates(stats)

    def _generate_round(self, phase, round_index: int) -> ScoredBatch:
        """One global batch of prompts: rollout on each infer replica, gathered, scored (overlong penalty
        included)."""
        global_batch = self.dataset.next_global_batch()
        local = phase("rollout", self.rollout, self.dataset.local_part(global_batch), round_index)
        samples = phase("gather", exchange.gather_samples, local, self.infer_mesh)
        solutions = references(global_batch)         # each row's answer with verl's data_source / extra_info
        rewards, scores, texts = phase("reward", self.score, samples, solutions)
        rl = self.cfg.rl
        if rl.overlong_buffer_len:
            penalty = overlong_penalty(samples.response_mask.sum(1), self.cfg.sampling.max_tokens,
                                       rl.overlong_buffer_len, rl.overlong_penalty_factor)
            rewards = rewards + penalty
            scores.parts["overlong_penalty"] = penalty.tolist()
        return ScoredBatch(samples, rewards, scores, texts, solutions)

    def collect(self, phase):
        """The step's training batch and its statistics. Without dynamic sampling: one round. With it
        (DAPO): rounds until batch_size x infer dp informative groups (rewards not all equal) are held or
        max_num_gen_batches rounds ran; the batch is the first informative groups in round order, topped
        up, when short, by dropped groups whose loss is masked out (group_mask). Every rank holds every
        sample's score (each scored once, shared), so every rank makes the same choice."""
        rl, g = self.cfg.rl, self.cfg.rl.num_generations
        target = self.geometry.sequences // g
        rounds = [self._generate_round(phase, 0)]
        informative = [informative_groups(rounds[0].rewards, g)]
        while rl.dynamic_sampling and sum(m.sum() for m in informative) < target and \
                len(rounds) < rl.max_num_gen_batches:
            rounds.append(self._generate_round(phase, len(rounds)))
            informative.append(informative_groups(rounds[-1].rewards, g))
        generated = np.concatenate(informative)
        stats = {"zero_std_groups_frac": float(1.0 - generated.mean())}
        if not rl.dynamic_sampling:
            rounds[0].group_mask = np.ones(target, bool)
            return rounds[0], stats
        chosen = np.sort(np.argsort(~generated, kind="stable")[:target])   # informative first, in round order
        every = ScoredBatch.concat(rounds)
        batch = every.take_groups(chosen, g)
        batch.group_mask = generated[chosen]
        stats.update({"tokens_generated": float(every.samples.loss_mask.sum()),
                      "dynamic_sampling/rounds": float(len(rounds)),
                      "dynamic_sampling/kept_groups": float(batch.group_mask.sum()),
                      "dynamic_sampling/masked_groups": float((~batch.group_mask).sum()),
                      "reward_mean_generated": float(every.rewards.mean())})
        return batch, stats

    def train_one_step(self) -> Dict[str, float]:
        rl, phase, swap_before = self.cfg.rl, self.phase_clocks.new(self.step + 1), self.swap.seconds
        self.swap.enter("rollout")
        batch, collect_stats = self.collect(phase)
        samples, rewards, group_mask = batch.samples, batch.rewards, batch.group_mask
        self.rollout_log.add(self.step + 1, samples, batch.texts, rewards, batch.solutions, self.run.tokenizer)
        train_mask = samples.loss_mask * samples.response_mask * np.repeat(group_mask, rl.num_generations)[:, None]
        if rl.mask_truncated_completions:
            train_mask = train_mask * samples.finished[:, None]
        advantages = compute_advantages(rl.adv_estimator, rewards, rl.num_generations, rl.adv_norm_std, train_mask)
        mine = self.geometry.rows_of(self.train_mesh.row_index)
        my_samples = samples.take(mine)
        if self.run.shared_prompt[0]:
            my_samples.check_groups(self.run.shared_prompt[0])
        skip = rl.dynamic_sampling and not group_mask.any()      # nothing informative: no update at all
        policy_routing = None               # the policy's own routing pass (router_replay.py, aux_loss.py)
        if self.policy_routing is not None and not skip:
            self.swap.enter("logprob")
            policy_routing = phase("routing", self.logprobs, self.policy_routing, my_samples)
        routing = StepRouting.of(self.run, samples, my_samples, policy_routing, self.geometry.mini_batch,
                                 self.train_mesh)
        if self.run.on_policy or skip:
            old_logp = my_samples.rollout_logp          # the loss cell uses its own detached log-probs
        else:
            self.swap.enter("logprob")
            old_logp = phase("old_logprob", self.logprobs, self.policy_logprob, my_samples, routing.replayed)
        ref_logp = np.zeros_like(old_logp)
        if self.ref_logprob and not skip:
            self.swap.enter("ref_logprob")
            ref_logp = phase("ref_logprob", self.logprobs, self.ref_logprob, my_samples)
        if self.cfg.run.save_data_file:
            phase("save_data_file", write_step_experience, self.cfg.run.save_data_file, self.rank == 0,
                  self.train_mesh, samples, train_mask, mine, ref_logp, advantages)
        self.swap.enter("train")
        local_stats = np.zeros(len(UPDATE_STATS)) if skip else phase(
            "train", self.update, my_samples, train_mask[mine], old_logp, ref_logp, advantages[mine],
            self.geometry.token_norms(train_mask), routing)
        # on-policy (or no update): the train step's own gap, or none
        gap = [0.0, 0.0] if self.run.on_policy or skip else logprob_gap_sum_count(my_samples, old_logp)
        metrics = update_metrics(local_stats, gap, self.run.on_policy, rl.tis)
        if not (np.isfinite(metrics["loss"]) and np.isfinite(metrics["grad_norm"])):
            raise TrainingError(f"step {self.step + 1}: the loss or gradient norm is not finite (NaN/inf) on at least "
                                f"one rank (loss={metrics['loss']}, grad_norm={metrics['grad_norm']}); the last "
                                f"checkpoint is untouched. Lower optim.lr or check the data and weights")
        self.swap.enter("sync")
        phase("weight_sync", self.weight_sync.sync)
        self.step += 1
        if self._reference_moves() and self.step % rl.ref_sync_steps == 0:
            self.swap.groups["ref"].reload()
            copy_params(self.policy.get_parameters(), self.ref_model.get_parameters())   # same layout: local
        metrics.update(sample_metrics(samples, rewards, batch.scores, self.run.episodes, self.infer_mesh), **collect_stats)
        metrics.update(routing.metrics)
        if skip:
            metrics["dynamic_sampling/skipped_update"] = 1.0
        metrics.update(phase.metrics(), time_swap=self.swap.seconds - swap_before,
                       swap_host_mb=self.swap.host_bytes / 2**20, time_step=time.time() - phase.started)
        metrics["rollout_tokens_per_s"] = metrics["tokens_generated"] / max(phase.times["rollout"], 1e-9)
        return metrics

    def _reference_moves(self) -> bool:
        """True when the reference model is re-synced from the policy, so checkpoints must hold it."""
        return self.run.reference == "model" and self.cfg.rl.ref_sync_steps > 0

    # ---- evaluation, checkpoints, the loop ----------------------------------------------------------
    def evaluate(self) -> Dict[str, float]:
        """eval_accuracy (and eval_pass@n when sampling n > 1) on up to eval_prompts held-out prompts, greedy
        unless run.eval_temperature > 0, split over infer-DP replicas, in chunks of the rollout's rows per replica:
        the decode graphs the rollout compiled serve here too (a deep model's decode graph costs seconds to
        compile and memory to keep). The eval command runs the same code (trainer/evaluation.py)."""
        watchdog.enter("eval")
        table, mesh, params = self.eval_dataset.table, self.infer_mesh, self.run.eval_sampling()
        idx = evaluation.replica_prompts(min(self.cfg.run.eval_prompts, len(table["prompt_ids"])), mesh.dp,
                                         mesh.dp_index)
        done = evaluation.complete(self.engine, self.run.tokenizer, table, idx, params,
                                   self.cfg.rl.batch_size * self.cfg.rl.num_generations,
                                   evaluation.accuracy_scores(self.cfg.reward.verifier_timeout),
                                   generating=lambda: self.swap.generating(self.engine))
        totals = exchange.sum_over_replicas(evaluation.tallies(done.scores, params.n), mesh)
        return evaluation.eval_metrics(totals, params.n)

    def save(self):
        watchdog.enter("save")
        run = self.cfg.run
        self.rollout_log.flush()             # before COMPLETE: a complete step always has its rollout rows
        extra = {"ref": self.ref_model} if self._reference_moves() else {}
        with self.swap.resident("optimizer", *(["ref"] if extra else [])):
            checkpointing.save_training_checkpoint(
                run.save_ckpt_dir, self.step, self.rank, self.policy, self.optimizer,
                rank_state={"data": self.dataset.state_dict()},
                trainer_state={"step": self.step, "layout": self.run.layout_state(), "run_id": self.run_id},
                keep=run.keep_checkpoints, extra_models=extra, marks=self.marks_checkpoints)

    def _resume(self):
        watchdog.enter("resume")
        extra = {"ref": self.ref_model} if self._reference_moves() else {}
        root = self.cfg.run.save_ckpt_dir
        step = checkpointing.agreed_resume_step(root, self.cfg.run.checkpoint_storage == "shared", self.nodes)
        recorded = self.run_id = run_dir.run_id_of(root)
        if self.marks_checkpoints:
            checkpointing.drop_steps_after(root, step or 0)      # never written into again
            self.run_id = recorded or run_dir.new_run(root)
        state = None if step is None else checkpointing.load_training_checkpoint(
            root, self.rank, self.policy, self.optimizer, extra_models=extra, expect_layout=self.run.layout_state(),
            step=step)
        if state is None:
            self.log(f"resume: no complete checkpoint in {self.cfg.run.save_ckpt_dir}; starting fresh")
            self.metrics.truncate_after(0)
            self.rollout_log.restore(0)
            return
        run_dir.check_same_run(state["trainer_state"], state["dir"], recorded)
        self.step = state["step"]
        self.dataset.load_state_dict(state["rank_state"]["data"])
        self.weight_sync.sync()
        self.metrics.truncate_after(self.step)
        self.rollout_log.restore(self.step)
        self.log(f"resumed from {state['dir']} (step {self.step})")

    def export_policy(self, out_dir: str, adapter_dir: str = ""):
        """Write the policy as HF safetensors (rank 0), its full tensors assembled from one replica each. Under
        LoRA as lora.lora_export says: merged weights to `out_dir`, the adapter in PEFT's format to
        `adapter_dir`, or both."""
        watchdog.enter("export")
        run, what = self.cfg.run, self.cfg.lora.lora_export if self.run.lora else "merged"
        if what in ("merged", "both"):
            exchange.write_full_policy(self.policy, lambda full: export_hf(
                full, out_dir, self.run.model_cfg, tokenizer_dir=run.vocab_path, overwrite=run.overwrite_ckpt_dir,
                flag="save_ckpt_dir/" + run_dir.EXPORT_DIR), merged_weights(self.policy))
        if what in ("adapter", "both"):
            exchange.write_full_policy(self.policy, lambda full: export_peft_adapter(
                full, adapter_dir, self.run.lora, run.load_sft_checkpoint_train, overwrite=run.overwrite_ckpt_dir,
                flag="save_ckpt_dir/" + run_dir.ADAPTER_EXPORT_DIR), adapter_weights(self.policy))

    def fit(self) -> List[Dict[str, float]]:
        run, history = self.cfg.run, []
        self.log(f"{self.run.describe()}; steps {self.step}->{run.total_steps}")
        if self.eval_dataset is not None and self.step == 0 and run.eval_at_start:
            self.metrics.log(0, self.evaluate(), echo=self.log)
        progress, echo = None, self.log
        if run.progress and self.rank == 0:
            from tqdm import tqdm
            progress = tqdm(total=run.total_steps, initial=self.step, desc="grpo", unit="step", leave=False)
            echo = self.phase_clocks.echo = progress.write
        while self.step < run.total_steps:
            metrics = self.train_one_step()
            if self.eval_dataset is not None and (self.step % run.eval_steps == 0 or self.step == run.total_steps):
                metrics.update(self.evaluate())
            self.metrics.log(self.step, metrics, echo=echo)
            history.append(metrics)
            if progress:
                progress.update(1)
            if (run.save_steps and self.step % run.save_steps == 0) or self.step == run.total_steps:
                self.save()
        if progress:
            progress.close()
        self.swap.reload_all()
        self.weight_sync.close()
        self.rollout_log.flush()
        if run.export_hf:
            self.export_policy(os.path.join(run.save_ckpt_dir, run_dir.EXPORT_DIR),
                               os.path.join(run.save_ckpt_dir, run_dir.ADAPTER_EXPORT_DIR))
        self.metrics.close()
        watchdog.stop()
        return history
