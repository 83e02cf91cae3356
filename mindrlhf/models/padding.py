"""How prompts and sequences are laid out for the model, on the host: left padding, RoPE positions, the
additive causal bias. Rollout, training and packing build their inputs with these."""
from __future__ import annotations

import numpy as np
from mindspore import Tensor

NEG_INF = -1e30  # additive mask value; finite so fully-masked rows stay NaN-free


def left_pad(prompts, width: int, pad: int):
    """Token lists -> (ids, mask), each (N, width) int64, right-aligned: the layout prefill and training share."""
    ids = np.full((len(prompts), width), pad, np.int64)
    mask = np.zeros((len(prompts), width), np.int64)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = p
        mask[i, width - len(p):] = 1
    return ids, mask


def position_ids(mask: np.ndarray) -> np.ndarray:
    """RoPE positions of a left-padded batch: 0 at each row's first real token (pads get 0 too), int32."""
    return np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32)


def causal_bias(attention_mask) -> Tensor:
    """attention_mask (B, S) of 1/0 (numpy or Tensor) -> additive bias Tensor (B, 1, S, S): 0 where query i may
    see key j (j <= i and key j is a real token), NEG_INF elsewhere. Built in numpy on the host: as eager
    MindSpore ops (each a launch and a sync) it cost as much as a small model's forward on CPU."""
    keys = np.asarray(attention_mask.asnumpy() if isinstance(attention_mask, Tensor) else attention_mask) > 0
    s = keys.shape[1]
    allowed = np.tril(np.ones((s, s), bool))[None, None] & keys[:, None, None, :]
    return Tensor(np.where(allowed, np.float32(0.0), np.float32(NEG_INF)))
