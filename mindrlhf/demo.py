"""The whole pipeline on built-in tiny defaults, end to end, on CPU: `python -m mindrlhf.demo`.

1 data      arithmetic questions in GSM8K jsonl form (train / held-out test / SFT warm-up)
2 tokenizer a byte-level BPE (vocab.json + merges.txt) trained on the bundled text and the questions
3 convert   rlhf_data.py: jsonl -> MindRecord
4 configs   tiny Qwen2 YAMLs: train layout dp1 x tp2, infer layout dp2 x tp1; grpo_config.yaml (--arch qwen3_moe:
            a tiny Qwen3-MoE, 4 experts top-2, train layout expert-parallel ep2, infer dp2)
5 warm-up   a short supervised phase. Its data teaches the sums but mostly as a bare number; only 20% of
            answers use the verifiable '#### n' form, so the warmed-up model's greedy answers score ~0
6 strategy  grpo_one_stage.py --only_save_strategy: train and infer strategy files
7 slice     transform_checkpoint.py: the warm-up checkpoint -> per-rank train and infer shards
8 grpo      msrun with N workers: grpo_one_stage.py, rewards from the '#### n' verifier, greedy eval
9 report    summary table, plot (PNG), exported HF safetensors loaded back; for the MoE model the expert load
            (tokens per expert, max / mean per layer) on the held-out prompts before and after GRPO
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_assets")
TUTORIAL = os.path.join(REPO, "examples", "grpo", "qwen_grpo_tutorial")
STAGES = 9


def say(stage: int, text: str):
    print(f"[{stage}/{STAGES}] {text}", flush=True)


def held_out(a: int, b: int) -> bool:
    """About one (a, b) pair in seven is never trained on: the eval measures generalisation, not recall."""
    return (a + 2 * b) % 7 == 0


def arithmetic(n: int, seed: int, test: bool, high: int = 30) -> List[dict]:
    r = random.Random(seed)
    rows = []
    while len(rows) < n:
        a, b = r.randint(0, high), r.randint(0, high)
        if held_out(a, b) == test:
            rows.append({"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}.\n#### {a + b}"})
    return rows


def write_jsonl(path: str, rows: List[dict]):
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def run(cmd: List[str], **kw):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), GLOG_v="3")
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:])
        raise SystemExit(f"demo: command failed ({proc.returncode}): {' '.join(cmd)}")
    return proc.stdout


def stage_data(work: str, n_train: int):
    say(1, f"writing {n_train} training and 200 held-out arithmetic questions (GSM8K jsonl; held-out pairs "
           f"never appear in training)")
    train, test = arithmetic(n_train, 1, test=False), arithmetic(200, 2, test=True)
    write_jsonl(os.path.join(work, "train.jsonl"), train)
    write_jsonl(os.path.join(work, "test.jsonl"), test)
    r = random.Random(3)
    sft = [{"prompt": x["question"], "answer": ("#### " if r.random() < 0.2 else "") + x["answer"].split("#### ")[1]}
           for x in train]
    write_jsonl(os.path.join(work, "sft.jsonl"), sft)
    return train


def stage_tokenizer(work: str, train: List[dict]):
    from mindrlhf.data.tokenizer import train_byte_level_bpe
    say(2, "training a byte-level BPE tokenizer (vocab.json + merges.txt)")
    with open(os.path.join(ASSETS, "corpus.txt"), encoding="utf-8") as fh:
        corpus = fh.read().splitlines()
    texts = corpus * 5 + [x["question"] + " " + x["answer"] for x in train]
    vocab, merges = train_byte_level_bpe(texts, 300, os.path.join(work, "tokenizer"))
    return vocab, merges


def stage_convert(work: str, vocab: str, merges: str):
    say(3, "converting jsonl to MindRecord with rlhf_data.py")
    for name, kind in (("train", "gsm8k"), ("test", "gsm8k"), ("sft", "raw")):
        out = run([sys.executable, os.path.join(TUTORIAL, "rlhf_data.py"), "--vocab_path", vocab,
                   "--merges_file_path", merges, "--file_path", os.path.join(work, f"{name}.jsonl"),
                   "--output_path", os.path.join(work, f"{name}.mindrecord"), "--max_prompt_length", "16",
                   "--seq_length", "32", "--prompt_template", "plain", "--dataset_type", kind, "--no_progress"])
        print("      " + next(ln for ln in out.splitlines() if ln.startswith("rows written")).strip(), flush=True)


# --arch qwen3_moe: the tiny model as a Qwen3-MoE (q/k norms, own head width, untied head, every MLP sparse)
QWEN3_MOE = dict(qkv_has_bias=False, qk_layernorm=True, head_dim=16, tie_word_embeddings=False, num_experts=4,
                 num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True)


def stage_configs(work: str, workers: int, vocab_size: int, args) -> Dict[str, str]:
    moe = args.arch == "qwen3_moe"
    train = f"dp{workers} as ep{workers}" if moe else f"dp1 x tp{workers}"
    say(4, f"writing {args.arch} model YAMLs (train {train}, infer dp{workers} x tp1) and grpo_config.yaml")
    with open(os.path.join(REPO, "model_configs", "qwen_grpo", "finetune_qwen2_tiny.yaml")) as fh:
        base = yaml.safe_load(fh)
    padded = -(-vocab_size // 64) * 64
    paths = {}
    # a MoE model is not tensor-parallel here: its train layout splits the experts over the ranks instead
    layouts = {"train": (workers, 1, workers) if moe else (1, workers, 1), "infer": (workers, 1, 1),
               "single": (1, 1, 1)}
    for role, (dp, tp, ep) in layouts.items():
        doc = copy.deepcopy(base)
        doc["model"]["model_config"].update(vocab_size=padded, seq_length=64, max_position_embedding=64,
                                            **(dict(QWEN3_MOE, router_aux_loss_coef=args.aux_loss_coef) if moe
                                               else {}))
        doc["parallel_config"].update(data_parallel=dp, model_parallel=tp, **({"expert_parallel": ep} if ep > 1
                                                                              else {}))
        paths[role] = os.path.join(work, f"{role}_model.yaml")
        with open(paths[role], "w") as fh:
            yaml.safe_dump(doc, fh)
    grpo = {
        "rl": {"num_generations": 8, "batch_size": 16 // workers, "mini_batch_size": 64 if args.steps >= 10 else 0,
               "beta": 0.01, "kl_estimator": "k3", "clip_high": 0.28, "loss_agg": "token-mean",
               "ref_sync_steps": 0},
        "sampling": {"max_tokens": 6, "temperature": 1.0},
        "optim": {"lr": 2e-4, "min_lr": 2e-5, "warmup_steps": 5, "weight_decay": 0.0, "lr_schedule": "cosine",
                  "beta2": 0.999},
        "reward": {"verifier_function": ["accuracy_reward"], "verifier_weight": [1.0]},
        "run": {"total_steps": args.steps, "eval_steps": args.eval_steps or max(1, args.steps // 5),
                "eval_prompts": 200, "save_steps": max(1, args.steps // 2), "seed": args.seed},
        # host swap is off: this model is tiny. On CPU, swapping rollout weights / KV cache lowers the process
        # total; the policy, optimizer and reference keep a host copy in the same RAM (mindrlhf/parallel/swap.py)
    }
    if args.dynamic_sampling:
        grpo["rl"].update(dynamic_sampling=True, max_num_gen_batches=4)
    paths["grpo"] = os.path.join(work, "grpo_config.yaml")
    with open(paths["grpo"], "w") as fh:
        yaml.safe_dump(grpo, fh)
    return paths


def stage_warmup(work: str, paths: Dict[str, str], steps: int) -> str:
    import mindspore as ms
    from mindrlhf.checkpoint.model_io import model_state, save_checkpoint
    from mindrlhf.configs.compat.sources import load_model_yaml
    from mindrlhf.data.mindrecord_io import read_mindrecord
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.trainer.sft import sft_warmup
    from mindrlhf.utils.cpu_threads import run_in_calling_thread
    run_in_calling_thread()     # before the first graph: see utils/cpu_threads.py (this is CPU-only code)
    say(5, f"supervised warm-up, {steps} steps (mostly bare-number answers; 20% in the '#### n' form)")
    ms.set_seed(0)
    model = CausalLM(load_model_yaml(paths["single"]).model)
    table = read_mindrecord(os.path.join(work, "sft.mindrecord"))
    sft_warmup(model, table["pretrain_ids"], table["loss_mask"], 0, steps, batch_size=64, lr=2e-3,
               log=lambda s: print("      " + s.strip(), flush=True))
    out = os.path.join(work, "sft", "full.safetensors")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    save_checkpoint(model_state(model), out)
    return out


def stage_strategy_and_slice(work: str, paths: Dict[str, str], full_ckpt: str) -> Dict[str, str]:
    say(6, "writing strategy files (grpo_one_stage.py --only_save_strategy True)")
    run([sys.executable, os.path.join(TUTORIAL, "grpo_one_stage.py"), "--only_save_strategy", "True",
         "--sft_path_train", paths["train"], "--sft_path_infer", paths["infer"], "--save_ckpt_dir", work])
    say(7, "slicing the warm-up checkpoint for both layouts (transform_checkpoint.py)")
    sliced = {}
    for role in ("train", "infer"):
        sliced[role] = os.path.join(work, f"sliced_{role}")
        out = run([sys.executable, os.path.join(REPO, "transform_checkpoint.py"), "--src_checkpoint", full_ckpt,
                   "--dst_checkpoint", sliced[role], "--dst_strategy",
                   os.path.join(work, "strategy", f"{role}_strategy"), "--no_progress"])
        print("      " + out.strip().splitlines()[-1], flush=True)
    return sliced


def stage_grpo(work: str, paths: Dict[str, str], sliced: Dict[str, str], full_ckpt: str, vocab: str, merges: str,
               workers: int, steps: int):
    import socket
    from mindrlhf.parallel.rendezvous import note_path
    say(8, f"GRPO under msrun with {workers} workers, {steps} steps (logs: {work}/grpo_log)")
    ckpt_dir = os.path.join(work, "grpo_ckpt")
    for attempt in range(3):   # a free port can be taken before msrun binds it: that fails fast, try another
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = ["msrun", f"--worker_num={workers}", f"--local_worker_num={workers}", "--master_addr=127.0.0.1",
               f"--master_port={port}", "--join=True", f"--log_dir={os.path.join(work, 'grpo_log')}",
               os.path.join(TUTORIAL, "grpo_one_stage.py"), "--config", paths["grpo"],
               "--sft_path_train", paths["train"], "--sft_path_infer", paths["infer"], "--vocab_path", vocab,
               "--merges_file_path", merges, "--mind_dataset_dir", os.path.join(work, "train.mindrecord"),
               "--eval_dataset", os.path.join(work, "test.mindrecord"), "--save_ckpt_dir", ckpt_dir,
               "--use_parallel", "True", "--load_sft_checkpoint_train", sliced["train"],
               "--load_sft_checkpoint_infer", sliced["infer"], "--load_ref_checkpoint", full_ckpt,
               "--progress", "False", "--overwrite_ckpt_dir", "True"]  # the demo's own folder: a rerun starts over
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), GLOG_v="3")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        log0 = os.path.join(work, "grpo_log", "worker_0.log")
        shown = 0
        while proc.poll() is None:
            time.sleep(2)
            shown = _echo_new_lines(log0, shown)
        _echo_new_lines(log0, shown)
        taken = note_path(port, proc.pid)
        if proc.returncode == 0 or not os.path.exists(taken):
            break
        os.remove(taken)
        print(f"      port {port} was taken meanwhile; launching again on another", flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"demo: GRPO failed (exit {proc.returncode}); see {work}/grpo_log/worker_*.log")
    return ckpt_dir


def _echo_new_lines(path: str, shown: int) -> int:
    if not os.path.isfile(path):
        return shown
    with open(path, errors="replace") as fh:
        lines = [l for l in fh.read().splitlines() if l.startswith(("step ", "GRPO:", "error", "resumed"))]
    for line in lines[shown:]:
        print("      " + line, flush=True)
    return len(lines)


def stage_report(work: str, ckpt_dir: str, paths: Dict[str, str]) -> dict:
    from mindrlhf.trainer.metrics import read_metrics
    say(9, "summary")
    rows = read_metrics(os.path.join(ckpt_dir, "metrics.jsonl"))
    steps = [r for r in rows if "reward_mean" in r]
    evals = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
    head, tail = steps[:5], steps[-5:]
    mean = lambda rs, k: float(np.mean([r[k] for r in rs if k in r])) if rs else float("nan")  # noqa: E731
    summary = {
        "steps": len(steps), "reward_first5": mean(head, "reward_mean"), "reward_last5": mean(tail, "reward_mean"),
        "eval_accuracy_before": evals[0][1] if evals else float("nan"),
        "eval_accuracy_after": evals[-1][1] if evals else float("nan"),
        "time_per_phase_s": {k[5:]: mean(steps, k) for k in steps[0] if k.startswith("time_")},
        "peak_mb_per_phase": {k[8:]: max(r[k] for r in steps) for k in steps[0] if k.startswith("peak_mb_")},
    }
    plot = _plot(steps, evals, os.path.join(work, "grpo_curves.png"))
    hf_ok = _check_export(os.path.join(ckpt_dir, "hf_policy"), paths["single"])
    load_lines = []
    if hf_ok and "num_experts" in _model_fields(paths["single"]):
        test = os.path.join(work, "test.mindrecord")
        summary["expert_load"] = {when: _expert_load(paths["single"], weights, test) for when, weights in
                                  (("before", os.path.join(work, "sft", "full.safetensors")),
                                   ("after", os.path.join(ckpt_dir, "hf_policy")))}
        load_lines = [f"  expert load {when:<6} (max/mean tokens per expert, by layer) "
                      + ", ".join(f"{r:.2f}" for r in v["max_over_mean"]) for when, v in summary["expert_load"].items()]
    lines = [
        f"  steps                      {summary['steps']}",
        f"  reward (first 5 -> last 5) {summary['reward_first5']:.3f} -> {summary['reward_last5']:.3f}",
        f"  held-out greedy accuracy   {summary['eval_accuracy_before']:.3f} -> {summary['eval_accuracy_after']:.3f}",
        "  time per step, by phase    " + ", ".join(f"{k} {v:.2f}s" for k, v in summary["time_per_phase_s"].items()),
        "  peak RSS by phase (rank 0) " + ", ".join(f"{k} {v:.0f}MB" for k, v in summary["peak_mb_per_phase"].items()),
        f"  checkpoints                {ckpt_dir}",
        f"  metrics                    {os.path.join(ckpt_dir, 'metrics.jsonl')}",
        f"  logs                       {os.path.join(work, 'grpo_log')}",
        f"  plot                       {plot}",
        f"  exported HF policy         {os.path.join(ckpt_dir, 'hf_policy')} ({'loads back' if hf_ok else 'FAILED'})",
    ] + load_lines
    print("\n".join(lines), flush=True)
    summary.update(plot=plot, hf_export_loads=hf_ok)
    with open(os.path.join(work, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    return summary


def _plot(steps, evals, path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    x = [r["step"] for r in steps]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = [("reward_mean", "reward (mean)"), (None, "held-out greedy accuracy"), ("kl", "KL to reference"),
              ("response_len_mean", "response length (tokens)")]
    for ax, (key, title) in zip(axes.flat, panels):
        if key is None:
            ax.plot([e[0] for e in evals], [e[1] for e in evals], marker="o")
        else:
            ax.plot(x, [r.get(key, np.nan) for r in steps])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _model_fields(model_yaml: str) -> dict:
    with open(model_yaml) as fh:
        return yaml.safe_load(fh)["model"]["model_config"]


def _expert_load(model_yaml: str, weights: str, prompts: str) -> dict:
    """Tokens routed to each expert over the held-out prompts' real tokens, per sparse layer, with `weights`:
    the counts and max / mean (1.0 = perfectly balanced; top-k of E experts)."""
    from mindspore import Tensor
    from mindrlhf.checkpoint.model_io import load_weights
    from mindrlhf.configs.compat.sources import load_model_yaml
    from mindrlhf.data.mindrecord_io import read_mindrecord
    from mindrlhf.models.moe import expert_load
    from mindrlhf.models.padding import causal_bias
    from mindrlhf.models.qwen2 import CausalLM
    cfg = load_model_yaml(model_yaml).model
    model = CausalLM(cfg, random_init=False)
    load_weights(model, weights)
    table = read_mindrecord(prompts, ["prompt_ids", "prompt_length"])
    ids = table["prompt_ids"].astype(np.int32)
    mask = (np.arange(ids.shape[1])[None] < table["prompt_length"].reshape(-1, 1)).astype(np.int32)
    pos = np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32)
    logits = model.router_logits(Tensor(ids), Tensor(pos), causal_bias(Tensor(mask)))
    counts = expert_load(logits, cfg.num_experts_per_tok, mask)
    return {"tokens_per_expert": counts.tolist(),
            "max_over_mean": (counts.max(1) / counts.mean(1)).tolist()}


def _check_export(hf_dir: str, model_yaml: str) -> bool:
    """The exported safetensors load into a fresh model (strict: every weight present, shapes right)."""
    from mindrlhf.checkpoint.model_io import load_weights
    from mindrlhf.configs.compat.sources import load_model_yaml
    from mindrlhf.models.qwen2 import CausalLM
    try:
        load_weights(CausalLM(load_model_yaml(model_yaml).model, random_init=False), hf_dir)
        return True
    except Exception as err:  # noqa: BLE001 - reported in the summary
        print(f"      export check failed: {err}")
        return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="demo_output", help="everything the demo writes goes here (a folder holding "
                   "anything else is refused)")
    p.add_argument("--overwrite", action="store_true", help="use --workdir even if it holds files the demo did not "
                   "write (they may be replaced)")
    p.add_argument("--steps", type=int, default=100, help="GRPO steps")
    p.add_argument("--sft_steps", type=int, default=600, help="supervised warm-up steps")
    p.add_argument("--workers", type=int, default=2, help="msrun workers (2 or 4 on this CPU)")
    p.add_argument("--train_rows", type=int, default=3000)
    p.add_argument("--seed", type=int, default=1, help="GRPO seed (sampling and prompt order)")
    p.add_argument("--eval_steps", type=int, default=0, help="held-out eval every N steps (default: steps / 5)")
    p.add_argument("--dynamic_sampling", action="store_true", help="DAPO's dynamic sampling (rl.dynamic_sampling)")
    p.add_argument("--aux_loss_coef", type=float, default=0.0,
                   help="--arch qwen3_moe: the model's router_aux_loss_coef, the load-balancing loss's weight in the "
                        "GRPO update (0: none)")
    p.add_argument("--arch", default="qwen2", choices=("qwen2", "qwen3_moe"),
                   help="the tiny model: Qwen2 (train layout tensor-parallel) or Qwen3-MoE (4 experts, top-2; train "
                        "layout expert-parallel)")
    args = p.parse_args(argv)
    t0 = time.time()
    from mindrlhf.utils.output_dir import check_output_dir, write_marker
    from mindrlhf.configs.errors import ConfigError
    try:
        work = check_output_dir(args.workdir, "demo", "--workdir", args.overwrite)   # ours, or refused
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    os.makedirs(work, exist_ok=True)
    write_marker(work, "demo", ["*"])
    train = stage_data(work, args.train_rows)
    vocab, merges = stage_tokenizer(work, train)
    stage_convert(work, vocab, merges)
    from mindrlhf.data.tokenizer import load_tokenizer
    paths = stage_configs(work, args.workers, load_tokenizer(vocab, merges).vocab_size, args)
    full = stage_warmup(work, paths, args.sft_steps)
    sliced = stage_strategy_and_slice(work, paths, full)
    ckpt_dir = stage_grpo(work, paths, sliced, full, vocab, merges, args.workers, args.steps)
    stage_report(work, ckpt_dir, paths)
    print(f"demo finished in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
