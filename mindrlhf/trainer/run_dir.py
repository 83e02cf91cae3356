"""What a training run owns, so two runs never mix in one save_ckpt_dir.

A run's state: its step folders, `RUN` (the run's id, written at start), the HF export (`hf_policy`) in
save_ckpt_dir; metrics.jsonl and TensorBoard events in log_dir; the rollout log. A fresh run (resume off)
finding another run's state refuses to start, naming it, unless `overwrite_ckpt_dir`, which deletes that
state first; otherwise the old run's checkpoints would be pruned against the new run's steps, a later resume
would pick the old run's newer step and metrics would be appended to. Each checkpoint's trainer_state
records the run id; resume refuses a step another run wrote. Strategy files and the compile cache are not a
run's state: they stay.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import Callable, List, Optional

from mindrlhf.configs.errors import CheckpointError, ConfigError
from mindrlhf.trainer import exchange
from mindrlhf.trainer.checkpointing import step_folders
from mindrlhf.configs.grpo_load import resolved_config_text
from mindrlhf.utils.atomic import write_json, write_text

RUN_FILE = "RUN"
CONFIG_FILE = "config_resolved.yaml"      # every field of the run with its origin, rewritten at each start
EXPORT_DIR = "hf_policy"
ADAPTER_EXPORT_DIR = "hf_adapter"       # a LoRA run's adapter in PEFT's format


def run_state(save_ckpt_dir: str, files: List[str]) -> List[str]:
    """The paths of a run's state present now: in save_ckpt_dir, and those of `files` (metrics, TensorBoard,
    rollout log) that exist."""
    owned = [os.path.join(save_ckpt_dir, n) for n in (RUN_FILE, EXPORT_DIR, ADAPTER_EXPORT_DIR)]
    found = sorted(list(step_folders(save_ckpt_dir).values()) + [p for p in owned if os.path.lexists(p)])
    return found + [f for f in files if f and os.path.exists(f) and f not in found]


def remove(paths: List[str]):
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)


def new_run(save_ckpt_dir: str) -> str:
    """Write RUN with a fresh id, the directory created first (node-local storage: a node's directory may not
    exist yet); returns it."""
    run_id = uuid.uuid4().hex
    os.makedirs(save_ckpt_dir, exist_ok=True)
    write_json(os.path.join(save_ckpt_dir, RUN_FILE), {"run_id": run_id})
    return run_id


def run_id_of(save_ckpt_dir: str) -> Optional[str]:
    """The id in RUN (None when there is none: a directory written before runs had ids)."""
    path = os.path.join(save_ckpt_dir, RUN_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return str(json.load(fh)["run_id"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path}: not a run file ({err}); it names the run this directory holds") from None


def check_same_run(state: dict, step_dir: str, run_id: Optional[str]):
    """Resume: the step's trainer_state must name this directory's run (when both are recorded)."""
    saved = state.get("run_id")
    if run_id is not None and saved is not None and saved != run_id:
        raise CheckpointError(f"{step_dir}: written by run {saved}, but {RUN_FILE} names run {run_id}: this "
                              f"directory mixes two runs; resume from a directory holding one run")


def claim(run, rank: int, marks: bool, log: Callable[[str], None]) -> Optional[str]:
    """Collective, at start of a fresh run: refuse (every rank alike) when any rank sees another run's state,
    or with run.overwrite_ckpt_dir delete it; the marking ranks then write RUN. Returns the run id there.
    A RUN with nothing beside it is a run that stopped before saving anything (RUN is written before the
    model paths are checked): nothing of it could mix with this run, so it is replaced, and said."""
    log_dir = run.log_dir or run.save_ckpt_dir
    files = [os.path.join(log_dir, "metrics.jsonl"), os.path.join(log_dir, "tensorboard"),
             run.rollout_log_file] if rank == 0 else []        # rank 0 writes these
    found = run_state(run.save_ckpt_dir, files) if (marks or rank == 0) else []
    if found == [os.path.join(run.save_ckpt_dir, RUN_FILE)]:
        log(f"save_ckpt_dir {run.save_ckpt_dir}: the RUN of a run that saved nothing (no checkpoint, export, metrics "
            f"or rollout log) is replaced by this run's")
        found = []
    flagged = exchange.ranks_flagging(bool(found))
    if flagged and not run.overwrite_ckpt_dir:
        what = (f"holds another run's state ({', '.join(os.path.basename(f) for f in found[:3])}"
                f"{', ...' if len(found) > 3 else ''})" if found else f"holds another run's state (rank {flagged[0]} "
                                                                      f"sees it)")
        raise ConfigError(f"save_ckpt_dir {run.save_ckpt_dir}: {what}; continue it with resume: true, choose "
                          f"another save_ckpt_dir, or set overwrite_ckpt_dir: true to delete that run's "
                          f"checkpoints, metrics and rollout log first")
    remove(found)
    exchange.barrier()
    return new_run(run.save_ckpt_dir) if marks else None


def write_resolved_config(cfg, rank: int):
    """Rank 0 writes the resolved config (every field, value and origin) into save_ckpt_dir, atomically."""
    if rank == 0 and cfg.run.save_ckpt_dir:
        os.makedirs(cfg.run.save_ckpt_dir, exist_ok=True)
        write_text(os.path.join(cfg.run.save_ckpt_dir, CONFIG_FILE), resolved_config_text(cfg))
