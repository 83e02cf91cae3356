"""mindrlhf against TRL's GRPOTrainer on the same GRPO work, in one run, single process each.

The work (issue #16): a Qwen2 decoder (small: 2 layers, hidden 128, 4 heads / 2 kv heads, intermediate 352;
`--scale`: 4 layers, hidden 512, 8 / 2 heads, intermediate 1408) with random weights written once as HF
safetensors and loaded by both; a byte-level BPE tokenizer trained on the bundled corpus (vocab.json +
merges.txt, read by both); 8 prompts x 8 completions of exactly 16 new tokens per step (EOS suppressed until
then on both sides); beta 0.04 (k3 KL to the initial weights), lr 1e-4 constant, token-mean loss (TRL's
"dapo"), AdamW, one update per rollout (TRL's num_iterations 1; mindrlhf then skips the old-policy pass),
temperature 1, the same dense reward (share of digits in the completion), no TensorBoard on either side (TRL's
report_to=[]; importing torch for ours would add ~200 MB). 20 steps; medians of steps 3..20.

TRL's gradient checkpointing (GRPOConfig.gradient_checkpointing, TRL's default on: lower memory, "~20% slower"
by its docs) is set explicitly by --trl_gradient_checkpointing, default on (TRL's default, and the setting every
figure in docs/BENCHMARKS.md was measured with, unset then); off is TRL's faster, larger setting. The JSON line
says which ("trl_gradient_checkpointing"). mindrlhf keeps every activation (no recomputation) either way.

The TRL side runs in the Python given by --trl_python (default: this one), because trl's dependencies may
want numpy 2 beside mindspore's numpy < 2. A second environment that worked here:
    python -m venv --system-site-packages trl_venv && trl_venv/bin/pip install trl
(it takes torch and transformers from the main environment and installs trl, accelerate, datasets and numpy
2 into the venv). The mindrlhf side runs in this Python.

Ours runs with run.enable_compile_cache on, twice in the same directory: the first run compiles its graphs
(and writes them to the cache: the headline figures), the second is a re-run of the same job that loads them
(the rerun_* figures: start-up and peak RSS without the graph compiler's work and heap).

Start-up ("startup_*") is the trainer's construction plus its first step, on both sides: mindrlhf compiles
its training graph while it is constructed (utils/compile_ahead.py), the rest in the first step. Peak RSS
is the process's whole-life VmHWM (common.peak_rss_mb: mindrlhf's trainer restarts VmHWM per phase for its
peak_mb_* metrics and keeps the highest mark; earlier versions watched VmRSS from a 5 ms thread instead, which
slowed the watched GRPO step by 8-15% on two cores).

This machine's speed drifts by 10-30% within minutes, moving one side at a time (measured on a 2-core AMD
EPYC Zen 4: ours 0.155, 0.196, 0.218 s/step in three consecutive rounds of one run, TRL 0.336, 0.295, 0.346).
`--rounds N` runs the three children N times, interleaved, each round from a cold compile, and reports the
median of the per-round ratios.

Prints per-phase medians for both (of the median round), the start-up time, peak RSS, every round's ratio,
and last {"bench": "grpo_vs_trl", "ours": s_per_step, "reference": s_per_step, "ratio": reference / ours,
"peak_rss_ratio": ours / reference, "round_ratios": [...], "startup_ours": s, "rerun_startup_ours": s,
"rerun_peak_rss_ratio": ..., ...}; with several rounds ratio and peak_rss_ratio are medians over them, and
ours, reference and the start-up and rerun_* figures are those of "median_round" (the upper of the two
middle rounds for an even count).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, peak_rss_mb, run_child  # noqa: E402

SMALL = dict(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=352)
SCALE = dict(layers=4, hidden=512, heads=8, kv_heads=2, intermediate=1408)
PROMPTS, G, NEW, STEPS, BETA, LR = 8, 8, 16, 20, 0.04, 1e-4
TEMPLATE = "Question: {question}\nAnswer:"          # mindrlhf's "plain" prompt template


def digit_share(completion: str) -> float:
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


# ---- shared inputs (this Python) --------------------------------------------------------------------------
def prepare(work: str, dims: dict) -> dict:
    import random
    from mindrlhf.data.tokenizer import load_tokenizer, train_byte_level_bpe
    rng = random.Random(0)
    rows = []
    for _ in range(PROMPTS * STEPS):
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        rows.append({"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}.\n#### {a + b}"})
    with open(os.path.join(REPO, "mindrlhf", "demo_assets", "corpus.txt"), encoding="utf-8") as fh:
        corpus = fh.read().splitlines()
    vocab, merges = train_byte_level_bpe(corpus * 5 + [r["question"] + " " + r["answer"] for r in rows], 300,
                                         os.path.join(work, "tok"))
    ours_tok = load_tokenizer(vocab, merges)
    vocab_size = ours_tok.vocab_size
    ours_tok._tok.save(os.path.join(work, "tok", "tokenizer.json"))      # the same pipeline, for transformers
    jsonl = os.path.join(work, "train.jsonl")
    with open(jsonl, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    from mindrlhf.data.convert import build_parser, convert
    data = os.path.join(work, "train.mindrecord")
    convert(build_parser().parse_args(["--vocab_path", vocab, "--merges_file_path", merges, "--file_path", jsonl,
                                       "--output_path", data, "--max_prompt_length", "16", "--seq_length", "48",
                                       "--prompt_template", "plain", "--no_progress"]))
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=dims["hidden"], num_hidden_layers=dims["layers"], num_attention_heads=dims["heads"],
                      num_key_value_heads=dims["kv_heads"], intermediate_size=dims["intermediate"],
                      vocab_size=vocab_size, max_position_embeddings=64, tie_word_embeddings=False,
                      rope_theta=10000.0, rms_norm_eps=1e-6, use_sliding_window=False, torch_dtype="float32",
                      bos_token_id=None, eos_token_id=0, pad_token_id=0)
    hf_dir = os.path.join(work, "hf_init")
    Qwen2ForCausalLM(cfg).save_pretrained(hf_dir, safe_serialization=True)
    return {"vocab": vocab, "merges": merges, "data": data, "hf_dir": hf_dir, "vocab_size": vocab_size,
            "tokenizer_json": os.path.join(work, "tok", "tokenizer.json"),
            "prompts": [TEMPLATE.format(question=r["question"]) for r in rows]}


# ---- mindrlhf side (this Python) --------------------------------------------------------------------------
def child_ours(work: str, inputs: dict, dims: dict) -> dict:
    import yaml
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.reward.verifiers import register_verifier
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    register_verifier("digit_share")(lambda completion, solution: digit_share(completion))
    model_yaml = os.path.join(work, "model.yaml")
    with open(model_yaml, "w") as fh:
        yaml.safe_dump({"model": {"model_config": {
            "hidden_size": dims["hidden"], "num_layers": dims["layers"], "num_heads": dims["heads"],
            "n_kv_heads": dims["kv_heads"], "intermediate_size": dims["intermediate"],
            "vocab_size": inputs["vocab_size"], "qkv_has_bias": True, "tie_word_embeddings": False, "seq_length": 64,
            "max_position_embedding": 64, "theta": 10000.0, "rms_norm_eps": 1e-6, "eos_token_id": 0,
            "pad_token_id": 0}}}, fh)
    cfg = load_grpo_config(None, {
        "sft_path_train": model_yaml, "vocab_path": inputs["vocab"], "merges_file_path": inputs["merges"],
        "mind_dataset_dir": inputs["data"], "load_sft_checkpoint_train": inputs["hf_dir"],
        "save_ckpt_dir": os.path.join(work, "ours"), "total_steps": STEPS, "save_steps": 0, "export_hf": False,
        "progress": False, "batch_size": PROMPTS, "num_generations": G, "max_tokens": NEW, "min_tokens": NEW,
        "temperature": 1.0, "beta": BETA, "kl_estimator": "k3", "loss_agg": "token-mean", "lr": LR,
        "lr_schedule": "constant", "warmup_steps": 0, "beta2": 0.999, "ref_sync_steps": 0, "weight_decay": 0.0,
        "max_grad_norm": 1.0, "verifier_function": "digit_share",
        "verifier_weight": "1.0", "tensorboard": False, "enable_compile_cache": True})
    t0 = time.perf_counter()
    trainer = GRPOTrainer(cfg, log=lambda *a, **k: None)
    setup = time.perf_counter() - t0
    rows = [trainer.train_one_step() for _ in range(STEPS)]
    later = rows[2:]
    phases = {"generation": "time_rollout", "old-policy log-probs": "time_old_logprob",
              "reference log-probs": "time_ref_logprob", "policy fwd+bwd+AdamW": "time_train",
              "weight sync": "time_weight_sync"}
    return {"setup_s": setup, "startup_s": setup + rows[0]["time_step"],
            "step_s": median([r["time_step"] for r in later]),
            "phases": {name: median([r.get(key, 0.0) for r in later]) for name, key in phases.items()},
            "peak_rss_mb": peak_rss_mb(), "mean_completion_len": median([r["response_len_mean"] for r in later])}


# ---- TRL side (the --trl_python) ------------------------------------------------------------------------
def child_trl(work: str, inputs: dict, dims: dict, gradient_checkpointing: bool = True) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    torch.set_num_threads(os.cpu_count() or 1)
    tok = PreTrainedTokenizerFast(tokenizer_file=inputs["tokenizer_json"], pad_token="<|endoftext|>",
                                  eos_token="<|endoftext|>")
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(inputs["hf_dir"], torch_dtype=torch.float32)

    def reward(completions, **kw):
        return [digit_share(c) for c in completions]

    args = GRPOConfig(output_dir=os.path.join(work, "trl"), per_device_train_batch_size=PROMPTS * G,
                      num_generations=G, max_completion_length=NEW, learning_rate=LR, lr_scheduler_type="constant",
                      beta=BETA, loss_type="dapo", num_iterations=1, temperature=1.0, max_steps=STEPS,
                      logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0, weight_decay=0.0,
                      max_grad_norm=1.0, generation_kwargs={"min_new_tokens": NEW}, warmup_steps=0,
                      dataloader_num_workers=0, disable_tqdm=True, bf16=False, fp16=False,
                      gradient_checkpointing=gradient_checkpointing)
    assert args.gradient_checkpointing is gradient_checkpointing
    data = Dataset.from_list([{"prompt": p} for p in inputs["prompts"]])
    t_setup = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok)
    setup = time.perf_counter() - t_setup
    timing = {"step": [], "generation": [], "reference log-probs": [], "policy fwd+bwd+AdamW": []}
    state = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            out = fn(*a, **k)
            state[name] = state.get(name, 0.0) + time.perf_counter() - t
            return out
        return wrapper

    trainer._generate = timed("generation", trainer._generate)
    real_logps = trainer._get_per_token_logps_and_entropies

    def logps(model_arg, *a, **k):
        t = time.perf_counter()
        out = real_logps(model_arg, *a, **k)
        if torch.is_grad_enabled() is False and model_arg is getattr(trainer, "ref_model", None):
            state["reference log-probs"] = state.get("reference log-probs", 0.0) + time.perf_counter() - t
        return out

    trainer._get_per_token_logps_and_entropies = logps
    trainer._compute_loss = timed("loss", trainer._compute_loss)

    lengths = []

    class Clock(TrainerCallback):
        def on_log(self, args_, state_, control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

        def on_step_begin(self, *a, **k):
            state.clear()
            state["t0"] = time.perf_counter()

        def on_step_end(self, *a, **k):
            total = time.perf_counter() - state["t0"]
            timing["step"].append(total)
            gen_and_score = state.get("generate_and_score", 0.0)
            timing["generation"].append(state.get("generation", 0.0))
            timing["reference log-probs"].append(state.get("reference log-probs", 0.0))
            timing["policy fwd+bwd+AdamW"].append(total - gen_and_score)

    trainer._generate_and_score_completions = timed("generate_and_score", trainer._generate_and_score_completions)
    trainer.add_callback(Clock())
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    later = {k: v[2:] for k, v in timing.items()}
    return {"setup_s": setup, "startup_s": setup + timing["step"][0], "step_s": median(later["step"]), "train_s": total,
            "phases": {k: median(v) for k, v in later.items() if k != "step"}, "peak_rss_mb": peak_rss_mb(),
            "steps": len(timing["step"]), "mean_completion_len": median(lengths) if lengths else float("nan")}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trl_python", default=sys.executable, help="Python with trl installed (see above)")
    p.add_argument("--scale", action="store_true", help="4 layers / hidden 512 / 8 heads / intermediate 1408")
    p.add_argument("--rounds", type=int, default=1,
                   help="interleaved rounds of (ours, ours re-run, TRL), each from a cold compile; the ratios "
                        "printed last are the medians over the rounds (this machine's speed drifts between runs)")
    p.add_argument("--trl_gradient_checkpointing", choices=("on", "off"), default="on",
                   help="TRL's GRPOConfig.gradient_checkpointing: on (TRL's default: less memory, slower) or off")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    dims = SCALE if args.scale else SMALL
    trl_gc = args.trl_gradient_checkpointing == "on"
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.child:
        which, work = args.child
        with open(os.path.join(work, "inputs.json")) as fh:
            inputs = json.load(fh)
        out = child_ours(work, inputs, dims) if which == "ours" else child_trl(work, inputs, dims, trl_gc)
        print(json.dumps(out), flush=True)      # the last line: common.run_child reads it
        return
    work = tempfile.mkdtemp(prefix="bench_vs_trl_")
    scale_flag = (["--scale"] if args.scale else []) + ["--trl_gradient_checkpointing", args.trl_gradient_checkpointing]
    rounds = []
    try:
        inputs = prepare(work, dims)
        with open(os.path.join(work, "inputs.json"), "w") as fh:
            json.dump(inputs, fh)
        for _ in range(args.rounds):
            shutil.rmtree(os.path.join(work, "ours"), ignore_errors=True)    # each round compiles from scratch
            rounds.append({name: run_child(os.path.abspath(__file__), which, work, *scale_flag, python=python)
                           for name, which, python in (("ours", "ours", sys.executable),
                                                       ("ours_rerun", "ours", sys.executable),
                                                       ("trl", "trl", args.trl_python))})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(rounds, args.scale, trl_gc)


def report(rounds: list, scale: bool, trl_gradient_checkpointing: bool = True):
    """Per-phase table of the median round (by step-time ratio), every round's ratios, then the JSON line:
    ratio and peak_rss_ratio are medians over the rounds."""
    ratios = [r["trl"]["step_s"] / r["ours"]["step_s"] for r in rounds]
    rss_ratios = [r["ours"]["peak_rss_mb"] / r["trl"]["peak_rss_mb"] for r in rounds]
    mid = sorted(range(len(rounds)), key=lambda i: ratios[i])[len(rounds) // 2]
    ours, rerun, ref = rounds[mid]["ours"], rounds[mid]["ours_rerun"], rounds[mid]["trl"]
    title = f"phase (median, steps 3..{STEPS})" + (f", round {mid + 1} of {len(rounds)}" if len(rounds) > 1 else "")
    print(f"TRL's gradient checkpointing: {'on' if trl_gradient_checkpointing else 'off'}")
    print(f"{title:34s} {'TRL':>10s} {'mindrlhf':>10s}")
    print(f"{'whole step':34s} {ref['step_s']:10.3f} {ours['step_s']:10.3f}")
    for name in ("generation", "old-policy log-probs", "reference log-probs", "policy fwd+bwd+AdamW", "weight sync"):
        print(f"{name:34s} {ref['phases'].get(name, 0.0):10.3f} {ours['phases'].get(name, 0.0):10.3f}")
    print(f"{'set-up + first step (compile)':34s} {ref['startup_s']:10.3f} {ours['startup_s']:10.3f}")
    print(f"{'peak RSS MB':34s} {ref['peak_rss_mb']:10.0f} {ours['peak_rss_mb']:10.0f}")
    print(f"{'re-run from the compile cache':34s} {'':10s} set-up + first step {rerun['startup_s']:.3f} s, "
          f"peak RSS {rerun['peak_rss_mb']:.0f} MB, step {rerun['step_s']:.3f} s")
    print(f"{'completion length (tokens)':34s} {ref['mean_completion_len']:10.1f} {ours['mean_completion_len']:10.1f}")
    if len(rounds) > 1:
        for i, r in enumerate(rounds):
            print(f"round {i + 1}: TRL {r['trl']['step_s']:.4f} s/step, mindrlhf {r['ours']['step_s']:.4f} "
                  f"(ratio {ratios[i]:.3f}); peak RSS {r['trl']['peak_rss_mb']:.0f} vs "
                  f"{r['ours']['peak_rss_mb']:.0f} MB")
    print(json.dumps({"bench": "grpo_vs_trl" + ("_scale" if scale else ""), "ours": round(ours["step_s"], 4),
                      "reference": round(ref["step_s"], 4), "ratio": round(median(ratios), 3),
                      "peak_rss_ratio": round(median(rss_ratios), 3),
                      "round_ratios": [round(x, 3) for x in ratios], "median_round": mid + 1,
                      "startup_ours": round(ours["startup_s"], 2), "startup_reference": round(ref["startup_s"], 2),
                      "rerun_startup_ours": round(rerun["startup_s"], 2),
                      "rerun_peak_rss_ratio": round(rerun["peak_rss_mb"] / ref["peak_rss_mb"], 3),
                      "rerun_ratio": round(ref["step_s"] / rerun["step_s"], 3),
                      "trl_gradient_checkpointing": trl_gradient_checkpointing}))


if __name__ == "__main__":
    main()
