"""Cells compiled once and reused: MindSpore's `lazy_inline(policy="front")`, with the key that decides which
cells share a compiled subgraph.

A graph that calls N cells of the same structure otherwise parses, type-infers and optimises N copies of
them: most of a deep model's first step (30 decoder layers; 272 per-parameter optimizer updates).
lazy_inline compiles the cell's `construct` once per key as a subgraph whose inputs include the cell's
parameters, so every cell with the key runs it on its own weights, and inlines it after the front end: the
kernels that run are those of the inlined graph. Cells share a subgraph only when they are built with the
same key; `new_key` gives a fresh one per owner (one model's layers, one optimizer's parameters of a
shape), never reused in the process, so a new model or optimizer never meets another one's constants.
MindSpore documents lazy_inline for Ascend; on CPU `policy="front"` compiles and `policy=None` does not.
"""
from __future__ import annotations

import itertools

from mindspore import lazy_inline

_KEYS = itertools.count()

# decorates a Cell's __init__; the cell sets `self.reuse_key` there
reused = lazy_inline(attrs="reuse_key", policy="front")


def new_key(owner: str) -> str:
    """A key no cell built so far has: cells given it share one compiled subgraph."""
    return f"{owner}#{next(_KEYS)}"
