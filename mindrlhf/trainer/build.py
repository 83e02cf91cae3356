"""The objects a resolved GRPO run trains with: the policy, rollout, reference and reward models with their
weights loaded and synced, the rollout engine, the optimizer, the compiled train and log-prob steps, and
the swap groups. Built once, after every check in resolve.py has passed."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from mindrlhf.checkpoint.model_io import load_full_weights, load_weights
from mindrlhf.configs.errors import CheckpointError
from mindrlhf.models.lora import BaseModelLogProb, merged_weights
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.parallel.reshard import WeightSync
from mindrlhf.parallel.swap import SwapGroup, on_ascend
from mindrlhf.rollout.backends import make_engine
from mindrlhf.trainer import checkpointing
from mindrlhf.trainer.optim import AdamW
from mindrlhf.trainer.packing import PackedRowLayout
from mindrlhf.trainer.resolve import ResolvedRun
from mindrlhf.trainer.reward_model import RewardModelScorer, build_reward_model
from mindrlhf.trainer.samples import PaddedRows, SampleBatch, train_step_inputs
from mindrlhf.trainer.swap_schedule import SwapSchedule
from mindrlhf.trainer.update.engines import build_update
from mindrlhf.trainer.update.loss_inputs import LossInputs
from mindrlhf.utils import compile_ahead
from mindrlhf.utils.params import copy_params


@dataclass
class Models:
    policy: CausalLM
    rollout_model: CausalLM             # the policy itself when the layouts and dtypes match
    ref_model: Optional[CausalLM]       # only when run.reference is "model"
    weight_sync: WeightSync
    reward_model: Optional[object] = None   # models/reward_model.SequenceClassifier, when run.reward_model


def load_model_weights(model: CausalLM, path: str, log: Callable = print) -> str:
    """`path` into `model`: a training step folder (or the newest complete step of a save_ckpt_dir) assembled
    from its shards whatever layout wrote it, anything else as checkpoint/model_io.load_weights reads it.
    Returns the path read."""
    if os.path.isdir(path) and not checkpointing.is_step_dir(path) and checkpointing.step_folders(path):
        done = checkpointing.complete_steps(path)
        if not done:
            raise CheckpointError(f"{path}: holds step folders but none is marked COMPLETE")
        path = checkpointing.step_dir(path, done[-1])
        log(f"{path}: the newest complete step")
    if checkpointing.is_step_dir(path):
        load_full_weights(model, checkpointing.policy_tensors(path, model.config), path)
    else:
        load_weights(model, path)
    return path


def model_with_weights(cfg, mesh, weights: str, lora=None, log: Callable = print) -> CausalLM:
    """A model of `cfg` on `mesh` holding `weights` (drawn at random when none are given): how every command
    (training, eval) builds one. A model whose weights are loaded or synced next starts from zeros."""
    model = CausalLM(cfg, mesh, lora, random_init=not weights)
    if weights:
        load_model_weights(model, weights, log)
    return model


def build_models(run: ResolvedRun, log: Callable) -> Models:
    paths = run.cfg.run
    policy = model_with_weights(run.model_cfg, run.train_mesh, paths.load_sft_checkpoint_train, run.lora, log)
    t, i = run.train_mesh, run.infer_mesh
    if t.same_layout(i) and run.infer_model_cfg.param_init_type == run.model_cfg.param_init_type:
        rollout = policy                   # the seam: one model serves both roles
    else:
        rollout = CausalLM(run.infer_model_cfg, run.infer_mesh, random_init=False)
    shared = rollout is policy
    # a policy with adapters runs them itself when it serves rollout; a separate rollout model receives the
    # merged weights W + scale B A through the same re-layout
    sync = WeightSync(merged_weights(policy), None if shared else rollout.weights(), paths.reshard_transport, log=log)
    if paths.load_sft_checkpoint_infer and not shared:
        load_model_weights(rollout, paths.load_sft_checkpoint_infer, log)   # checked by the logprob gap
    else:
        sync.sync()                        # rollout starts from the policy's weights
    ref = None
    if run.reference == "model":
        ref = CausalLM(run.model_cfg, run.train_mesh, random_init=False)
        ref_path = paths.load_ref_checkpoint or paths.load_sft_checkpoint_train
        if ref_path:
            load_model_weights(ref, ref_path, log)
        else:
            copy_params(policy.get_parameters(), ref.get_parameters())
    rm = build_reward_model(run.reward_model, log) if run.reward_model else None
    return Models(policy, rollout, ref, sync, rm)


@dataclass
class Training:
    engine: object                      # rollout/backends.py
    optimizer: AdamW
    train_step: object                  # the update engine run.update_graphs names (trainer/update/)
    policy_logprob: object              # the policy's log-prob cell (run.logprob_graphs)
    ref_logprob: Optional[object]       # ... of the reference model
    swap: SwapSchedule
    rows: object                        # samples.PaddedRows or packing.PackedRowLayout: how samples become rows
    reward_model: Optional[RewardModelScorer] = None     # when run.reward_model
    policy_routing: Optional[object] = None  # the policy's routing pass (Update.routing_cell), when run.routing_inputs


def build_training(run: ResolvedRun, models: Models, log: Callable) -> Training:
    opt, sw, smp = run.cfg.optim, run.cfg.swap, run.cfg.sampling
    engine = make_engine(run.cfg.run.rollout_backend, models.rollout_model, run.pad_id, run.prompt_width,
                         run.cfg.run.max_num_seqs, tools=run.episodes)
    optimizer = AdamW(list(models.policy.trainable_params()), opt.weight_decay, opt.beta1, opt.beta2, opt.eps)
    # packed rows: every position may hold a response token, so log-probs come for the whole row; the number
    # of packed micro-batches varies by update, so the update always accumulates over them
    read_len, micro_rows = (run.packing.width, run.packing.micro_rows) if run.packing else (smp.max_tokens, 0)
    update = build_update(run, models.policy, optimizer, read_len, micro_rows)

    separate = models.rollout_model is not models.policy
    ref = models.ref_model
    swap = SwapSchedule({
        "policy": SwapGroup("policy", models.policy.get_parameters(), sw.offload_train_param and separate),
        "optimizer": SwapGroup("optimizer", optimizer.state_parameters(), sw.offload_train_optimizer),
        # the weight sync rewrites every rollout parameter after each update, before any rollout reads
        # them again: offloading them needs no host copy, so this saves memory even on a CPU-only host
        "rollout": SwapGroup("rollout", models.rollout_model.get_parameters(), sw.offload_infer_param and separate,
                             keep_contents=False),
        "ref": SwapGroup("ref", ref.get_parameters() if ref else [], sw.offload_ref_param),
        "reward_model": SwapGroup("reward_model", models.reward_model.get_parameters() if models.reward_model
                                  else [], sw.offload_reward_model_param),
        # filled after the first rollout; prefill rewrites the whole cache, so no host copy is kept
        "kv_cache": SwapGroup("kv_cache", [], sw.offload_kv_cache, keep_contents=False),
    }, offload_kv_cache=sw.offload_kv_cache)
    if swap.any_enabled and not on_ascend():
        log("note: on CPU, swapped buffers' pages are released; the policy, optimizer and reference keep a host copy "
            "in the same RAM (device-side footprint drops, process total does not), the rollout weights and KV "
            "cache keep none (both drop) (mindrlhf/parallel/swap.py)")
    policy_logprob = update.logprob_cell(models.policy)
    ref_logprob = None
    if run.reference == "model":
        ref_logprob = update.logprob_cell(ref)
    elif run.reference == "adapters_off":       # the base: the policy's own graph, adapters off
        ref_logprob = BaseModelLogProb(policy_logprob, models.policy)
    rows = PackedRowLayout(run.pad_id, micro_rows, run.logprob_graphs == "stages") if run.packing \
        else PaddedRows(run.geometry.mini_batch)
    scorer = RewardModelScorer(models.reward_model, run.reward_model, swap) if models.reward_model \
        else None
    routing = update.routing_cell(models.policy) if run.routing_inputs else None
    return Training(engine, optimizer, update.step, policy_logprob, ref_logprob, swap, rows, scorer, routing)


def compile_train_step(run: ResolvedRun, training: Training, log: Callable):
    """Compile the training graph now, before the first rollout (utils/compile_ahead.py says why: the
    rollout and reference graphs, compiled after it, reuse the heap its compile freed). Its inputs have
    static shapes: a mini-batch of [prompt | response] rows. The pipelined step compiles per stage and
    micro-batch at its first update."""
    if run.update_graphs != "one":
        return
    if not compile_ahead.available():
        log("note: this MindSpore has no jit executor to compile ahead with; the training graph compiles at the "
            "first update (utils/compile_ahead.py)")
        return
    t0 = time.time()
    cfg, routed = run.model_cfg, run.routing_inputs
    blank = SampleBatch.blank(run.geometry.mini_batch, run.prompt_width, run.cfg.sampling.max_tokens,
                              (len(cfg.sparse_layers), cfg.num_experts_per_tok) if routed else None)
    logp = blank.rollout_logp
    routing = (blank.input_routing(), np.zeros(blank.input_routing().shape[:2] + (cfg.num_experts,), np.float32)) \
        if routed else (None, None)
    compile_ahead.compile_jit_cell(training.train_step, *train_step_inputs(
        blank, LossInputs(blank.response_mask, logp, logp, logp, np.zeros(len(blank), np.float32), 1.0, *routing),
        0.0))
    log(f"compiled the training step in {time.time() - t0:.1f} s")
