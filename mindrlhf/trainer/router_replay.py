"""Router replay for Qwen3-MoE (rl.router_replay) and the routing metrics of a MoE run.

The rollout records the experts every token it feeds through the model goes to (rollout/engine.RoutingRecord ->
SampleBatch.routing). The policy's training passes can then replay a fixed choice of experts instead of their
routers' top-k (models/moe.MoEFeedForward.route), so the expert choice cannot differ between the passes whose
log-probs the loss compares:
- r3: the rollout's choice, in the old-policy pass and every update (rollout-train mismatch of the routing gone);
- r2: the policy's own choice before the step's first update (one routing pass over the samples), in every
  update (the routing cannot drift between the updates of one step; with one update per rollout it replays
  what that update would have chosen anyway);
- none: every pass routes itself.
The routing weights are always the training router's probabilities of the chosen experts, renormalised, so the
router keeps its gradient. The reference model routes itself.

Metrics (every MoE run): `moe/expert_load_max_over_mean` (the rollout's tokens per expert, max over mean, mean
over the sparse layers; 1.0 is perfectly balanced). When the routing pass runs (replay on, or the aux loss), it
also gives `moe/routing_agreement` (the share of tokens whose k experts the policy's routers choose exactly as the
rollout's did, mean over the sparse layers) and `moe/routing_agreement_min` (the least agreeing layer).

StepRouting gathers what a step's passes take: the routing the old-policy pass replays and the update's routing
inputs (LossInputs.routing / router_grad: the replayed experts, -1 where the forward routes itself, and the aux
loss's gradient, trainer/aux_loss.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import numpy as np

from mindrlhf.trainer import exchange
from mindrlhf.trainer.aux_loss import router_grad
from mindrlhf.trainer.samples import SampleBatch


@dataclass
class StepRouting:
    """A step's routing on this train replica's rows; all None for a dense model or a step without an update."""
    replayed: Optional[np.ndarray] = None       # (N, T, sparse layers, k) what every policy pass replays
    update: Optional[np.ndarray] = None         # the update's routing: `replayed`, or -1 (routes itself)
    router_grad: Optional[np.ndarray] = None    # (N, T, E) the aux loss's gradient (zeros at coefficient 0)
    metrics: Dict[str, float] = field(default_factory=dict)

    def rows(self, cut) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        """(routing, router_grad) of rows `cut`: the update's optional loss inputs."""
        return (None, None) if self.update is None else (self.update[cut], self.router_grad[cut])

    @classmethod
    def of(cls, run, samples: SampleBatch, my_samples: SampleBatch, policy_routing, mini_batch: int,
           mesh) -> "StepRouting":
        """From the step's `samples` (every rank holds them), this replica's `my_samples` and the policy's routing
        pass over them (ModelRouting's (experts, probability sums), None when it did not run); `run` a
        ResolvedRun (rl.router_replay, routing_inputs, aux_loss_coef)."""
        num_experts = run.model_cfg.num_experts
        ids, prob_sums = (None, None) if policy_routing is None else policy_routing
        metrics = routing_metrics(samples, num_experts, ids, my_samples, mesh)
        replayed = replayed_routing(run.cfg.rl.router_replay, my_samples, ids)
        if not run.routing_inputs or ids is None:
            return cls(replayed, metrics=metrics)
        update = np.full(ids.shape, -1, np.int32) if replayed is None else replayed
        grad, aux = router_grad(update if replayed is not None else ids, prob_sums, recorded_positions(my_samples),
                                mini_batch, num_experts, run.aux_loss_coef, mesh)
        metrics["moe/aux_loss"] = aux
        return cls(replayed, update, grad, metrics)


def replayed_routing(mode: str, samples: SampleBatch, policy_routing: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """What the policy's passes over `samples` replay, in the model inputs' layout: r3 the rollout's routing,
    r2 the policy's own (`policy_routing`, the routing pass's output; None: no update this step), none: None."""
    if mode == "r3":
        return samples.input_routing()
    if mode == "r2" and policy_routing is not None:
        return np.sort(policy_routing, -1)
    return None


def recorded_positions(samples: SampleBatch) -> np.ndarray:
    """(N, P + R - 1) bool, in the model inputs' layout: the tokens whose routing the rollout recorded, the real
    prompt tokens and every response token that was fed back (all but each row's last)."""
    return np.concatenate([samples.prompt_mask, samples.response_mask[:, 1:]], 1).astype(bool)


def expert_load(samples: SampleBatch, num_experts: int) -> np.ndarray:
    """(sparse layers, E) the rollout's recorded tokens per expert."""
    routing = samples.input_routing()[recorded_positions(samples)]            # (tokens, layers, k)
    layers = routing.shape[1]
    counts = np.zeros((layers, num_experts), np.int64)
    for layer in range(layers):
        counts[layer] = np.bincount(routing[:, layer].reshape(-1), minlength=num_experts)
    return counts


def routing_metrics(samples: SampleBatch, num_experts: int, policy_routing: Optional[np.ndarray] = None,
                    my_samples: Optional[SampleBatch] = None, mesh=None) -> Dict[str, float]:
    """The step's routing metrics from the whole step's `samples` (every rank holds them) and, when given, this
    train replica's rows `my_samples` with the policy's own routing of them (`policy_routing`, ModelRouting's
    output, any order per token), summed over the train-DP replicas of `mesh`. None for a dense model's samples."""
    if samples.routing is None:
        return {}
    load = expert_load(samples, num_experts)
    metrics = {"moe/expert_load_max_over_mean": float(np.mean(load.max(1) / np.maximum(load.mean(1), 1e-9)))}
    if policy_routing is not None:
        keep = recorded_positions(my_samples)
        same = (np.sort(policy_routing, -1) == my_samples.input_routing()).all(-1)[keep]     # (tokens, layers)
        totals = exchange.sum_over_replicas(np.concatenate([same.sum(0), [len(same)]]).astype(np.float64), mesh)
        agree = totals[:-1] / max(totals[-1], 1.0)
        metrics.update({"moe/routing_agreement": float(agree.mean()), "moe/routing_agreement_min": float(agree.min())})
    return metrics
