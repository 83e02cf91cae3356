"""utils.memory: per-phase peaks and the process's peak over all of them (what bench_vs_trl reports)."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Touches 300 MB, frees it, then starts a new peak window: the window's peak no longer shows the 300 MB, the
# process's peak must. A fresh process, so that no earlier peak of pytest's own hides the allocation.
_CHILD = """
import json, numpy as np
from mindrlhf.utils import memory
before = memory.rss_mb()
block = np.ones(300 * 2**20 // 8)
del block
memory.reset_peak()
print(json.dumps({"before": before, "window": memory.peak_mb(), "process": memory.process_peak_mb(),
                  "cleared": memory.peak_mb() < before + 150}))
"""


def test_process_peak_survives_the_per_phase_resets():
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=REPO), check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["process"] >= res["before"] + 290, res
    if res["cleared"]:          # /proc/self/clear_refs writable: the window restarted below the old peak
        assert res["window"] < res["process"] - 150, res
