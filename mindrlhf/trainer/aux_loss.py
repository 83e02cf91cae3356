"""Qwen3-MoE's load-balancing loss in the GRPO update (router_aux_loss_coef; MindSpeed-RL's moe_aux_loss_coeff).

transformers' form (load_balancing_loss_func; models/moe.load_balancing_loss) over one global mini-batch: the L
sparse layers' routings of its N real input tokens (prompts and responses, padding out, on every row share of the train layout)
pooled,

    aux = E * sum_e f_e * P_e,    f_e = C_e / (L N),    P_e = S_e / (L N),

C_e the top-k slots that went to expert e and S_e the sum of the router probabilities of e. f is a count, so aux is
linear in every token's router probabilities: d aux / d p[l, t, e] = E C_e / (L N)^2, the same for every layer and
real token. The update therefore needs no forward of its own for it: `router_grad` computes that gradient per
mini-batch from the counts of the whole global mini-batch (summed over the train layout's row shares), times the
coefficient and the number of shares (Mesh.row_ways: the train dp, times ep under the all-to-all dispatcher; the
update averages gradients over them), and the graphs add it to the router
probabilities' gradient (models/moe.AuxLossGradient). Micro-batches and DP / EP / TP layouts so get the gradient
one process gets with the whole mini-batch; TRL and Megatron take f and P per micro-batch instead.

Whose routing gives C: the routing the update's forward uses. r3: the rollout's; r2: the routing pass's (both
replayed); none: the routing pass's, the policy's own before the step's first update, which is exactly what that
update chooses (ties aside); later updates of the same step (several mini-batches, num_iterations) reuse it.

Reported as `moe/aux_loss`: transformers' aux_loss (not times the coefficient) of the policy before the step's
updates, from the routing pass's probabilities, mean over the step's mini-batches.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from mindrlhf.trainer import exchange


def describe(path: str, coef: float, joins: str) -> str:
    """The start-up line that says the aux loss is on (GRPO's update, SFT's loss): `joins` says over what, where."""
    return (f"aux loss: {path}: router_aux_loss_coef {coef:g} x the load-balancing loss (transformers' form) over "
            f"{joins}; reported as moe/aux_loss (set it to 0 to train without)")


def router_grad(ids: np.ndarray, prob_sums: np.ndarray, keep: np.ndarray, mini_batch: int, num_experts: int,
                coef: float, mesh) -> Tuple[np.ndarray, float]:
    """(router_grad (N, T, E) float32, mean aux loss over the mini-batches) for this train replica's rows.

    ids (N, T, L, k): the experts the update's forward uses per input token; prob_sums (N, T, E): the router
    probabilities summed over the sparse layers (the routing pass); keep (N, T) bool: the real tokens. Rows come
    mini-batch by mini-batch, `mini_batch` each; the counts are summed over the row shares of `mesh`."""
    rows, _, layers, _ = ids.shape
    batches = rows // mini_batch
    counts = np.zeros((batches, num_experts), np.float64)
    probs = np.zeros((batches, num_experts), np.float64)
    tokens = np.zeros((batches, 1), np.float64)
    for b in range(batches):
        cut = slice(b * mini_batch, (b + 1) * mini_batch)
        mine = keep[cut]
        counts[b] = np.bincount(ids[cut][mine].reshape(-1), minlength=num_experts)
        probs[b] = prob_sums[cut][mine].sum(0)
        tokens[b] = mine.sum()
    totals = exchange.sum_over_replicas(np.concatenate([counts, probs, tokens], 1).reshape(-1), mesh)
    totals = totals.reshape(batches, 2 * num_experts + 1)
    counts, probs, slots = totals[:, :num_experts], totals[:, num_experts:-1], np.maximum(totals[:, -1:], 1) * layers
    aux = num_experts * (counts / slots * probs / slots).sum(1)
    per_expert = coef * mesh.row_ways * num_experts * counts / slots ** 2                  # (batches, E)
    grad = keep[:, :, None] * np.repeat(per_expert, mini_batch, 0)[:, None, :]
    return grad.astype(np.float32), float(aux.mean())
