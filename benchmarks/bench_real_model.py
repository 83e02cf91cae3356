"""GRPO from a real pretrained model, mindrlhf and TRL side by side: SmolLM2-135M-Instruct (30 layers) on
one-step arithmetic word problems (examples/grpo/smollm2_arithmetic, whose README says why each setting).

    python benchmarks/bench_real_model.py [--steps 40] [--eval_every 5] [--trl_python PY] [--quick]

Both systems start from the same HF folder (scripts/get_smollm2.py), see the same prompts rendered by the
model's own chat template, score with the same verifier (mindrlhf.reward.verifiers.accuracy_reward: the
'#### n' answer must be right) and use the same settings: 4 prompts x 8 samples per step, <= 40 new tokens,
temperature 0.5, beta 0 (no reference model), token-mean loss (TRL's "dapo"), clip 0.2 / 0.28, AdamW lr 1e-5
constant after 3 warm-up updates, weight decay 0, gradient clip 1.0, one update per rollout. mindrlhf runs
each update one decoder layer at a time over the whole batch, the loss and LM head in micro-batches of one
group (engine.micro_batch_size 8: the same update); TRL runs its default, the whole batch in one pass
(per_device_train_batch_size 32), with TRL's gradient checkpointing as --trl_gradient_checkpointing says: on by
default (TRL's own default and the setting every figure in docs/BENCHMARKS.md was measured with, unset then:
less memory, "~20% slower" by TRL's docs), off for TRL's faster, larger setting; both JSON lines of TRL say
which ("trl_gradient_checkpointing"). Held-out
accuracy is greedy on the first 64 test prompts (never trained on), before step 1 and every --eval_every
steps; evaluation time counts in the wall time, not in the step time.

Each system runs in a fresh process, one after the other (2 cores: never at once). Per system one JSON line
{"bench": "real_model", "system", "heldout_before", "heldout_after", "steps", "wall_min", "step_s",
"first_step_s", "peak_rss_mb", "curve": [[step, accuracy], ...], "phases": {...}, and for mindrlhf
"first_step_phases": {"construction", each phase of step 1 (its compiles included)}}, then
{"bench": "real_model_vs_trl", "ratio": trl step_s / ours, "peak_rss_ratio": ours / trl, "first_step_s": ours,
"heldout_gain": ours after - before, "heldout_gap_vs_trl": ours after - trl after, "matmul_gflops": ...,
"floor": {phase: estimated FLOPs / the machine's matmul rate, seconds}}. step_s is the median over steps
2..N (step 1 compiles). --quick: 10 steps and no evaluation (timing only). --plot writes both learning
curves on one figure. The example updates one decoder layer per graph (engine.layerwise_update);
--systems mindrlhf,mindrlhf_one_graph,trl adds a run with one graph for the whole model's update and its
ratios as "one_graph" in the last line. --warm_cache: each mindrlhf system runs with run.enable_compile_cache
and then once more in a new process, reading the first run's compiled graphs (system "<name>_warm"; the
last line's "warm_first_step_s").

The TRL side runs in --trl_python (a venv with trl; see bench_vs_trl.py).
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, peak_rss_mb, run_child  # noqa: E402

EXAMPLE = os.path.join(REPO, "examples", "grpo", "smollm2_arithmetic")
PROMPTS, G, NEW, TEMPERATURE, LR, WARMUP, EVAL_PROMPTS = 4, 8, 40, 0.5, 1e-5, 3, 64
PROMPT_WIDTH = 64         # rlhf_data.py --max_prompt_length (the prompts are 59-61 tokens)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


# ---- shared inputs (this Python) ----------------------------------------------------------------------------
def prepare(work: str, model_dir: str) -> dict:
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    from get_smollm2 import convert
    convert(model_dir)
    data = os.path.join(work, "data")
    subprocess.run([sys.executable, os.path.join(EXAMPLE, "make_data.py"), data], check=True,
                   stdout=subprocess.DEVNULL)
    for split in ("train", "test"):
        subprocess.run([sys.executable, os.path.join(REPO, "examples", "grpo", "qwen_grpo_tutorial", "rlhf_data.py"),
                        "--vocab_path", model_dir, "--file_path", os.path.join(data, f"{split}.jsonl"),
                        "--output_path", os.path.join(data, f"{split}.mindrecord"), "--prompt_template", "chat",
                        "--max_prompt_length", str(PROMPT_WIDTH), "--seq_length", str(2 * PROMPT_WIDTH),
                        "--no_progress"], check=True, stdout=subprocess.DEVNULL)
    return {"model_dir": model_dir, "data": data}


def matmul_gflops() -> float:
    """This machine's float32 matmul rate (numpy, all cores), best of 5: the floor the phases are held to."""
    import numpy as np
    a = np.random.default_rng(0).standard_normal((2048, 2048), dtype=np.float32)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    return 2 * 2048 ** 3 / best / 1e9


def phase_flops(model_dir: str) -> dict:
    """Matmul FLOPs of one step's phases (2 per weight per token forward, 6 forward + backward; attention
    scores and element-wise work left out): the rollout's prefill (each prompt once) and decode (every row at
    each of the NEW positions), the training forward + backward over each group's prompt once and every
    response (mindrlhf's shared-prompt layout; the head only on response positions)."""
    with open(os.path.join(model_dir, "config.json")) as fh:
        c = json.load(fh)
    h, i, layers, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]        # Qwen3's is not always hidden / heads
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    per_layer = 2 * h * q + 2 * h * kv + 3 * h * i                  # q and o, k and v, the MLP
    body, head = layers * per_layer, v * h
    rows, prompt_tokens = PROMPTS * G, PROMPTS * PROMPT_WIDTH
    rollout = 2 * body * (prompt_tokens + rows * NEW) + 2 * head * (PROMPTS + rows * NEW)
    train = 6 * body * (prompt_tokens + rows * NEW) + 6 * head * rows * NEW
    return {"rollout": rollout, "train": train}


# ---- mindrlhf (this Python) ---------------------------------------------------------------------------------
ONE_GRAPH = {"layerwise_update": False}     # the mindrlhf_one_graph system: one graph for the model's update


def child_ours(work: str, inputs: dict, steps: int, eval_every: int, extra: dict = None,
               out_name: str = "mindrlhf", seed: int = 1, config: str = os.path.join(EXAMPLE, "grpo_config.yaml")) -> dict:
    """One mindrlhf run of an example's config (this one's by default); `extra`: overrides on top (bench_lora.py's
    LoRA run, bench_tools.py's tool module)."""
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    from mindrlhf.trainer.metrics import read_metrics
    out_dir = os.path.join(work, out_name)
    overrides = {"sft_path_train": inputs["model_dir"], "mind_dataset_dir": os.path.join(inputs["data"], "train.mindrecord"),
                 "save_ckpt_dir": out_dir, "total_steps": steps, "save_steps": 0, "export_hf": False,
                 "progress": False, "tensorboard": False, "eval_prompts": EVAL_PROMPTS, "seed": seed}
    if eval_every:
        overrides.update(eval_dataset=os.path.join(inputs["data"], "test.mindrecord"), eval_steps=eval_every)
    else:
        overrides.update(eval_steps=0)
    overrides.update(extra or {})
    cfg = load_grpo_config(config, overrides)
    t0 = time.perf_counter()
    trainer = GRPOTrainer(cfg, log=lambda *a, **k: None)
    construct = time.perf_counter() - t0
    history = trainer.fit()
    wall = time.perf_counter() - t0
    rows = read_metrics(os.path.join(out_dir, "metrics.jsonl"))
    curve = [[r["step"], r["eval_accuracy"]] for r in rows if "eval_accuracy" in r]
    later = history[1:]
    phases = {"generation": "time_rollout", "reward": "time_reward", "old-policy log-probs": "time_old_logprob",
              "reference log-probs": "time_ref_logprob", "policy fwd+bwd+AdamW": "time_train",
              "weight sync": "time_weight_sync"}
    first = {"construction": construct, **{name: history[0].get(key, 0.0) for name, key in phases.items()}}
    return {"wall_s": wall, "first_step_s": construct + history[0]["time_step"],
            "step_s": median([r["time_step"] for r in later]), "curve": curve,
            "phases": {name: median([r.get(key, 0.0) for r in later]) for name, key in phases.items()},
            "first_step_phases": first, "peak_rss_mb": peak_rss_mb()}


# ---- TRL (the --trl_python) ---------------------------------------------------------------------------------
def child_trl(work: str, inputs: dict, steps: int, eval_every: int, seed: int = 1,
              gradient_checkpointing: bool = True) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from mindrlhf.reward.verifiers import accuracy_reward
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(inputs["model_dir"])
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(inputs["model_dir"], dtype=torch.float32)

    def read(split):
        with open(os.path.join(inputs["data"], f"{split}.jsonl"), encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh]
        return [{"prompt": [{"role": "user", "content": r["question"]}],
                 "solution": r["answer"].rsplit("####", 1)[1].strip()} for r in rows]

    train, test = read("train"), read("test")[:EVAL_PROMPTS]

    def reward(completions, solution, **kw):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [accuracy_reward(t, s) for t, s in zip(texts, solution)]

    def evaluate():
        texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in test]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        was_training = model.training
        model.eval()
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=NEW, do_sample=False, pad_token_id=tok.pad_token_id)
        model.train(was_training)
        answers = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        return sum(accuracy_reward(a, r["solution"]) for a, r in zip(answers, test)) / len(test)

    args = GRPOConfig(output_dir=os.path.join(work, "trl"), per_device_train_batch_size=PROMPTS * G,
                      num_generations=G, max_completion_length=NEW, learning_rate=LR, lr_scheduler_type="constant_with_warmup",
                      warmup_steps=WARMUP, beta=0.0, loss_type="dapo", num_iterations=1, temperature=TEMPERATURE,
                      top_p=1.0, epsilon=0.2, epsilon_high=0.28, max_steps=steps, logging_steps=1,
                      save_strategy="no", report_to=[], use_cpu=True, seed=seed, weight_decay=0.0, max_grad_norm=1.0,
                      dataloader_num_workers=0, disable_tqdm=True, bf16=False, fp16=False,
                      gradient_checkpointing=gradient_checkpointing)
    assert args.gradient_checkpointing is gradient_checkpointing
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(train),
                          processing_class=tok)
    state = {"step_times": [], "curve": [], "gen": []}

    def timed_generate(fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            out = fn(*a, **k)
            state["gen_now"] = state.get("gen_now", 0.0) + time.perf_counter() - t
            return out
        return wrapper

    trainer._generate = timed_generate(trainer._generate)

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            state["gen_now"] = 0.0
            state["t0"] = time.perf_counter()

        def on_step_end(self, args_, state_, control, **k):
            state["step_times"].append(time.perf_counter() - state["t0"])
            state["gen"].append(state["gen_now"])
            if eval_every and (state_.global_step % eval_every == 0 or state_.global_step == steps):
                state["curve"].append([state_.global_step, evaluate()])

    trainer.add_callback(Clock())
    t0 = time.perf_counter()
    if eval_every:
        state["curve"].append([0, evaluate()])
    trainer.train()
    wall = time.perf_counter() - t0
    times = state["step_times"]
    return {"wall_s": wall, "first_step_s": times[0], "step_s": median(times[1:]), "curve": state["curve"],
            "phases": {"generation": median(state["gen"][1:]),
                       "policy fwd+bwd+AdamW": median([t - g for t, g in zip(times[1:], state["gen"][1:])])},
            "peak_rss_mb": peak_rss_mb()}


# ---- report ---------------------------------------------------------------------------------------------------
def summary(system: str, r: dict, steps: int, seed: int = 1) -> dict:
    curve = r["curve"]
    return {"bench": "real_model", "system": system, "seed": seed, "heldout_before": curve[0][1] if curve else None,
            "heldout_after": curve[-1][1] if curve else None, "steps": steps, "wall_min": round(r["wall_s"] / 60, 2),
            "step_s": round(r["step_s"], 3), "first_step_s": round(r["first_step_s"], 2),
            "peak_rss_mb": round(r["peak_rss_mb"]), "curve": curve,
            "phases": {k: round(v, 3) for k, v in r["phases"].items()},
            **({"first_step_phases": {k: round(v, 2) for k, v in r["first_step_phases"].items()}}
               if "first_step_phases" in r else {})}


def plot(path: str, curves: dict, title: str = "SmolLM2-135M-Instruct, one-step arithmetic word problems",
         xlabel: str = "GRPO step"):
    """Held-out accuracy curves {label: [[step, accuracy], ...]} into one PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curve in curves.items():
        if curve:
            ax.plot([s for s, _ in curve], [a for _, a in curve], marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"held-out greedy accuracy ({EVAL_PROMPTS} prompts)")
    ax.set_title(title)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval_every", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="10 steps, no evaluation: timing only")
    p.add_argument("--trl_python", default=sys.executable, help="Python with trl installed")
    p.add_argument("--systems", default="mindrlhf,trl",
                   help="which to run, in order: mindrlhf, mindrlhf_one_graph (engine.layerwise_update false), trl")
    p.add_argument("--model_dir", default=os.path.join(os.path.expanduser("~"), ".cache", "mindrlhf", "smollm2"),
                   help="where the HF folder is written once (scripts/get_smollm2.py)")
    p.add_argument("--work", default="", help="working directory (default: a new temporary one, kept)")
    p.add_argument("--plot", default="", help="write the learning curves here (PNG)")
    p.add_argument("--warm_cache", action="store_true",
                   help="mindrlhf systems with the compile cache, each run twice: cold, then warm")
    p.add_argument("--seed", type=int, default=1,
                   help="both systems' seed (data order, sampling; run.seed and TRL's seed)")
    p.add_argument("--trl_gradient_checkpointing", choices=("on", "off"), default="on",
                   help="TRL's GRPOConfig.gradient_checkpointing: on (TRL's default: less memory, slower) or off")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    trl_gc = args.trl_gradient_checkpointing == "on"
    steps, eval_every = (10, 0) if args.quick else (args.steps, args.eval_every)
    if args.child:
        which, work = args.child
        with open(os.path.join(work, "inputs.json")) as fh:
            inputs = json.load(fh)
        if which == "trl":
            result = child_trl(work, inputs, steps, eval_every, args.seed, trl_gc)
        else:
            extra = dict(ONE_GRAPH) if which == "mindrlhf_one_graph" else {}
            if args.warm_cache:
                extra.update(enable_compile_cache=True, overwrite_ckpt_dir=True)     # the cache stays
            result = child_ours(work, inputs, steps, eval_every, extra, out_name=which, seed=args.seed)
        print(json.dumps(result), flush=True)
        return
    import tempfile
    work = args.work or tempfile.mkdtemp(prefix="bench_real_model_")
    os.makedirs(work, exist_ok=True)
    inputs = prepare(work, args.model_dir)
    with open(os.path.join(work, "inputs.json"), "w") as fh:
        json.dump(inputs, fh)
    rate = matmul_gflops()
    child_args = ["--quick"] if args.quick else ["--steps", str(steps), "--eval_every", str(eval_every)]
    child_args += ["--seed", str(args.seed)] + (["--warm_cache"] if args.warm_cache else [])
    child_args += ["--trl_gradient_checkpointing", args.trl_gradient_checkpointing]
    results = {}
    for system in args.systems.split(","):
        python = args.trl_python if system == "trl" else sys.executable
        results[system] = run_child(os.path.abspath(__file__), system, work, *child_args, python=python)
        line = summary(system, results[system], steps, args.seed)
        if system == "trl":
            line["trl_gradient_checkpointing"] = trl_gc
        print(json.dumps(line), flush=True)
        if args.warm_cache and system != "trl":
            warm = run_child(os.path.abspath(__file__), system, work, *child_args, python=python)
            results[system + "_warm"] = warm
            print(json.dumps(summary(system + "_warm", warm, steps, args.seed)), flush=True)
    if args.plot:
        plot(args.plot, {system: r["curve"] for system, r in results.items()})
    if "mindrlhf" in results:
        ours = results["mindrlhf"]
        flops = phase_flops(inputs["model_dir"])
        floor = {"generation": flops["rollout"] / rate / 1e9, "policy fwd+bwd+AdamW": flops["train"] / rate / 1e9}
        line = {"bench": "real_model_vs_trl", "first_step_s": round(ours["first_step_s"], 2),
                **({"warm_first_step_s": round(results["mindrlhf_warm"]["first_step_s"], 2),
                    "warm_peak_rss_mb": round(results["mindrlhf_warm"]["peak_rss_mb"])}
                   if "mindrlhf_warm" in results else {}),
                "matmul_gflops": round(rate, 1),
                "floor": {k: {"s": round(v, 3), "ours_s": round(ours["phases"][k], 3),
                              "ours_x_floor": round(ours["phases"][k] / v, 2)} for k, v in floor.items()}}
        if ours["curve"]:
            line["heldout_gain"] = round(ours["curve"][-1][1] - ours["curve"][0][1], 4)
        if "trl" in results:
            ref = results["trl"]
            line.update(ratio=round(ref["step_s"] / ours["step_s"], 3), trl_gradient_checkpointing=trl_gc,
                        peak_rss_ratio=round(ours["peak_rss_mb"] / ref["peak_rss_mb"], 3))
            if ours["curve"] and ref["curve"]:
                line["heldout_gap_vs_trl"] = round(ours["curve"][-1][1] - ref["curve"][-1][1], 4)
            if "mindrlhf_one_graph" in results:
                one = results["mindrlhf_one_graph"]
                line["one_graph"] = {"ratio": round(ref["step_s"] / one["step_s"], 3),
                                     "peak_rss_ratio": round(one["peak_rss_mb"] / ref["peak_rss_mb"], 3),
                                     "first_step_s": round(one["first_step_s"], 2)}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
