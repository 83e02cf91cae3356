"""Per-step metrics: one readable stdout line, a JSONL file, and TensorBoard when a writer is installed."""
from __future__ import annotations

import json
import os
import time
from typing import Callable, Dict, Optional, Sequence

import numpy as np

from mindrlhf.parallel import watchdog
from mindrlhf.trainer import exchange
from mindrlhf.trainer.update.loss import MAX_STATS, TIS_STATS, UPDATE_STATS
from mindrlhf.utils import memory
from mindrlhf.utils.atomic import atomic_path

_SHOWN = [("reward", "reward_mean", "{:.3f}"), ("acc", "accuracy", "{:.3f}"), ("len", "response_len_mean", "{:.1f}"),
          ("kl", "kl", "{:.4f}"), ("clip", "clip_frac", "{:.3f}"), ("ent", "entropy", "{:.3f}"),
          ("loss", "loss", "{:.4f}"), ("gnorm", "grad_norm", "{:.3f}"), ("lr", "lr", "{:.2e}"), ("gap", "rollout_train_logprob_gap", "{:.1e}"),
          ("load", "moe/expert_load_max_over_mean", "{:.2f}"), ("aux", "moe/aux_loss", "{:.3f}"),
          ("s", "time_step", "{:.1f}"), ("eval_acc", "eval_accuracy", "{:.3f}"),
          ("eval_loss", "eval_loss", "{:.4f}")]


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
            fh.flush()
            os.fsync(fh.fileno())
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, float(v), step)
            self._tb.flush()
        parts = [f"step {step}"] + [f"{label} {fmt.format(metrics[key])}" for label, key, fmt in _SHOWN
                                    if key in metrics]
        parts += [f"{key} {metrics[key]:.3f}" for key in metrics if key.startswith("eval_pass@")]   # n varies
        if echo:
            echo(" | ".join(parts))

    def truncate_after(self, step: int):
        """Resume: drop the rows of steps after `step` (they are trained again), so each step appears once."""
        if not (self.enabled and os.path.isfile(self.path)):
            return
        keep = [r for r in read_metrics(self.path) if r["step"] <= step]
        with atomic_path(self.path) as tmp:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in keep)

    def close(self):
        if self._tb is not None:
            self._tb.close()


def sample_metrics(samples, rewards: np.ndarray, scored, episodes=None, infer_mesh=None) -> Dict[str, float]:
    """Metrics of the whole step's samples (every rank holds all of them). `episodes` (rollout/episodes.
    EpisodeTools, multi-turn runs): the episode counters and the tool runner's (tool_metrics)."""
    lengths = samples.response_mask.sum(1)
    metrics = {
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
        "accuracy": float(np.mean(scored.parts.get("accuracy_reward", [np.nan]))),
        "response_len_mean": float(lengths.mean()), "response_len_max": float(lengths.max()),
        "response_clipped_frac": float(1.0 - samples.finished.mean()),
        "tokens_generated": float(samples.loss_mask.sum()),      # the model's own (tool tokens are not)
    }
    if episodes is not None:
        tool_tokens = (samples.response_mask - samples.loss_mask).sum(1)
        metrics.update({"episode/tool_calls_mean": float(samples.tool_calls.mean()),
                        "episode/tool_calls_max": float(samples.tool_calls.max()),
                        "episode/tool_tokens_mean": float(tool_tokens.mean()),
                        "episode/with_tool_call_frac": float((samples.tool_calls > 0).mean())})
        metrics.update(tool_metrics(episodes.runner, infer_mesh))
    for name, values in scored.parts.items():
        metrics[f"reward/{name}"] = float(np.mean(values))
    metrics.update(scored.stats)
    return metrics


TOOL_STATS = ("calls", "errors", "timeouts", "truncations", "seconds")


def tool_metrics(runner, infer_mesh) -> Dict[str, float]:
    """tools/<name>/{calls,errors,timeouts,truncations,seconds} since the last step (then reset), every tool
    always (zeros when not called), malformed calls under "(malformed)", unknown names under "(unknown)";
    summed over the infer-DP replicas (each runs its own rows' calls; TP peers run the same ones and count
    once). tools/abandoned_threads: timed-out functions whose threads still run (not reset)."""
    stats = runner.stats()
    runner.metrics(reset=True)
    names = sorted(runner.tools) + ["(malformed)", "(unknown)"]
    values = [float(getattr(stats.get(n), k, 0)) for n in names for k in TOOL_STATS] + [runner.abandoned_threads]
    total = exchange.sum_over_replicas(values, infer_mesh).tolist()
    out = {f"tools/{n}/{k}": total[i * len(TOOL_STATS) + j] for i, n in enumerate(names)
           for j, k in enumerate(TOOL_STATS)}
    out["tools/abandoned_threads"] = total[-1]
    return out


class PhaseClock:
    """Runs a step's phases: tells the watchdog which one is running, and keeps each phase's seconds
    (summed over its calls) and peak memory for the step's metrics; `report(name, seconds)`, when given, hears
    of each phase as it ends (a long first step says what it is doing)."""

    def __init__(self, report: Optional[Callable[[str, float], None]] = None):
        self.started, self.times, self.peaks = time.time(), {}, {}
        self.report = report

    def __call__(self, name: str, fn, *args):
        watchdog.enter(name)
        memory.reset_peak()
        t0 = time.time()
        result = fn(*args)
        seconds = time.time() - t0
        self.times[name] = self.times.get(name, 0.0) + seconds
        self.peaks[name] = max(self.peaks.get(name, 0.0), memory.peak_mb())
        if self.report is not None:
            self.report(name, seconds)
        return result

    def metrics(self) -> Dict[str, float]:
        out = {f"time_{k}": v for k, v in self.times.items()}
        out.update({f"peak_mb_{k}": v for k, v in self.peaks.items()})
        return out


class PhaseClocks:
    """A PhaseClock per step. The process's first step compiles its graphs as they are first used (tens of
    seconds for a deep model on CPU, with nothing else to show): it says so through `echo` (the trainer's log,
    or the progress bar's writer while one shows) and reports each phase as it ends."""

    def __init__(self, echo: Callable[[str], None]):
        self.echo, self.first = echo, True

    def new(self, step: int) -> PhaseClock:
        if not self.first:
            return PhaseClock()
        self.first = False
        self.echo(f"step {step}: the first of this process; graphs not compiled yet compile as they are first "
                  f"used, so it runs longer than the steps after it. Its phases as they end:")
        return PhaseClock(lambda name, seconds: self.echo(f"  step {step} {name}: {seconds:.1f} s"))


def logprob_gap_sum_count(samples, old_logp: np.ndarray) -> list:
    """(sum, count) of |rollout - old-policy log-prob| over this rank's trained tokens: update_metrics' input."""
    gap = np.abs(samples.rollout_logp - old_logp)[samples.loss_mask.astype(bool)]
    return [gap.sum(), gap.size]


def update_metrics(local_stats: Sequence[float], gap_sum_count: Sequence[float], on_policy: bool,
                   tis: bool) -> Dict[str, float]:
    """The step's UPDATE_STATS over every rank (MAX_STATS by max, with TIS; the rest by mean), and the
    rollout-vs-train log-prob gap: the train step's own when on-policy, else from this rank's (sum, count)
    of |rollout - old| over response tokens. Every rank gets the same numbers (a NaN anywhere is NaN here)."""
    stats = exchange.mean_over_ranks(list(local_stats) + list(gap_sum_count))
    result = dict(zip(UPDATE_STATS, stats.tolist()))
    if tis:                              # the only statistics reduced by max (one more collective)
        maxima = exchange.max_over_ranks([local_stats[UPDATE_STATS.index(k)] for k in MAX_STATS])
        result.update(zip(MAX_STATS, maxima.tolist()))
    drop = {"on_policy_gap"} | (set() if tis else set(TIS_STATS))
    metrics = {k: v for k, v in result.items() if k not in drop}
    metrics["rollout_train_logprob_gap"] = (result["on_policy_gap"] if on_policy
                                            else float(stats[-2] / max(stats[-1], 1.0)))
    return metrics


def read_metrics(path: str):
    """Rows of a metrics.jsonl; a last line cut short by a crash is skipped."""
    with open(path, encoding="utf-8") as fh:
        lines = [line for line in fh if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except ValueError:
            if i != len(lines) - 1:
                raise ValueError(f"{path}:{i + 1}: not a JSON line") from None
    return rows
