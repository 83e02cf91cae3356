"""Fault injection: a job that meets a fault ends with a named error within a bound, the last good checkpoint
stays loadable, and resuming gives the uninterrupted run's trajectory: the same metrics and, bit for bit, the
same final policy weights and optimizer moments.

The 2-worker faults run the tiny model (train dp2, infer dp2; 3 steps, a checkpoint each step) under msrun
through tests/workers/grpo_worker.py's MINDRLHF_TEST_FAULT. The schedule is a constant lr without warm-up, so
every update moves the weights: step 1's checkpoint, which every fault (in step 2) resumes from, holds a policy
that differs from the initial one, and a resume that lost the policy or the moments ends elsewhere. Each test
prints one row of the table (fault | outcome | seconds to fail | data kept); `-s` shows them.
"""
import io
import os
import socket
import subprocess
import time

import pytest

from grpo_helpers import WORKER, cli_args, make_grpo_assets, model_yaml
from msrun_util import REPO, free_port
from mindrlhf.checkpoint.model_io import rank_dir, read_checkpoint
from mindrlhf.parallel.watchdog import EXIT_CODE, Watchdog
from mindrlhf.trainer import checkpointing
from mindrlhf.trainer.metrics import read_metrics

STEPS = 3


def _row(fault, outcome, seconds, kept):
    print(f"\n| {fault} | {outcome} | {seconds:.0f} s | {kept} |", flush=True)


# ---- in-process --------------------------------------------------------------------------------------
def test_watchdog_names_the_stuck_rank_its_phase_and_whether_it_waits():
    exits, out = [], io.StringIO()
    dog = Watchdog(0.3, rank=1, node=0, exit_fn=exits.append, out=out, poll=0.02)
    for _ in range(10):                    # beating keeps it quiet
        time.sleep(0.05)
        dog.beat(in_collective=False)
    assert exits == []
    dog.enter("reward")
    time.sleep(0.6)
    assert exits == [EXIT_CODE]
    text = out.getvalue()
    assert "rank 1 (node 0" in text and "phase 'reward'" in text and "outside any collective" in text
    exits.clear()
    other = Watchdog(0.3, rank=0, node=0, exit_fn=exits.append, out=out, poll=0.02)
    other.enter("reward")
    other.beat(in_collective=True)         # waiting for the stuck rank
    time.sleep(0.6)
    assert exits == [EXIT_CODE] and "rank 0" in out.getvalue() and "inside a collective" in out.getvalue()
    dog.stop()
    other.stop()


def test_the_stuck_rank_speaks_before_the_ranks_waiting_for_it():
    """The stuck rank (no collective) exits first even when a waiting rank's timer ran out at the same moment:
    the first exit ends an msrun job, and a waiter's message names no culprit (the msrun hang test below
    failed once this way: rank 1's log had no watchdog line)."""
    exits, out = [], io.StringIO()
    stuck = Watchdog(0.5, rank=1, node=0, exit_fn=lambda c: exits.append(("stuck", time.monotonic())), out=out,
                     poll=0.25)
    waiter = Watchdog(0.5, rank=0, node=0, exit_fn=lambda c: exits.append(("waiter", time.monotonic())), out=out,
                      poll=0.25)
    start = time.monotonic()
    stuck.enter("reward")
    waiter.enter("reward")
    waiter.beat(in_collective=True)
    time.sleep(0.85)          # stuck: exits by 0.5 + one poll; the waiter not before 0.5 + two polls
    assert [who for who, _ in exits] == ["stuck"], exits
    time.sleep(0.65)
    assert [who for who, _ in exits] == ["stuck", "waiter"] and exits[1][1] - start >= 1.0, exits
    stuck.stop()
    waiter.stop()


def test_a_taken_master_port_ends_the_job_within_seconds(tmp_path):
    """msrun's scheduler cannot bind a taken --master_port; without the guard its workers wait 600 s."""
    script = tmp_path / "init_only.py"
    script.write_text("import sys\nfrom mindrlhf.cli import grpo_main\nfrom mindrlhf.parallel.mesh import "
                      "init_distributed\nfrom mindrlhf.configs.errors import ConfigError\ntry:\n"
                      "    print('initialised', init_distributed(), flush=True)\nexcept ConfigError as err:\n"
                      "    print(f'error: {err}', file=sys.stderr)\n    sys.exit(2)\n")
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen(4)
        port = holder.getsockname()[1]
        t0 = time.time()
        proc = subprocess.run(["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
                               f"--master_port={port}", "--join=True", f"--log_dir={tmp_path / 'log'}", str(script)],
                              env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=120)
        seconds = time.time() - t0
    assert proc.returncode != 0 and seconds < 60, seconds
    named = [log for log in ("scheduler.log", "worker_0.log", "worker_1.log")
             if f"127.0.0.1:{port} is already in use" in (tmp_path / "log" / log).read_text(errors="replace")]
    # the scheduler names it; a worker that reached init() does too (msrun may end the other one first)
    assert named[0] == "scheduler.log" and len(named) >= 2, named
    _row("master port taken", "the job ends, the port named", seconds, "n/a")


# ---- 2-worker jobs -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    assets = make_grpo_assets(str(root))
    flags = dict(use_parallel=True, sft_path_train=model_yaml(str(root / "dp2.yaml"), dp=2),
                 vocab_path=assets["vocab_path"], merges_file_path=assets["merges_file_path"],
                 mind_dataset_dir=assets["mind_dataset_dir"], total_steps=STEPS, save_steps=1, keep_checkpoints=2,
                 max_tokens=6, num_generations=4, batch_size=2, progress=False, export_hf=False, lr=1e-3,
                 verifier_function="digit_fraction_test", watchdog_timeout=15, share_prompt=False,
                 # every update moves the weights (the package default warms up from lr 0: update 1 would not)
                 lr_schedule="constant", warmup_steps=0)
    reference = str(root / "reference")
    code, logs, _ = _launch(flags, reference)
    assert code == 0, logs[0][-3000:]
    rows = read_metrics(os.path.join(reference, "metrics.jsonl"))
    assert all(r["lr"] == pytest.approx(1e-3) and r["grad_norm"] > 0 for r in rows), rows   # every update moves it
    return flags, reference


def _launch(flags, out, fault=None, timeout=400, **extra):
    cmd = ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "--join=True", f"--log_dir={out}_log{'_' + fault if fault else ''}",
           WORKER] + cli_args(dict(flags, save_ckpt_dir=out, **extra))
    env = dict(os.environ, PYTHONPATH=REPO)
    if fault:
        env["MINDRLHF_TEST_FAULT"] = fault
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    log_dir = f"{out}_log{'_' + fault if fault else ''}"
    logs = [open(os.path.join(log_dir, f"worker_{r}.log"), errors="replace").read() for r in range(2)]
    return proc.returncode, logs, time.time() - t0


def _computed(rows):
    return [{k: v for k, v in r.items() if not (k.startswith(("time", "peak_mb")) or k.endswith("_per_s"))}
            for r in rows]


def _tensors(path):
    return {name: (a.dtype.str, a.shape, a.tobytes()) for name, a in read_checkpoint(path).items()}


def _same_final_state(out, reference):
    """The last step's policy weights and optimizer state (moments, step counter), every rank's shard, equal
    the uninterrupted run's bit for bit."""
    for rank in range(2):
        for name in (checkpointing.POLICY_FILE, "optimizer.safetensors"):
            got, want = (_tensors(os.path.join(rank_dir(checkpointing.step_dir(root, STEPS), rank), name))
                         for root in (out, reference))
            assert got.keys() == want.keys(), (rank, name)
            differ = [k for k in want if got[k] != want[k]]
            assert not differ, (rank, name, differ[:5])


def _survives(job, out, fault, outcome, seconds):
    """The last good checkpoint loads and the resumed run's metrics, final weights and moments equal the
    uninterrupted run's."""
    flags, reference = job
    kept = checkpointing.complete_steps(out)
    assert kept and kept[-1] >= 1, kept
    code, logs, _ = _launch(flags, out, resume=True)
    assert code == 0, logs[0][-3000:]
    assert f"resumed from {checkpointing.step_dir(out, kept[-1])}" in logs[0]
    got, want = read_metrics(os.path.join(out, "metrics.jsonl")), read_metrics(os.path.join(reference, "metrics.jsonl"))
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for a, b in zip(_computed(got), _computed(want)):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=0, abs=0, nan_ok=True), (a["step"], k)   # the same floats
    _same_final_state(out, reference)
    _row(fault, outcome, seconds, f"steps {kept} complete; resumed to the uninterrupted trajectory")


@pytest.mark.msrun
@pytest.mark.slow      # ~84 s: the watchdog's timeout; the default run keeps the other faults
def test_a_hung_rank_ends_the_job_naming_it_and_resume_is_exact(job, tmp_path):
    flags, _ = job
    out = str(tmp_path / "run")
    code, logs, seconds = _launch(flags, out, fault="1:2:reward:hang")
    assert code != 0 and seconds < 240, (code, seconds)
    assert "watchdog: rank 1 (node 0" in logs[1] and "phase 'reward'" in logs[1] and \
        "outside any collective: this rank is the one that stopped" in logs[1], logs[1][-2000:]
    _survives(job, out, "rank 1 hangs in step 2's reward", "watchdog ends the job naming rank 1, phase reward",
              seconds)


@pytest.mark.msrun
@pytest.mark.slow       # ~100 s each
@pytest.mark.parametrize("phase", ["rollout", "reward", "train", "weight_sync", "save"])
def test_kill_9_of_one_rank_in_each_phase(job, tmp_path, phase):
    flags, _ = job
    out = str(tmp_path / "run")
    code, logs, seconds = _launch(flags, out, fault=f"1:2:{phase}:kill")
    assert code != 0 and seconds < 240, (code, seconds)
    assert f"fault: kill on rank 1 in step 2, phase {phase}" in logs[1]
    _survives(job, out, f"kill -9 of rank 1 in step 2's {phase}", "msrun ends the job", seconds)


@pytest.mark.msrun
@pytest.mark.slow       # ~100 s
def test_disk_full_during_a_save(job, tmp_path):
    flags, _ = job
    out = str(tmp_path / "run")
    code, logs, seconds = _launch(flags, out, fault="0:2:save:enospc")
    assert code != 0 and seconds < 240, (code, seconds)
    assert "No space left on device" in logs[0]
    assert not os.path.exists(os.path.join(out, "step_000002", "COMPLETE"))
    _survives(job, out, "disk full in step 2's save (rank 0)", "the job ends, ENOSPC named", seconds)
