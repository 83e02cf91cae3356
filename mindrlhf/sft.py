"""Supervised fine-tuning on chat conversations: the cold start before GRPO (tool use, an answer format).

    python -m mindrlhf.sft --model smollm2 --dataset sft.jsonl --output_dir sft_out --epochs 2 --lr 2e-5

Rows are `messages` conversations (tool calls and tool results included, TRL's and verl's form; see
data/conversations.py), rendered by the model folder's chat template; the loss is on the assistant's tokens
only. The model, its weights, layouts (--model_parallel; --expert_parallel for a Qwen3-MoE, taken from the
data-parallel ranks as GRPO's; every other rank data-parallel, under msrun with --use_parallel True), LoRA,
checkpoints (`output_dir/step_N`, which GRPO's --load_sft_checkpoint_train reads) and the HF export
(`output_dir/hf_policy`, merged under LoRA) are the GRPO trainer's own.
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

import numpy as np

from mindrlhf.configs.errors import CheckpointError, ConfigError
from mindrlhf.configs.fields import default, flag_parser, from_flags, help_field as _f
from mindrlhf.configs.grpo_config import LoraConfig, OptimConfig, RunConfig


@dataclass
class SFTConfig:
    """The SFT command's settings (flags, help and docs/CONFIG.md's table are generated from here)."""
    model: str = _f("", "a Hugging Face model folder, or a model YAML with --checkpoint", required=True)
    checkpoint: str = _f("", "the starting weights: an HF folder, save_ckpt_dir/step_N or a checkpoint file; "
                         "default: --model when it is an HF folder")
    vocab_path: str = _f("", "the folder with the tokenizer and chat template; default: --model")
    dataset: str = _f("", "chat conversations: .jsonl (one {\"messages\": [...]} a line) or a .json array",
                      required=True)
    eval_dataset: str = _f("", "held-out conversations for the eval loss (optional)")
    output_dir: str = _f("", "checkpoints (step_N), metrics.jsonl and the HF export (hf_policy)", required=True)
    max_length: int = _f(1024, "tokens per conversation; longer ones are cut (their end is lost, counted)")
    batch_size: int = _f(8, "conversations per optimizer step, over all data-parallel ranks")
    epochs: int = _f(1, "passes over the dataset (the last, partial batch of each pass is dropped)")
    total_steps: int = _f(0, "optimizer steps; 0: epochs x (conversations // batch_size)")
    lr: float = _f(1e-5, "peak learning rate (linear warm-up, then cosine decay to min_lr)")
    min_lr: float = _f(0.0, "learning rate at the last step")
    warmup_steps: int = _f(0, "linear warm-up steps")
    weight_decay: float = _f(default(OptimConfig, "weight_decay"), "AdamW's decoupled weight decay")
    max_grad_norm: float = _f(default(OptimConfig, "max_grad_norm"), "clip the global gradient norm (0: off)")
    seed: int = _f(default(RunConfig, "seed"), "shuffling seed")
    model_parallel: int = _f(1, "tensor-parallel ranks; the other ranks are data-parallel")
    expert_parallel: int = _f(1, "MoE models: expert-parallel ranks, each holding num_experts / expert_parallel of "
                              "every sparse layer's experts; taken from the data-parallel ranks (an EP group's "
                              "ranks train on the same rows)")
    moe_tp_extend_ep: bool = _f(False, "MoE models: the model_parallel ranks hold other whole experts instead of a "
                                "share of each one's width (experts split over expert_parallel x model_parallel)")
    lora_rank: int = _f(default(LoraConfig, "lora_rank"), "adapter rank; 0 = full fine-tuning")
    lora_alpha: float = _f(default(LoraConfig, "lora_alpha"), "adapter scale alpha (alpha / r)")
    target_modules: List[str] = _f(default(LoraConfig, "target_modules"), "layers with adapters (as GRPO's "
                                   "lora.target_modules)")
    eval_steps: int = _f(0, "eval loss every N steps and at the end (0: at the end only, with --eval_dataset)")
    save_steps: int = _f(0, "a checkpoint every N steps (0: none before the end)")
    keep_checkpoints: int = _f(default(RunConfig, "keep_checkpoints"), "checkpoints kept")
    export_hf: bool = _f(True, "write output_dir/hf_policy at the end")
    use_parallel: bool = _f(False, "under msrun: one process group over every worker")
    watchdog_timeout: float = _f(default(RunConfig, "watchdog_timeout"), "a rank silent this many seconds ends "
                                 "the job")
    progress: bool = _f(True, "a line every ~5% of the steps")


def build_parser():
    return flag_parser(SFTConfig, "python -m mindrlhf.sft", __doc__.split("\n")[0])


def config_from_argv(argv=None) -> SFTConfig:
    return from_flags(SFTConfig, build_parser().parse_args(argv))


def check(cfg: SFTConfig):
    for flag in ("model", "dataset"):
        if not os.path.exists(getattr(cfg, flag)):
            raise ConfigError(f"--{flag}: not found: {getattr(cfg, flag)}")
    for flag, low in (("max_length", 2), ("batch_size", 1), ("epochs", 1), ("model_parallel", 1),
                      ("expert_parallel", 1)):
        if getattr(cfg, flag) < low:
            raise ConfigError(f"--{flag}: expected >= {low}, got {getattr(cfg, flag)}")
    for flag in ("total_steps", "warmup_steps", "eval_steps", "save_steps", "lora_rank"):
        if getattr(cfg, flag) < 0:
            raise ConfigError(f"--{flag}: expected >= 0, got {getattr(cfg, flag)}")


class _Run:
    """What one SFT job trains with, built once."""

    def __init__(self, cfg: SFTConfig, log: Callable):
        from mindrlhf.configs.compat.hf import is_hf_folder
        from mindrlhf.configs.compat.keys import describe_ignored
        from mindrlhf.configs.lora import LoraSpec, parse_targets
        from mindrlhf.configs.model_config import ParallelConfig
        from mindrlhf.configs.compat.sources import load_model_yaml
        from mindrlhf.data.chat_template import ChatTemplate
        from mindrlhf.data.conversations import tokenize_conversations
        from mindrlhf.data.tokenizer import load_tokenizer
        from mindrlhf.parallel.mesh import mesh_for
        from mindrlhf.trainer import aux_loss, startup
        from mindrlhf.trainer.build import model_with_weights
        from mindrlhf.trainer.optim import AdamW
        from mindrlhf.trainer.resolve import special_ids
        from mindrlhf.trainer.sft import SFTLossValue, SFTStep
        from mindrlhf.trainer.update.one_graph import ModelRouting
        self.rank, world, nodes, self.log, _ = startup.join(cfg.use_parallel, cfg.watchdog_timeout, log)
        startup.set_cpu_threads(0, nodes, self.log)
        tp, ep = cfg.model_parallel, cfg.expert_parallel
        if world % tp:
            raise ConfigError(f"--model_parallel {tp} does not divide the {world} rank(s)")
        layout = ParallelConfig(data_parallel=world // tp, model_parallel=tp, expert_parallel=ep,
                                moe_tp_extend_ep=cfg.moe_tp_extend_ep)
        model_yaml = load_model_yaml(cfg.model)
        self.model_cfg = model_yaml.model
        try:
            layout.check_model(self.model_cfg, names={"model_parallel": "--model_parallel",
                                                      "expert_parallel": "--expert_parallel",
                                                      "moe_tp_extend_ep": "--moe_tp_extend_ep",
                                                      "data_parallel": "the data-parallel ranks (world / "
                                                                       "--model_parallel)"})
        except ConfigError as err:
            raise ConfigError(f"{cfg.model}: {err}") from None
        self.mesh = mesh_for(layout, world, self.rank, "SFT")
        if model_yaml.ignored:
            self.log(describe_ignored(model_yaml.path, model_yaml.ignored))
        self.aux_coef = self.model_cfg.router_aux_loss_coef if self.model_cfg.num_experts else 0.0
        if self.aux_coef:
            self.log(aux_loss.describe(cfg.model, self.aux_coef, "every real token of each step's global batch "
                                                                 "joins the loss"))
        weights = cfg.checkpoint or (cfg.model if is_hf_folder(cfg.model) else "")
        if not weights:
            raise ConfigError(f"--checkpoint: required with a model YAML ({cfg.model})")
        self.folder = cfg.vocab_path or cfg.model
        tokenizer = load_tokenizer(self.folder)
        template = ChatTemplate(self.folder)
        self.pad_id, _ = special_ids(tokenizer, self.model_cfg)
        self.train = tokenize_conversations(cfg.dataset, template, tokenizer, cfg.max_length, self.pad_id)
        self.eval = tokenize_conversations(cfg.eval_dataset, template, tokenizer, cfg.max_length, self.pad_id) \
            if cfg.eval_dataset else None
        n, b, dp = len(self.train.ids), cfg.batch_size, self.mesh.row_ways
        if b % dp or b > n:
            rows = f"{dp} data-parallel group(s) of distinct rows" if self.mesh.ep > 1 else \
                f"{dp} data-parallel rank(s)"
            raise ConfigError(f"--batch_size {b}: expected a multiple of the {rows}, at most the {n} conversations "
                              f"of --dataset")
        self.per_epoch = n // b
        self.total = cfg.total_steps or cfg.epochs * self.per_epoch
        self.lora = LoraSpec(cfg.lora_rank, float(cfg.lora_alpha), parse_targets(cfg.target_modules), cfg.seed) \
            if cfg.lora_rank else None
        self.model = model_with_weights(self.model_cfg, self.mesh, weights, self.lora, self.log)
        self.optimizer = AdamW(list(self.model.trainable_params()), cfg.weight_decay)
        self.step_fn = SFTStep(self.model, self.optimizer, cfg.max_grad_norm)
        self.routing = ModelRouting(self.model) if self.aux_coef else None
        self.loss_value = SFTLossValue(self.model)
        cut = self.train.truncated + (self.eval.truncated if self.eval else 0)
        self.log(f"SFT: {n} conversations ({int(self.train.loss_mask.sum())} assistant tokens"
                 + (f", {cut} cut at --max_length {cfg.max_length}" if cut else "") + f"), {self.total} steps of "
                 f"{b}; layout {self.mesh.sizes()}" + (f"; {self.lora.describe()}" if self.lora else ""))

    def rows(self, step: int, cfg: SFTConfig) -> np.ndarray:
        """The global batch of `step`: epoch-wise permutations keyed by (seed, epoch), remainders dropped."""
        epoch, k = divmod(step, self.per_epoch)
        order = np.random.default_rng([cfg.seed, epoch]).permutation(len(self.train.ids))
        return order[k * cfg.batch_size:(k + 1) * cfg.batch_size]


def _my_rows(rows: np.ndarray, mesh) -> np.ndarray:
    per = len(rows) // mesh.row_ways
    return rows[mesh.row_index * per:(mesh.row_index + 1) * per]


def eval_loss(run: _Run, batch_size: int) -> float:
    """The mean loss over every assistant token of the eval set: each DP replica takes every dp-th
    conversation, in chunks of batch_size / dp (the last one filled with untrained rows: one compiled shape)."""
    from mindspore import Tensor
    from mindrlhf.trainer import exchange
    from mindrlhf.trainer.sft import sft_inputs
    table, mesh = run.eval, run.mesh
    ways, share = mesh.row_ways, mesh.row_index
    chunk = batch_size // ways
    mine = np.arange(share, len(table.ids), ways)
    count = -(-len(table.ids) // ways)                 # every replica runs as many chunks (ceil)
    mine = np.concatenate([mine, np.zeros(count - len(mine), np.int64)])
    weight = np.arange(count) < len(np.arange(share, len(table.ids), ways))
    total = 0.0
    for start in range(0, count, chunk):
        rows = np.resize(mine[start:start + chunk], chunk)
        keep = np.resize(weight[start:start + chunk], chunk) & (np.arange(chunk) < len(mine[start:start + chunk]))
        inputs = sft_inputs(table.ids[rows], table.loss_mask[rows] * keep[:, None], table.lengths[rows])
        total += float(run.loss_value(*inputs, Tensor(np.float32(1.0))).asnumpy())
    total = float(exchange.sum_over_replicas([total], mesh)[0])
    return total / max(float(table.loss_mask[:, 1:].sum()), 1.0)


def train(cfg: SFTConfig, log: Callable = print) -> Optional[List[dict]]:
    """The SFT job; rank 0 returns the metrics rows, the other ranks None."""
    from mindspore import Tensor
    from mindrlhf.checkpoint.hf_interop import export_hf
    from mindrlhf.models.lora import merged_weights
    from mindrlhf.parallel import watchdog
    from mindrlhf.trainer import checkpointing, exchange
    from mindrlhf.trainer.metrics import MetricsLogger
    from mindrlhf.trainer.optim import lr_at
    from mindrlhf.trainer.sft import aux_loss_gradient, sft_inputs
    check(cfg)
    run = _Run(cfg, log)
    metrics = MetricsLogger(cfg.output_dir, enabled=run.rank == 0, tensorboard=False)
    rows_out, t0 = [], time.time()
    layout = checkpointing.layout_record(run.mesh.world_size, run.mesh, run.mesh, run.model_cfg)   # as GRPO does
    for step in range(run.total):
        watchdog.enter("sft")
        rows = run.rows(step, cfg)
        mine = _my_rows(rows, run.mesh)
        token_norm = max(float(run.train.loss_mask[rows, 1:].sum()), 1.0) / run.mesh.row_ways
        lr = lr_at(step, cfg.lr, cfg.warmup_steps, run.total, cfg.min_lr)
        inputs = sft_inputs(run.train.ids[mine], run.train.loss_mask[mine], run.train.lengths[mine])
        router, aux = (), None           # a Qwen3-MoE's aux loss: its gradient on the router probabilities
        if run.routing is not None:
            grad, aux = aux_loss_gradient(run.routing, inputs, run.train.lengths[mine], run.aux_coef, run.mesh)
            router = (grad,)
        loss, grad_norm = run.step_fn(*inputs, Tensor(np.float32(token_norm)), Tensor(np.float32(lr)), *router)
        loss = float(exchange.sum_over_replicas([float(loss.asnumpy())], run.mesh)[0]) / run.mesh.row_ways
        row = {"loss": loss, "grad_norm": float(grad_norm.asnumpy()), "lr": lr, "time_elapsed": time.time() - t0}
        if aux is not None:
            row["moe/aux_loss"] = aux
        if not (math.isfinite(loss) and math.isfinite(row["grad_norm"])):
            raise RuntimeError(f"step {step + 1}: the loss or gradient norm is not finite (loss={loss}); the last "
                               f"checkpoint is untouched. Lower --lr or check the data")
        last = step + 1 == run.total
        if run.eval is not None and (last or (cfg.eval_steps and (step + 1) % cfg.eval_steps == 0)):
            row["eval_loss"] = eval_loss(run, cfg.batch_size)
        show = cfg.progress and ((step + 1) % max(1, run.total // 20) == 0 or last)
        metrics.log(step + 1, row, echo=run.log if show else None)
        rows_out.append({"step": step + 1, **row})
        if (cfg.save_steps and (step + 1) % cfg.save_steps == 0) or last:
            checkpointing.save_training_checkpoint(cfg.output_dir, step + 1, run.rank, run.model, run.optimizer,
                                                   rank_state={}, trainer_state={"step": step + 1, "layout": layout,
                                                                                 "sft": True},
                                                   keep=cfg.keep_checkpoints)
    if cfg.export_hf:
        out = os.path.join(cfg.output_dir, "hf_policy")
        exchange.write_full_policy(run.model, lambda full: export_hf(full, out, run.model_cfg, tokenizer_dir=run.folder,
                                                                     overwrite=True, flag="output_dir/hf_policy"),
                                   merged_weights(run.model))
        run.log(f"wrote {out}")
    watchdog.stop()
    return rows_out if run.rank == 0 else None


def main(argv=None) -> int:
    try:
        train(config_from_argv(argv))
    except (ConfigError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
