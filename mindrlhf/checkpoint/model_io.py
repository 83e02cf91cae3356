"""Put weights into a (possibly TP-sharded) model and take them out; MindSpore checkpoint files.

Loading is strict and explicit: every model parameter must be found with its full shape, and every
tensor in the source must be used. (MindSpore's `load_param_into_net(strict_load=True)` does not raise on
missing or unexpected keys, so we never rely on it.)
"""
from __future__ import annotations

import os
from typing import Dict, Iterable, Iterator, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindrlhf.checkpoint.safetensors_io import (SafeTensorsFile, SafeTensorsStreamWriter, dtype_code_of,
                                                require_float, write_safetensors)
from mindrlhf.configs.errors import CheckpointError
from mindrlhf.models.lora import is_adapter
from mindrlhf.utils.atomic import atomic_path
from mindrlhf.utils.bf16 import BF16, bf16_to_f32
from mindrlhf.utils.params import param_to_numpy, write_param

CKPT_EXTS = (".ckpt", ".safetensors")


def load_full_weights(model, tensors: Iterable[Tuple[str, np.ndarray]], source: str):
    """Load full (unsharded) tensors, slicing each to this rank's shard; errors name the parameter. A model
    with LoRA adapters may load a source without them (a base model): its adapters keep their initialisation."""
    params = {p.name: p for p in model.get_parameters()}
    layouts = model.layouts()
    rank = model.mesh.rank
    loaded = set()
    for name, arr in tensors:
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue  # a tied model reads its head from the embedding
        if name not in layouts:
            raise CheckpointError(f"{source}: unexpected parameter {name} (the model has no such weight; "
                                  f"wrong model config?)")
        layout = layouts[name]
        require_float(arr, name, source)
        if tuple(arr.shape) != layout.full_shape:
            raise CheckpointError(f"{source}: parameter {name} has shape {tuple(arr.shape)}, the model "
                                  f"expects {layout.full_shape}")
        if rank not in layout.ranks:
            continue  # held by another pipeline stage
        shard = layout.shard(arr, rank)
        write_param(params[name], shard)
        loaded.add(name)
    missing = set(params) - loaded
    adapters = {n for n in params if is_adapter(n)}
    if not loaded & adapters:
        missing -= adapters
    missing = sorted(missing)
    if missing:
        raise CheckpointError(f"{source}: missing parameter {missing[0]} (expected shape "
                              f"{layouts[missing[0]].full_shape})" + (f" and {len(missing) - 1} more"
                                                                      if len(missing) > 1 else ""))


def load_sharded_weights(model, tensors: Dict[str, np.ndarray], source: str, names=None):
    """Load tensors that are already this rank's shards (a per-rank checkpoint); `names`: only those
    parameters (a LoRA run's checkpoint holds its adapters only)."""
    params = {p.name: p for p in model.get_parameters() if names is None or p.name in names}
    for name in sorted(set(params) | set(tensors)):
        if name not in tensors:
            raise CheckpointError(f"{source}: missing parameter {name} (expected shape {params[name].shape})")
        if name not in params:
            raise CheckpointError(f"{source}: unexpected parameter {name}")
        require_float(tensors[name], name, source)
        if tuple(tensors[name].shape) != tuple(params[name].shape):
            raise CheckpointError(f"{source}: parameter {name} has shape {tuple(tensors[name].shape)}, this "
                                  f"rank expects {tuple(params[name].shape)}")
        write_param(params[name], tensors[name])


def model_state(model, names=None) -> Dict[str, np.ndarray]:
    """This rank's parameter shards as numpy (bf16 as BF16 bit views); `names`: only those."""
    return {p.name: param_to_numpy(p) for p in model.get_parameters() if names is None or p.name in names}


def save_params(params, path: str):
    """Write parameters (this rank's shards) to a .safetensors file one at a time, atomically: the process
    holds at most one tensor's copy at a time, not the model's (a training checkpoint of a 135M model is 1.6 GB of
    policy and AdamW moments; copying them all first raised the run's peak RSS at every save)."""
    params = list(params)
    if not path.endswith(".safetensors"):
        raise CheckpointError(f"{path}: parameters are saved as .safetensors")
    writer = SafeTensorsStreamWriter(path, [(p.name, dtype_code_of(p.dtype), tuple(p.shape)) for p in params])
    try:
        for p in params:          # written before any graph runs again: the view need not be a copy
            writer.write(p.name, param_to_numpy(p) if p.dtype == ms.bfloat16 else p.asnumpy())
    except BaseException:
        writer.abort()
        raise
    writer.close()


def save_checkpoint(tensors: Dict[str, np.ndarray], path: str):
    """Write a MindSpore checkpoint (.ckpt or .safetensors by extension), atomically."""
    ext = os.path.splitext(path)[1]
    if ext not in CKPT_EXTS:
        raise CheckpointError(f"{path}: checkpoint files must end in {CKPT_EXTS}")
    if ext == ".safetensors":
        write_safetensors(path, tensors.items())
        return
    items = [{"name": n, "data": Tensor(bf16_to_f32(a)).astype(ms.bfloat16) if isinstance(a, BF16)
              else Tensor(np.ascontiguousarray(a))} for n, a in tensors.items()]
    with atomic_path(path) as tmp:
        ms.save_checkpoint(items, tmp)


def iter_checkpoint(path: str) -> Iterator[Tuple[str, np.ndarray]]:
    """(name, array) of a MindSpore .ckpt or .safetensors file."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: checkpoint file not found")
    if path.endswith(".safetensors"):
        f = SafeTensorsFile(path)
        for name in f.keys():
            yield name, f.get(name)
        return
    if not path.endswith(".ckpt"):
        raise CheckpointError(f"{path}: expected a .ckpt or .safetensors file")
    try:
        loaded = ms.load_checkpoint(path)
    except Exception as err:  # MindSpore raises several types for a corrupt file
        raise CheckpointError(f"{path}: not a readable MindSpore checkpoint ({err})") from None
    for name, param in loaded.items():
        yield name, param_to_numpy(param)


def read_checkpoint(path: str) -> Dict[str, np.ndarray]:
    return dict(iter_checkpoint(path))


def is_hf_naming(names) -> bool:
    return any(n.startswith("model.embed_tokens.") or ".self_attn." in n for n in names)


def rank_dir(root: str, rank: int) -> str:
    """Where rank `rank`'s shard lives in a per-rank checkpoint directory (transform_checkpoint.py, training
    checkpoints): `root/rank_N/`."""
    return os.path.join(root, f"rank_{rank}")


# a training step's rank_N/ holds the policy's shard beside the optimizer's and the reference's
POLICY_FILE = "policy.safetensors"


def holds_rank_dirs(path: str) -> bool:
    return os.path.isdir(path) and any(d.startswith("rank_") for d in os.listdir(path))


def rank_dir_count(path: str) -> int:
    return sum(d.startswith("rank_") for d in os.listdir(path)) if os.path.isdir(path) else 0


def rank_checkpoint_file(root: str, rank: int, what: str) -> str:
    """The one .ckpt/.safetensors file of `rank` under `root` (of a training step's: the policy's); the error
    says `what` was expected."""
    directory = rank_dir(root, rank)
    files = sorted(f for f in os.listdir(directory) if f.endswith(CKPT_EXTS)) if os.path.isdir(directory) else []
    if POLICY_FILE in files:
        files = [POLICY_FILE]
    if len(files) != 1:
        raise CheckpointError(f"{directory}: expected one checkpoint file for {what}, found {files or 'none'}")
    return os.path.join(directory, files[0])


def checkpoint_kind(path: str) -> str:
    """What a checkpoint path holds: "rank_dirs" (per-rank shards `rank_N/`, as transform_checkpoint.py
    writes them), "hf" (an HF directory, or safetensors with HF names) or "full" (our names, one file)."""
    if os.path.isdir(path):
        return "rank_dirs" if holds_rank_dirs(path) else "hf"
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: checkpoint not found")
    if path.endswith(".safetensors"):
        return "hf" if is_hf_naming(SafeTensorsFile(path).keys()) else "full"
    if path.endswith(".ckpt"):
        return "full"
    raise CheckpointError(f"{path}: expected a .ckpt or .safetensors file, an HF directory or a directory of "
                          f"rank_N/ shards")


def iter_full_tensors(path: str) -> Iterator[Tuple[str, np.ndarray]]:
    """(name, full tensor) in our names from an "hf" or "full" checkpoint."""
    from mindrlhf.checkpoint.hf_interop import iter_hf_as_ms
    kind = checkpoint_kind(path)
    if kind == "rank_dirs":
        raise CheckpointError(f"{path}: holds per-rank shards, not one full checkpoint")
    return iter_hf_as_ms(path) if kind == "hf" else iter_checkpoint(path)


def load_weights(model, path: str):
    """Load `path` into `model`, whatever it is (see checkpoint_kind); per-rank shards must be laid out for
    this model's layout."""
    if checkpoint_kind(path) == "rank_dirs":
        shard = rank_checkpoint_file(path, model.mesh.rank, f"rank {model.mesh.rank}")
        load_sharded_weights(model, read_checkpoint(shard), shard)
        return
    load_full_weights(model, iter_full_tensors(path), path)
