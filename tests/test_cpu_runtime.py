"""utils/cpu_threads: MindSpore's host work runs in the calling thread (no spinning async-queue wait)."""
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# runs one jit graph and prints the names of the process's threads; argv[1]: "call" to go through
# run_in_calling_thread first, "skip" not to
_PROBE = """
import glob, os, sys
import numpy as np, mindspore as ms
from mindspore import nn, ops, Tensor
if sys.argv[1] == "call":
    from mindrlhf.utils.cpu_threads import run_in_calling_thread
    print("value", run_in_calling_thread())
class G(nn.Cell):
    @ms.jit
    def construct(self, x):
        return ops.matmul(x, x)
G()(Tensor(np.ones((4, 4), np.float32))).asnumpy()
print("threads", sorted(open(p).read().strip() for p in glob.glob("/proc/self/task/*/comm")))
"""


def _probe(tmp_path, mode, **env):
    script = tmp_path / "probe.py"      # MindSpore compiles graphs from source files only
    script.write_text(_PROBE)
    base = {k: v for k, v in os.environ.items() if k != "MS_DEV_HOST_BLOCKING_RUN"}
    proc = subprocess.run([sys.executable, str(script), mode], env=dict(base, PYTHONPATH=REPO, **env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in proc.stdout.splitlines()
             if ln.startswith(("value ", "threads "))}
    return lines.get("value"), lines["threads"]


def test_graphs_run_in_the_calling_thread_unless_the_user_says_otherwise(tmp_path):
    # MindSpore's async host queue (whose waiter spins) shows as 'frontend_queue' threads once a graph ran
    _, plain = _probe(tmp_path, "skip")
    assert "frontend_queue" in plain
    value, ours = _probe(tmp_path, "call")
    assert value == "1" and "frontend_queue" not in ours
    value, theirs = _probe(tmp_path, "call", MS_DEV_HOST_BLOCKING_RUN="0")
    assert value == "0" and "frontend_queue" in theirs


def test_graph_kernel_fusion_is_refused_on_cpu_before_the_job_starts(monkeypatch):
    # MindSpore 2.10's CPU graph-kernel fusion (MS_DEV_GRAPH_KERNEL_FLAGS) gave NaN log-probs in the real-model
    # example's rollout and other bits in plain forwards (docs/BENCHMARKS.md): every job refuses it at the door,
    # naming the variable, before any collective
    import pytest
    from mindrlhf.errors import ConfigError
    from mindrlhf.trainer import startup
    monkeypatch.setenv("MS_DEV_GRAPH_KERNEL_FLAGS", "--opt_level=1")
    with pytest.raises(ConfigError, match=r"MS_DEV_GRAPH_KERNEL_FLAGS=--opt_level=1.*unset it"):
        startup.join(False, 0.0)
    for harmless in ("--opt_level=0", " "):
        monkeypatch.setenv("MS_DEV_GRAPH_KERNEL_FLAGS", harmless)
        assert startup.join(False, 0.0)[:2] == (0, 1)
    monkeypatch.delenv("MS_DEV_GRAPH_KERNEL_FLAGS")
    assert startup.join(False, 0.0)[:2] == (0, 1)
