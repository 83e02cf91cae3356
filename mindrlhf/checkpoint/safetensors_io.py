"""Streaming safetensors read/write on numpy, with bfloat16 kept bit-exact.

Hand-rolled on the (simple, documented) file format rather than through a framework so that: tensors are
memory-mapped and read one at a time (peak memory ~ one tensor), bfloat16 survives as its raw 16 bits
(numpy has no bfloat16), and writes go to a temp file renamed into place (no half-written checkpoints).
"""
from __future__ import annotations

import json
import os
import struct
from typing import Dict, Iterable, Iterator, List, Tuple

import numpy as np

from mindrlhf.configs.errors import CheckpointError
from mindrlhf.utils.atomic import atomic_path
from mindrlhf.utils.bf16 import BF16, as_bf16

_NP_OF = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
          "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_CODE_OF = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
            np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16",
            np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL"}


class SafeTensorsFile:
    """Lazy reader of one .safetensors file."""

    def __init__(self, path: str):
        self.path = path
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as fh:
                head = fh.read(8)
                if len(head) != 8:
                    raise ValueError("file shorter than the 8-byte header length")
                (n,) = struct.unpack("<Q", head)
                if n > size - 8:
                    raise ValueError(f"header length {n} exceeds the file size {size}")
                self.header = json.loads(fh.read(n))
        except (OSError, ValueError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None
        self.metadata = self.header.pop("__metadata__", {}) or {}
        self._offset = 8 + n
        self._size = size
        for name, info in self.header.items():
            begin, end = info["data_offsets"]
            if info["dtype"] not in _NP_OF:
                raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
            if self._offset + end > size:
                raise CheckpointError(f"{path}: tensor {name} runs past the end of the file (truncated?)")
        self._mm = None

    def keys(self) -> List[str]:
        return list(self.header)

    def shape(self, name: str) -> Tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def dtype_code(self, name: str) -> str:
        return self.header[name]["dtype"]

    def get(self, name: str) -> np.ndarray:
        """The tensor as a (read-only, memory-mapped) numpy array; BF16 comes back as a BF16 view."""
        if name not in self.header:
            raise CheckpointError(f"{self.path}: no tensor named {name}")
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        info = self.header[name]
        begin, end = info["data_offsets"]
        raw = self._mm[self._offset + begin:self._offset + end]
        arr = raw.view(_NP_OF[info["dtype"]]).reshape(info["shape"])
        return as_bf16(arr) if info["dtype"] == "BF16" else arr


def dtype_code(arr: np.ndarray) -> str:
    if isinstance(arr, BF16):
        return "BF16"
    try:
        return _CODE_OF[arr.dtype]
    except KeyError:
        raise CheckpointError(f"cannot store numpy dtype {arr.dtype} in safetensors") from None


def write_safetensors(path: str, tensors: Iterable[Tuple[str, np.ndarray]], metadata: Dict[str, str] = None):
    """Write (name, array) pairs; arrays may be produced lazily. Atomic: temp file, then rename."""
    items = list(tensors)
    header, offset = {}, 0
    for name, arr in items:
        nbytes = int(np.asarray(arr).nbytes)
        header[name] = {"dtype": dtype_code(arr), "shape": list(arr.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * ((8 - len(blob) % 8) % 8)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<Q", len(blob)))
            fh.write(blob)
            for _, arr in items:
                fh.write(np.ascontiguousarray(np.asarray(arr)).tobytes())


def iter_safetensors(paths: Iterable[str]) -> Iterator[Tuple[str, np.ndarray, str]]:
    """(name, array, file) over several files, one tensor at a time."""
    for path in paths:
        f = SafeTensorsFile(path)
        for name in f.keys():
            yield name, f.get(name), path


class SafeTensorsStreamWriter:
    """Write tensors one at a time in a declared order (header first), so a slicer holds one at a time.

    Atomic like write_safetensors: data goes to a temp file that `close()` renames into place.
    """

    def __init__(self, path: str, specs: List[Tuple[str, str, Tuple[int, ...]]]):
        self._ctx = atomic_path(path)
        self._tmp = self._ctx.__enter__()
        header, offset = {}, 0
        itemsize = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                    "BOOL": 1}
        for name, code, shape in specs:
            nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize[code]
            header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
        blob += b" " * ((8 - len(blob) % 8) % 8)
        self._order = [(n, c, tuple(s)) for n, c, s in specs]
        self._next = 0
        self._fh = open(self._tmp, "wb")
        self._fh.write(struct.pack("<Q", len(blob)))
        self._fh.write(blob)

    def write(self, name: str, arr: np.ndarray):
        exp_name, code, shape = self._order[self._next]
        if name != exp_name or tuple(arr.shape) != shape or dtype_code(arr) != code:
            raise CheckpointError(f"stream writer: expected {exp_name} {code}{list(shape)}, got {name} "
                                  f"{dtype_code(arr)}{list(arr.shape)}")
        self._fh.write(np.ascontiguousarray(arr).tobytes())
        self._next += 1

    def close(self):
        self._fh.close()
        if self._next != len(self._order):
            self.abort()
            raise CheckpointError(f"stream writer: {len(self._order) - self._next} tensors were never written")
        self._ctx.__exit__(None, None, None)

    def abort(self):
        if not self._fh.closed:
            self._fh.close()
        try:
            self._ctx.__exit__(CheckpointError, CheckpointError("aborted"), None)
        except CheckpointError:
            pass
