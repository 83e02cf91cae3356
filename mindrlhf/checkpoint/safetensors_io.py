"""Streaming safetensors read/write on numpy, with bfloat16 kept bit-exact.

Hand-rolled on the (simple, documented) file format rather than through a framework so that: tensors are
memory-mapped and read one at a time (peak memory ~ one tensor), bfloat16 survives as its raw 16 bits
(numpy has no bfloat16), and writes go to a temp file renamed into place (no half-written checkpoints).
"""
from __future__ import annotations

import json
import math
import os
import struct
from typing import Dict, Iterable, List, Tuple

import numpy as np

from mindrlhf.configs.errors import CheckpointError
from mindrlhf.utils.atomic import atomic_path
from mindrlhf.utils.bf16 import BF16, as_bf16

_NP_OF = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
          "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_CODE_OF = {np.dtype(t): code for code, t in _NP_OF.items() if code != "BF16"}
ITEMSIZE = {code: np.dtype(t).itemsize for code, t in _NP_OF.items()}
FLOAT_CODES = ("F64", "F32", "F16", "BF16")
MAX_HEADER_BYTES = 100_000_000      # the safetensors package's limit: a header is names and numbers, not data


class SafeTensorsFile:
    """Lazy reader of one .safetensors file.

    The header is checked against the file before any tensor is read, as the safetensors package does: a
    crafted or damaged header must give an error naming the file and the tensor, never a numpy view of the
    wrong bytes (or of bytes outside the tensor's own).
    """

    def __init__(self, path: str):
        self.path = path
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as fh:
                head = fh.read(8)
                if len(head) != 8:
                    raise CheckpointError(f"{path}: not a safetensors file (shorter than the 8-byte header length)")
                (n,) = struct.unpack("<Q", head)
                if n > MAX_HEADER_BYTES:
                    raise CheckpointError(f"{path}: header length {n} is over the limit of {MAX_HEADER_BYTES} bytes "
                                          f"(not a safetensors file?)")
                if n > size - 8:
                    raise CheckpointError(f"{path}: header length {n} exceeds the file size {size} (truncated?)")
                blob = fh.read(n)
        except OSError as err:
            raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None
        try:
            header = json.loads(blob)
        except (ValueError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{path}: header is not valid JSON ({err})") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{path}: header is a {type(header).__name__}, expected a JSON object of tensors")
        meta = header.pop("__metadata__", None)
        if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
            raise CheckpointError(f"{path}: __metadata__ must map strings to strings, got {meta!r:.200}")
        self.metadata = meta or {}
        for name, info in header.items():
            self._check_entry(name, info)
        self.header = header
        self._offset = 8 + n
        self._check_layout(size - self._offset)
        self._mm = None

    def _check_entry(self, name: str, info):
        """One tensor's header entry: well-formed, and its byte range exactly as long as its shape and dtype."""
        where = f"{self.path}: tensor {name}"
        if not isinstance(info, dict):
            raise CheckpointError(f"{where}: expected an object with dtype, shape and data_offsets, got {info!r:.200}")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in info:
                raise CheckpointError(f"{where}: missing {key}")
        code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(code, str) or code not in _NP_OF:
            raise CheckpointError(f"{where} has unsupported dtype {code!r:.50} (expected one of {', '.join(_NP_OF)})")
        if not _naturals(shape):
            raise CheckpointError(f"{where}: shape {shape!r:.200} is not a list of non-negative integers")
        if not (_naturals(offsets) and len(offsets) == 2 and offsets[0] <= offsets[1]):
            raise CheckpointError(f"{where}: data_offsets {offsets!r:.200} are not two integers 0 <= begin <= end")
        need = math.prod(shape) * ITEMSIZE[code]
        if offsets[1] - offsets[0] != need:
            raise CheckpointError(f"{where}: data_offsets {offsets} hold {offsets[1] - offsets[0]} bytes, shape "
                                  f"{shape} of {code} needs {need}")

    def _check_layout(self, data_bytes: int):
        """Taken in order, the tensors must tile the data section: no overlap (two tensors aliasing one
        buffer), no gap and nothing after the last (bytes no tensor owns), nothing past the end."""
        covered, prev, after = 0, None, "the header"
        for name, info in sorted(self.header.items(), key=lambda item: item[1]["data_offsets"]):
            begin, end = info["data_offsets"]
            if begin < covered:
                raise CheckpointError(f"{self.path}: tensor {name} (bytes {begin}..{end}) overlaps tensor {prev} "
                                      f"(which ends at {covered})")
            if begin > covered:
                raise CheckpointError(f"{self.path}: {begin - covered} bytes between {after} and tensor {name} belong "
                                      f"to no tensor")
            if end > data_bytes:
                raise CheckpointError(f"{self.path}: tensor {name} runs past the end of the file (data ends at "
                                      f"{end}, the file holds {data_bytes} data bytes; truncated?)")
            covered, prev, after = end, name, f"tensor {name}"
        if covered != data_bytes:
            raise CheckpointError(f"{self.path}: {data_bytes - covered} bytes after {after} belong to no tensor")

    def _info(self, name: str) -> dict:
        if name not in self.header:
            raise CheckpointError(f"{self.path}: no tensor named {name}")
        return self.header[name]

    def keys(self) -> List[str]:
        return list(self.header)

    def shape(self, name: str) -> Tuple[int, ...]:
        return tuple(self._info(name)["shape"])

    def dtype_code(self, name: str) -> str:
        return self._info(name)["dtype"]

    def get(self, name: str) -> np.ndarray:
        """The tensor as a (read-only, memory-mapped) numpy array; BF16 comes back as a BF16 view."""
        info = self._info(name)
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        begin, end = info["data_offsets"]
        raw = self._mm[self._offset + begin:self._offset + end]
        arr = raw.view(_NP_OF[info["dtype"]]).reshape(info["shape"])
        return as_bf16(arr) if info["dtype"] == "BF16" else arr


def _naturals(value) -> bool:
    """A JSON list of non-negative integers (JSON true/false parse as bool, an int subclass: not counted)."""
    return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


def dtype_code(arr: np.ndarray) -> str:
    if isinstance(arr, BF16):
        return "BF16"
    try:
        return _CODE_OF[arr.dtype]
    except KeyError:
        raise CheckpointError(f"cannot store numpy dtype {arr.dtype} in safetensors") from None


def require_float(arr: np.ndarray, name: str, source: str) -> np.ndarray:
    """`arr`, if it is a float tensor. An integer or bool tensor (a quantized checkpoint, the wrong file)
    would otherwise be cast into float weights without a word."""
    if isinstance(arr, BF16) or arr.dtype.kind == "f":
        return arr
    raise CheckpointError(f"{source}: tensor {name} has dtype {_CODE_OF.get(arr.dtype, arr.dtype)}, expected a float "
                          f"({'/'.join(FLOAT_CODES)}): integer and bool tensors are not loaded as weights")


def _header_bytes(specs: Iterable[Tuple[str, str, Tuple[int, ...]]], metadata: Dict[str, str] = None) -> bytes:
    """Length field and JSON header for (name, dtype code, shape) stored back to back in that order; padded
    with spaces to 8 bytes, as the safetensors package pads it, so every tensor starts aligned."""
    header, offset = {}, 0
    for name, code, shape in specs:
        nbytes = math.prod(shape) * ITEMSIZE[code]
        header[name] = {"dtype": code, "shape": [int(d) for d in shape], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * ((8 - len(blob) % 8) % 8)
    return struct.pack("<Q", len(blob)) + blob


def write_safetensors(path: str, tensors: Iterable[Tuple[str, np.ndarray]], metadata: Dict[str, str] = None):
    """Write (name, array) pairs; arrays may be produced lazily. Atomic: temp file, then rename."""
    items = list(tensors)
    head = _header_bytes([(name, dtype_code(arr), arr.shape) for name, arr in items], metadata)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(head)
            for _, arr in items:
                _write_array(fh, arr)


def _write_array(fh, arr: np.ndarray):
    """The array's bytes from its own buffer (tobytes() would copy the tensor once more)."""
    fh.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)


def dtype_code_of(dtype) -> str:
    """The safetensors dtype code of a MindSpore dtype (a parameter's, before it is read)."""
    import mindspore as ms
    codes = {ms.float32: "F32", ms.float16: "F16", ms.bfloat16: "BF16", ms.float64: "F64", ms.int32: "I32",
             ms.int64: "I64"}
    if dtype not in codes:
        raise CheckpointError(f"cannot store MindSpore dtype {dtype} in safetensors")
    return codes[dtype]


class TensorStream:
    """(name, array) pairs produced one at a time, in the order of `specs` - (name, dtype code, shape) each,
    known before any tensor is: a writer lays out its files first and holds one tensor at a time."""

    def __init__(self, specs: List[Tuple[str, str, Tuple[int, ...]]], items: Iterable[Tuple[str, np.ndarray]]):
        self.specs, self._items = [(n, c, tuple(s)) for n, c, s in specs], items

    def __iter__(self):
        return iter(self._items)


def tensor_stream(tensors) -> TensorStream:
    """A TensorStream as it is; a {name: array} dict as a stream over its items."""
    if isinstance(tensors, TensorStream):
        return tensors
    return TensorStream([(n, dtype_code(a), a.shape) for n, a in tensors.items()], tensors.items())


class SafeTensorsStreamWriter:
    """Write tensors one at a time in a declared order (header first), so a slicer holds one at a time.

    Atomic like write_safetensors: data goes to a temp file that `close()` renames into place.
    """

    def __init__(self, path: str, specs: List[Tuple[str, str, Tuple[int, ...]]], metadata: Dict[str, str] = None):
        self._ctx = atomic_path(path)
        self._tmp = self._ctx.__enter__()
        self._order = [(n, c, tuple(s)) for n, c, s in specs]
        self._next = 0
        self._fh = open(self._tmp, "wb")
        self._fh.write(_header_bytes(self._order, metadata))

    def write(self, name: str, arr: np.ndarray):
        exp_name, code, shape = self._order[self._next]
        if name != exp_name or tuple(arr.shape) != shape or dtype_code(arr) != code:
            raise CheckpointError(f"stream writer: expected {exp_name} {code}{list(shape)}, got {name} "
                                  f"{dtype_code(arr)}{list(arr.shape)}")
        _write_array(self._fh, arr)
        self._next += 1

    def close(self):
        self._fh.close()
        if self._next != len(self._order):
            self.abort()
            raise CheckpointError(f"stream writer: {len(self._order) - self._next} tensors were never written")
        self._ctx.__exit__(None, None, None)

    def abort(self):
        """Remove the temp file; called on an error path, whose error is the one to raise."""
        try:
            self._fh.close()
        except OSError:                 # a full disk cannot take the buffered bytes either
            pass
        try:
            self._ctx.__exit__(CheckpointError, CheckpointError("aborted"), None)
        except CheckpointError:
            pass
