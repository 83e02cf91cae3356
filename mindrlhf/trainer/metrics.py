"""Per-step metrics: one readable stdout line, a JSONL file, and TensorBoard when a writer is installed."""
from __future__ import annotations

import json
import os
from typing import Dict

_SHOWN = [("reward", "reward_mean", "{:.3f}"), ("acc", "accuracy", "{:.3f}"), ("len", "response_len_mean", "{:.1f}"),
          ("kl", "kl", "{:.4f}"), ("clip", "clip_frac", "{:.3f}"), ("ent", "entropy", "{:.3f}"),
          ("gnorm", "grad_norm", "{:.3f}"), ("lr", "lr", "{:.2e}"), ("gap", "rollout_train_logprob_gap", "{:.1e}"),
          ("s", "time_step", "{:.1f}"), ("eval_acc", "eval_accuracy", "{:.3f}")]


def _tensorboard_writer(log_dir: str):
    for module in ("torch.utils.tensorboard", "tensorboardX"):
        try:
            mod = __import__(module, fromlist=["SummaryWriter"])
            return mod.SummaryWriter(log_dir)
        except Exception:  # optional dependency: absent or broken -> JSONL only
            continue
    return None


class MetricsLogger:
    def __init__(self, log_dir: str, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self.path = os.path.join(log_dir, "metrics.jsonl")
        self._tb = None
        if enabled:
            os.makedirs(log_dir, exist_ok=True)
            self._tb = _tensorboard_writer(os.path.join(log_dir, "tensorboard")) if tensorboard else None

    def log(self, step: int, metrics: Dict[str, float], echo=print):
        if not self.enabled:
            return
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, float(v), step)
            self._tb.flush()
        parts = [f"step {step}"] + [f"{label} {fmt.format(metrics[key])}" for label, key, fmt in _SHOWN
                                    if key in metrics]
        if echo:
            echo(" | ".join(parts))

    def close(self):
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
