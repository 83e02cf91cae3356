"""bfloat16 on numpy (which has no such dtype): raw 16-bit patterns marked by a view type, and exact
conversions to and from float32."""
from __future__ import annotations

import numpy as np


class BF16(np.ndarray):
    """Marker view: a uint16 array that holds bfloat16 bits."""


def as_bf16(bits: np.ndarray) -> np.ndarray:
    return bits.view(np.uint16).view(BF16)


def contiguous(arr: np.ndarray) -> np.ndarray:
    """np.ascontiguousarray that keeps the BF16 marker."""
    out = np.ascontiguousarray(arr)
    return as_bf16(out) if isinstance(arr, BF16) else out


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bits (exact for values that came from bf16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + 0x7FFF + ((u >> 16) & 1)
    return as_bf16((rounded >> 16).astype(np.uint16))
