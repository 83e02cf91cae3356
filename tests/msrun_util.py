"""Launch a worker script under msrun with N CPU workers and surface its logs on failure."""
from __future__ import annotations

import glob
import os
import socket
import subprocess

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_msrun(script: str, args, workers: int, log_dir: str, timeout: int = 900) -> None:
    cmd = ["msrun", f"--worker_num={workers}", f"--local_worker_num={workers}", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "--join=True", f"--log_dir={log_dir}", script] + [str(a) for a in args]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), GLOG_v="3")
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        logs = []
        for path in sorted(glob.glob(os.path.join(log_dir, "worker_*.log"))):
            with open(path, errors="replace") as fh:
                logs.append(f"--- {path} ---\n" + fh.read()[-4000:])
        raise AssertionError(f"msrun failed ({proc.returncode}):\n{proc.stdout.decode(errors='replace')[-3000:]}\n"
                             + "\n".join(logs))
