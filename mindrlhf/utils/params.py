"""Reading and writing a Parameter's values in place: the one way weights change after start-up.

Graphs compiled with `ms.jit` keep the buffer a Parameter had when they were compiled: `set_data` swaps in
a new buffer that those graphs never see (measured on MindSpore 2.10 CPU). Every weight write after
start-up (re-layout, resume, swap, tests) therefore copies into the existing buffer. On CPU a Parameter's
data pointer is that very buffer, so numpy can read and write it without a temporary.
"""
from __future__ import annotations

import ctypes

import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindrlhf.errors import CheckpointError
from mindrlhf.utils.bf16 import BF16, bf16_to_f32, f32_to_bf16


def to_param_dtype(arr: np.ndarray, dtype) -> Tensor:
    if isinstance(arr, BF16):
        arr = bf16_to_f32(arr)
    return Tensor(np.ascontiguousarray(arr)).astype(dtype)


def wait_for_graphs():
    """Block until the graphs launched so far have finished, before host code writes their parameters.
    `ms.runtime.synchronize()` is that call, but on CPU MindSpore 2.10 makes its first call log "CPU device is
    not supported" as an ERROR and return without waiting; the call it makes from then on is made here."""
    try:
        from mindspore._c_expression import synchronize
    except ImportError:          # another MindSpore: its public call
        synchronize = ms.runtime.synchronize
    synchronize()


def param_buffer(param) -> np.ndarray:
    """A uint8 numpy view of a CPU Parameter's own buffer (any dtype).

    Callers make sure no graph is running (`wait_for_graphs()`). Off CPU the pointer is device
    memory, which numpy must never touch: this raises there.
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
    """Overwrite a parameter's values in place. `value`: a numpy array (BF16 views allowed) or a Tensor of
    the parameter's shape."""
    tensor = value if isinstance(value, Tensor) else to_param_dtype(value, param.dtype)
    if tuple(tensor.shape) != tuple(param.shape):
        raise CheckpointError(f"parameter {param.name}: cannot write shape {tuple(tensor.shape)} into "
                              f"{tuple(param.shape)}")
    param.copy_(tensor.astype(param.dtype))


def copy_params(src_params, dst_params) -> None:
    """Write every source parameter into the destination parameter of the same name (same shapes)."""
    dst = {p.name: p for p in dst_params}
    for p in src_params:
        write_param(dst[p.name], param_to_numpy(p))


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


def hold_reads(cell, params) -> None:
    """Make `params` part of `cell`'s own parameters: those its jit graph reads through an attribute outside
    its cell tree (a gradient function, a reference kept out of the tree). MindSpore's compile cache binds a
    reloaded graph's Parameters by name to the cell's `parameters_dict()`; one the cell does not hold comes
    back unbound and reads uninitialised memory (measured on MindSpore 2.10 CPU; tests/test_trainer.py, the
    compile-cache rerun)."""
    cell.graph_reads = ms.ParameterTuple(list(params))
