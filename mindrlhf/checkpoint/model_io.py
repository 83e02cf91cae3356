"""Put weights into a (possibly TP-sharded) model and take them out; MindSpore checkpoint files.

Loading is strict and explicit: every model parameter must be found with its full shape, and every
tensor in the source must be used. (MindSpore's `load_param_into_net(strict_load=True)` does not raise on
missing or unexpected keys, so we never rely on it.)
"""
from __future__ import annotations

import ctypes
import os
from typing import Dict, Iterable, Iterator, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindrlhf.checkpoint.safetensors_io import BF16, SafeTensorsFile, bf16_to_f32, f32_to_bf16, write_safetensors
from mindrlhf.configs.errors import CheckpointError
from mindrlhf.parallel.layouts import role_layouts
from mindrlhf.utils.atomic import atomic_path

CKPT_EXTS = (".ckpt", ".safetensors")


def _to_param_dtype(arr: np.ndarray, dtype) -> Tensor:
    if isinstance(arr, BF16):
        arr = bf16_to_f32(arr)
    return Tensor(np.ascontiguousarray(arr)).astype(dtype)


def param_buffer(param) -> np.ndarray:
    """A uint8 numpy view of a CPU Parameter's own buffer (any dtype).

    On CPU a Parameter's data pointer is the buffer its compiled graphs read and write (measured on
    MindSpore 2.10), so writes through this view reach every graph, with no temporary Tensor. Callers
    make sure no graph is running (`ms.runtime.synchronize()`). Off CPU the pointer is device memory, which
    numpy must never touch: this raises there.
    """
    if ms.get_context("device_target") != "CPU":
        raise RuntimeError(f"param_buffer({param.name}): host views of parameter buffers exist only on CPU")
    if param.has_init:
        param.init_data()
    nbytes = int(np.prod(param.shape, dtype=np.int64)) * param.itemsize
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(param.data_ptr()))


def param_f32_view(param):
    """`param`'s buffer as a float32 array of its shape, or None if it is not a float32 CPU parameter."""
    if param.dtype != ms.float32 or ms.get_context("device_target") != "CPU":
        return None
    return param_buffer(param).view(np.float32).reshape(tuple(param.shape))


def write_param(param, value) -> None:
    """Overwrite a parameter's values in place.

    Graphs compiled with `ms.jit` keep the buffer a Parameter had when they were compiled:
    `set_data` swaps in a new buffer that those graphs never see (measured on MindSpore 2.10 CPU). Every
    weight write after start-up (re-layout, resume, swap, tests) must therefore copy into the existing
    buffer. `value` is a numpy array (BF16 views allowed) or a Tensor of the parameter's shape.
    """
    tensor = value if isinstance(value, Tensor) else _to_param_dtype(value, param.dtype)
    if tuple(tensor.shape) != tuple(param.shape):
        raise CheckpointError(f"parameter {param.name}: cannot write shape {tuple(tensor.shape)} into "
                              f"{tuple(param.shape)}")
    param.copy_(tensor.astype(param.dtype))


def model_layouts(model):
    from mindrlhf.models.qwen2 import param_specs
    return role_layouts(param_specs(model.config), model.mesh.dp, model.mesh.tp)


def load_full_weights(model, tensors: Iterable[Tuple[str, np.ndarray]], source: str):
    """Load full (unsharded) tensors, slicing each to this rank's shard; errors name the parameter."""
    params = {p.name: p for p in model.get_parameters()}
    layouts = model_layouts(model)
    rank = model.mesh.rank
    loaded = set()
    for name, arr in tensors:
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue  # a tied model reads its head from the embedding
        if name not in params:
            raise CheckpointError(f"{source}: unexpected parameter {name} (the model has no such weight; "
                                  f"wrong model config?)")
        layout = layouts[name]
        if tuple(arr.shape) != layout.full_shape:
            raise CheckpointError(f"{source}: parameter {name} has shape {tuple(arr.shape)}, the model "
                                  f"expects {layout.full_shape}")
        shard = layout.shard(arr, rank)
        write_param(params[name], shard)
        loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise CheckpointError(f"{source}: missing parameter {missing[0]} (expected shape "
                              f"{layouts[missing[0]].full_shape})" + (f" and {len(missing) - 1} more"
                                                                      if len(missing) > 1 else ""))


def load_sharded_weights(model, tensors: Dict[str, np.ndarray], source: str):
    """Load tensors that are already this rank's shards (a per-rank checkpoint)."""
    params = {p.name: p for p in model.get_parameters()}
    for name in sorted(set(params) | set(tensors)):
        if name not in tensors:
            raise CheckpointError(f"{source}: missing parameter {name} (expected shape {params[name].shape})")
        if name not in params:
            raise CheckpointError(f"{source}: unexpected parameter {name}")
        if tuple(tensors[name].shape) != tuple(params[name].shape):
            raise CheckpointError(f"{source}: parameter {name} has shape {tuple(tensors[name].shape)}, this "
                                  f"rank expects {tuple(params[name].shape)}")
        write_param(params[name], tensors[name])


def param_to_numpy(param) -> np.ndarray:
    """A copy (asnumpy() may alias the parameter's memory, which later updates would change)."""
    if param.dtype == ms.bfloat16:
        return f32_to_bf16(param.float().asnumpy())
    return param.asnumpy().copy()


def param_as_f32(param) -> np.ndarray:
    """float32 numpy view/copy of a parameter of any dtype (for packing into float32 buffers)."""
    if param.dtype == ms.float32:
        return param.asnumpy()
    return param.float().asnumpy()


def model_state(model) -> Dict[str, np.ndarray]:
    """This rank's parameter shards as numpy (bf16 as BF16 bit views)."""
    return {p.name: param_to_numpy(p) for p in model.get_parameters()}


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


def _is_hf_naming(names) -> bool:
    return any(n.startswith("model.embed_tokens.") or ".self_attn." in n for n in names)


def load_weights(model, path: str):
    """Load `path` into `model`, whatever it is: an HF directory / safetensors file (HF names), a full
    MindSpore checkpoint (our names), or a directory of per-rank shards (`rank_N/*.ckpt|.safetensors`,
    as transform_checkpoint.py writes them) for this rank's layout."""
    from mindrlhf.checkpoint.hf_interop import iter_hf_as_ms
    if os.path.isdir(path):
        rank_dir = os.path.join(path, f"rank_{model.mesh.rank}")
        if os.path.isdir(rank_dir):
            files = sorted(f for f in os.listdir(rank_dir) if f.endswith(CKPT_EXTS))
            if len(files) != 1:
                raise CheckpointError(f"{rank_dir}: expected exactly one .ckpt/.safetensors file, found {files}")
            load_sharded_weights(model, read_checkpoint(os.path.join(rank_dir, files[0])), rank_dir)
            return
        load_full_weights(model, iter_hf_as_ms(path), path)
        return
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: checkpoint not found")
    if path.endswith(".safetensors") and _is_hf_naming(SafeTensorsFile(path).keys()):
        load_full_weights(model, iter_hf_as_ms(path), path)
        return
    load_full_weights(model, iter_checkpoint(path), path)
