"""GRPO with a tool, mindrlhf and TRL side by side: SmolLM2-135M-Instruct calls the sandboxed code interpreter on
multiplication word problems (examples/grpo/tool_calculator, whose README says why each setting).

    python benchmarks/bench_tools.py [--steps 20] [--eval_every 5] [--trl_python PY] [--plot tools.png]

Both systems start from the same SFT checkpoint (the example's commands: make_data.py, then `python -m
mindrlhf.sft`, 10 steps; written once into --work), see the same prompts (the example's chat template, its
system prompt, the interpreter's schema: TRL's is derived from a function whose docstring gives the same schema,
checked), call the same tool (mindrlhf's CodeInterpreter, bubblewrap sandbox, 5 s, 256 MB; in TRL as a plain
function, `GRPOTrainer(tools=[code_interpreter])`, TRL reading the calls with its Qwen3 / hermes response
template), score with the same verifier (accuracy_reward on the whole episode's text) and use the example's
settings: 4 prompts x 8 samples, <= 96 tokens per episode (model, tool and template tokens; TRL's
max_completion_length counts the same), at most 2 tool calls, temperature 0.7, beta 0, token-mean loss (TRL's
"dapo"), clip 0.2 / 0.28, AdamW lr 1e-5 constant after 3 warm-up updates, gradient clip 1.0. TRL runs with its
default gradient checkpointing (on).

Held-out accuracy: greedy episodes on the first 64 test prompts, by one evaluator for both: mindrlhf's
in-run evaluation (equal to `python -m mindrlhf.eval`'s greedy accuracy) and `python -m mindrlhf.eval` on each
checkpoint TRL saves every --eval_every steps. Evaluation time is not in the step time.

Each system runs in a fresh process, one after the other (2 cores). JSON lines: per system {"bench": "tools",
"system", "heldout_before", "heldout_after", "step_s", "first_step_s", "peak_rss_mb", "tool_s", "curve",
"phases"}, then {"bench": "tools_vs_trl", "ratio": trl step_s / ours, "peak_rss_ratio": ours / trl,
"heldout_gain_over_sft": ours after - before, "heldout_gap_vs_trl": ours after - trl after}. step_s is the
median over steps 2..N; tool_s the median per step of the seconds spent in tool calls (they overlap decoding).
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, peak_rss_mb, run_child  # noqa: E402
from bench_real_model import child_ours, median, plot, summary  # noqa: E402

EXAMPLE = os.path.join(REPO, "examples", "grpo", "tool_calculator")
TOOLS = os.path.join(EXAMPLE, "tools.py")
sys.path.insert(0, EXAMPLE)
from make_data import SYSTEM_PROMPT  # noqa: E402  (the example's one system prompt)
PROMPTS, G, NEW, TEMPERATURE, LR, WARMUP, EVAL_PROMPTS, MAX_CALLS = 4, 8, 96, 0.7, 1e-5, 3, 64, 2
PROMPT_WIDTH = 224
SFT_FLAGS = ["--max_length", "320", "--batch_size", "8", "--total_steps", "10", "--lr", "2e-5", "--warmup_steps", "2"]


def _run(*args):
    subprocess.run([sys.executable, *args], check=True, cwd=REPO, stdout=subprocess.DEVNULL)


def prepare(work: str, model_dir: str) -> dict:
    """The example's data and SFT checkpoint (kept in `work`: a second run reuses them)."""
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    from get_smollm2 import convert
    convert(model_dir)
    data, sft = os.path.join(work, "data"), os.path.join(work, "sft")
    if not os.path.isfile(os.path.join(data, "test.jsonl")):
        _run(os.path.join(EXAMPLE, "make_data.py"), data, "--model", model_dir)
    if not os.path.isfile(os.path.join(sft, "hf_policy", "model.safetensors")):
        _run("-m", "mindrlhf.sft", "--model", os.path.join(data, "model"), "--dataset", os.path.join(data, "sft.jsonl"),
             "--output_dir", sft, "--progress", "false", *SFT_FLAGS)
    for split in ("train", "test"):
        if not os.path.exists(os.path.join(data, f"{split}.mindrecord")):
            _run(os.path.join(REPO, "examples", "grpo", "qwen_grpo_tutorial", "rlhf_data.py"), "--vocab_path",
                 os.path.join(sft, "hf_policy"), "--file_path", os.path.join(data, f"{split}.jsonl"), "--output_path",
                 os.path.join(data, f"{split}.mindrecord"), "--prompt_template", "chat", "--system_prompt",
                 SYSTEM_PROMPT, "--tool_module", TOOLS, "--max_prompt_length", str(PROMPT_WIDTH), "--seq_length",
                 str(PROMPT_WIDTH + NEW), "--no_progress")
    return {"model_dir": os.path.join(sft, "hf_policy"), "data": data}


def heldout(model: str, inputs: dict) -> float:
    """Greedy episodes on the first EVAL_PROMPTS test prompts, by `python -m mindrlhf.eval`."""
    out = subprocess.run([sys.executable, "-m", "mindrlhf.eval", "--model", model, "--vocab_path", inputs["model_dir"],
                          "--dataset", os.path.join(inputs["data"], "test.jsonl"), "--prompt_template", "chat",
                          "--system_prompt", SYSTEM_PROMPT, "--max_prompt_length", str(PROMPT_WIDTH),
                          "--max_tokens", str(NEW), "--max_tool_calls", str(MAX_CALLS), "--tool_module", TOOLS,
                          "--limit", str(EVAL_PROMPTS), "--progress", "false"],
                         check=True, cwd=REPO, stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["accuracy"]


# ---- TRL (the --trl_python) ---------------------------------------------------------------------------------
def child_trl(work: str, inputs: dict, steps: int, eval_every: int, seed: int = 1) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.utils import get_json_schema
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template
    from mindrlhf.reward.verifiers import accuracy_reward
    from mindrlhf.tools import CodeInterpreter, SandboxLimits
    from mindrlhf.tools.registry import CODE_INTERPRETER_SCHEMA
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(seed)
    interpreter = CodeInterpreter(SandboxLimits(timeout=5.0, memory_mb=256))       # tools.py's
    state = {"step_times": [], "tool_s": [], "tool_now": 0.0, "calls": 0}

    def code_interpreter(code: str):           # no return hint: the schema then equals ours exactly
        """Runs Python code and returns what it prints (stdout, then stderr). Print the values you need.

        Args:
            code: The Python code to run.
        """
        t = time.perf_counter()
        try:
            return str(interpreter(code=code))
        finally:
            state["tool_now"] += time.perf_counter() - t
            state["calls"] += 1

    assert get_json_schema(code_interpreter) == CODE_INTERPRETER_SCHEMA, get_json_schema(code_interpreter)
    tok = AutoTokenizer.from_pretrained(inputs["model_dir"])
    tok.padding_side = "left"
    tok.response_template = qwen3_template      # hermes <tool_call>{json}</tool_call> after "<|im_start|>assistant\n"
    model = AutoModelForCausalLM.from_pretrained(inputs["model_dir"], dtype=torch.float32)
    with open(os.path.join(inputs["data"], "train.jsonl"), encoding="utf-8") as fh:
        train = [json.loads(line) for line in fh]
    train = [{"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": r["question"]}],
              "solution": r["answer"].rsplit("####", 1)[1].strip()} for r in train]

    def reward(completions, solution, **kw):
        texts = ["\n".join(m.get("content") or "" for m in c) if isinstance(c, list) else c for c in completions]
        return [accuracy_reward(t, s) for t, s in zip(texts, solution)]

    out_dir = os.path.join(work, "trl")
    args = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=PROMPTS * G, num_generations=G,
                      max_completion_length=NEW, max_tool_calling_iterations=MAX_CALLS, learning_rate=LR,
                      lr_scheduler_type="constant_with_warmup", warmup_steps=WARMUP, beta=0.0, loss_type="dapo",
                      num_iterations=1, temperature=TEMPERATURE, top_p=1.0, epsilon=0.2, epsilon_high=0.28,
                      max_steps=steps, logging_steps=1, report_to=[], use_cpu=True, seed=seed, weight_decay=0.0,
                      max_grad_norm=1.0, dataloader_num_workers=0, disable_tqdm=True, bf16=False, fp16=False,
                      save_strategy="steps" if eval_every else "no", save_steps=eval_every or steps,
                      save_only_model=True)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(train),
                          processing_class=tok, tools=[code_interpreter])

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            state["tool_now"] = 0.0
            state["t0"] = time.perf_counter()

        def on_step_end(self, *a, **k):
            state["step_times"].append(time.perf_counter() - state["t0"])
            state["tool_s"].append(state["tool_now"])

    trainer.add_callback(Clock())
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    times = state["step_times"]
    checkpoints = sorted((int(d.split("-")[1]), os.path.join(out_dir, d)) for d in os.listdir(out_dir)
                         if d.startswith("checkpoint-"))
    return {"wall_s": wall, "first_step_s": times[0], "step_s": median(times[1:]), "curve": [],
            "checkpoints": checkpoints, "tool_s": median(state["tool_s"][1:]), "tool_calls": state["calls"],
            "phases": {}, "peak_rss_mb": peak_rss_mb()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval_every", type=int, default=5, help="0: no held-out curve (timing only)")
    p.add_argument("--trl_python", default=sys.executable, help="Python with trl installed (see bench_vs_trl.py)")
    p.add_argument("--systems", default="mindrlhf,trl", help="which to run, in order")
    p.add_argument("--model_dir", default=os.path.join(os.path.expanduser("~"), ".cache", "mindrlhf", "smollm2"),
                   help="where the SmolLM2 HF folder is written once (scripts/get_smollm2.py)")
    p.add_argument("--work", default="", help="working directory: data and the SFT checkpoint are made once there")
    p.add_argument("--plot", default="", help="write both held-out curves here (PNG)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        which, work = args.child
        with open(os.path.join(work, "inputs.json")) as fh:
            inputs = json.load(fh)
        if which == "trl":
            result = child_trl(work, inputs, args.steps, args.eval_every, args.seed)
        else:
            result = child_ours(work, inputs, args.steps, args.eval_every, {"tool_module": TOOLS}, out_name=which,
                                seed=args.seed, config=os.path.join(EXAMPLE, "grpo_config.yaml"))
        print(json.dumps(result), flush=True)
        return
    import tempfile
    work = args.work or tempfile.mkdtemp(prefix="bench_tools_")
    os.makedirs(work, exist_ok=True)
    inputs = prepare(work, args.model_dir)
    with open(os.path.join(work, "inputs.json"), "w") as fh:
        json.dump(inputs, fh)
    child_args = ["--steps", str(args.steps), "--eval_every", str(args.eval_every), "--seed", str(args.seed)]
    results = {}
    for system in args.systems.split(","):
        python = args.trl_python if system == "trl" else sys.executable
        r = run_child(os.path.abspath(__file__), system, work, *child_args, python=python)
        if system == "trl" and args.eval_every:        # TRL's checkpoints, by the same evaluator
            r["curve"] = [[0, heldout(inputs["model_dir"], inputs)]] + \
                [[step, heldout(path, inputs)] for step, path in r.pop("checkpoints")]
        elif system != "trl":
            with open(os.path.join(work, system, "metrics.jsonl")) as fh:
                rows = [json.loads(line) for line in fh]
            rows = [row for row in rows if "time_step" in row]
            r["tool_s"] = median([row.get("tools/code_interpreter/seconds", 0.0) for row in rows[1:]])
            r["tool_calls"] = sum(row.get("tools/code_interpreter/calls", 0.0) for row in rows)
        results[system] = r
        line = dict(summary(system, r, args.steps, args.seed), bench="tools", tool_s=round(r["tool_s"], 3),
                    tool_calls=r["tool_calls"])
        print(json.dumps(line), flush=True)
    if args.plot:
        plot(args.plot, {system: r["curve"] for system, r in results.items()},
             title="SmolLM2-135M-Instruct + code interpreter, after SFT")
    if "mindrlhf" in results and "trl" in results:
        ours, ref = results["mindrlhf"], results["trl"]
        line = {"bench": "tools_vs_trl", "ratio": round(ref["step_s"] / ours["step_s"], 3),
                "peak_rss_ratio": round(ours["peak_rss_mb"] / ref["peak_rss_mb"], 3),
                "first_step_s": round(ours["first_step_s"], 2), "trl_first_step_s": round(ref["first_step_s"], 2)}
        if ours["curve"] and ref["curve"]:
            line.update(heldout_gain_over_sft=round(ours["curve"][-1][1] - ours["curve"][0][1], 4),
                        heldout_gap_vs_trl=round(ours["curve"][-1][1] - ref["curve"][-1][1], 4))
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
