"""Training checkpoints: per-rank shards written atomically, a step counts only once marked COMPLETE.

    save_ckpt_dir/step_000010/rank_0/{policy,optimizer[,ref]}.safetensors + rank_state.json
    (under LoRA `policy` holds the adapters only: the base is the run's load_sft_checkpoint_train)
    save_ckpt_dir/step_000010/trainer_state.json, COMPLETE

Every file is fsynced before it is renamed into place and COMPLETE is written last, after every rank's
shard is durable: a crash (or power loss) while saving leaves a step directory without COMPLETE, which
resume skips and the next save prunes. `ref` is saved when the reference model moves (ref_sync_steps).

Storage (`checkpoint_storage`): `shared` - one save_ckpt_dir every node sees; rank 0 marks and prunes.
`node_local` - each node's own save_ckpt_dir holds its ranks' shards; each node's lowest rank marks and
prunes it. Either way resume takes the newest step complete on every node, agreed by a collective (with
shared storage, nodes that see different steps mean the directory is not shared: an error says so).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from mindrlhf.checkpoint.model_io import (POLICY_FILE, load_sharded_weights, rank_dir, read_checkpoint, save_params,
                                          write_param)
from mindrlhf.checkpoint.safetensors_io import require_float
from mindrlhf.checkpoint.slicing import ShardedSource
from mindrlhf.configs.errors import CheckpointError
from mindrlhf.configs.model_config import layer_split
from mindrlhf.models.lora import saved_names
from mindrlhf.models.specs import layouts_for
from mindrlhf.parallel.mesh import distributed_env
from mindrlhf.parallel.strategy import StrategyEntry
from mindrlhf.trainer import exchange
from mindrlhf.utils.atomic import atomic_dir, write_json

_STEP_RE = re.compile(r"^step_(\d+)$")


def step_folders(root: str) -> Dict[int, str]:
    """step -> path of every step_N folder in `root`, complete or not."""
    if not os.path.isdir(root):
        return {}
    return {int(m.group(1)): os.path.join(root, m.group(0)) for m in map(_STEP_RE.match, os.listdir(root)) if m}


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step_{step:06d}")


def complete_steps(root: str) -> List[int]:
    return sorted(s for s, folder in step_folders(root).items() if os.path.isfile(os.path.join(folder, "COMPLETE")))


def save_training_checkpoint(root: str, step: int, rank: int, policy, optimizer, rank_state: Dict,
                             trainer_state: Dict, keep: int, extra_models: Dict = None, marks: bool = None):
    """Collective: every rank writes its shard; the marking ranks (`marks`: rank 0 with shared storage, each
    node's lowest rank with node-local storage; default rank 0) mark the step complete and prune old steps,
    once every rank's shard is durable."""
    marks = rank == 0 if marks is None else marks
    target = step_dir(root, step)
    if os.path.isfile(os.path.join(target, "COMPLETE")):
        raise CheckpointError(f"{target}: already marked complete; a complete step is never written again (is "
                              f"another run writing to save_ckpt_dir?)")
    os.makedirs(target, exist_ok=True)
    with atomic_dir(rank_dir(target, rank)) as tmp:
        names = saved_names(policy)
        save_params([p for p in policy.get_parameters() if names is None or p.name in names],
                    os.path.join(tmp, POLICY_FILE))
        save_params(optimizer.state_parameters(), os.path.join(tmp, "optimizer.safetensors"))
        for name, model in (extra_models or {}).items():
            save_params(model.get_parameters(), os.path.join(tmp, f"{name}.safetensors"))
        write_json(os.path.join(tmp, "rank_state.json"), rank_state)
    exchange.barrier()
    if marks:
        write_json(os.path.join(target, "trainer_state.json"), trainer_state)
        write_json(os.path.join(target, "COMPLETE"), {"step": step})
        _prune(root, keep)
    exchange.barrier()


def _prune(root: str, keep: int):
    done = complete_steps(root)
    newest = done[-1] if done else -1
    for s, folder in step_folders(root).items():
        if (s in done and s not in done[-keep:]) or (s not in done and s < newest):
            shutil.rmtree(folder, ignore_errors=True)


def drop_steps_after(root: str, step: int):
    """Resume from `step`: later step folders (complete on some nodes only, or never marked) are abandoned;
    their steps are trained and saved again."""
    for s, folder in step_folders(root).items():
        if s > step:
            shutil.rmtree(folder, ignore_errors=True)


def agreed_resume_step(root: str, shared: bool, nodes=None) -> Optional[int]:
    """Collective: the newest step complete in every rank's view of `root` (None if there is none). With
    shared storage every rank must see the same steps; otherwise the directory is not shared."""
    mine = complete_steps(root)
    if distributed_env()[1] == 1:
        return mine[-1] if mine else None
    width = 64                                   # the newest 64 complete steps of each rank's view
    view = np.full(width, -1.0, np.float32)
    view[:len(mine[-width:])] = mine[-width:]
    views = exchange.gather_over_world(view)
    sets = [set(int(v) for v in row if v >= 0) for row in views]
    if shared and any(s != sets[0] for s in sets):
        other = next(r for r, s in enumerate(sets) if s != sets[0])
        where = f" (node {nodes.node_of_rank[other]})" if nodes is not None else ""
        raise CheckpointError(f"{root}: rank {other}{where} sees complete steps {sorted(sets[other])[-5:]}, rank 0 "
                              f"sees {sorted(sets[0])[-5:]}: save_ckpt_dir is not shared between the nodes; set "
                              f"checkpoint_storage: node_local (each node keeps its own ranks' shards)")
    common = set.intersection(*sets)
    return max(common) if common else None


def load_training_checkpoint(root: str, rank: int, policy, optimizer, extra_models: Dict = None,
                             expect_layout: Dict = None, step: Optional[int] = None) -> Optional[Dict]:
    """Restore step `step` (default: the newest complete one in `root`) into policy/optimizer (and
    `extra_models`); returns its states or None if there is none. A checkpoint saved with another world
    size or layout is refused, naming both."""
    if step is None:
        steps = complete_steps(root)
        if not steps:
            return None
        step = steps[-1]
    target = step_dir(root, step)
    with open(os.path.join(target, "trainer_state.json"), encoding="utf-8") as fh:
        trainer_state = json.load(fh)
    saved_layout = trainer_state.get("layout")
    if saved_layout is None and expect_layout is not None:     # written before layouts were recorded
        saved_layout = dict(expect_layout, world_size=trainer_state.get("world_size"))
    if expect_layout is not None and STAGE_LAYERS in expect_layout and STAGE_LAYERS not in saved_layout:
        saved_layout = dict(saved_layout, **{STAGE_LAYERS: expect_layout[STAGE_LAYERS]})   # saved before it was
    if expect_layout is not None and saved_layout != expect_layout:
        raise CheckpointError(f"{target}: saved with layout {_describe(saved_layout)}, but this run has "
                              f"{_describe(expect_layout)}; resume with the same world size and layouts, or "
                              f"convert the checkpoint with transform_checkpoint.py")
    shard_dir = rank_dir(target, rank)
    if not os.path.isdir(shard_dir):
        raise CheckpointError(f"{target}: no shard for rank {rank}; was it saved with another world size?")
    policy_path = os.path.join(shard_dir, POLICY_FILE)
    load_sharded_weights(policy, read_checkpoint(policy_path), policy_path, saved_names(policy))
    for name, model in (extra_models or {}).items():
        path = os.path.join(shard_dir, f"{name}.safetensors")
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: missing; this run needs the saved {name} model (it was saved without)")
        load_sharded_weights(model, read_checkpoint(path), path)
    opt_path = os.path.join(shard_dir, "optimizer.safetensors")
    opt_state = read_checkpoint(opt_path)
    for p in optimizer.state_parameters():
        if p.name not in opt_state:
            raise CheckpointError(f"{opt_path}: missing {p.name}")
        if tuple(opt_state[p.name].shape) != tuple(p.shape):
            raise CheckpointError(f"{opt_path}: {p.name} has shape {tuple(opt_state[p.name].shape)}, expected "
                                  f"{tuple(p.shape)}")
        if p.is_floating_point():          # the moments; the step counter is an integer and saved as one
            require_float(opt_state[p.name], p.name, opt_path)
        write_param(p, opt_state[p.name])
    with open(os.path.join(shard_dir, "rank_state.json"), encoding="utf-8") as fh:
        rank_state = json.load(fh)
    return {"step": step, "rank_state": rank_state, "trainer_state": trainer_state, "dir": target}


def is_step_dir(path: str) -> bool:
    return bool(_STEP_RE.match(os.path.basename(os.path.normpath(path)))) and os.path.isdir(path)


def policy_tensors(step_path: str, model_cfg) -> Iterator[Tuple[str, np.ndarray]]:
    """A saved step's policy as full tensors, assembled from the shards of the train layout it was saved in
    (trainer_state.json records it): loading a step outside training (the eval command) needs no strategy
    file and may use another layout."""
    if not os.path.isfile(os.path.join(step_path, "COMPLETE")):
        raise CheckpointError(f"{step_path}: not marked COMPLETE (its save did not finish); use a complete step")
    with open(os.path.join(step_path, "trainer_state.json"), encoding="utf-8") as fh:
        layout = json.load(fh).get("layout")
    if not layout:
        raise CheckpointError(f"{step_path}/trainer_state.json: records no layout (saved by an earlier version); "
                              f"convert the step with transform_checkpoint.py and its strategy files")
    if layout.get("lora"):
        raise CheckpointError(f"{step_path}: holds the LoRA adapters of a run, not a whole model; evaluate that "
                              f"run's export (run.export_hf, lora.lora_export merged or both), or load its base "
                              f"model with the adapter through PEFT")
    (dp, tp), pp = layout["train"], layout.get("train_pipeline_stage", 1)
    layouts = layouts_for(with_recorded_split(model_cfg, layout), dp, tp, pp,
                          ep=layout.get("train_expert_parallel", 1),
                          experts_over_tp=layout.get("train_moe_tp_extend_ep", False))
    source = ShardedSource(step_path, {n: StrategyEntry.of(lay) for n, lay in layouts.items()}, POLICY_FILE)
    return ((name, source.assemble(name, lay)) for name, lay in layouts.items())


STAGE_LAYERS = "train_stage_layers"


def _stage_layers(model_cfg, pp: int) -> List[int]:
    return [len(r) for r in layer_split(model_cfg.num_layers, pp, model_cfg.offset)]


def with_recorded_split(model_cfg, layout: Dict):
    """`model_cfg` with the offset that gives the stages the layer counts `layout` records, when it records them."""
    counts = layout.get(STAGE_LAYERS)
    if counts is None:
        return model_cfg
    return dataclasses.replace(model_cfg, offset=[c - model_cfg.num_layers // len(counts) for c in counts])


def layout_record(world: int, train, infer, model_cfg=None) -> Dict:
    """What a checkpoint records of the train and infer meshes (resume refuses another; the loaders assemble the
    train one): data_parallel as parallel_config counts it (EP ranks in it), the EP and experts-over-tp settings
    only where they are on, and the train stages' layer counts where `model_cfg`'s offset makes them other than
    MindFormers' even split (a run's parallel.train_offset is not in the model YAML the loaders are given)."""
    state = {"world_size": world, "train": [train.data_parallel, train.tp], "infer": [infer.data_parallel, infer.tp]}
    if train.pp > 1:
        state["train_pipeline_stage"] = train.pp
        counts = _stage_layers(model_cfg, train.pp) if model_cfg is not None else None
        if counts is not None and counts != _stage_layers(dataclasses.replace(model_cfg, offset=0), train.pp):
            state[STAGE_LAYERS] = counts
    for role, m in (("train", train), ("infer", infer)):
        if m.ep > 1:
            state[f"{role}_expert_parallel"] = m.ep
        if m.experts_over_tp:
            state[f"{role}_moe_tp_extend_ep"] = True
    return state


def _describe(layout: Optional[Dict]) -> str:
    if not layout:
        return "(not recorded)"

    def role(name: str) -> str:
        (dp, tp), ep = layout[name], layout.get(f"{name}_expert_parallel", 1)
        return f"{name} dp{dp}" + (f" x ep{ep}" if ep > 1 else "") + f" x tp{tp}" + \
            (" (experts over tp)" if layout.get(f"{name}_moe_tp_extend_ep") else "")
    stages = layout.get("train_pipeline_stage", 1)
    split = f" (layers per stage {layout[STAGE_LAYERS]})" if STAGE_LAYERS in layout else ""
    return f"world_size={layout['world_size']}, {role('train')}" + (f" x pp{stages}{split}" if stages > 1 else "") + \
        f", {role('infer')}"
