"""build_update: the update engine and log-prob cells a resolved run names (trainer/update/__init__ lists them)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from mindrlhf.trainer.optim import AdamW
from mindrlhf.trainer.update.layerwise import LayerTemplate, LayerwiseLogProb, LayerwiseTrainStep
from mindrlhf.trainer.update.loss import GRPOLossCell
from mindrlhf.trainer.update.one_graph import ModelRouting, PolicyTrainStep, ResponseLogProb
from mindrlhf.trainer.update.pipelined import PipelineLogProb, PipelineRouting, PipelineTrainStep


@dataclass
class Update:
    step: object                        # one_graph.PolicyTrainStep, pipelined.PipelineTrainStep, layerwise...
    logprob_cell: Callable              # model -> its no-grad log-prob cell, built the way the update runs
    routing_cell: Callable              # model -> its routing pass (a Qwen3-MoE's own experts), the same way


def build_update(run, policy, optimizer: AdamW, read_len: int, micro_rows: int) -> Update:
    """The update engine and log-prob cells `run` (a ResolvedRun) names, for the policy read over `read_len`
    response positions (the packed width with packed rows) and packed micro-batches of `micro_rows` (0: none)."""
    temperature, shared, m = run.logprob_temperature, run.shared_prompt, run.micro_batches
    max_norm = run.cfg.optim.max_grad_norm
    loss_cell = GRPOLossCell(policy, run.cfg.rl, read_len, temperature, run.on_policy, m, shared, run.routing_inputs)
    template: Optional[LayerTemplate] = None
    if run.update_graphs == "layerwise":
        template = LayerTemplate(policy, bool(shared[0]))
        step = LayerwiseTrainStep(loss_cell, optimizer, run.train_mesh, max_norm, m, template, micro_rows)
    elif run.update_graphs == "host":
        step = PipelineTrainStep(loss_cell, optimizer, run.train_mesh, max_norm, m, micro_rows)
    else:
        step = PolicyTrainStep(loss_cell, optimizer, run.train_mesh, max_norm)

    def logprob_cell(model):
        if run.logprob_graphs == "layerwise":
            return LayerwiseLogProb(model, template, read_len, temperature, shared,
                                    micro_rows or run.geometry.mini_batch // m, micro_rows or run.geometry.mini_batch)
        if run.logprob_graphs == "stages":
            return PipelineLogProb(model, read_len, temperature, m, micro_rows)
        return ResponseLogProb(model, read_len, temperature, shared)

    def routing_cell(model):
        return PipelineRouting(model, m) if run.logprob_graphs == "stages" else ModelRouting(model)

    return Update(step, logprob_cell, routing_cell)
