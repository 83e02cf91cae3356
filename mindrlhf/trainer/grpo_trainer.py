"""The GRPO loop. One process group; every rank holds the policy (train layout), the rollout model (infer
layout; the policy object itself when the layouts match) and, when beta > 0, a frozen reference model.

One step: rollout -> gather samples -> rewards -> group advantages -> old/ref logprobs -> updates ->
weight sync -> metrics / checkpoint / eval. Each phase is one method below; the math lives in grpo_math,
every exchange between ranks in exchange, the swap policy in swap_schedule.

Layout invariance: a step's prompts are the dataset's global batch, sample j of prompt i draws from a
random stream keyed by (seed, step, i, j), every rank holds the whole batch's scores, the train-DP ranks split each
global mini-batch (not the step) and losses are normalised over the global mini-batch. So a seed gives the
same trajectory on any train/infer layout, up to float reassociation in TP reductions.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Dict, List, Tuple

import numpy as np
import mindspore as ms

from mindrlhf.checkpoint.hf_interop import export_hf
from mindrlhf.checkpoint.model_io import load_weights
from mindrlhf.configs import upstream
from mindrlhf.configs.coerce import coerce
from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.grpo_config import GRPOConfig
from mindrlhf.configs.hf_config import is_hf_folder
from mindrlhf.configs.model_config import ParallelConfig, load_model_yaml
from mindrlhf.data.dataset import PromptDataset
from mindrlhf.data.tokenizer import load_tokenizer
from mindrlhf.models.qwen2 import CausalLM, left_pad, param_specs
from mindrlhf.parallel import watchdog
from mindrlhf.parallel.mesh import init_distributed, mesh_for
from mindrlhf.parallel.pipeline import bubble_fraction
from mindrlhf.parallel.reshard import WeightSync
from mindrlhf.parallel.swap import SwapGroup, on_ascend
from mindrlhf.parallel.topology import Nodes, discover_nodes, ranks_not_sharing
from mindrlhf.reward.verifiers import RewardFn, accuracy_reward, extract_answer, load_reward_module, score_each
from mindrlhf.rollout.backends import check_backend, make_engine
from mindrlhf.rollout.sampling import SamplingParams
from mindrlhf.trainer import checkpointing, exchange, run_dir
from mindrlhf.trainer.experience_file import write_experience
from mindrlhf.trainer.grpo_math import group_advantages, informative_groups, overlong_penalty
from mindrlhf.trainer.metrics import MetricsLogger, sample_metrics
from mindrlhf.trainer.node_check import check_nodes_agree, compile_cache_dir
from mindrlhf.trainer.optim import AdamW, scheduled_lr
from mindrlhf.trainer.rollout_log import RolloutLog
from mindrlhf.trainer.samples import SampleBatch, ScoredBatch, train_step_inputs, training_tensors
from mindrlhf.trainer.step_geometry import StepGeometry
from mindrlhf.trainer.swap_schedule import SwapSchedule
from mindrlhf.trainer.pipeline_step import PipelineLogProb, PipelineTrainStep, micro_batch_count
from mindrlhf.trainer.train_step import GRPOLossCell, PolicyTrainStep, ResponseLogProb
from mindrlhf.utils import compile_ahead, cpu_threads, memory
from mindrlhf.utils.params import copy_params

# what each update reports (the train step's outputs, then the learning rate), averaged over a step's updates
UPDATE_STATS = ("loss", "pg_loss", "kl", "clip_frac", "entropy", "grad_norm", "on_policy_gap", "tis_ratio_mean",
                "tis_ratio_max", "tis_clipped_frac", "lr")
MAX_STATS = ("tis_ratio_max",)          # reduced by max over updates and ranks; the rest by mean
TIS_STATS = ("tis_ratio_mean", "tis_ratio_max", "tis_clipped_frac")


class TrainingError(RuntimeError):
    """The run cannot continue (e.g. the loss became NaN); raised on every rank together."""


class GRPOTrainer:
    def __init__(self, cfg: GRPOConfig, log=print):
        self.cfg = cfg
        blocking = cpu_threads.run_in_calling_thread() if not on_ascend() else None   # before anything runs
        self.rank, self.world = init_distributed() if cfg.run.use_parallel else (0, 1)
        self.log = log if self.rank == 0 else (lambda *a, **k: None)
        self.nodes = discover_nodes() if cfg.run.use_parallel else Nodes([0], 0)
        if cfg.run.use_parallel:
            watchdog.start(cfg.run.watchdog_timeout, self.rank, self.nodes.node_of_rank[self.rank])
            check_nodes_agree(cfg, self.nodes)    # before anything else: every node runs the same job
        self._report_storage()
        self.run_id = None if cfg.run.resume else run_dir.claim(cfg.run, self.rank, self._marks_checkpoints())
        self._set_cpu_threads()
        if blocking is not None:
            self.log(f"MindSpore host work in the calling thread: {cpu_threads.BLOCKING_RUN}={blocking} "
                     f"(utils/cpu_threads.py says why)")
        ms.set_seed(cfg.run.seed)
        self._set_compile_cache()
        self._read_configs()      # configs, layouts, file checks: cheap, and identical on every rank
        self._setup_data()        # tokenizer, dataset and the checks that need them
        self._setup_models()      # only now the expensive part: build and load weights, first sync
        self._setup_training()
        self.step = 0
        log_dir = cfg.run.log_dir or cfg.run.save_ckpt_dir
        self.metrics = MetricsLogger(log_dir, enabled=self.rank == 0, tensorboard=cfg.run.tensorboard)
        self.rollout_log = RolloutLog(cfg.run.rollout_log_file if self.rank == 0 else "")
        if cfg.run.resume:
            self._resume()
        self._compile_train_step()

    # ---- set-up (all validation happens here, before any collective) ----------------------------------
    def _read_configs(self):
        run = self.cfg.run
        if not run.sft_path_train:
            raise ConfigError("sft_path_train: required (model YAML of the policy)")
        hf_layout = ParallelConfig(data_parallel=self.world)      # an HF folder's layout: every rank data-parallel
        train_yaml = load_model_yaml(run.sft_path_train, hf_layout)
        infer_yaml = load_model_yaml(run.sft_path_infer, hf_layout, "infer") if run.sft_path_infer else train_yaml
        ref_yaml = load_model_yaml(run.sft_path_ref, hf_layout) if run.sft_path_ref else None
        for y in {y.path: y for y in (train_yaml, infer_yaml, ref_yaml) if y is not None}.values():
            if is_hf_folder(y.path):
                self.log(f"{y.path}: Hugging Face folder, layout data_parallel={self.world} (another layout: write "
                         f"a model YAML with python -m mindrlhf.configs.hf_config {y.path} --model_parallel N)")
        for other, flag in ((infer_yaml, "sft_path_infer"), (ref_yaml, "sft_path_ref")):
            if other is not None and train_yaml.model.weight_shapes() != other.model.weight_shapes():
                raise ConfigError(f"{flag} {other.path}: model.model_config describes another model than "
                                  f"{run.sft_path_train} (shapes must match; dtypes may differ)")
        self._apply_generation_fields(infer_yaml)
        if infer_yaml.parallel.use_seq_parallel and infer_yaml is not train_yaml:
            infer_yaml.ignored.append(("parallel_config.use_seq_parallel", "sequence parallelism applies to the "
                                       "train layout; the rollout keeps whole activations"))
        self._report_ignored([train_yaml, infer_yaml] + ([ref_yaml] if ref_yaml else []))
        if not run.use_parallel and (train_yaml.parallel.world_size > 1 or infer_yaml.parallel.world_size > 1):
            raise ConfigError(f"use_parallel is False but {run.sft_path_train} asks for "
                              f"{train_yaml.parallel.world_size} ranks: launch with msrun and --use_parallel True")
        if infer_yaml.parallel.pipeline_stage > 1:
            raise ConfigError(f"sft_path_infer {infer_yaml.path}: parallel_config.pipeline_stage="
                              f"{infer_yaml.parallel.pipeline_stage}; the rollout (infer) layout has no pipeline "
                              f"stages (as in MindRLHF): use pipeline_stage 1 and data_parallel/model_parallel")
        if train_yaml.model.param_init_type == "bfloat16" and not on_ascend():
            raise ConfigError(f"sft_path_train {train_yaml.path}: model.model_config.param_init_type bfloat16 cannot "
                              f"be trained on MindSpore's CPU: its Assign kernel, with which AdamW writes the weights "
                              f"in place, has no bfloat16 (2.10). Use float32 (or float16) for the policy; the "
                              f"rollout model (sft_path_infer) may keep bfloat16")
        self.model_cfg = train_yaml.model
        par = train_yaml.parallel
        # micro-batches per update: the pipeline's, each cut into micro_batch_interleave_num parts
        self.micro_batches = (par.micro_batch_num if par.pipeline_stage > 1 else 1) * par.micro_batch_interleave_num
        self.train_mesh = mesh_for(train_yaml.parallel, self.world, self.rank, "train (sft_path_train)")
        # the rollout runs prefill/decode on whole sequences: sequence parallelism is a training layout's
        self.infer_mesh = mesh_for(dataclasses.replace(infer_yaml.parallel, use_seq_parallel=False), self.world,
                                   self.rank, "infer (sft_path_infer)")
        for path, what in ((run.load_sft_checkpoint_train, "load_sft_checkpoint_train"),
                           (run.load_sft_checkpoint_infer, "load_sft_checkpoint_infer"),
                           (run.load_ref_checkpoint, "load_ref_checkpoint")):
            if path and not os.path.exists(path):
                raise ConfigError(f"{what}: not found: {path}")
        self.infer_model_cfg = infer_yaml.model
        check_backend(run.rollout_backend)

    def _set_compile_cache(self):
        """run.enable_compile_cache: MindSpore's compile cache in this job's own directory. Off, it is off for
        MindSpore too: MS_COMPILER_CACHE_ENABLE in the environment would otherwise turn on a cache keyed by
        the Python sources only, and another job's graphs would run (node_check.compile_cache_dir)."""
        run = self.cfg.run
        if run.enable_compile_cache:
            resume_step = (checkpointing.complete_steps(run.save_ckpt_dir) or [0])[-1] if run.resume else 0
            cache_dir = compile_cache_dir(self.cfg, resume_step)
            ms.set_context(enable_compile_cache=True, compile_cache_path=cache_dir)
            self.log(f"compile cache: {cache_dir} (this job's; another config, model, tokenizer, "
                     f"dataset or resume step gets another directory)")
            return
        ms.set_context(enable_compile_cache=False)
        env = os.environ.get("MS_COMPILER_CACHE_ENABLE", "")
        if env.strip() not in ("", "0"):
            self.log(f"note: MS_COMPILER_CACHE_ENABLE={env} ignored: MindSpore's cache there is keyed by the "
                     f"Python sources only, so another job's graphs would run; run.enable_compile_cache: true "
                     f"caches per job")

    def _report_storage(self):
        """Say which checkpoint storage is in use; a 'shared' directory that is not one directory for every
        rank is an error before any training (collective)."""
        run, n = self.cfg.run, self.nodes.count
        if run.checkpoint_storage == "shared":
            os.makedirs(run.save_ckpt_dir, exist_ok=True)
            missing = ranks_not_sharing(run.save_ckpt_dir) if run.use_parallel else []
            if missing:
                raise ConfigError(f"save_ckpt_dir {run.save_ckpt_dir}: not one directory for every rank (rank "
                                  f"{missing[0]}, node {self.nodes.node_of_rank[missing[0]]}, does not see what rank "
                                  f"0 writes there); put it on a filesystem every node shares, or set "
                                  f"checkpoint_storage: node_local")
            self.log(f"checkpoints: {run.save_ckpt_dir}, one directory shared by {n} node(s); rank 0 marks steps "
                     f"complete")
        else:
            self.log(f"checkpoints: node-local {run.save_ckpt_dir} on each of {n} node(s); each node's lowest rank "
                     f"marks its shards complete; metrics, rollout log and HF export are written on node 0")

    def _set_cpu_threads(self):
        """MindSpore's CPU kernels default to 25 threads per process; utils.cpu_threads says why and what
        we use instead."""
        if on_ascend():
            return
        if self.cfg.run.cpu_threads:
            threads, why = self.cfg.run.cpu_threads, "run.cpu_threads"
        else:
            threads, why = cpu_threads.auto_threads(self.nodes.local_ranks)
        in_force = cpu_threads.set_kernel_threads(threads)
        if in_force != threads:
            self.log(f"note: CPU kernel threads stay {in_force} (set earlier in this process; MindSpore takes "
                     f"it once), not {threads}")
            return
        self.log(f"CPU kernel threads per rank: {threads} ({why})")

    def _marks_checkpoints(self) -> bool:
        return self.rank == 0 if self.cfg.run.checkpoint_storage == "shared" else self.nodes.leader

    def _apply_generation_fields(self, infer_yaml):
        """The infer YAML's generation fields (max_decode_length, top_k, ...) drive sampling, as in MindRLHF,
        except where the GRPO config or a flag set the field."""
        fields = {f.name: f for f in dataclasses.fields(self.cfg.sampling)}
        taken = []
        for name, value in infer_yaml.generation.items():
            if f"sampling.{name}" not in self.cfg.explicit:
                setattr(self.cfg.sampling, name, coerce(value, fields[name], f"{infer_yaml.path}: {name}"))
                taken.append(f"{name}={getattr(self.cfg.sampling, name)}")
        self.cfg.sampling.validate(where=f"{infer_yaml.path}: sampling from model_config: ")
        self.cfg.validate()          # the checks that involve sampling fields (e.g. rl.overlong_buffer_len)
        if taken:
            self.log(f"sampling from {infer_yaml.path}: {', '.join(taken)}")

    def _report_ignored(self, yamls):
        """Once at start-up: every accepted MindRLHF/MindFormers key that changes nothing here, and why."""
        by_source = {}
        for source, key, why in self.cfg.ignored:
            by_source.setdefault(source, []).append((key, why))
        for y in {y.path: y for y in yamls}.values():
            if y.ignored:             # one line per file: a MindSpeed-RL file is the config and the model YAML
                by_source.setdefault(y.path, []).extend(y.ignored)
        for source, items in by_source.items():
            self.log(upstream.describe_ignored(source, items))
        for line in self.cfg.derived:
            self.log(line)
        if self.cfg.rl.beta == 0 and self.cfg.run.load_ref_checkpoint:
            self.log(f"note: load_ref_checkpoint {self.cfg.run.load_ref_checkpoint} is not loaded: rl.beta is 0, so "
                     f"there is no KL term and no reference model (set beta > 0 to use it)")

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
        self.dataset = self._with_solutions(PromptDataset(run.mind_dataset_dir, rl.batch_size, self.infer_mesh.dp,
                                                          self.infer_mesh.dp_index, run.seed, self.pad_id))
        self.prompt_width = self.dataset.table["prompt_ids"].shape[1]
        need = self.prompt_width + smp.max_tokens
        for limit, name in ((self.model_cfg.seq_length, "seq_length"),
                            (self.model_cfg.max_position_embedding, "max_position_embedding")):
            if need > limit:
                raise ConfigError(f"sampling.max_tokens: prompt length {self.prompt_width} (from "
                                  f"{run.mind_dataset_dir}) + max_tokens {smp.max_tokens} = {need} exceeds "
                                  f"model.model_config.{name}={limit}")
        if run.max_model_len and need > run.max_model_len:
            raise ConfigError(f"run.max_model_len: prompt length {self.prompt_width} + max_tokens {smp.max_tokens} = "
                              f"{need} exceeds max_model_len={run.max_model_len}")
        self.geometry = StepGeometry.from_config(rl, self.infer_mesh.dp, self.train_mesh.dp)
        where = f"{run.sft_path_train}: parallel_config.micro_batch_num x micro_batch_interleave_num"
        if rl.micro_batch_size:
            self.micro_batches = self._micro_batches_of_size(rl.micro_batch_size, where)
            where = "rl.micro_batch_size"
        if self.micro_batches > 1:
            micro_batch_count(self.geometry.mini_batch, self.micro_batches, where)
            if 1 < self.train_mesh.pp and self.micro_batches < self.train_mesh.pp:
                self.log(f"warning: {where}={self.micro_batches} < pipeline_stage={self.train_mesh.pp}: some stages "
                         f"idle most of each update (1F1B bubble {bubble_fraction(self.train_mesh.pp, self.micro_batches):.0%}"
                         f"); micro_batch_num >= pipeline_stage is recommended")
        if run.epochs and "run.total_steps" not in self.cfg.explicit:
            per_epoch = self.dataset.num_rows // (rl.batch_size * self.infer_mesh.dp)
            if per_epoch == 0:
                raise ConfigError(f"run.epochs: {run.mind_dataset_dir} has {self.dataset.num_rows} prompts, fewer "
                                  f"than one step's {rl.batch_size * self.infer_mesh.dp}")
            run.total_steps = run.epochs * per_epoch
            self.log(f"epochs {run.epochs} x {per_epoch} steps per pass over {run.mind_dataset_dir} = "
                     f"{run.total_steps} steps")
        self.eval_dataset = None
        if run.eval_steps and run.eval_dataset:
            self.eval_dataset = self._with_solutions(PromptDataset(run.eval_dataset, 1, 1, 0, run.seed, self.pad_id,
                                                                   shuffle=False))
            n = min(run.eval_prompts, self.eval_dataset.num_rows)
            if n < self.infer_mesh.dp:
                raise ConfigError(f"run.eval_prompts: {n} eval prompt(s) (eval_prompts={run.eval_prompts}, "
                                  f"{run.eval_dataset} has {self.eval_dataset.num_rows}) cannot give each of the "
                                  f"{self.infer_mesh.dp} infer data-parallel replicas one")
        added = load_reward_module(self.cfg.reward.reward_module)
        if added:
            self.log(f"verifiers from {self.cfg.reward.reward_module}: {', '.join(added)}")
        self.reward_fn = RewardFn(self.cfg.reward.verifier_function, self.cfg.reward.verifier_weight,
                                  self.cfg.reward.verifier_timeout)

    def _micro_batches_of_size(self, size: int, yaml_where: str) -> int:
        """Micro-batches per update for rl.micro_batch_size rows each: they must fill the mini-batch, and
        with pipeline stages come in a multiple of the YAML's micro_batch_num."""
        mini, pipeline = self.geometry.mini_batch, self.micro_batches
        if mini % size:
            raise ConfigError(f"rl.micro_batch_size: {size} does not divide the {mini} sequences of a mini-batch on "
                              f"one train data-parallel rank (rl.mini_batch_size)")
        if self.train_mesh.pp == 1 and pipeline > 1:
            raise ConfigError(f"rl.micro_batch_size: set, and {yaml_where} = {pipeline}; both cut the mini-batch "
                              f"into micro-batches: set one of them")
        if (mini // size) % pipeline:
            raise ConfigError(f"rl.micro_batch_size: {mini // size} micro-batches of {size} rows are not a multiple "
                              f"of the pipeline's {yaml_where} = {pipeline}")
        return mini // size

    def _with_solutions(self, dataset: PromptDataset) -> PromptDataset:
        if not dataset.has_solutions:
            dataset.recover_solutions(self.tokenizer.decode_batch, extract_answer)
            self.log(f"{dataset.path}: no solution column (MindRLHF's format); solutions taken from the answer "
                     f"part of pretrain_ids")
        return dataset

    def _setup_models(self):
        run = self.cfg.run
        self.policy = CausalLM(self.model_cfg, self.train_mesh)
        if run.load_sft_checkpoint_train:
            load_weights(self.policy, run.load_sft_checkpoint_train)
        same_layout = (self.train_mesh.dp, self.train_mesh.tp, self.train_mesh.pp) == \
            (self.infer_mesh.dp, self.infer_mesh.tp, self.infer_mesh.pp)
        if same_layout and self.infer_model_cfg.param_init_type == self.model_cfg.param_init_type:
            self.rollout_model = self.policy           # the seam: one model serves both roles
        else:
            self.rollout_model = CausalLM(self.infer_model_cfg, self.infer_mesh)
        shared = self.rollout_model is self.policy
        self.weight_sync = WeightSync(self.policy.weights(), None if shared else self.rollout_model.weights(),
                                      run.reshard_transport, log=self.log)
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
                copy_params(self.policy.get_parameters(), self.ref_model.get_parameters())

    def _setup_training(self):
        rl, opt, smp = self.cfg.rl, self.cfg.optim, self.cfg.sampling
        self.shared_prompt = self._shared_prompt()
        self.engine = make_engine(self.cfg.run.rollout_backend, self.rollout_model, self.pad_id, self.prompt_width,
                                  self.cfg.run.max_num_seqs)
        params = list(self.policy.trainable_params())
        self.optimizer = AdamW(params, opt.weight_decay, opt.beta1, opt.beta2, opt.eps)
        specs = param_specs(self.model_cfg)
        split = [self.train_mesh.tp > 1 and specs[p.name][1] is not None for p in params]
        temperature = self.sampling_params().logprob_temperature    # the log-prob convention (sampling.py)
        self.on_policy = self._one_update_per_rollout()
        shared, m, pp = self.shared_prompt, self.micro_batches, self.train_mesh.pp
        loss_cell = GRPOLossCell(self.policy, rl, smp.max_tokens, temperature, self.on_policy, m, shared)
        if m > 1 or pp > 1:
            self.train_step = PipelineTrainStep(loss_cell, self.optimizer, self.train_mesh, split, opt.max_grad_norm, m)
        else:
            self.train_step = PolicyTrainStep(loss_cell, self.optimizer, self.train_mesh, split, opt.max_grad_norm)

        def logprob_cell(model):
            if pp == 1:
                return ResponseLogProb(model, smp.max_tokens, temperature, shared)
            return PipelineLogProb(model, smp.max_tokens, temperature, m)

        self.policy_logprob = logprob_cell(self.policy)
        self.ref_logprob = logprob_cell(self.ref_model) if self.ref_model else None
        self.updates_per_step = rl.num_iterations * self.geometry.minibatches
        sw, separate = self.cfg.swap, self.rollout_model is not self.policy
        self.swap = SwapSchedule({
            "policy": SwapGroup("policy", self.policy.get_parameters(), sw.offload_train_param and separate),
            "optimizer": SwapGroup("optimizer", self.optimizer.state_parameters(), sw.offload_train_optimizer),
            # the weight sync rewrites every rollout parameter after each update, before any rollout reads
            # them again: offloading them needs no host copy, so this saves memory even on a CPU-only host
            "rollout": SwapGroup("rollout", self.rollout_model.get_parameters(), sw.offload_infer_param and separate,
                                 keep_contents=False),
            "ref": SwapGroup("ref", self.ref_model.get_parameters() if self.ref_model else [], sw.offload_ref_param),
            # filled after the first rollout; prefill rewrites the whole cache, so no host copy is kept
            "kv_cache": SwapGroup("kv_cache", [], sw.offload_kv_cache, keep_contents=False),
        })
        if self.swap.any_enabled and not on_ascend():
            self.log("note: on CPU, swapped buffers' pages are released; the policy, optimizer and reference keep a "
                     "host copy in the same RAM (device-side footprint drops, process total does not), the rollout "
                     "weights and KV cache keep none (both drop) (mindrlhf/parallel/swap.py)")
        self.total_updates = self.cfg.run.total_steps * self.updates_per_step

    def _shared_prompt(self) -> Tuple[int, int]:
        """(group, prompt width) when the log-prob and training forwards run each prompt once for its group
        (run.share_prompt, models/qwen2.SharedPrompt), else (0, 0) - with a note when asked for but not possible."""
        g, mesh = self.cfg.rl.num_generations, self.train_mesh
        if not self.cfg.run.share_prompt or g == 1:
            return 0, 0
        mini = self.geometry.mini_batch
        micro_rows = mini // self.micro_batches
        obstacles = [(mesh.pp > 1, "pipeline stages"), (mesh.seq_parallel, "sequence parallelism"),
                     (mini % g, f"mini-batches of {mini} rows split groups of {g}"),
                     (micro_rows % g, f"micro-batches of {micro_rows} rows split groups of {g}"),
                     (self.cfg.sampling.max_tokens < 2, "one-token responses")]
        why = next((reason for present, reason in obstacles if present), "")
        if why:
            self.log(f"note: run.share_prompt: every row runs its prompt itself ({why} in the train layout)")
            return 0, 0
        return g, self.prompt_width

    def sampling_params(self, greedy=False) -> SamplingParams:
        fields = dict(dataclasses.asdict(self.cfg.sampling), n=self.cfg.rl.num_generations,
                      eos_token_ids=self.eos_ids, seed=self.cfg.run.seed)
        if greedy:
            fields.update(temperature=0.0, n=1)
        return SamplingParams(**fields)

    # ---- phases ---------------------------------------------------------------------------------------
    def rollout(self, batch, round_index: int = 0) -> SampleBatch:
        """This infer-DP replica's prompts; prompt i of the step's global batch is sampled with key (step, i),
        and of a dynamic-sampling round r > 0 with key (step, r x prompts per round + i)."""
        prompts = [row[:n].tolist() for row, n in zip(batch["prompt_ids"], batch["prompt_length"])]
        offset = self.infer_mesh.dp_index * len(prompts)
        first = round_index * len(prompts) * self.infer_mesh.dp
        keys = [(self.step, first + offset + i) for i in range(len(prompts))]
        kv = self.swap.groups["kv_cache"]
        kv.reload()
        out = self.engine.generate(prompts, self.sampling_params(), keys)
        kv.params = self.engine.cache_parameters()
        kv.enabled = self.cfg.swap.offload_kv_cache and bool(kv.params)
        kv.offload()
        ids, mask = left_pad(out.prompt_ids, self.prompt_width, self.pad_id)
        return SampleBatch(ids, mask, out.response_ids, out.response_mask, out.logprobs,
                           (out.prompt_index + offset).astype(np.int64),
                           np.array([r == "stop" for r in out.finish_reason], np.int64))

    def score(self, samples: SampleBatch, solutions: List[str]):
        texts = self.tokenizer.decode_batch([r[m == 1].tolist() for r, m in zip(samples.response_ids,
                                                                               samples.response_mask)])
        sols = [solutions[i] for i in samples.solution_index]
        # each sample is scored once, by one rank, and every rank uses those numbers: a verifier near its
        # time limit, or one that differs by host, cannot give TP peers different rewards
        mine = range(self.rank, len(texts), self.world)
        table = np.zeros((len(texts), self.reward_fn.columns), np.float32)
        table[mine] = self.reward_fn.score_rows([texts[i] for i in mine], [sols[i] for i in mine])
        result = self.reward_fn.scores_of(exchange.rows_of_all_ranks(table))
        return np.array(result.total, np.float32), result, texts

    def logprobs(self, cell, samples: SampleBatch) -> np.ndarray:
        out = []
        mb = self.geometry.mini_batch
        for start in range(0, len(samples), mb):
            t = training_tensors(samples.rows(start, start + mb))
            out.append(cell(t["input_ids"], t["position_ids"], t["bias"], t["labels"]).asnumpy())
        return np.concatenate(out)

    def update(self, samples: SampleBatch, train_mask, old_logp, ref_logp, advantages, token_norms) -> np.ndarray:
        """num_iterations passes over this rank's mini-batches; returns UPDATE_STATS over the updates (MAX_STATS
        by max, the rest by mean). `train_mask` is the response mask the loss sees (masked groups and, with
        mask_truncated_completions, truncated rows zeroed)."""
        stats, mb = [], self.geometry.mini_batch
        for _ in range(self.cfg.rl.num_iterations):
            for k in range(self.geometry.minibatches):
                sl = slice(k * mb, (k + 1) * mb)
                update_index = int(self.optimizer.step.asnumpy()[0])
                lr = scheduled_lr(update_index, self.cfg.optim, self.total_updates)
                out = self.train_step(*train_step_inputs(samples.rows(sl.start, sl.stop), train_mask[sl],
                                                         old_logp[sl], ref_logp[sl], advantages[sl], token_norms[k], lr))
                stats.append([float(x.asnumpy()) for x in out] + [lr])
        stats = np.array(stats, np.float64)
        return np.array([stats[:, i].max() if name in MAX_STATS else stats[:, i].mean()
                         for i, name in enumerate(UPDATE_STATS)])

    def _compile_train_step(self):
        """Compile the training graph now, before the first rollout (utils/compile_ahead.py says why: the
        rollout and reference graphs, compiled after it, reuse the heap its compile freed). Its inputs have
        static shapes: a mini-batch of [prompt | response] rows. The pipelined step compiles per stage and
        micro-batch at its first update, as before."""
        if not isinstance(self.train_step, PolicyTrainStep):
            return
        if not compile_ahead.available():
            self.log("note: this MindSpore has no jit executor to compile ahead with; the training graph "
                     "compiles at the first update (utils/compile_ahead.py)")
            return
        t0 = time.time()
        blank = SampleBatch.blank(self.geometry.mini_batch, self.prompt_width, self.cfg.sampling.max_tokens)
        logp = blank.rollout_logp
        compile_ahead.compile_jit_cell(self.train_step, *train_step_inputs(
            blank, blank.response_mask, logp, logp, np.zeros(len(blank), np.float32), 1.0, 0.0))
        self.log(f"compiled the training step in {time.time() - t0:.1f} s")

    def _generate_round(self, phase, round_index: int) -> ScoredBatch:
        """One global batch of prompts: rollout on each infer replica, gathered, scored (overlong penalty
        included)."""
        global_batch = self.dataset.next_global_batch()
        local = phase("rollout", self.rollout, self.dataset.local_part(global_batch), round_index)
        samples = phase("gather", exchange.gather_samples, local, self.infer_mesh)
        solutions = [str(s) for s in global_batch["solution"]]
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
        stats.update({"tokens_generated": float(every.samples.response_mask.sum()),
                      "dynamic_sampling/rounds": float(len(rounds)),
                      "dynamic_sampling/kept_groups": float(batch.group_mask.sum()),
                      "dynamic_sampling/masked_groups": float((~batch.group_mask).sum()),
                      "reward_mean_generated": float(every.rewards.mean())})
        return batch, stats

    def train_one_step(self) -> Dict[str, float]:
        times, peaks = {}, {}

        def phase(name, fn, *args):
            watchdog.enter(name)
            memory.reset_peak()
            t0 = time.time()
            result = fn(*args)
            times[name] = times.get(name, 0.0) + time.time() - t0
            peaks[name] = max(peaks.get(name, 0.0), memory.peak_mb())
            return result

        rl = self.cfg.rl
        t_step = time.time()
        swap_before = self.swap.seconds
        self.swap.enter("rollout")
        batch, collect_stats = self.collect(phase)
        samples, rewards, group_mask = batch.samples, batch.rewards, batch.group_mask
        self.rollout_log.add(self.step + 1, samples, batch.texts, rewards, batch.solutions, self.tokenizer)
        advantages = group_advantages(rewards, rl.num_generations, rl.adv_norm_std)
        train_mask = samples.response_mask * np.repeat(group_mask, rl.num_generations)[:, None]
        if rl.mask_truncated_completions:
            train_mask = train_mask * samples.finished[:, None]
        mine = self.geometry.rows_of(self.train_mesh.dp_index)
        my_samples = samples.take(mine)
        if self.shared_prompt[0]:
            my_samples.check_groups(self.shared_prompt[0])
        skip = rl.dynamic_sampling and not group_mask.any()      # nothing informative: no update at all
        if self.on_policy or skip:
            old_logp = my_samples.rollout_logp          # the loss cell uses its own detached log-probs
        else:
            self.swap.enter("logprob")
            old_logp = phase("old_logprob", self.logprobs, self.policy_logprob, my_samples)
        ref_logp = np.zeros_like(old_logp)
        if self.ref_logprob and not skip:
            self.swap.enter("ref_logprob")
            ref_logp = phase("ref_logprob", self.logprobs, self.ref_logprob, my_samples)
        if self.cfg.run.save_data_file:
            phase("save_data_file", self._write_experience, samples, train_mask, mine, ref_logp, advantages)
        self.swap.enter("train")
        if skip:
            local_stats = np.zeros(len(UPDATE_STATS))
        else:
            local_stats = phase("train", self.update, my_samples, train_mask[mine], old_logp, ref_logp,
                                advantages[mine], self.geometry.token_norms(train_mask))
        off_policy_gap = [0.0, 0.0]          # the on-policy gap comes from the train step itself
        if not (self.on_policy or skip):
            gap = np.abs(my_samples.rollout_logp - old_logp)[my_samples.response_mask.astype(bool)]
            off_policy_gap = [gap.sum(), gap.size]
        stats = exchange.mean_over_ranks(list(local_stats) + off_policy_gap)
        result = dict(zip(UPDATE_STATS, stats.tolist()))
        if rl.tis:                           # the only statistics reduced by max (one more collective)
            maxima = exchange.max_over_ranks([local_stats[UPDATE_STATS.index(k)] for k in MAX_STATS])
            result.update(zip(MAX_STATS, maxima.tolist()))
        if not (np.isfinite(result["loss"]) and np.isfinite(result["grad_norm"])):
            raise TrainingError(f"step {self.step + 1}: the loss or gradient norm is not finite (NaN/inf) on at least "
                                f"one rank (loss={result['loss']}, grad_norm={result['grad_norm']}); the last checkpoint "
                                f"is untouched. Lower optim.lr or check the data and weights")
        self.swap.enter("sync")
        phase("weight_sync", self.weight_sync.sync)
        self.step += 1
        if self._reference_moves() and self.step % rl.ref_sync_steps == 0:
            self.swap.groups["ref"].reload()
            copy_params(self.policy.get_parameters(), self.ref_model.get_parameters())   # same layout: local
        drop = {"on_policy_gap"} | (set() if rl.tis else set(TIS_STATS))
        metrics = {k: v for k, v in result.items() if k not in drop}
        metrics["rollout_train_logprob_gap"] = (result["on_policy_gap"] if self.on_policy
                                                else float(stats[-2] / max(stats[-1], 1.0)))
        metrics.update(sample_metrics(samples, rewards, batch.scores))
        metrics.update(collect_stats)
        if skip:
            metrics["dynamic_sampling/skipped_update"] = 1.0
        metrics.update({f"time_{k}": v for k, v in times.items()})
        metrics.update({f"peak_mb_{k}": v for k, v in peaks.items()})
        metrics["time_swap"] = self.swap.seconds - swap_before
        metrics["swap_host_mb"] = self.swap.host_bytes / 2**20
        metrics["time_step"] = time.time() - t_step
        metrics["rollout_tokens_per_s"] = metrics["tokens_generated"] / max(times["rollout"], 1e-9)
        return metrics

    def _write_experience(self, samples, train_mask, mine, ref_logp, advantages):
        full_ref = exchange.rows_of_all_replicas(ref_logp, mine, len(samples), self.train_mesh)
        if self.rank == 0:
            write_experience(self.cfg.run.save_data_file, samples, train_mask, full_ref, advantages)

    def _one_update_per_rollout(self) -> bool:
        """The weights that sampled are the ones trained: the old log-probs are the train forward's own
        (detached), and the separate old-policy pass is skipped."""
        return self.cfg.rl.num_iterations == 1 and self.geometry.minibatches == 1

    def _reference_moves(self) -> bool:
        """True when the reference model is re-synced from the policy, so checkpoints must hold it."""
        return self.ref_model is not None and self.cfg.rl.ref_sync_steps > 0

    # ---- evaluation, checkpoints, the loop ----------------------------------------------------------
    def evaluate(self) -> float:
        """Greedy accuracy on up to eval_prompts held-out prompts, split over infer-DP replicas, in chunks of
        the rollout's rows per replica: the decode graphs the rollout compiled serve here too (a deep model's
        decode graph costs seconds to compile and memory to keep)."""
        watchdog.enter("eval")
        table = self.eval_dataset.table
        n = min(self.cfg.run.eval_prompts, len(table["prompt_ids"]))
        idx = np.arange(n)[self.infer_mesh.dp_index::self.infer_mesh.dp]
        prompts = [table["prompt_ids"][i][:table["prompt_length"][i]].tolist() for i in idx]
        self.swap.groups["kv_cache"].reload()
        rows = self.cfg.rl.batch_size * self.cfg.rl.num_generations
        texts = []
        for start in range(0, len(prompts), rows):
            out = self.engine.generate(prompts[start:start + rows], self.sampling_params(greedy=True))
            texts += self.tokenizer.decode_batch([r[m == 1].tolist()
                                                  for r, m in zip(out.response_ids, out.response_mask)])
        correct = sum(v or 0.0 for v in score_each(accuracy_reward, texts, [table["solution"][i] for i in idx],
                                                   self.cfg.reward.verifier_timeout))
        total = exchange.sum_over_replicas([correct, len(idx)], self.infer_mesh)
        return float(total[0] / max(total[1], 1))

    def layout_state(self) -> Dict:
        state = {"world_size": self.world, "train": [self.train_mesh.dp, self.train_mesh.tp],
                 "infer": [self.infer_mesh.dp, self.infer_mesh.tp]}
        if self.train_mesh.pp > 1:
            state["train_pipeline_stage"] = self.train_mesh.pp
        return state

    def save(self):
        watchdog.enter("save")
        run = self.cfg.run
        self.rollout_log.flush()             # before COMPLETE: a complete step always has its rollout rows
        extra = {"ref": self.ref_model} if self._reference_moves() else {}
        with self.swap.resident("optimizer", *(["ref"] if extra else [])):
            checkpointing.save_training_checkpoint(
                run.save_ckpt_dir, self.step, self.rank, self.policy, self.optimizer,
                rank_state={"data": self.dataset.state_dict()},
                trainer_state={"step": self.step, "layout": self.layout_state(), "run_id": self.run_id},
                keep=run.keep_checkpoints, extra_models=extra, marks=self._marks_checkpoints())

    def _resume(self):
        watchdog.enter("resume")
        extra = {"ref": self.ref_model} if self._reference_moves() else {}
        root = self.cfg.run.save_ckpt_dir
        step = checkpointing.agreed_resume_step(root, self.cfg.run.checkpoint_storage == "shared", self.nodes)
        recorded = self.run_id = run_dir.run_id_of(root)
        if self._marks_checkpoints():
            checkpointing.drop_steps_after(root, step or 0)      # never written into again
            self.run_id = recorded or run_dir.new_run(root)
        state = None if step is None else checkpointing.load_training_checkpoint(
            root, self.rank, self.policy, self.optimizer, extra_models=extra, expect_layout=self.layout_state(),
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

    def export_policy(self, out_dir: str):
        """Write the policy as HF safetensors (rank 0), its full tensors assembled from one replica each."""
        watchdog.enter("export")
        full = exchange.full_policy(self.policy)
        if self.rank == 0:
            export_hf(full, out_dir, self.model_cfg, tokenizer_dir=self.cfg.run.vocab_path,
                      overwrite=self.cfg.run.overwrite_ckpt_dir, flag="save_ckpt_dir/" + run_dir.EXPORT_DIR)
        exchange.barrier()

    def _train_layout_text(self) -> str:
        m = self.train_mesh
        text = f"dp={m.dp} tp={m.tp}" + (f" pp={m.pp} (1F1B)" if m.pp > 1 else "")
        text += " sequence parallel" if m.seq_parallel else ""
        return text + (f", {self.micro_batches} micro-batches per update" if self.micro_batches > 1 else "")

    def fit(self) -> List[Dict[str, float]]:
        run = self.cfg.run
        history = []
        self.log(f"GRPO: {self.world} rank(s); train layout {self._train_layout_text()}; "
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
        self.swap.reload_all()
        self.weight_sync.close()
        self.rollout_log.flush()
        if run.export_hf:
            self.export_policy(os.path.join(run.save_ckpt_dir, run_dir.EXPORT_DIR))
        self.metrics.close()
        watchdog.stop()
        return history
