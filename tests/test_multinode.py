"""Two msrun nodes on one machine (`--node_rank 0` and `--node_rank 1`, one worker each, one master port):
the same trajectory as one 2-worker launch; node-local checkpoint directories survive a kill of both nodes
and resume exactly; nodes that run different jobs are refused before training.

These are the commands docs/PARALLELISM.md's multi-node section shows.
"""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from data_helpers import arithmetic_rows, make_tokenizer_files, write_jsonl
from grpo_helpers import WORKER, cli_args, model_yaml
from msrun_util import REPO, free_port, run_msrun
from mindrlhf.checkpoint.model_io import model_state, read_checkpoint, save_checkpoint
from mindrlhf.configs import load_model_yaml
from mindrlhf.data.convert import build_parser, convert
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.trainer.metrics import read_metrics

pytestmark = [pytest.mark.msrun, pytest.mark.slow]

REMOTE_MASTER_MSRUN = os.path.join(os.path.dirname(__file__), "workers", "msrun_remote_master.py")
STEPS = 3
COMPARED = ("reward_mean", "loss", "pg_loss", "kl", "grad_norm", "entropy", "response_len_mean")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("nodes"))
    vocab, merges = make_tokenizer_files(os.path.join(root, "tok"), vocab_size=400)
    src = write_jsonl(os.path.join(root, "train.jsonl"), arithmetic_rows(32, seed=5))
    data = os.path.join(root, "train.mindrecord")
    convert(build_parser().parse_args(["--vocab_path", vocab, "--merges_file_path", merges, "--file_path", src,
                                       "--output_path", data, "--max_prompt_length", "16", "--seq_length", "48",
                                       "--prompt_template", "plain", "--no_progress"]))
    eos = [2] + list(range(200, 260))
    train = model_yaml(os.path.join(root, "train.yaml"), dp=1, tp=2, eos_token_id=eos)
    infer = model_yaml(os.path.join(root, "infer.yaml"), dp=2, tp=1, eos_token_id=eos)
    init = os.path.join(root, "init.safetensors")
    save_checkpoint(model_state(CausalLM(load_model_yaml(train).model)), init)
    return {"root": root, "vocab": vocab, "merges": merges, "data": data, "train": train, "infer": infer, "init": init}


def _args(assets, save_dir, **extra):
    flags = {"sft_path_train": assets["train"], "sft_path_infer": assets["infer"], "vocab_path": assets["vocab"],
             "merges_file_path": assets["merges"], "mind_dataset_dir": assets["data"],
             "load_sft_checkpoint_train": assets["init"], "save_ckpt_dir": save_dir, "use_parallel": True,
             "total_steps": STEPS, "save_steps": 1, "keep_checkpoints": 3, "seed": 11, "batch_size": 2,
             "num_generations": 4, "mini_batch_size": 4, "beta": 0.04, "max_tokens": 8, "lr": 1e-4,
             "verifier_function": "response_length_test", "reshard_transport": "collective", "progress": False,
             "export_hf": False}
    flags.update(extra)
    return cli_args(flags)


def _launch_nodes(per_node_args, log_dir, env=None):
    """Start one msrun per node (node_rank k, one local worker each) on a shared master port. Node 1's msrun
    is told that the master is remote (as it is on a real second host), so only node 0 runs a scheduler."""
    port = free_port()
    procs = []
    for node, args in enumerate(per_node_args):
        msrun = ["msrun"] if node == 0 else [sys.executable, REMOTE_MASTER_MSRUN]
        cmd = msrun + ["--worker_num=2", "--local_worker_num=1", f"--node_rank={node}", "--master_addr=127.0.0.1",
               f"--master_port={port}", "--join=True", f"--log_dir={log_dir}/node{node}", WORKER] + args
        procs.append(subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=REPO, GLOG_v="3", **(env or {})),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    return procs


def _wait(procs, log_dir, timeout=900):
    deadline = time.time() + timeout
    codes = []
    for p in procs:
        codes.append(p.wait(timeout=max(1, deadline - time.time())))
    return codes, _logs(log_dir)


def _logs(log_dir):
    out = []
    for node in (0, 1):
        d = os.path.join(log_dir, f"node{node}")
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            if name.startswith("worker_"):
                with open(os.path.join(d, name), errors="replace") as fh:
                    out.append(f"--- node{node}/{name} ---\n" + fh.read())   # the start-up lines included
    return "\n".join(out)


def _final_policy(save_dir, rank, step=STEPS):
    return read_checkpoint(os.path.join(save_dir, f"step_{step:06d}", f"rank_{rank}", "policy.safetensors"))


@pytest.fixture(scope="module")
def one_launch(assets):
    out = os.path.join(assets["root"], "one_launch")
    run_msrun(WORKER, _args(assets, out), 2, os.path.join(out, "log"))
    return out


@pytest.fixture(scope="module")
def two_nodes(assets):
    out = os.path.join(assets["root"], "two_nodes")
    codes, logs = _wait(_launch_nodes([_args(assets, out)] * 2, os.path.join(assets["root"], "two_nodes_log")),
                        os.path.join(assets["root"], "two_nodes_log"))
    assert codes == [0, 0], logs
    return out


def test_two_nodes_follow_the_one_launch_trajectory(one_launch, two_nodes, assets):
    ref = read_metrics(os.path.join(one_launch, "metrics.jsonl"))
    rows = read_metrics(os.path.join(two_nodes, "metrics.jsonl"))
    assert [r["step"] for r in rows] == [r["step"] for r in ref] == list(range(1, STEPS + 1))
    for a, b in zip(rows, ref):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), (a["step"], key)
    for rank in (0, 1):
        want, got = _final_policy(one_launch, rank), _final_policy(two_nodes, rank)
        for n in want:
            np.testing.assert_allclose(got[n], want[n], rtol=0, atol=1e-6, err_msg=n)
    log = _logs(os.path.join(assets["root"], "two_nodes_log"))
    assert "one directory shared by 2 node(s)" in log


def test_node_local_checkpoints_survive_killing_both_nodes(assets, two_nodes, tmp_path):
    dirs = [str(tmp_path / "node0_disk"), str(tmp_path / "node1_disk")]
    args = [_args(assets, d, checkpoint_storage="node_local") for d in dirs]
    marker = str(tmp_path / "in_save")
    procs = _launch_nodes(args, str(tmp_path / "log1"), env={"MINDRLHF_TEST_PAUSE_IN_SAVE": f"3:{marker}"})
    try:
        deadline = time.time() + 600
        while not os.path.exists(marker) and all(p.poll() is None for p in procs) and time.time() < deadline:
            time.sleep(0.05)
        assert os.path.exists(marker), _logs(str(tmp_path / "log1"))
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    for node, d in enumerate(dirs):        # each node's disk holds only its own rank's shards, marked by it
        assert os.path.isfile(os.path.join(d, "step_000002", "COMPLETE")), node
        assert os.path.isdir(os.path.join(d, "step_000002", f"rank_{node}"))
        assert not os.path.isdir(os.path.join(d, "step_000002", f"rank_{1 - node}"))
        assert not os.path.exists(os.path.join(d, "step_000003", "COMPLETE"))

    # using these directories as if they were one shared directory is refused, with the fix named
    codes, logs = _wait(_launch_nodes([a + ["--resume", "True"] for a in
                                       [_args(assets, d) for d in dirs]], str(tmp_path / "log2")),
                        str(tmp_path / "log2"))
    assert codes != [0, 0] and "not one directory for every rank (rank 1, node 1" in logs, logs
    assert "checkpoint_storage: node_local" in logs

    codes, logs = _wait(_launch_nodes([a + ["--resume", "True"] for a in args], str(tmp_path / "log3")),
                        str(tmp_path / "log3"))
    assert codes == [0, 0], logs
    assert "resumed from" in logs
    for rank in (0, 1):
        want, got = _final_policy(two_nodes, rank), _final_policy(dirs[rank], rank)
        for n in want:
            np.testing.assert_allclose(got[n], want[n], rtol=0, atol=1e-6, err_msg=n)
    rows = read_metrics(os.path.join(dirs[0], "metrics.jsonl"))     # rank 0 logs, on node 0's disk
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))


def test_nodes_running_different_jobs_are_refused(assets, tmp_path):
    args = [_args(assets, str(tmp_path / "a")), _args(assets, str(tmp_path / "b"), lr=2e-4)]
    codes, logs = _wait(_launch_nodes(args, str(tmp_path / "log")), str(tmp_path / "log"))
    assert codes != [0, 0]
    assert "node 1 (rank 1) differs from node 0 (rank 0) in: GRPO config (paths aside)" in logs, logs
    assert not os.path.exists(tmp_path / "a" / "metrics.jsonl")      # nothing trained
