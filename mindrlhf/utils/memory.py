"""Peak resident memory of this process per phase (MindSpore's own statistics read 0 on CPU), and over its
whole life.

Per phase: `reset_peak` starts a new window of the kernel's high-water mark (VmHWM) and `peak_mb` reads it.
Over the whole life: `process_peak_mb`, which keeps the highest mark of every window that was reset. Both are
the kernel's own page counts, exact, at no cost: sampling RSS from a thread instead can miss a short peak, and
on two cores its 5 ms wake-ups slowed the sampled GRPO step by 8-15% (docs/BENCHMARKS.md, "Measurements behind code choices").
"""
from __future__ import annotations

_PEAK_OF_RESET_WINDOWS_MB = [0.0]     # the highest VmHWM read just before a reset_peak


def reset_peak():
    """Start a new VmHWM window (the mark drops to the current RSS); process_peak_mb keeps the old mark."""
    _PEAK_OF_RESET_WINDOWS_MB[0] = max(_PEAK_OF_RESET_WINDOWS_MB[0], peak_mb())
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _status_kb(field: str) -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def peak_mb() -> float:
    """Peak RSS since the last reset_peak (or the process's start)."""
    return _status_kb("VmHWM") / 1024.0


def process_peak_mb() -> float:
    """Peak RSS since the process started, whatever reset_peak did in between (VmHWM is never below VmRSS:
    the kernel reports the higher of the two)."""
    return max(_PEAK_OF_RESET_WINDOWS_MB[0], peak_mb())


def rss_mb() -> float:
    return _status_kb("VmRSS") / 1024.0
