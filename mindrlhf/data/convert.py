"""jsonl / JSON array / parquet (GSM8K, MATH, DeepScaleR, OpenR1-Math, raw, verl's RL rows) -> GRPO prompt
MindRecord. The library behind `rlhf_data.py`; the input side is data/sources.py.

Streams: the input is read a line, an item or a parquet batch at a time and rows go to the file one write
batch at a time, so memory does not grow with the file (a 220k-row file at seq_length 8192 is ~29 GB as
whole arrays)."""
from __future__ import annotations

import argparse
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from mindrlhf.configs.errors import ConfigError
from mindrlhf.data.mindrecord_io import PROMPT_TEMPLATES, SCHEMA, VERL_SCHEMA, WRITE_BATCH_ROWS, MindRecordWriter
from mindrlhf.data.sources import DATASET_TYPES, Example, Source, parse_map_keys
from mindrlhf.data.tokenizer import load_tokenizer

TOKENIZE_ROWS = 2048    # rows per tokenizer call (the Rust side parallelises across one call's texts)

# our defaults where MindRLHF's rlhf_data.py has others: (ours, MindRLHF's)
DEFAULTS = {"max_prompt_length": (256, "2048"), "seq_length": (512, "4096"),
            "dataset_type": ("gsm8k", "none, i.e. 'question' + 'answer' taken whole")}


@dataclass
class ConvertSummary:
    rows_in: int = 0
    rows_written: int = 0
    prompts_truncated: int = 0
    prompts_skipped: int = 0
    answers_truncated: int = 0
    output_bytes: int = 0
    seconds: float = 0.0
    reasons: Dict[str, int] = field(default_factory=dict)
    data_sources: Dict[str, int] = field(default_factory=dict)     # verl rows: data_source -> rows written

    def lines(self, path: str) -> List[str]:
        from mindrlhf.configs.compat.verl import data_source_line
        return [f"rows read:        {self.rows_in}",
                f"rows written:     {self.rows_written}  -> {path} (+ .db)",
                f"prompts > max_prompt_length: {self.prompts_truncated} truncated, {self.prompts_skipped} skipped",
                f"answers cut at seq_length:   {self.answers_truncated}",
                f"output size:      {self.output_bytes / 1e6:.2f} MB",
                f"time:             {self.seconds:.1f} s ({self.rows_in / max(self.seconds, 1e-9):.0f} rows/s)"] + \
            [data_source_line(name, n) for name, n in sorted(self.data_sources.items())]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Convert GSM8K/MATH/DeepScaleR/OpenR1-Math rows (jsonl, a JSON array, "
                                            "parquet, or a directory of them) into a GRPO prompt MindRecord.")
    p.add_argument("--config", default=None,
                   help="a MindSpeed-RL dataset YAML (its configs/datasets/*.yaml): its keys become these flags "
                        "(configs/compat/mindspeed_data.py; flags given here win)")
    p.add_argument("--vocab_path", help="vocab.json, or a model folder (tokenizer.json, vocab.json + merges.txt "
                   "or tokenizer.model); required")
    p.add_argument("--merges_file_path", default=None, help="merges.txt belonging to --vocab_path")
    p.add_argument("--file_path",
                   help="required; input: a .jsonl, a .json holding one array of objects, a .parquet (needs pyarrow), or a "
                        "directory whose .jsonl/.json/.parquet files are all read in sorted order")
    p.add_argument("--output_path", help="output .mindrecord (a .db index is written beside it); required")
    p.add_argument("--max_prompt_length", type=int, default=None,
                   help="prompt_ids column length (default 256; MindRLHF's 2048)")
    p.add_argument("--seq_length", type=int, default=None,
                   help="pretrain_ids/loss_mask column length (default 512; MindRLHF's 4096)")
    p.add_argument("--pad_token_id", type=int, default=None,
                   help="default: the tokenizer's pad token (a folder's tokenizer_config.json pad_token, else "
                        "<|endoftext|>)")
    p.add_argument("--dataset_type", default=None, type=str.lower, choices=sorted(DATASET_TYPES),
                   help="the columns a row is read from (default gsm8k): " +
                        "; ".join(f"{t.name}: {t.about}" for t in DATASET_TYPES.values()) +
                        ". MindRLHF's spelling openR1math works")
    p.add_argument("--map_keys", default=None,
                   help="JSON {field: column in the file}, e.g. '{\"question\": \"problem\"}': the columns a "
                        "--dataset_type reads, renamed (MindSpeed-RL's 'prompt'/'response' keys work too)")
    p.add_argument("--is_dataset_gsm8k", nargs="?", const="True", default=None,
                   help="MindRLHF's earlier flag: True means --dataset_type gsm8k")
    p.add_argument("--prompt_template", default=None,
                   help=f"chat (the chat template of the model folder given as --vocab_path), one of "
                        f"{sorted(PROMPT_TEMPLATES)}, or a text file containing '{{question}}' (default: none; "
                        f"chat for --dataset_type verl, whose prompts are chat messages)")
    p.add_argument("--prompt_type", default=None,
                   help="a MindSpeed-RL template name (qwen_r1, qwen3, empty, ...) of --prompt_type_path, rendered "
                        "around each question as its R1AlpacaStyleInstructionHandler does (data/prompt_types.py)")
    p.add_argument("--prompt_type_path", default=None, help="MindSpeed-RL's configs/model/templates.json")
    p.add_argument("--system_prompt", default="", help="with --prompt_template chat or --prompt_type: a system "
                                                       "message before each question (default: the template's "
                                                       "own, if any)")
    p.add_argument("--enable_thinking", default=None, type=_flag,
                   help="with --prompt_template chat or --prompt_type qwen3: the template's enable_thinking (Qwen3: "
                        "false closes an empty <think> block in each prompt; default: unset, the template's own "
                        "default)")
    p.add_argument("--tool_module", default="",
                   help="with --prompt_template chat: offer these tools in every prompt (the chat template's tools=), "
                        "a .py file or module of plain typed, documented functions: the GRPO config's "
                        "tools.tool_module, so the prompts offer the tools the episodes run")
    p.add_argument("--tool_config_path", default="",
                   help="with --prompt_template chat: offer the tools of a MindSpeed-RL / verl tool config file (the "
                        "GRPO config's tools.tool_config_path)")
    p.add_argument("--on_long_prompt", default="truncate", choices=["truncate", "skip", "error"],
                   help="what to do with prompts longer than --max_prompt_length (truncate keeps the end, as verl's "
                        "data.truncation=left; skip is verl's filter_overlong_prompts; error names the row, as "
                        "verl's default data.truncation=error)")
    p.add_argument("--workers", type=int, default=0, help="tokenizer threads (0: all cores)")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    return p


def resolve_upstream(args) -> List[str]:
    """Fill in defaults and MindRLHF's flags on `args`; the start-up lines saying what was assumed.

    Our defaults are kept where MindRLHF's differ (a 2048-token prompt column is 8x the rows' bytes for
    GSM8K, whose prompts fit in 256), but the one line naming them tells a user following MindRLHF's
    tutorial why the file's widths are not the tutorial's."""
    notes = []
    gsm8k_flag = getattr(args, "is_dataset_gsm8k", None)
    if gsm8k_flag is not None:
        value = str(gsm8k_flag).strip().lower()
        if value not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigError(f"--is_dataset_gsm8k: expected True or False, got {gsm8k_flag!r}")
        if value in ("true", "1", "yes"):
            if args.dataset_type not in (None, "gsm8k"):
                raise ConfigError(f"--is_dataset_gsm8k True asks for gsm8k rows but --dataset_type is "
                                  f"{args.dataset_type}; give one of them")
            args.dataset_type = "gsm8k"
            notes.append("--is_dataset_gsm8k True: read as --dataset_type gsm8k (the final answer after '####' "
                         "is the solution column; pretrain_ids hold prompt + worked answer)")
        args.is_dataset_gsm8k = None         # applied once
    differ = []
    for name, (ours, theirs) in DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, ours)
            differ.append(f"--{name} {ours} (MindRLHF's default: {theirs})")
    if differ:
        notes.insert(0, "defaults that differ from MindRLHF's rlhf_data.py (give the flag to choose): " +
                     ", ".join(differ))
    return notes


def _flag(text: str) -> bool:
    if text.strip().lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.strip().lower() == "true"


class _ChatPrompt:
    """`--prompt_template chat`: question -> prompt text, and a row's own messages (verl) -> prompt text, both
    through the model folder's chat template with the generation prompt added (as verl's RLHFDataset);
    `variables` (enable_thinking) reach the template."""

    def __init__(self, folder: str, system_prompt: str, variables: dict, tools: Optional[List[dict]] = None):
        from mindrlhf.data.chat_template import ChatTemplate
        self.chat, self.system_prompt, self.variables = ChatTemplate(folder), system_prompt, variables
        self.tools = tools or None          # the tools' schemas, offered in every prompt

    def __call__(self, question: str) -> str:
        return self.chat.prompt(question, self.system_prompt, tools=self.tools, **self.variables)

    def render_messages(self, messages) -> str:
        return self.chat.render(messages, tools=self.tools, **self.variables)


def prompt_text(template: Callable[[str], str], example: Example) -> str:
    """The prompt of one row: its chat messages rendered (verl rows), else the template around its question (a
    MindSpeed-RL prompt type also reads the row's answer: data/prompt_types.py)."""
    if example.messages is None:
        render = getattr(template, "render_example", None)
        return render(example) if render else template(example.question)
    render = getattr(template, "render_messages", None)
    if render is None:
        raise ConfigError(f"{example.where}: the prompt is a list of chat messages (dataset_type verl); they are "
                          f"rendered by the model folder's chat template: give --prompt_template chat and the "
                          f"folder as --vocab_path")
    return render(example.messages)


def resolve_template(name: Optional[str], vocab_path: str = "", system_prompt: str = "",
                     enable_thinking: Optional[bool] = None, tools: Optional[List[dict]] = None,
                     prompt_type: Optional[str] = None, prompt_type_path: Optional[str] = None
                     ) -> Callable[[str], str]:
    """question -> prompt text: a named template, a text file with '{question}', or `chat` (the model
    folder's own chat template, data/chat_template.py, which also renders verl's message lists;
    `enable_thinking` None leaves the variable unset, as apply_chat_template without it; `tools`: schemas
    every chat prompt offers); or `prompt_type`, a template of MindSpeed-RL's templates.json."""
    if prompt_type is not None:
        return _prompt_type(name, vocab_path, system_prompt, enable_thinking, tools, prompt_type, prompt_type_path)
    if prompt_type_path:
        raise ConfigError("--prompt_type_path: the file of --prompt_type's templates; give --prompt_type")
    name = name or "none"
    if enable_thinking is not None and name != "chat":
        raise ConfigError("--enable_thinking: a chat template variable; give --prompt_template chat")
    if tools and name != "chat":
        raise ConfigError("--tool_module / --tool_config_path: the tools are offered by the model folder's chat "
                          "template; give --prompt_template chat")
    if name == "chat":
        if not vocab_path or not os.path.isdir(vocab_path):
            raise ConfigError(f"--prompt_template chat: renders the model folder's chat template; give the folder "
                              f"as --vocab_path (got {vocab_path!r})")
        return _ChatPrompt(vocab_path, system_prompt,
                           {} if enable_thinking is None else {"enable_thinking": enable_thinking}, tools)
    if system_prompt:
        raise ConfigError("--system_prompt: only --prompt_template chat has a system message")
    if name in PROMPT_TEMPLATES:
        text = PROMPT_TEMPLATES[name]
        return lambda question: text.format(question=question)
    if not os.path.isfile(name):
        raise ConfigError(f"--prompt_template: expected chat, one of {sorted(PROMPT_TEMPLATES)} or a file, got "
                          f"{name!r}")
    with open(name, encoding="utf-8") as fh:
        text = fh.read()
    if "{question}" not in text:
        raise ConfigError(f"--prompt_template {name}: the template has no {{question}} placeholder")
    # a file's other braces are literal (\boxed{}): only the placeholder is filled in
    return lambda question: text.replace("{question}", question)


def _prompt_type(name, vocab_path, system_prompt, enable_thinking, tools, prompt_type, prompt_type_path):
    """--prompt_type: one template of MindSpeed-RL's templates.json; the tokenizer folder's bos/eos tokens fill
    its ["bos_token"] slots."""
    from mindrlhf.data.prompt_types import PromptType
    from mindrlhf.data.tokenizer import token_text, tokenizer_config
    if name not in (None, "none"):
        raise ConfigError(f"--prompt_type {prompt_type} and --prompt_template {name}: give one of them")
    if tools:
        raise ConfigError("--tool_module / --tool_config_path: tools are offered by --prompt_template chat, not by "
                          "--prompt_type")
    if not prompt_type_path:
        raise ConfigError(f"--prompt_type {prompt_type}: give --prompt_type_path (MindSpeed-RL's "
                          f"configs/model/templates.json)")
    folder = vocab_path if os.path.isdir(vocab_path or "") else os.path.dirname(vocab_path or "")
    config = tokenizer_config(folder) if folder else {}
    special = {k: token_text(config.get(k)) for k in ("bos_token", "eos_token") if token_text(config.get(k))}
    return PromptType(prompt_type_path, prompt_type, special, system_prompt, enable_thinking)


def _offered_tools(args) -> List[dict]:
    """--tool_module / --tool_config_path: the tools' schemas, loaded as the trainer loads them; said once."""
    module, config = getattr(args, "tool_module", ""), getattr(args, "tool_config_path", "")
    if not (module or config):
        return []
    from mindrlhf.tools import load_tools
    notes: List[str] = []
    tools = load_tools(module, config, notes)
    print(f"prompts offer {len(tools)} tool(s): {', '.join(t.name for t in tools)} (from "
          f"{' and '.join(x for x in (module, config) if x)}; the GRPO run's tools section must name the same)")
    for line in notes:
        print(line)
    return [t.schema for t in tools]


def convert(args) -> ConvertSummary:
    t0 = time.time()
    for name in ("vocab_path", "file_path", "output_path"):
        if not getattr(args, name, None):
            raise ConfigError(f"--{name} is required (or its key in the --config file)")
    given = {name: getattr(args, name, None) is not None for name in DEFAULTS}
    for line in resolve_upstream(args):
        print(line)
    if args.max_prompt_length <= 0 or args.seq_length <= args.max_prompt_length:
        shown = {n: f"{getattr(args, n)}{'' if given[n] else ', the default'}" for n in ("seq_length",
                                                                                         "max_prompt_length")}
        raise ConfigError(f"--seq_length ({shown['seq_length']}) must exceed --max_prompt_length "
                          f"({shown['max_prompt_length']}) > 0")
    out_dir = os.path.dirname(os.path.abspath(args.output_path))
    if not os.path.isdir(out_dir):
        raise ConfigError(f"--output_path: the directory {out_dir} does not exist")
    source = Source(args.file_path, args.dataset_type, parse_map_keys(getattr(args, "map_keys", None)))
    if len(source.files) > 1 or source.skipped:
        print(f"--file_path {args.file_path}: reading {', '.join(os.path.basename(f) for f in source.files)}"
              + (f"; skipped (not .jsonl/.json/.parquet): {', '.join(os.path.basename(f) for f in source.skipped)}"
                 if source.skipped else ""))
    if args.workers:
        os.environ["RAYON_NUM_THREADS"] = str(args.workers)
    if args.prompt_template is None:
        args.prompt_template = "chat" if args.dataset_type == "verl" and getattr(args, "prompt_type", None) is None \
            else "none"
    if args.dataset_type == "verl" and args.system_prompt:
        raise ConfigError("--system_prompt: verl rows carry their own messages (a system turn, if any, is in "
                          "their prompt column)")
    template = resolve_template(args.prompt_template, args.vocab_path, args.system_prompt, args.enable_thinking,
                                _offered_tools(args), getattr(args, "prompt_type", None),
                                getattr(args, "prompt_type_path", None))
    tok = load_tokenizer(args.vocab_path, args.merges_file_path)
    pad = tok.pad_token_id if args.pad_token_id is None else args.pad_token_id
    if pad is None:
        raise ConfigError("--pad_token_id: the tokenizer has no <|endoftext|> token; give the id explicitly")
    summary = ConvertSummary()
    progress = None
    if not args.no_progress:
        from tqdm import tqdm
        progress = tqdm(total=source.count(), desc="tokenize", unit="rows")
    verl = source.spec.row_fields
    batch = _WriteBatch(WRITE_BATCH_ROWS, args.max_prompt_length, args.seq_length, pad, verl)
    schema = VERL_SCHEMA if verl else SCHEMA
    with MindRecordWriter(args.output_path, schema, index_fields=["prompt_length"]) as out:
        for p_ids, full, ex in tokenized_rows(source.examples(), template, tok, args.max_prompt_length,
                                              args.on_long_prompt, args.seq_length, summary, progress):
            batch.add(p_ids, full, ex)
            summary.rows_written += 1
            if batch.rows == WRITE_BATCH_ROWS:
                batch.write_to(out)
        if progress:
            progress.close()
        if summary.rows_written == 0:
            raise ConfigError(f"{args.file_path}: every row was skipped (prompts longer than "
                              f"--max_prompt_length={args.max_prompt_length}); nothing written")
        batch.write_to(out)
        out.commit()
    summary.output_bytes = sum(os.path.getsize(args.output_path + s) for s in ("", ".db"))
    summary.seconds = time.time() - t0
    return summary


def tokenized_rows(examples: Iterator[Example], template: Callable[[str], str], tok, max_prompt_length: int,
                   on_long_prompt: str, seq_length: Optional[int], summary: ConvertSummary,
                   progress=None) -> Iterator[Tuple[List[int], List[int], Example]]:
    """(prompt ids, prompt + answer + EOS ids, the row) of each kept row, as rlhf_data.py writes them: a
    prompt longer than max_prompt_length cut to its end or skipped (`on_long_prompt`), the whole row cut at
    seq_length (None: never). The eval command reads jsonl/JSON/parquet through this too, so its prompts are
    the ones a converted file would hold."""
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    while True:
        part = list(itertools.islice(examples, TOKENIZE_ROWS))
        if not part:
            return
        summary.rows_in += len(part)
        # one tokenizer call per chunk (prompts then answers): the Rust side parallelises across both
        ids = tok.encode_batch([prompt_text(template, e) for e in part] + [" " + e.answer_text for e in part])
        for ex, p_ids, a_ids in zip(part, ids[:len(part)], ids[len(part):]):
            if len(p_ids) > max_prompt_length:
                if on_long_prompt == "error":
                    raise ConfigError(f"{ex.where}: the prompt is {len(p_ids)} tokens, over --max_prompt_length="
                                      f"{max_prompt_length} (--on_long_prompt error, as verl's data.truncation="
                                      f"error; truncate or skip it instead)")
                if on_long_prompt == "skip":
                    summary.prompts_skipped += 1
                    continue
                summary.prompts_truncated += 1
                p_ids = p_ids[-max_prompt_length:]
            full = p_ids + a_ids + eos
            if seq_length is not None and len(full) > seq_length:
                summary.answers_truncated += 1
                full = full[:seq_length]
            if ex.data_source:
                summary.data_sources[ex.data_source] = summary.data_sources.get(ex.data_source, 0) + 1
            yield p_ids, full, ex
        if progress:
            progress.update(len(part))


class _WriteBatch:
    """One MindRecord write call's rows, filled in place and reused: the same calls (so the same file
    bytes) as writing the whole table with write_mindrecord, without holding it."""

    def __init__(self, size: int, prompt_len: int, seq_len: int, pad: int, verl: bool = False):
        self.pad, self.rows = pad, 0
        self.strings = ("solution", "data_source", "extra_info") if verl else ("solution",)
        self.cols = {"prompt_ids": np.full((size, prompt_len), pad, np.int64),
                     "pretrain_ids": np.full((size, seq_len), pad, np.int64),
                     "loss_mask": np.zeros((size, seq_len), np.int64), "prompt_length": np.zeros(size, np.int64),
                     **{name: [] for name in self.strings}}

    def add(self, prompt_ids: List[int], full: List[int], ex: Example):
        row, cols = self.rows, self.cols
        cols["prompt_ids"][row, :len(prompt_ids)] = prompt_ids
        cols["pretrain_ids"][row, :len(full)] = full
        cols["loss_mask"][row, len(prompt_ids):len(full)] = 1
        cols["prompt_length"][row] = len(prompt_ids)
        cols["solution"].append(ex.solution)
        if "data_source" in cols:
            cols["data_source"].append(ex.data_source)
            cols["extra_info"].append(ex.extra_info_json)
        self.rows += 1

    def write_to(self, out: MindRecordWriter):
        if not self.rows:
            return
        out.write({k: v[:self.rows] for k, v in self.cols.items()}, batch_rows=self.rows)
        for name in ("prompt_ids", "pretrain_ids"):
            self.cols[name][:self.rows] = self.pad
        self.cols["loss_mask"][:self.rows] = 0
        for name in self.strings:
            self.cols[name] = []
        self.rows = 0


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line, over a --config file's keys (MindSpeed-RL's dataset YAML) when one is given: the
    file's values become the defaults, so a flag given here wins. The file's inert keys are said once."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.config:
        return args
    from mindrlhf.configs.compat.keys import describe_ignored
    from mindrlhf.configs.compat.mindspeed_data import translate
    from mindrlhf.configs.model_config import read_yaml_mapping
    if not os.path.isfile(args.config):
        raise ConfigError(f"--config {args.config}: file not found")
    flags, ignored, notes = translate(read_yaml_mapping(args.config), args.config)
    if args.vocab_path:                   # the command line's tokenizer, whole (not its vocab with the file's merges)
        flags.pop("merges_file_path", None)
    parser.set_defaults(**flags)
    args = parser.parse_args(argv)
    overridden = [k for k in flags if getattr(args, k) != flags[k]]
    for line in notes + ([describe_ignored(args.config, ignored)] if ignored else []) + \
            ([f"--config {args.config}: the command line's {', '.join('--' + k for k in overridden)} win over the "
              f"file"] if overridden else []):
        print(line)
    return args


def main(argv: Optional[List[str]] = None) -> int:
    try:
        args = parse_args(argv)
        summary = convert(args)
    except ConfigError as err:
        print(f"error: {err}")
        return 2
    print("\n".join(summary.lines(args.output_path)))
    return 0
