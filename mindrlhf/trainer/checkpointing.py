"""Training checkpoints: per-rank shards written atomically, a step counts only once marked COMPLETE.

    save_ckpt_dir/step_000010/rank_0/{policy,optimizer[,ref]}.safetensors + rank_state.json
    save_ckpt_dir/step_000010/trainer_state.json, COMPLETE

Every file is fsynced before it is renamed into place and COMPLETE is written last, after every rank's
shard is durable: a crash (or power loss) while saving leaves a step directory without COMPLETE, which
resume skips and the next save prunes. `ref` is saved when the reference model moves (ref_sync_steps).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from typing import Dict, List, Optional


from mindrlhf.checkpoint.model_io import (load_sharded_weights, model_state, rank_dir, read_checkpoint, save_checkpoint,
                                         write_param)
from mindrlhf.configs.errors import CheckpointError
from mindrlhf.parallel import comm
from mindrlhf.utils.atomic import atomic_dir, write_json

_STEP_RE = re.compile(r"^step_(\d+)$")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step_{step:06d}")


def complete_steps(root: str) -> List[int]:
    if not os.path.isdir(root):
        return []
    steps = []
    for name in os.listdir(root):
        m = _STEP_RE.match(name)
        if m and os.path.isfile(os.path.join(root, name, "COMPLETE")):
            steps.append(int(m.group(1)))
    return sorted(steps)


def save_training_checkpoint(root: str, step: int, rank: int, policy, optimizer, rank_state: Dict,
                             trainer_state: Dict, keep: int, extra_models: Dict = None):
    """Collective: every rank writes its shard; rank 0 marks the step complete and prunes old steps."""
    target = step_dir(root, step)
    os.makedirs(target, exist_ok=True)
    with atomic_dir(rank_dir(target, rank)) as tmp:
        save_checkpoint(model_state(policy), os.path.join(tmp, "policy.safetensors"))
        opt_state = {p.name: p.asnumpy() for p in optimizer.state_parameters()}
        save_checkpoint(opt_state, os.path.join(tmp, "optimizer.safetensors"))
        for name, model in (extra_models or {}).items():
            save_checkpoint(model_state(model), os.path.join(tmp, f"{name}.safetensors"))
        write_json(os.path.join(tmp, "rank_state.json"), rank_state)
    comm.barrier()
    if rank == 0:
        write_json(os.path.join(target, "trainer_state.json"), trainer_state)
        write_json(os.path.join(target, "COMPLETE"), {"step": step})
        _prune(root, keep)
    comm.barrier()


def _prune(root: str, keep: int):
    done = complete_steps(root)
    newest = done[-1] if done else -1
    for name in os.listdir(root):
        m = _STEP_RE.match(name)
        if not m:
            continue
        s = int(m.group(1))
        if (s in done and s not in done[-keep:]) or (s not in done and s < newest):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def load_training_checkpoint(root: str, rank: int, policy, optimizer, extra_models: Dict = None,
                             expect_layout: Dict = None) -> Optional[Dict]:
    """Restore the newest complete step into policy/optimizer (and `extra_models`); returns its states or
    None if there is none. A checkpoint saved with another world size or layout is refused, naming both."""
    steps = complete_steps(root)
    if not steps:
        return None
    target = step_dir(root, steps[-1])
    with open(os.path.join(target, "trainer_state.json"), encoding="utf-8") as fh:
        trainer_state = json.load(fh)
    saved_layout = trainer_state.get("layout")
    if saved_layout is None and expect_layout is not None:     # written before layouts were recorded
        saved_layout = dict(expect_layout, world_size=trainer_state.get("world_size"))
    if expect_layout is not None and saved_layout != expect_layout:
        raise CheckpointError(f"{target}: saved with layout {_describe(saved_layout)}, but this run has "
                              f"{_describe(expect_layout)}; resume with the same world size and layouts, or "
                              f"convert the checkpoint with transform_checkpoint.py")
    shard_dir = rank_dir(target, rank)
    if not os.path.isdir(shard_dir):
        raise CheckpointError(f"{target}: no shard for rank {rank}; was it saved with another world size?")
    load_sharded_weights(policy, read_checkpoint(os.path.join(shard_dir, "policy.safetensors")), shard_dir)
    for name, model in (extra_models or {}).items():
        path = os.path.join(shard_dir, f"{name}.safetensors")
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: missing; this run needs the saved {name} model (it was saved without)")
        load_sharded_weights(model, read_checkpoint(path), shard_dir)
    opt_state = read_checkpoint(os.path.join(shard_dir, "optimizer.safetensors"))
    for p in optimizer.state_parameters():
        if p.name not in opt_state:
            raise CheckpointError(f"{shard_dir}/optimizer.safetensors: missing {p.name}")
        if tuple(opt_state[p.name].shape) != tuple(p.shape):
            raise CheckpointError(f"{shard_dir}/optimizer.safetensors: {p.name} has shape "
                                  f"{tuple(opt_state[p.name].shape)}, expected {tuple(p.shape)}")
        write_param(p, opt_state[p.name])
    with open(os.path.join(shard_dir, "rank_state.json"), encoding="utf-8") as fh:
        rank_state = json.load(fh)
    return {"step": steps[-1], "rank_state": rank_state, "trainer_state": trainer_state, "dir": target}


def _describe(layout: Optional[Dict]) -> str:
    if not layout:
        return "(not recorded)"
    (tdp, ttp), (idp, itp) = layout["train"], layout["infer"]
    return f"world_size={layout['world_size']}, train dp{tdp} x tp{ttp}, infer dp{idp} x tp{itp}"
