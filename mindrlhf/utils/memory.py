"""Peak resident memory of this process per phase (MindSpore's own statistics read 0 on CPU)."""
from __future__ import annotations


def reset_peak():
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
    return _status_kb("VmHWM") / 1024.0


def rss_mb() -> float:
    return _status_kb("VmRSS") / 1024.0
