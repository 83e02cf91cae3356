"""The GRPO loss of a mini-batch (GRPOLossCell) and what an update reports: the same for every update engine
(update/one_graph.py, pipelined.py, layerwise.py).

A training sequence is [prompt left-padded to P | response right-padded to R]; the logprob of response
token k is read at input position P - 1 + k. Shapes are static per run so each graph compiles once.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import nn, ops

from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.trainer.grpo_math import CovOptions, agg_token_mean, grpo_loss, tis_weights


def response_logprobs(model: CausalLM, input_ids, position_ids, bias, labels, response_len: int,
                      temperature: float, shared_prompt=(0, 0), routing=None, router_grad=None):
    """(logprob, entropy) of the last `response_len` label positions under softmax(logits / temperature),
    each (N, R): the log-prob convention of rollout/sampling.py. shared_prompt = (group, prompt width): rows
    come in groups of `group` with one prompt, which then runs once per group; (0, 0): every row whole.
    `routing` (N, T, sparse layers, k): experts to replay (router replay), None: the router's own;
    `router_grad` (N, T, E): the aux loss's gradient (trainer/aux_loss.py)."""
    return model.token_logprobs(input_ids, position_ids, bias, labels, response_len, temperature, *shared_prompt,
                                routing=routing, router_grad=router_grad)


class GRPOLossCell(nn.Cell):
    """The GRPO loss of one mini-batch. `on_policy`: the weights that sampled are the weights being trained
    (one update per rollout), so the old log-probs are this forward's own, detached (as TRL does): no
    separate old-policy pass (the `old_logp` input is then unused), and the mean |train - rollout| log-prob
    gap comes back as a statistic. `rl.tis`: the policy-gradient term is weighted per token by
    min(exp(old - rollout), tis_cap) (grpo_math.tis_weights); its mean, max and clipped share come back.
    `rl.loss_mode` picks the policy term (grpo_math.POLICY_LOSSES; clip_frac is that variant's clipped or
    selected share) and `rl.top_entropy_quantile` < 1 keeps it on this call's highest-entropy tokens only: the
    quantile is over one micro-batch on one rank (TRL gathers the entropies of every rank's micro-batch first).
    `rl.entropy_coeff` subtracts that times the aggregated entropy (the entropy bonus)."""

    def __init__(self, model: CausalLM, rl, response_len: int, temperature: float = 1.0, on_policy: bool = False,
                 micro_batches: int = 1, shared_prompt=(0, 0), routed: bool = False):
        super().__init__(auto_prefix=False)
        self.model = model
        self.routed = routed                # the loss inputs end with the routing inputs (LossInputs)
        self.shared_prompt = tuple(shared_prompt)       # see response_logprobs
        # the token-mean terms are normalised by the mini-batch's token count (token_norm), so micro-batch
        # losses add up to the mini-batch's; the sequence means are per call, hence 1/m
        self.seq_scale = 1.0 if rl.loss_agg == "token-mean" else 1.0 / micro_batches
        self.response_len = response_len
        self.temperature = temperature
        self.on_policy = on_policy
        self.clip_low, self.clip_high = rl.clip_low, rl.clip_high
        self.beta, self.kl_estimator, self.agg = rl.beta, rl.kl_estimator, rl.loss_agg
        self.tis, self.tis_cap = rl.tis, rl.tis_cap
        self.loss_mode, self.top_entropy_quantile = rl.loss_mode, rl.top_entropy_quantile
        self.cov = CovOptions(rl.kl_cov_ratio, rl.ppo_kl_coef, rl.clip_cov_ratio, rl.clip_cov_lb, rl.clip_cov_ub)
        self.entropy_coeff = rl.entropy_coeff
        if self.entropy_coeff != 0:
            model.differentiate_entropy()       # the bonus's gradient: through every logit

    def construct(self, input_ids, position_ids, bias, labels, *loss_inputs):
        if self.routed:
            logp, ent = response_logprobs(self.model, input_ids, position_ids, bias, labels, self.response_len,
                                          self.temperature, self.shared_prompt, *loss_inputs[-2:])
            return self.terms(logp, ent, loss_inputs[:-2])
        logp, ent = response_logprobs(self.model, input_ids, position_ids, bias, labels, self.response_len,
                                      self.temperature, self.shared_prompt)
        return self.terms(logp, ent, loss_inputs)

    def terms(self, logp, ent, loss_inputs):
        """(loss, LOSS_STATS) from the policy's log-probs and entropies (N, R) and `loss_inputs`
        (LossInputs.args()): construct's part after the model (update/layerwise.py runs the model one layer
        per graph and calls this from the final stream). The one place that reads the loss inputs by name."""
        mask, old_logp, rollout_logp, ref_logp, advantages, token_norm = loss_inputs
        fmask = ops.cast(mask, ms.float32)
        gap = ops.zeros((), ms.float32)
        if self.on_policy:
            gap = agg_token_mean(ops.abs(ops.stop_gradient(logp) - rollout_logp), fmask, self.response_len,
                                 token_norm)
            old_logp = ops.stop_gradient(logp)
        weight = None
        tis_mean, tis_max, tis_clipped = ops.zeros((), ms.float32), ops.zeros((), ms.float32), ops.zeros((), ms.float32)
        if self.tis:
            weight, ratio = tis_weights(old_logp, rollout_logp, self.tis_cap)
            tis_mean = agg_token_mean(ratio, fmask, self.response_len, token_norm)
            tis_max = ops.amax(ratio * fmask)
            tis_clipped = agg_token_mean(ops.cast(ratio > self.tis_cap, ms.float32), fmask, self.response_len,
                                         token_norm)
        loss, pg_loss, kl, clip_frac = grpo_loss(logp, old_logp, ref_logp, advantages, mask, self.clip_low,
                                                 self.clip_high, self.beta, self.kl_estimator, self.agg,
                                                 self.response_len, token_norm, weight, self.loss_mode, ent,
                                                 self.top_entropy_quantile, self.cov, self.entropy_coeff)
        entropy = agg_token_mean(ops.stop_gradient(ent), fmask, self.response_len, token_norm)
        if self.seq_scale != 1.0:
            loss, pg_loss, kl = loss * self.seq_scale, pg_loss * self.seq_scale, kl * self.seq_scale
        return loss, (pg_loss, kl, clip_frac, entropy, gap, tis_mean, tis_max, tis_clipped)


# the loss cell's statistics (GRPOLossCell.terms' second output, in order)
LOSS_STATS = ("pg_loss", "kl", "clip_frac", "entropy", "on_policy_gap", "tis_ratio_mean", "tis_ratio_max",
              "tis_clipped_frac")
# what each update reports (every engine's outputs, then the learning rate), averaged over a step's updates
UPDATE_STATS = ("loss", "pg_loss", "kl", "clip_frac", "entropy", "grad_norm", "on_policy_gap", "tis_ratio_mean",
                "tis_ratio_max", "tis_clipped_frac", "lr")
MAX_STATS = ("tis_ratio_max",)          # reduced by max over updates and ranks; the rest by mean
TIS_STATS = ("tis_ratio_mean", "tis_ratio_max", "tis_clipped_frac")


def reduce_updates(per_update) -> np.ndarray:
    """(updates, UPDATE_STATS) -> UPDATE_STATS: MAX_STATS by max over the updates, the rest by mean."""
    stats = np.array(per_update, np.float64)
    return np.array([stats[:, i].max() if name in MAX_STATS else stats[:, i].mean()
                     for i, name in enumerate(UPDATE_STATS)])
