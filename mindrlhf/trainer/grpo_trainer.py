"""The GRPO loop. One process group; every rank holds the policy (train layout), the rollout model (infer
layout; the policy object itself when the layouts match) and, when beta > 0, a frozen reference model.

One step: rollout -> gather samples -> rewards -> group advantages -> old/ref logprobs -> updates ->
weight sync -> metrics / checkpoint / eval. Each phase is one method below; the math lives in grpo_math.
"""
from __future__ import annotations

import os
import time
from typing import Dict, List

import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindrlhf.checkpoint.hf_interop import export_hf
from mindrlhf.checkpoint.model_io import (load_weights, model_layouts, param_as_f32, param_to_numpy,
                                         write_param)
from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.grpo_config import GRPOConfig
from mindrlhf.configs.model_config import load_model_yaml
from mindrlhf.data.dataset import PromptDataset
from mindrlhf.data.tokenizer import load_tokenizer
from mindrlhf.models.qwen2 import CausalLM, param_specs
from mindrlhf.parallel import comm
from mindrlhf.parallel.mesh import init_distributed, mesh_for
from mindrlhf.parallel.reshard import WeightSync
from mindrlhf.parallel.swap import SwapGroup, on_ascend
from mindrlhf.reward.verifiers import RewardFn, accuracy_reward
from mindrlhf.rollout.backends import check_backend, make_engine
from mindrlhf.rollout.sampling import SamplingParams
from mindrlhf.trainer import checkpointing
from mindrlhf.trainer.grpo_math import group_advantages
from mindrlhf.trainer.metrics import MetricsLogger
from mindrlhf.trainer.optim import AdamW, lr_at
from mindrlhf.trainer.samples import SampleBatch, gather_samples, left_pad, training_tensors
from mindrlhf.trainer.train_step import GRPOLossCell, PolicyTrainStep, ResponseLogProb
from mindrlhf.utils import memory


class TrainingError(RuntimeError):
    """The run cannot continue (e.g. the loss became NaN); raised on every rank together."""


class GRPOTrainer:
    def __init__(self, cfg: GRPOConfig, log=print):
        self.cfg = cfg
        self.rank, self.world = init_distributed() if cfg.run.use_parallel else (0, 1)
        self.log = log if self.rank == 0 else (lambda *a, **k: None)
        ms.set_seed(cfg.run.seed)
        if cfg.run.enable_compile_cache:
            ms.set_context(enable_compile_cache=True,
                           compile_cache_path=os.path.join(cfg.run.save_ckpt_dir, "compile_cache"))
        self._read_configs()      # configs, layouts, file checks: cheap, and identical on every rank
        self._setup_data()        # tokenizer, dataset and the checks that need them
        self._setup_models()      # only now the expensive part: build and load weights, first sync
        self._setup_training()
        self.step = 0
        # TP peers of a rollout replica must sample identically: seed by the infer-DP index
        self.rng = np.random.default_rng([cfg.run.seed, self.infer_mesh.dp_index])
        log_dir = cfg.run.log_dir or cfg.run.save_ckpt_dir
        self.metrics = MetricsLogger(log_dir, enabled=self.rank == 0)
        self.rollout_log = RolloutLog(cfg.run.save_data_file)
        if cfg.run.resume:
            self._resume()

    # ---- set-up (all validation happens here, before any collective) ----------------------------------
    def _read_configs(self):
        run = self.cfg.run
        if not run.sft_path_train:
            raise ConfigError("sft_path_train: required (model YAML of the policy)")
        train_yaml = load_model_yaml(run.sft_path_train)
        infer_yaml = load_model_yaml(run.sft_path_infer) if run.sft_path_infer else train_yaml
        if train_yaml.model != infer_yaml.model and _shape_fields(train_yaml.model) != _shape_fields(infer_yaml.model):
            raise ConfigError(f"{run.sft_path_infer}: model.model_config describes another model than "
                              f"{run.sft_path_train} (shapes must match; dtypes may differ)")
        if not run.use_parallel and (train_yaml.parallel.world_size > 1 or infer_yaml.parallel.world_size > 1):
            raise ConfigError(f"use_parallel is False but {run.sft_path_train} asks for "
                              f"{train_yaml.parallel.world_size} ranks: launch with msrun and --use_parallel True")
        self.model_cfg = train_yaml.model
        self.train_mesh = mesh_for(train_yaml.parallel, self.world, self.rank, "train (sft_path_train)")
        self.infer_mesh = mesh_for(infer_yaml.parallel, self.world, self.rank, "infer (sft_path_infer)")
        for path, what in ((run.load_sft_checkpoint_train, "load_sft_checkpoint_train"),
                           (run.load_sft_checkpoint_infer, "load_sft_checkpoint_infer"),
                           (run.load_ref_checkpoint, "load_ref_checkpoint")):
            if path and not os.path.exists(path):
                raise ConfigError(f"{what}: not found: {path}")
        self.infer_model_cfg = infer_yaml.model
        check_backend(run.rollout_backend)

    def _setup_models(self):
        run = self.cfg.run
        self.policy = CausalLM(self.model_cfg, self.train_mesh)
        if run.load_sft_checkpoint_train:
            load_weights(self.policy, run.load_sft_checkpoint_train)
        same_layout = (self.train_mesh.dp, self.train_mesh.tp) == (self.infer_mesh.dp, self.infer_mesh.tp)
        if same_layout and self.infer_model_cfg.param_init_type == self.model_cfg.param_init_type:
            self.rollout_model = self.policy           # the seam: one model serves both roles
        else:
            self.rollout_model = CausalLM(self.infer_model_cfg, self.infer_mesh)
        self.weight_sync = WeightSync(self.policy, self.rollout_model, run.reshard_transport)
        if run.load_sft_checkpoint_infer and self.rollout_model is not self.policy:
            load_weights(self.rollout_model, run.load_sft_checkpoint_infer)   # checked by the logprob gap
        else:
            self.weight_sync.sync()                    # rollout starts from the policy's weights
        self.ref_model = None
        if self.cfg.rl.beta > 0:
            self.ref_model = CausalLM(self.model_cfg, self.train_mesh)
            ref_path = run.load_ref_checkpoint or run.load_sft_checkpoint_train
            if ref_path:
                load_weights(self.ref_model, ref_path)
            else:
                _copy_weights(self.policy, self.ref_model)

    def _setup_data(self):
        run, rl, smp = self.cfg.run, self.cfg.rl, self.cfg.sampling
        self.tokenizer = load_tokenizer(run.vocab_path, run.merges_file_path)
        if self.tokenizer.vocab_size > self.model_cfg.vocab_size:
            raise ConfigError(f"vocab_path: the tokenizer has {self.tokenizer.vocab_size} tokens but "
                              f"model.model_config.vocab_size is {self.model_cfg.vocab_size}")
        if not run.mind_dataset_dir:
            raise ConfigError("mind_dataset_dir: required (prompt MindRecord from rlhf_data.py)")
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else \
            self.model_cfg.pad_token_id
        eos = {self.tokenizer.eos_token_id, *self.model_cfg.eos_token_ids} - {None}
        self.eos_ids = sorted(eos)
        self.dataset = PromptDataset(run.mind_dataset_dir, rl.batch_size, self.infer_mesh.dp,
                                     self.infer_mesh.dp_index, run.seed, self.pad_id)
        self.prompt_width = self.dataset.table["prompt_ids"].shape[1]
        need = self.prompt_width + smp.max_tokens
        if need > self.model_cfg.max_position_embedding or need > self.model_cfg.seq_length:
            raise ConfigError(f"sampling.max_tokens: prompt length {self.prompt_width} (from "
                              f"{run.mind_dataset_dir}) + max_tokens {smp.max_tokens} = {need} exceeds "
                              f"model.model_config.seq_length={self.model_cfg.seq_length}")
        rows = rl.batch_size * self.infer_mesh.dp
        if rows % self.train_mesh.dp:
            raise ConfigError(f"rl.batch_size: {rl.batch_size} prompts x infer data_parallel "
                              f"{self.infer_mesh.dp} = {rows} prompt groups do not split over train "
                              f"data_parallel={self.train_mesh.dp}")
        self.rows_per_train_rank = rows * rl.num_generations // self.train_mesh.dp
        mb = rl.mini_batch_size or self.rows_per_train_rank
        if self.rows_per_train_rank % mb:
            raise ConfigError(f"rl.mini_batch_size: {mb} does not divide the {self.rows_per_train_rank} "
                              f"sequences each train-DP rank gets per step")
        self.mini_batch = mb
        self.eval_dataset = None
        if run.eval_steps and run.eval_dataset:
            self.eval_dataset = PromptDataset(run.eval_dataset, 1, 1, 0, run.seed, self.pad_id, shuffle=False)
        self.reward_fn = RewardFn(self.cfg.reward.verifier_function, self.cfg.reward.verifier_weight)

    def _setup_training(self):
        rl, opt, smp = self.cfg.rl, self.cfg.optim, self.cfg.sampling
        self.engine = make_engine(self.cfg.run.rollout_backend, self.rollout_model, self.pad_id, self.prompt_width)
        params = list(self.policy.trainable_params())
        self.optimizer = AdamW(params, opt.weight_decay, opt.beta1, opt.beta2, opt.eps)
        specs = param_specs(self.model_cfg)
        split = [self.train_mesh.tp > 1 and specs[p.name][1] is not None for p in params]
        loss_cell = GRPOLossCell(self.policy, rl, smp.max_tokens)
        self.train_step = PolicyTrainStep(loss_cell, self.optimizer, self.train_mesh, split, opt.max_grad_norm)
        self.policy_logprob = ResponseLogProb(self.policy, smp.max_tokens)
        self.ref_logprob = ResponseLogProb(self.ref_model, smp.max_tokens) if self.ref_model else None
        self.updates_per_step = rl.num_iterations * (self.rows_per_train_rank // self.mini_batch)
        sw, separate = self.cfg.swap, self.rollout_model is not self.policy
        self.swap = {
            "policy": SwapGroup("policy", self.policy.get_parameters(), sw.offload_train_param and separate),
            "optimizer": SwapGroup("optimizer", self.optimizer.state_parameters(), sw.offload_train_optimizer),
            # the weight sync rewrites every rollout parameter after each update, before any rollout reads
            # them again: offloading them needs no host copy, so this saves memory even on a CPU-only host
            "rollout": SwapGroup("rollout", self.rollout_model.get_parameters(), sw.offload_infer_param and separate,
                                 keep_contents=False),
            "ref": SwapGroup("ref", self.ref_model.get_parameters() if self.ref_model else [], sw.offload_ref_param),
            # filled after the first rollout; prefill rewrites the whole cache, so no host copy is kept
            "kv_cache": SwapGroup("kv_cache", [], sw.offload_kv_cache, keep_contents=False),
        }
        if any(g.enabled for g in self.swap.values()) and not on_ascend():
            self.log("note: on CPU, swapped buffers' pages are released but their host copy lives in the same RAM: "
                     "the device-side footprint drops, the process total does not (mindrlhf/parallel/swap.py)")
        self.total_updates = self.cfg.run.total_steps * self.updates_per_step

    def sampling_params(self, greedy=False) -> SamplingParams:
        s = self.cfg.sampling
        return SamplingParams(temperature=0.0 if greedy else s.temperature, top_k=s.top_k, top_p=s.top_p,
                              min_p=s.min_p, repetition_penalty=s.repetition_penalty, max_tokens=s.max_tokens,
                              min_tokens=s.min_tokens, n=1 if greedy else self.cfg.rl.num_generations,
                              eos_token_ids=self.eos_ids, seed=self.cfg.run.seed)

    # ---- phases ---------------------------------------------------------------------------------------
    def rollout(self, batch) -> SampleBatch:
        prompts = [row[:n].tolist() for row, n in zip(batch["prompt_ids"], batch["prompt_length"])]
        swap = self.swap["kv_cache"]
        swap.reload()
        out = self.engine.generate(prompts, self.sampling_params(), self.rng)
        swap.params = self.engine.cache_parameters()
        swap.enabled = self.cfg.swap.offload_kv_cache and bool(swap.params)
        swap.offload()
        ids, mask = left_pad(out.prompt_ids, self.prompt_width, self.pad_id)
        offset = self.infer_mesh.dp_index * len(prompts)
        return SampleBatch(ids, mask, out.response_ids, out.response_mask, out.logprobs,
                           (out.prompt_index + offset).astype(np.int64),
                           np.array([r == "stop" for r in out.finish_reason], np.int64))

    def score(self, samples: SampleBatch, solutions: List[str]):
        texts = self.tokenizer.decode_batch([r[m == 1].tolist() for r, m in zip(samples.response_ids,
                                                                               samples.response_mask)])
        sols = [solutions[i] for i in samples.solution_index]
        rewards, parts = self.reward_fn(texts, sols)
        return np.array(rewards, np.float32), parts, texts

    def logprobs(self, cell, samples: SampleBatch) -> np.ndarray:
        out = []
        for start in range(0, len(samples), self.mini_batch):
            t = training_tensors(samples.rows(start, start + self.mini_batch))
            logp, _ = cell(t["input_ids"], t["position_ids"], t["bias"], t["labels"])
            out.append(logp.asnumpy())
        return np.concatenate(out)

    def update(self, samples: SampleBatch, old_logp, ref_logp, advantages) -> Dict[str, float]:
        stats = []
        n = len(samples)
        for _ in range(self.cfg.rl.num_iterations):
            for start in range(0, n, self.mini_batch):
                sl = slice(start, start + self.mini_batch)
                t = training_tensors(samples.rows(start, start + self.mini_batch))
                update_index = int(self.optimizer.step.asnumpy()[0])
                lr = lr_at(update_index, self.cfg.optim.lr, self.cfg.optim.warmup_steps, self.total_updates,
                           self.cfg.optim.min_lr)
                out = self.train_step(t["input_ids"], t["position_ids"], t["bias"], t["labels"],
                                      Tensor(samples.response_mask[sl].astype(np.float32)),
                                      Tensor(old_logp[sl]), Tensor(ref_logp[sl]), Tensor(advantages[sl]),
                                      Tensor(np.float32(lr)))
                vals = [float(x.asnumpy()) for x in out]
                stats.append(vals + [lr])
        mean = np.mean(np.array(stats), 0)
        keys = ["loss", "pg_loss", "kl", "clip_frac", "entropy", "grad_norm", "lr"]
        result = dict(zip(keys, mean.tolist()))
        bad = not (np.isfinite(result["loss"]) and np.isfinite(result["grad_norm"]))
        if comm.any_rank(bad):
            raise TrainingError(f"step {self.step + 1}: the loss or gradient norm is not finite (NaN/inf) on at least "
                                f"one rank (loss={result['loss']}, grad_norm={result['grad_norm']}); the last "
                                f"checkpoint is untouched. Lower optim.lr or check the data and weights")
        return result

    # which swap groups each phase needs on the device (the rest go to host when their switch is on)
    PHASE_RESIDENT = {
        "rollout": ("rollout",),
        "logprob": ("rollout", "policy"),
        "train": ("policy", "optimizer"),
        "sync": ("policy", "rollout"),
    }

    def enter_phase(self, phase: str, keep=()):
        resident = set(self.PHASE_RESIDENT[phase]) | set(keep)
        for name, group in self.swap.items():
            if name != "kv_cache":
                (group.reload if name in resident else group.offload)()

    def train_one_step(self) -> Dict[str, float]:
        times, peaks = {}, {}

        def phase(name, fn, *args):
            memory.reset_peak()
            t0 = time.time()
            result = fn(*args)
            times[name] = time.time() - t0
            peaks[name] = memory.peak_mb()
            return result

        t_step = time.time()
        swap_before = sum(g.seconds for g in self.swap.values())
        self.enter_phase("rollout")
        batch = self.dataset.next_batch()
        local = phase("rollout", self.rollout, batch)
        solutions = comm_gather_solutions(batch["solution"], self.infer_mesh)
        samples = phase("gather", gather_samples, local, self.infer_mesh)
        rewards, parts, texts = phase("reward", self.score, samples, solutions)
        if self.cfg.run.save_data_file and self.rank == 0:
            self.rollout_log.add(self.step + 1, samples, texts, rewards, solutions, self.tokenizer)
        advantages = group_advantages(rewards, self.cfg.rl.num_generations, self.cfg.rl.adv_norm_std)
        per = self.rows_per_train_rank
        mine = slice(self.train_mesh.dp_index * per, (self.train_mesh.dp_index + 1) * per)
        my_samples = samples.rows(mine.start, mine.stop)
        self.enter_phase("logprob")
        old_logp = phase("old_logprob", self.logprobs, self.policy_logprob, my_samples)
        ref_logp = np.zeros_like(old_logp)
        if self.ref_logprob:
            self.enter_phase("logprob", keep=("ref",))
            ref_logp = phase("ref_logprob", self.logprobs, self.ref_logprob, my_samples)
        self.enter_phase("train")
        stats = phase("train", self.update, my_samples, old_logp, ref_logp, advantages[mine])
        self.enter_phase("sync")
        phase("weight_sync", self.weight_sync.sync)
        self.step += 1
        if self.ref_model is not None and self.cfg.rl.ref_sync_steps and self.step % self.cfg.rl.ref_sync_steps == 0:
            self.swap["ref"].reload()
            _copy_weights(self.policy, self.ref_model)     # same (train) layout: a local copy
        metrics = self._step_metrics(samples, my_samples, rewards, parts, old_logp, stats)
        metrics.update({f"time_{k}": v for k, v in times.items()})
        metrics.update({f"peak_mb_{k}": v for k, v in peaks.items()})
        metrics["time_swap"] = sum(g.seconds for g in self.swap.values()) - swap_before
        metrics["swap_host_mb"] = sum(g.host_bytes() for g in self.swap.values()) / 2**20
        metrics["time_step"] = time.time() - t_step
        metrics["rollout_tokens_per_s"] = metrics["tokens_generated"] / max(times["rollout"], 1e-9)
        return metrics

    @staticmethod
    def _step_metrics(samples, my_samples, rewards, parts, old_logp, stats) -> Dict[str, float]:
        mask = my_samples.response_mask.astype(bool)
        lengths = samples.response_mask.sum(1)
        metrics = {
            "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
            "accuracy": float(np.mean(parts.get("accuracy_reward", [np.nan]))),
            "response_len_mean": float(lengths.mean()), "response_len_max": float(lengths.max()),
            "response_clipped_frac": float(1.0 - samples.finished.mean()),
            "rollout_train_logprob_gap": float(np.abs(my_samples.rollout_logp - old_logp)[mask].mean())
            if mask.any() else 0.0,
            "tokens_generated": float(lengths.sum()),
            **stats,
        }
        for name, values in parts.items():
            metrics[f"reward/{name}"] = float(np.mean(values))
        return metrics

    # ---- evaluation, checkpoints, the loop ----------------------------------------------------------
    def evaluate(self) -> float:
        """Greedy accuracy on up to eval_prompts held-out prompts, split over infer-DP replicas."""
        table = self.eval_dataset.table
        n = min(self.cfg.run.eval_prompts, len(table["prompt_ids"]))
        idx = np.arange(n)[self.infer_mesh.dp_index::self.infer_mesh.dp]
        prompts = [table["prompt_ids"][i][:table["prompt_length"][i]].tolist() for i in idx]
        self.swap["kv_cache"].reload()
        out = self.engine.generate(prompts, self.sampling_params(greedy=True), self.rng)
        texts = self.tokenizer.decode_batch([r[m == 1].tolist() for r, m in zip(out.response_ids, out.response_mask)])
        correct = sum(accuracy_reward(t, table["solution"][i]) for t, i in zip(texts, idx))
        counts = np.array([correct, len(idx)], np.float64) if self.infer_mesh.tp_index == 0 else np.zeros(2)
        total = comm.all_reduce_sum(counts.astype(np.float32), comm.world_ranks())
        return float(total[0] / max(total[1], 1))

    def save(self):
        run = self.cfg.run
        self.swap["optimizer"].reload()
        checkpointing.save_training_checkpoint(
            run.save_ckpt_dir, self.step, self.rank, self.policy, self.optimizer,
            rank_state={"rng": self.rng.bit_generator.state, "data": self.dataset.state_dict()},
            trainer_state={"step": self.step, "world_size": self.world}, keep=run.keep_checkpoints)
        self.swap["optimizer"].offload()
        if self.rank == 0:
            self.rollout_log.flush()

    def _resume(self):
        state = checkpointing.load_training_checkpoint(self.cfg.run.save_ckpt_dir, self.rank, self.policy,
                                                       self.optimizer)
        if state is None:
            self.log(f"resume: no complete checkpoint in {self.cfg.run.save_ckpt_dir}; starting fresh")
            return
        self.step = state["step"]
        self.rng.bit_generator.state = state["rank_state"]["rng"]
        self.dataset.load_state_dict(state["rank_state"]["data"])
        self.weight_sync.sync()
        self.log(f"resumed from {state['dir']} (step {self.step})")

    def export_policy(self, out_dir: str):
        """Gather the policy's shards into full tensors and write HF safetensors (rank 0 writes)."""
        layouts = model_layouts(self.policy)
        full = {}
        for param in self.policy.get_parameters():
            layout = layouts[param.name]
            buf = np.zeros(layout.full_shape, np.float32)
            if self.train_mesh.dp_index == 0:        # one replica of each slice contributes
                buf[layout.shard_slices(self.rank)] = param_as_f32(param)
            full[param.name] = comm.all_reduce_sum(buf, comm.world_ranks()) if self.world > 1 else buf
        if self.rank == 0:
            export_hf(full, out_dir, self.model_cfg)
        comm.barrier()

    def fit(self) -> List[Dict[str, float]]:
        run = self.cfg.run
        history = []
        self.log(f"GRPO: {self.world} rank(s); train layout dp={self.train_mesh.dp} tp={self.train_mesh.tp}; "
                 f"infer layout dp={self.infer_mesh.dp} tp={self.infer_mesh.tp}; "
                 f"{self.cfg.rl.batch_size * self.infer_mesh.dp} prompts x {self.cfg.rl.num_generations} "
                 f"samples per step; steps {self.step}->{run.total_steps}")
        if self.eval_dataset is not None and self.step == 0:
            acc = self.evaluate()
            self.metrics.log(0, {"eval_accuracy": acc}, echo=self.log)
        progress = None
        if run.progress and self.rank == 0:
            from tqdm import tqdm
            progress = tqdm(total=run.total_steps, initial=self.step, desc="grpo", unit="step", leave=False)
        while self.step < run.total_steps:
            metrics = self.train_one_step()
            if self.eval_dataset is not None and (self.step % run.eval_steps == 0 or self.step == run.total_steps):
                metrics["eval_accuracy"] = self.evaluate()
            self.metrics.log(self.step, metrics, echo=(progress.write if progress else self.log))
            history.append(metrics)
            if progress:
                progress.update(1)
            if (run.save_steps and self.step % run.save_steps == 0) or self.step == run.total_steps:
                self.save()
        if progress:
            progress.close()
        for group in self.swap.values():
            group.reload()
        self.weight_sync.close()
        if self.rank == 0:
            self.rollout_log.flush()
        if run.export_hf:
            self.export_policy(os.path.join(run.save_ckpt_dir, "hf_policy"))
        self.metrics.close()
        return history


class RolloutLog:
    """Every rollout sample of the run, written to `save_data_file` (MindRecord) at each flush."""

    SCHEMA = {"step": {"type": "int64"}, "prompt": {"type": "string"}, "response": {"type": "string"},
              "reward": {"type": "float32"}, "solution": {"type": "string"}}

    def __init__(self, path: str):
        self.path = path
        self.rows = {k: [] for k in self.SCHEMA}

    def add(self, step, samples: SampleBatch, texts, rewards, solutions, tokenizer):
        prompts = tokenizer.decode_batch([p[m == 1].tolist() for p, m in zip(samples.prompt_ids, samples.prompt_mask)],
                                         skip_special_tokens=False)
        for i, text in enumerate(texts):
            self.rows["step"].append(np.int64(step))
            self.rows["prompt"].append(prompts[i])
            self.rows["response"].append(text)
            self.rows["reward"].append(np.float32(rewards[i]))
            self.rows["solution"].append(solutions[samples.solution_index[i]])

    def flush(self):
        if self.path and self.rows["step"]:
            from mindrlhf.data.mindrecord_io import write_mindrecord
            write_mindrecord(self.path, self.rows, self.SCHEMA)


def comm_gather_solutions(local: np.ndarray, infer_mesh) -> List[str]:
    """Solutions of every infer-DP replica's prompts, in DP order (strings travel as UTF-8 bytes)."""
    if comm.world_ranks() == (0,):
        return [str(s) for s in local]
    encoded = [str(s).encode("utf-8")[:255] for s in local]
    buf = np.zeros((len(local), 256), np.int64)
    for i, e in enumerate(encoded):
        buf[i, 0] = len(e)
        buf[i, 1:1 + len(e)] = list(e)
    gathered = comm.all_gather(buf, comm.world_ranks(), infer_mesh.rank)
    out = []
    for d in range(infer_mesh.dp):
        for row in gathered[d * infer_mesh.tp]:
            out.append(bytes(row[1:1 + row[0]].astype(np.uint8).tolist()).decode("utf-8", errors="replace"))
    return out


def _shape_fields(cfg):
    return (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.n_kv_heads, cfg.intermediate_size, cfg.vocab_size,
            cfg.qkv_has_bias, cfg.tie_word_embeddings)


def _copy_weights(src: CausalLM, dst: CausalLM):
    dst_params = {p.name: p for p in dst.get_parameters()}
    for p in src.get_parameters():
        write_param(dst_params[p.name], param_to_numpy(p))
