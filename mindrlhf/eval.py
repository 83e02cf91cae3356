"""Evaluate a model on a prompt set outside training: accuracy, pass@k and a completions file.

    python -m mindrlhf.eval --model ckpt/hf_policy --dataset test.jsonl --prompt_template plain \\
        --n 8 --temperature 0.7 --output completions.jsonl

The model is an HF folder (config.json + safetensors), or a model YAML with --checkpoint (a step folder
save_ckpt_dir/step_N, a save_ckpt_dir, whose newest complete step is taken, the exported hf_policy, or a
.ckpt/.safetensors file). The prompts are a MindRecord written by rlhf_data.py, or jsonl / a JSON array /
parquet / a directory of them, read and tokenized by rlhf_data.py's own code (data/convert.py) with its
--dataset_type, --prompt_template and --max_prompt_length. Completions are generated, decoded and scored by
trainer/evaluation.py, the code of the trainer's in-training eval: greedy (the default) on the same weights
and prompts, with --chunk_rows set to the run's rl.batch_size x rl.num_generations, gives its eval_accuracy
exactly (the trainer pads eval prompts to its training file's prompt width, this command to the eval file's:
convert both with the same --max_prompt_length).

Under msrun (--use_parallel True) every rank holds the whole model (data parallel, as an HF folder trains)
and generates every world-th prompt from its own rank (r::world, as the trainer's eval splits prompts over
infer-DP replicas); completions travel to rank 0 through trainer/exchange.py, which writes the file. Prompt p
is sampled from its own random stream (seed, p, sample), so sampled completions do not depend on the number of
ranks either.

pass@k is the unbiased estimator of Chen et al. 2021 (1 - C(n-c, k) / C(n, k) per prompt, averaged), for k =
1, 2, 4, ... < n and n. A completion is correct when its score (the weighted verifiers, by default
accuracy_reward) is at least --correct_threshold.
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from dataclasses import dataclass

from mindrlhf.configs.errors import CheckpointError, ConfigError
from mindrlhf.configs.fields import default, flag_parser, from_flags, help_field as _f
from mindrlhf.configs.grpo_config import RewardConfig, RunConfig, SamplingConfig, ToolsConfig
from mindrlhf.data.convert import DEFAULTS as CONVERT_DEFAULTS
from mindrlhf.data.mindrecord_io import PROMPT_TEMPLATES
from mindrlhf.data.sources import DATASET_TYPES
from mindrlhf.trainer.evaluation import CORRECT_SCORE, pass_at_k, pass_ks

MINDRECORD_SUFFIX = ".mindrecord"


@dataclass
class EvalConfig:
    """The eval command's settings: its flags, help and docs/CONFIG.md's eval table are generated from here;
    the defaults shared with training are the training config's own."""
    model: str = _f("", "a Hugging Face model folder (config.json + safetensors) or a model YAML (MindFormers' or "
                    "MindSpeed-RL's; its parallel layout is not used: every rank holds the whole model)", required=True)
    checkpoint: str = _f("", "the weights: save_ckpt_dir/step_N, a save_ckpt_dir (its newest complete step), an HF "
                         "folder (save_ckpt_dir/hf_policy) or a .ckpt/.safetensors file; default: --model when it is "
                         "an HF folder")
    vocab_path: str = _f("", "tokenizer vocab.json, or a folder holding one (tokenizer.json, vocab.json + "
                         "merges.txt, tokenizer.model); default: the HF folder's tokenizer")
    merges_file_path: str = _f("", "merges.txt belonging to --vocab_path")
    dataset: str = _f("", "a prompt MindRecord from rlhf_data.py, or a .jsonl, a .json array, a .parquet or a "
                      "directory of them (read as rlhf_data.py reads them)", required=True)
    dataset_type: str = _f("gsm8k", "jsonl/JSON/parquet input: the columns a row is read from (rlhf_data.py's flag)",
                           choices=tuple(sorted(DATASET_TYPES)))
    map_keys: str = _f("", "jsonl/JSON/parquet input: JSON {field: column} renaming the columns --dataset_type "
                       "reads (rlhf_data.py's flag)")
    prompt_template: str = _f("none", f"jsonl/JSON/parquet input: chat, one of {sorted(PROMPT_TEMPLATES)} or a file "
                              f"with '{{question}}' (rlhf_data.py's flag; use the one the training data was "
                              f"converted with)")
    system_prompt: str = _f("", "with --prompt_template chat: a system message")
    enable_thinking: str = _f("", "with --prompt_template chat: the template's enable_thinking, true or false "
                              "(rlhf_data.py's flag; empty: unset, the template's own default)",
                              choices=("", "true", "false"))
    max_prompt_length: int = _f(CONVERT_DEFAULTS["max_prompt_length"][0], "jsonl/JSON/parquet input: prompt "
                                "tokens kept (rlhf_data.py's flag; the prompt bucket the rollout pads to)")
    on_long_prompt: str = _f("truncate", "jsonl/JSON/parquet input: prompts longer than --max_prompt_length "
                             "(truncate keeps the end)", choices=("truncate", "skip"))
    limit: int = _f(0, "evaluate the first N prompts (0: all)")
    n: int = _f(1, "completions per prompt")
    temperature: float = _f(0.0, "0: greedy")
    top_p: float = _f(default(SamplingConfig, "top_p"), "nucleus sampling: keep the smallest set of tokens "
                      "whose probability reaches top_p")
    top_k: int = _f(default(SamplingConfig, "top_k"), "keep the k most likely tokens (0: off)")
    min_p: float = _f(default(SamplingConfig, "min_p"), "drop tokens below min_p x the top token's probability")
    repetition_penalty: float = _f(default(SamplingConfig, "repetition_penalty"), "CTRL's repetition penalty "
                                   "(1: off)")
    max_tokens: int = _f(default(SamplingConfig, "max_tokens"), "most new tokens per completion")
    seed: int = _f(0, "sampling seed (completion j of prompt p draws from the stream (seed, p, j))")
    verifier_function: List[str] = _f(["accuracy_reward"], "verifiers scoring each completion, as in training "
                                      "(mindrlhf.reward.verifiers); space- or comma-separated")
    verifier_weight: List[float] = _f([], "one weight per verifier (default: 1 each)")
    reward_module: str = _f("", "a .py file or module registering more verifiers")
    custom_reward_function: str = _f("", "a verl-style reward function, file.py or file.py:name (as the GRPO "
                                     "config's reward.custom_reward_function; name it in --verifier_function); "
                                     "a verl parquet --dataset or a file converted from one gives it each row's "
                                     "data_source and extra_info")
    custom_reward_kwargs: str = _f("", "its keyword arguments, a JSON object")
    verifier_timeout: float = _f(default(RewardConfig, "verifier_timeout"), "seconds one verifier may spend on "
                                 "one completion (0 scores it)")
    max_tool_calls: int = _f(default(ToolsConfig, "max_tool_calls"), "multi-turn: tool calls per completion "
                             "(the GRPO config's tools.max_tool_calls; 0: one turn); the other tool settings are "
                             "the tools section's defaults")
    tool_module: str = _f("", "with --max_tool_calls: a .py file or module of tools (tools.tool_module); a chat "
                          "--prompt_template also offers them in each prompt")
    tool_config_path: str = _f("", "with --max_tool_calls: MindSpeed-RL's / verl's tool config file "
                               "(tools.tool_config_path)")
    correct_threshold: float = _f(CORRECT_SCORE, "a completion with a score at least this is correct (accuracy, "
                                  "pass@k)")
    output: str = _f("", "write every completion here as JSON lines (index, sample, prompt, completion, solution, "
                     "score, correct, length, finish_reason, tool_calls)")
    chunk_rows: int = _f(32, "completions per generate call on a rank (the trainer's eval uses rl.batch_size x "
                         "rl.num_generations, 4 x 8 by default: the same number gives its greedy accuracy exactly)")
    use_parallel: bool = _f(False, "under msrun: each rank evaluates every world-th prompt")
    watchdog_timeout: float = _f(default(RunConfig, "watchdog_timeout"), "under msrun: a rank silent this many "
                                 "seconds ends the job (parallel/watchdog.py)")
    progress: bool = _f(True, "a progress bar on rank 0")


def build_parser():
    return flag_parser(EvalConfig, "python -m mindrlhf.eval", __doc__.split("\n")[0])


def config_from_argv(argv=None) -> EvalConfig:
    ns = build_parser().parse_args(argv)
    for flag in ("dataset_type", "enable_thinking"):
        if getattr(ns, flag):
            setattr(ns, flag, getattr(ns, flag).lower())
    return from_flags(EvalConfig, ns)


# ---- inputs ------------------------------------------------------------------------------------------------
def check_args(args):
    """The flags' own checks, before anything is loaded."""
    sampling(args, []).validate(where="--")
    for flag, value, low in (("--limit", args.limit, 0), ("--chunk_rows", args.chunk_rows, 1),
                             ("--max_prompt_length", args.max_prompt_length, 1)):
        if value < low:
            raise ConfigError(f"{flag}: expected >= {low}, got {value}")
    if not os.path.exists(args.model):
        raise ConfigError(f"--model: not found: {args.model}")
    if args.checkpoint and not os.path.exists(args.checkpoint):
        raise ConfigError(f"--checkpoint: not found: {args.checkpoint}")
    if not os.path.exists(args.dataset):
        raise ConfigError(f"--dataset: not found: {args.dataset}")
    if args.max_tool_calls < 0:
        raise ConfigError(f"--max_tool_calls: expected >= 0, got {args.max_tool_calls}")
    if not args.max_tool_calls and (args.tool_module or args.tool_config_path):
        raise ConfigError("--tool_module / --tool_config_path: give --max_tool_calls > 0 to let the model call them")
    if args.max_tool_calls and not (args.tool_module or args.tool_config_path):
        raise ConfigError(f"--max_tool_calls {args.max_tool_calls}: no tools; give --tool_module and/or "
                          f"--tool_config_path")
    if args.output:
        folder = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(folder):
            raise ConfigError(f"--output: the directory {folder} does not exist")
    verifiers(args)


def verifiers(args) -> Tuple[List[str], List[float]]:
    names = list(args.verifier_function)
    weights = list(args.verifier_weight) or [1.0] * len(names)
    if len(weights) != len(names):
        raise ConfigError(f"--verifier_weight: {len(weights)} weights for {len(names)} verifiers")
    return names, weights


def sampling(args, eos_ids: List[int]):
    from mindrlhf.rollout.sampling import SamplingParams
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, max_tokens=args.max_tokens, n=args.n,
                          eos_token_ids=list(eos_ids), seed=args.seed)


def model_config(args, world: int, log):
    """The model's config; its layout is every rank data-parallel, whatever a YAML says."""
    from mindrlhf.configs.compat.hf import is_hf_folder
    from mindrlhf.configs.model_config import ParallelConfig
    from mindrlhf.configs.compat.sources import load_model_yaml
    if os.path.isdir(args.model) and not is_hf_folder(args.model):
        raise ConfigError(f"--model {args.model}: a folder without config.json; expected a Hugging Face model "
                          f"folder or a model YAML")
    yaml_cfg = load_model_yaml(args.model, ParallelConfig(data_parallel=world))
    if not is_hf_folder(args.model):
        par = yaml_cfg.parallel
        if (par.data_parallel, par.model_parallel, par.pipeline_stage) != (world, 1, 1):
            log(f"{args.model}: parallel_config not used: every rank holds the whole model (data parallel over "
                f"{world} rank(s))")
        if yaml_cfg.generation:
            log(f"{args.model}: generation fields ({', '.join(sorted(yaml_cfg.generation))}) not used: sampling "
                f"comes from the flags")
    return yaml_cfg.model


def weights_path(args) -> str:
    from mindrlhf.configs.compat.hf import is_hf_folder
    if args.checkpoint:
        return args.checkpoint
    if is_hf_folder(args.model):
        return args.model
    raise ConfigError(f"--checkpoint: required with a model YAML ({args.model}): save_ckpt_dir/step_N, "
                      f"save_ckpt_dir/hf_policy or a checkpoint file")


def tokenizer_of(args) -> Tuple[object, str]:
    """(tokenizer, the folder holding it or ""): --vocab_path, else the HF folder's own files."""
    from mindrlhf.data.tokenizer import folder_tokenizer_files, load_folder_tokenizer, load_tokenizer
    if args.vocab_path:
        return load_tokenizer(args.vocab_path, args.merges_file_path or None), \
            args.vocab_path if os.path.isdir(args.vocab_path) else ""
    for folder in (args.model, args.checkpoint):
        if folder and os.path.isdir(folder) and folder_tokenizer_files(folder):
            return load_folder_tokenizer(folder), folder
    raise ConfigError(f"--vocab_path: required: {args.model} holds no tokenizer (tokenizer.json, vocab.json + "
                      f"merges.txt or tokenizer.model)")


def is_mindrecord(path: str) -> bool:
    return os.path.isfile(path) and (path.endswith(MINDRECORD_SUFFIX) or os.path.isfile(path + ".db"))


def prompt_table(args, tokenizer, tokenizer_dir: str, pad_id: int, log, tools=()) -> Dict[str, np.ndarray]:
    """prompt_ids (right-padded), prompt_length and solution of the first --limit prompts: a MindRecord's
    columns, or a jsonl/JSON/parquet input tokenized as rlhf_data.py would write it (a chat template offering
    `tools`, as rlhf_data.py --tool_module)."""
    from mindrlhf.data.dataset import PromptDataset
    from mindrlhf.trainer.resolve import with_solutions
    path = args.dataset
    if is_mindrecord(path):
        table = with_solutions(PromptDataset(path, 1, pad_token_id=pad_id, shuffle=False), tokenizer, log).table
        return {k: v[:args.limit] if args.limit else v for k, v in table.items()}
    from mindrlhf.data.convert import ConvertSummary, resolve_template, tokenized_rows
    from mindrlhf.data.sources import Source, parse_map_keys
    source = Source(path, args.dataset_type, parse_map_keys(args.map_keys))
    thinking = {"": None, "true": True, "false": False}[args.enable_thinking]
    offered = [t.schema for t in tools] if tools and args.prompt_template == "chat" else None
    template = resolve_template(args.prompt_template, tokenizer_dir, args.system_prompt, thinking, offered)
    summary = ConvertSummary()
    rows = tokenized_rows(source.examples(), template, tokenizer, args.max_prompt_length, args.on_long_prompt, None,
                          summary)
    rows = list(itertools.islice(rows, args.limit) if args.limit else rows)
    if not rows:
        raise ConfigError(f"--dataset {path}: no prompt left (every one longer than --max_prompt_length="
                          f"{args.max_prompt_length}, and --on_long_prompt skip)")
    blank = [i for i, (_, _, ex) in enumerate(rows) if not ex.solution.strip()]
    if blank:
        raise ConfigError(f"--dataset {path}: {len(blank)} of {len(rows)} rows have no reference answer (first: "
                          f"row {blank[0]}; {source.spec.describe()}): a completion cannot be scored without one")
    if summary.prompts_truncated or summary.prompts_skipped:
        log(f"--dataset {path}: prompts longer than --max_prompt_length={args.max_prompt_length}: "
            f"{summary.prompts_truncated} truncated (the end kept), {summary.prompts_skipped} skipped")
    ids = np.full((len(rows), args.max_prompt_length), pad_id, np.int64)
    for i, (prompt, _, _) in enumerate(rows):
        ids[i, :len(prompt)] = prompt
    columns = {"prompt_ids": ids, "prompt_length": np.array([len(r[0]) for r in rows], np.int64),
               "solution": np.array([r[2].solution for r in rows], dtype=object)}
    if source.spec.row_fields:                # what a verl-style reward function reads (reward/custom_function.py)
        columns["data_source"] = np.array([r[2].data_source for r in rows], dtype=object)
        columns["extra_info"] = np.array([r[2].extra_info_json for r in rows], dtype=object)
    return PromptDataset(path, 1, pad_token_id=pad_id, shuffle=False, columns=columns).table


def episode_tools_of(args, tokenizer, tokenizer_dir: str, log):
    """(the tools, rollout/episodes.EpisodeTools) for --max_tool_calls > 0, loaded and built as the trainer
    builds them (the tools section's defaults besides the three flags; the chat template of the tokenizer's
    folder renders the results); ([], None) for one turn."""
    if not args.max_tool_calls:
        return [], None
    from mindrlhf.data.chat_template import ChatTemplate
    from mindrlhf.rollout.episodes import episode_tools
    from mindrlhf.tools import load_tools
    section = ToolsConfig(max_tool_calls=args.max_tool_calls, tool_module=args.tool_module,
                          tool_config_path=args.tool_config_path)
    notes: List[str] = []
    tools = load_tools(args.tool_module, args.tool_config_path, notes)
    episodes = episode_tools(section, tools, tokenizer, ChatTemplate(tokenizer_dir))
    log(f"tools: {', '.join(t.name for t in tools)}; up to {args.max_tool_calls} call(s) per completion")
    for line in notes:
        log(line)
    return tools, episodes


# ---- the run -------------------------------------------------------------------------------------------------
def start_process(args, log) -> Tuple[int, int, Callable]:
    """(rank, world, log on rank 0 only): msrun's process group and CPU threads, as the trainer starts."""
    from mindrlhf.trainer import startup
    rank, world, nodes, log, _ = startup.join(args.use_parallel, args.watchdog_timeout, log)
    startup.set_cpu_threads(0, nodes, log)
    return rank, world, log


def evaluate(args, out: Callable = print) -> Optional[dict]:
    """Run the eval; rank 0 returns the report (and writes --output), the other ranks None."""
    from mindrlhf.parallel import watchdog
    from mindrlhf.parallel.mesh import Mesh
    from mindrlhf.reward.custom_function import load_custom_reward_function
    from mindrlhf.reward.verifiers import RewardFn, load_reward_module
    from mindrlhf.rollout.backends import make_engine
    from mindrlhf.trainer import evaluation, exchange
    from mindrlhf.trainer.build import model_with_weights
    from mindrlhf.trainer.resolve import special_ids
    t0 = time.time()
    check_args(args)
    rank, world, log = start_process(args, out)
    model_cfg = model_config(args, world, log)
    weights = weights_path(args)
    tokenizer, tokenizer_dir = tokenizer_of(args)
    pad_id, eos_ids = special_ids(tokenizer, model_cfg)
    tools, episodes = episode_tools_of(args, tokenizer, tokenizer_dir, log)
    table = prompt_table(args, tokenizer, tokenizer_dir, pad_id, log, tools)
    count, width = len(table["prompt_ids"]), table["prompt_ids"].shape[1]
    if count < world:
        raise ConfigError(f"--dataset/--limit: {count} prompt(s) cannot give each of the {world} ranks one")
    if width + args.max_tokens > model_cfg.max_position_embedding:
        raise ConfigError(f"--max_tokens: prompt width {width} (from --dataset) + max_tokens {args.max_tokens} exceeds "
                          f"the model's max_position_embedding={model_cfg.max_position_embedding}")
    added = load_reward_module(args.reward_module)
    if added:
        log(f"verifiers from {args.reward_module}: {', '.join(added)}")
    load_custom_reward_function(args.custom_reward_function, args.custom_reward_kwargs, verifiers(args)[0])
    reward_fn = RewardFn(*verifiers(args), args.verifier_timeout)
    params = sampling(args, eos_ids)
    if params.greedy and args.n > 1:
        log(f"note: --n {args.n} with greedy decoding: a prompt's completions are all equal (give --temperature > 0 "
            f"to sample)")
    model = model_with_weights(model_cfg, Mesh(dp=world, tp=1, rank=rank), weights, log=log)
    engine = make_engine("mindspore", model, pad_id, width, tools=episodes)
    idx = evaluation.replica_prompts(count, world, rank)
    how = "greedy" if params.greedy else f"temperature {params.temperature}, top_p {params.top_p}, top_k {params.top_k}"
    log(f"eval: {weights} on {args.dataset}: {count} prompts x {args.n} completion(s), {how}, max_tokens "
        f"{params.max_tokens}" + (f"; {world} ranks, rank r takes prompts r::{world}" if world > 1 else ""))
    progress = None
    if args.progress and rank == 0:
        from tqdm import tqdm
        progress = tqdm(total=len(idx), desc="eval" + (" (rank 0's share)" if world > 1 else ""), unit="prompt",
                        leave=False)

    def after_chunk(done: int):
        watchdog.enter("eval")            # a chunk finished: this rank is alive
        if progress:
            progress.update(done - progress.n)

    done = evaluation.complete(engine, tokenizer, table, idx, params, args.chunk_rows,
                               lambda texts, sols, calls: reward_fn.score_rows(texts, sols, calls)[:, 0],
                               after_chunk=after_chunk)
    if progress:
        progress.close()
    sample = np.tile(np.arange(args.n), len(idx))
    ints = exchange.rows_over_world(np.stack([done.prompt_index, sample, done.lengths, done.finished,
                                              done.tool_calls], 1))
    ids = exchange.rows_over_world(done.response_ids)
    scores = exchange.rows_over_world(done.scores.astype(np.float32)).astype(np.float64)
    watchdog.stop()
    if rank != 0:
        return None
    order = np.lexsort((ints[:, 1], ints[:, 0]))
    ints, ids, scores = ints[order], ids[order], scores[order]
    report = summarize(scores >= args.correct_threshold, scores, ints[:, 2], args.n, time.time() - t0)
    if args.max_tool_calls:
        report["tool_calls_mean"] = float(ints[:, 4].mean())
    if args.output:
        write_completions(args.output, table, tokenizer, ints, ids, scores, args.correct_threshold)
        log(f"wrote {args.output} ({len(ints)} completions)")
    return report


def summarize(correct: np.ndarray, scores: np.ndarray, lengths: np.ndarray, n: int, seconds: float) -> dict:
    """The report of completions in (prompt, sample) order: accuracy, pass@k, score and length means."""
    from mindrlhf.trainer.evaluation import share
    per_prompt = correct.reshape(-1, n).sum(1)
    report = {"accuracy": share(correct.sum(), len(correct))}
    for k in pass_ks(n):
        report[f"pass@{k}"] = float(np.mean([pass_at_k(n, int(c), k) for c in per_prompt]))
    report.update(score_mean=float(scores.mean()), mean_length=float(lengths.mean()), prompts=len(per_prompt),
                  samples=len(correct), n=n, seconds=round(seconds, 3))
    return report


def write_completions(path: str, table, tokenizer, ints, ids, scores, threshold: float):
    """One JSON line per completion, in (prompt, sample) order; written to a temp file renamed into place."""
    from mindrlhf.utils.atomic import atomic_path
    texts = tokenizer.decode_batch([r[:n].tolist() for r, n in zip(ids, ints[:, 2])])
    prompts = {int(i): tokenizer.decode(table["prompt_ids"][i][:table["prompt_length"][i]].tolist(),
                                        skip_special_tokens=False) for i in np.unique(ints[:, 0])}
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            for (index, sample, length, finished, calls), text, score in zip(ints.tolist(), texts, scores.tolist()):
                fh.write(json.dumps({"index": index, "sample": sample, "prompt": prompts[index], "completion": text,
                                     "solution": str(table["solution"][index]), "score": score,
                                     "correct": score >= threshold, "length": length,
                                     "finish_reason": "stop" if finished else "length", "tool_calls": calls},
                                    ensure_ascii=False) + "\n")


def report_lines(report: dict) -> List[str]:
    passes = ", ".join(f"{k} {v:.4f}" for k, v in report.items() if k.startswith("pass@"))
    return [f"accuracy {report['accuracy']:.4f} ({report['samples']} completions of {report['prompts']} prompts); "
            f"{passes}; score mean {report['score_mean']:.4f}; mean length {report['mean_length']:.1f} tokens; "
            f"{report['seconds']:.1f} s", json.dumps(report)]


def main(argv=None) -> int:
    try:
        report = evaluate(config_from_argv(argv))
    except (ConfigError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    if report is not None:
        print("\n".join(report_lines(report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
