"""Shared benchmark helpers: the benchmark model config, HF reference construction, peak-RSS subprocesses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, REPO)

# The issues' benchmark model: 4 layers, hidden 512, 8 heads / 2 kv heads, intermediate 1408, vocab 32000.
BENCH_MODEL = dict(hidden_size=512, num_layers=4, num_heads=8, n_kv_heads=2, intermediate_size=1408,
                   vocab_size=32000, qkv_has_bias=True, tie_word_embeddings=False, seq_length=512,
                   max_position_embedding=512, theta=10000.0, rms_norm_eps=1e-6)


def ours_kernel_threads() -> int:
    """Our side's MindSpore CPU runtime, set as the trainer sets it (calling-thread runs, run.cpu_threads auto)."""
    from mindrlhf.utils.cpu_threads import auto_threads, run_in_calling_thread, set_kernel_threads
    run_in_calling_thread()
    return set_kernel_threads(auto_threads(1)[0])


def train_tokens_per_s(model, ids, warmup: int, steps: int) -> float:
    """Forward + backward + AdamW tokens/s of `model` on `ids` (batch, seq + 1): trainer/sft.SFTStep, the update
    every engine shares, `steps` timed after `warmup`."""
    import numpy as np
    from mindspore import Tensor
    from mindrlhf.models.padding import causal_bias
    from mindrlhf.trainer.optim import AdamW
    from mindrlhf.trainer.sft import SFTStep
    step = SFTStep(model, AdamW(list(model.trainable_params()), weight_decay=0.0), max_grad_norm=0.0)
    batch, seq = ids.shape[0], ids.shape[1] - 1
    args = (Tensor(ids[:, :-1].astype(np.int32)), Tensor(np.tile(np.arange(seq, dtype=np.int32), (batch, 1))),
            causal_bias(Tensor(np.ones((batch, seq), np.int32))), Tensor(ids[:, 1:].astype(np.int32)),
            Tensor(np.ones((batch, seq), np.float32)), Tensor(np.float32(batch * seq)), Tensor(np.float32(1e-5)))
    for _ in range(warmup):
        step(*args)[0].asnumpy()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step(*args)[0]
    loss.asnumpy()
    return batch * seq * steps / (time.perf_counter() - t0)


def peak_rss_mb() -> float:
    """This process's peak RSS since it started (utils.memory.process_peak_mb: mindrlhf's trainer restarts
    VmHWM per phase, and the highest mark of every phase is kept)."""
    from mindrlhf.utils import memory
    return memory.process_peak_mb()


def hf_model_dir(path: str, seed: int = 0) -> str:
    """The benchmark model as an HF Qwen2 checkpoint with random weights (written once)."""
    if os.path.isfile(os.path.join(path, "model.safetensors")):
        return path
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    m = BENCH_MODEL
    cfg = Qwen2Config(hidden_size=m["hidden_size"], num_hidden_layers=m["num_layers"],
                      num_attention_heads=m["num_heads"], num_key_value_heads=m["n_kv_heads"],
                      intermediate_size=m["intermediate_size"], vocab_size=m["vocab_size"],
                      max_position_embeddings=m["max_position_embedding"], tie_word_embeddings=False,
                      rope_theta=m["theta"], rms_norm_eps=m["rms_norm_eps"], use_sliding_window=False)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    return path


def run_child(script: str, *args, env_extra=None, python: str = sys.executable) -> dict:
    """Run `script --child ...` in a fresh process of `python`; it prints one JSON line last."""
    env = dict(os.environ, PYTHONPATH=REPO, GLOG_v="3", **(env_extra or {}))
    out = subprocess.run([python, script, "--child", *map(str, args)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{script} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def torch_train_tokens_per_s(model, ids, warmup: int, steps: int) -> float:
    """The reference of train_tokens_per_s: a transformers causal LM in torch eager, mean next-token cross-entropy,
    backward and torch.optim.AdamW (no clipping), tokens/s of `steps` updates on `ids` (B, T + 1) after
    `warmup`."""
    import torch
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    ids = torch.tensor(ids)
    for i in range(warmup + steps):
        if i == warmup:
            t0 = time.perf_counter()
        logits = model(ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return ids.shape[0] * (ids.shape[1] - 1) * steps / (time.perf_counter() - t0)


def msrun_self(script: str, worker_flag: str, *extra: str) -> str:
    """Run `script` itself under msrun on 2 local workers as `script worker_flag WORK *extra`; WORK (returned)
    is a fresh folder for the workers' results (the caller removes it). Exits naming the logs on failure."""
    import socket
    import tempfile
    work = tempfile.mkdtemp(prefix="bench_msrun_")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=REPO, GLOG_v="3")
    cmd = ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1", f"--master_port={port}",
           "--join=True", f"--log_dir={os.path.join(work, 'log')}", os.path.abspath(script), worker_flag, work,
           *extra]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"msrun failed; logs in {work}/log\n{proc.stdout[-2000:]}")
    return work
