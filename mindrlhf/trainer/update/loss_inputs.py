"""What the GRPO loss reads besides the policy's own forward, as one structure.

Every update engine takes a mini-batch as (input_ids, position_ids, bias, labels, *LossInputs, lr) and passes
the loss inputs through to the loss cell without naming them: a new input (a tool-token mask, a routing to
replay) is a field here and a read in `GRPOLossCell`, nowhere else. On the host the fields are numpy
arrays; `tensors()` makes the Tensors the graphs take (float32 always, so one compiled graph serves every call;
the routing int32). The routing inputs, `routing` and `router_grad`, are the optional fields, both or neither:
present (router replay, the MoE aux loss) they are the last two arguments, absent no arguments at all, so a dense
model's graphs are what they were.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from mindspore import Tensor


@dataclass(frozen=True)
class LossInputs:
    """Rows as the mini-batch's; (N, R) per response token unless said."""
    mask: Any           # 1 on the tokens the loss trains (masked groups, truncated rows, tool tokens are 0)
    old_logp: Any       # the old policy's log-probs (on-policy unused: the forward's own, detached)
    rollout_logp: Any   # the sampler's log-probs (TIS weights, the on-policy rollout-train gap)
    ref_logp: Any       # the reference model's log-probs (zeros when there is none)
    advantages: Any     # (N,) per sequence, or (N, R) per token (packed rows)
    token_norm: Any     # () the global mini-batch's token count: the token-mean denominators
    # (N, T, sparse layers, k) the experts the policy's forward replays, laid out as the model inputs, -1 where a
    # token routes itself (rl.router_replay; SampleBatch.input_routing); None: each forward routes itself
    routing: Any = None
    # (N, T, E) the load-balancing loss's gradient with respect to each input token's router probabilities
    # (trainer/aux_loss.py); None with routing
    router_grad: Any = None

    NOT_PER_ROW = ("token_norm",)
    ROUTING = ("routing", "router_grad")

    def __post_init__(self):
        if (self.routing is None) != (self.router_grad is None):
            raise ValueError("LossInputs: routing and router_grad come together (both or neither)")

    def args(self) -> tuple:
        """The fields in order: the positional arguments the engines' graphs take after the model inputs (the
        routing inputs only when present)."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self)
                     if not (f.name in self.ROUTING and self.routing is None))

    def routing_args(self) -> tuple:
        """(routing, router_grad) when present, else (): what a model forward takes besides its inputs."""
        return () if self.routing is None else (self.routing, self.router_grad)

    def without_routing(self) -> "LossInputs":
        """The fields the loss reads after the model (what a head-only graph takes: update/layerwise.py)."""
        return dataclasses.replace(self, routing=None, router_grad=None)

    def per_row(self, fn: Callable, token_fn: Callable = None) -> "LossInputs":
        """`fn` applied to every field with a row axis (slicing, packing), the others kept; `token_fn`, when
        given, to the routing inputs instead (per input token, not per response token: packing)."""
        return LossInputs(*(v if f.name in self.NOT_PER_ROW else (token_fn or fn)(v) if f.name in self.ROUTING
                            else fn(v) for f, v in zip(dataclasses.fields(self), self.args())))

    def rows(self, cut) -> "LossInputs":
        return self.per_row(lambda v: v[cut])

    def tensors(self) -> "LossInputs":
        return LossInputs(*(Tensor(np.asarray(v, np.int32 if f.name == "routing" else np.float32))
                            for f, v in zip(dataclasses.fields(self), self.args())))


def field_names() -> tuple:
    """The fields GRPOLossCell.terms reads, in order (the optional routing inputs are read before:
    GRPOLossCell.construct)."""
    return tuple(f.name for f in dataclasses.fields(LossInputs) if f.name not in LossInputs.ROUTING)
