"""This process's part of a GRPO job, set up before anything is built: rank and nodes, the watchdog, the
checks that every node runs the same job on storage they agree on, the run's claim on save_ckpt_dir, CPU
kernel threads and the compile cache."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

import mindspore as ms

from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.grpo_config import GRPOConfig
from mindrlhf.parallel import watchdog
from mindrlhf.parallel.mesh import init_distributed
from mindrlhf.parallel.swap import on_ascend
from mindrlhf.parallel.topology import Nodes, discover_nodes, ranks_not_sharing
from mindrlhf.trainer import checkpointing, run_dir
from mindrlhf.trainer.node_check import check_nodes_agree, compile_cache_dir
from mindrlhf.trainer.resolve import ResolvedRun
from mindrlhf.utils import cpu_threads


@dataclass(frozen=True)
class Process:
    rank: int
    world: int
    nodes: Nodes
    marks_checkpoints: bool     # this rank marks steps complete (rank 0, or each node's leader when node-local)
    log: Callable               # prints on rank 0 only
    run_id: Optional[str]       # this run's id in save_ckpt_dir (run_dir.py); a resume reads it from there


def join(use_parallel: bool, watchdog_timeout: float, log: Callable = print):
    """(rank, world, nodes, log printing on rank 0 only, the calling-thread setting or None): msrun's process
    group (or one process) with the watchdog running. Every job of ours (training, eval) starts here."""
    blocking = None
    if not on_ascend():                   # before anything runs
        cpu_threads.refuse_graph_kernel_fusion()
        blocking = cpu_threads.run_in_calling_thread()
    rank, world = init_distributed() if use_parallel else (0, 1)
    log = log if rank == 0 else (lambda *a, **k: None)
    nodes = discover_nodes() if use_parallel else Nodes([0], 0)
    if use_parallel:
        watchdog.start(watchdog_timeout, rank, nodes.node_of_rank[rank])
    return rank, world, nodes, log, blocking


def start(cfg: GRPOConfig, log: Callable = print) -> Process:
    rank, world, nodes, log, blocking = join(cfg.run.use_parallel, cfg.run.watchdog_timeout, log)
    if cfg.run.use_parallel:
        check_nodes_agree(cfg, nodes)    # before anything else: every node runs the same job
    _report_storage(cfg, nodes, log)
    marks = rank == 0 if cfg.run.checkpoint_storage == "shared" else nodes.leader
    run_id = None if cfg.run.resume else run_dir.claim(cfg.run, rank, marks, log)
    set_cpu_threads(cfg.run.cpu_threads, nodes, log)
    if blocking is not None:
        log(f"MindSpore host work in the calling thread: {cpu_threads.BLOCKING_RUN}={blocking} "
            f"(utils/cpu_threads.py says why)")
    return Process(rank, world, nodes, marks, log, run_id)


def set_compile_cache(run: ResolvedRun, log: Callable):
    """run.enable_compile_cache: MindSpore's compile cache in this job's own directory. Off, it is off for
    MindSpore too: MS_COMPILER_CACHE_ENABLE in the environment would otherwise turn on a cache keyed by
    the Python sources only, and another job's graphs would run (node_check.compile_cache_dir). Refused with
    pipeline stages, the one way of running the update whose re-run from the cache no test covers
    (tests/test_trainer.py covers one graph, micro-batches, packed rows and a graph per layer). Call before
    anything compiles."""
    cfg = run.cfg
    if cfg.run.enable_compile_cache:
        if run.train_mesh.pp > 1:
            raise ConfigError(f"run.enable_compile_cache: not verified with pipeline stages (pipeline_stage "
                              f"{run.train_mesh.pp}): a re-run from the cache is tested to train exactly as the first "
                              f"run for the other ways of running the update only; set enable_compile_cache false")
        resume_step = (checkpointing.complete_steps(cfg.run.save_ckpt_dir) or [0])[-1] if cfg.run.resume else 0
        cache_dir = compile_cache_dir(cfg, resume_step)
        ms.set_context(enable_compile_cache=True, compile_cache_path=cache_dir)
        log(f"compile cache: {cache_dir} (this job's; another config, model, tokenizer, dataset or resume step "
            f"gets another directory)")
        return
    env = os.environ.get("MS_COMPILER_CACHE_ENABLE", "")
    if env.strip() not in ("", "0"):      # off by default: said only then (set_context warns it is deprecated)
        ms.set_context(enable_compile_cache=False)
        log(f"note: MS_COMPILER_CACHE_ENABLE={env} ignored: MindSpore's cache there is keyed by the Python "
            f"sources only, so another job's graphs would run; run.enable_compile_cache: true caches per job")


def _report_storage(cfg: GRPOConfig, nodes: Nodes, log: Callable):
    """Say which checkpoint storage is in use; a 'shared' directory that is not one directory for every
    rank is an error before any training (collective)."""
    run, n = cfg.run, nodes.count
    if run.checkpoint_storage == "shared":
        os.makedirs(run.save_ckpt_dir, exist_ok=True)
        missing = ranks_not_sharing(run.save_ckpt_dir) if run.use_parallel else []
        if missing:
            raise ConfigError(f"save_ckpt_dir {run.save_ckpt_dir}: not one directory for every rank (rank "
                              f"{missing[0]}, node {nodes.node_of_rank[missing[0]]}, does not see what rank 0 "
                              f"writes there); put it on a filesystem every node shares, or set "
                              f"checkpoint_storage: node_local")
        log(f"checkpoints: {run.save_ckpt_dir}, one directory shared by {n} node(s); rank 0 marks steps complete")
    else:
        log(f"checkpoints: node-local {run.save_ckpt_dir} on each of {n} node(s); each node's lowest rank marks its "
            f"shards complete; metrics, rollout log and HF export are written on node 0")


def set_cpu_threads(requested: int, nodes: Nodes, log: Callable):
    """MindSpore's CPU kernels default to 25 threads per process; utils.cpu_threads says why and what we
    use instead (`requested`: run.cpu_threads, 0 = derived from the cores and the node's ranks)."""
    if on_ascend():
        return
    if requested:
        threads, why = requested, "run.cpu_threads"
    else:
        threads, why = cpu_threads.auto_threads(nodes.local_ranks)
    in_force = cpu_threads.set_kernel_threads(threads)
    if in_force != threads:
        log(f"note: CPU kernel threads stay {in_force} (set earlier in this process; MindSpore takes it once), "
            f"not {threads}")
        return
    log(f"CPU kernel threads per rank: {threads} ({why})")
