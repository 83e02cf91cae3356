"""rlhf_data.py's input: jsonl, a JSON array, parquet, or a directory of them, read a piece at a time, and
the dataset types that turn one row into (prompt text, worked answer, reference answer).

Users arrive with GSM8K's train.jsonl (MindRLHF's tutorial), DeepScaleR's deepscaler.json (one JSON array),
Hugging Face parquet shards (MATH, OpenR1-Math) and verl's RL parquet (what its examples/data_preprocess/*.py
write: `prompt` as chat messages, `reward_model.ground_truth`), so all of these are read as they are
downloaded.

A bad row is named where a user can find it: jsonl `file:LINE` (from 1, as editors count), a JSON array
`file:item N (line L)` and parquet `file:row N` (N from 0, as `json.load(f)[N]` and pandas' `iloc[N]`).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from mindrlhf.configs.errors import ConfigError

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
JSON_READ_CHARS = 1 << 20     # characters per read of a JSON array file
PARQUET_BATCH_ROWS = 1024     # rows per record batch taken from a parquet row group


@dataclass
class Example:
    question: str
    answer_text: str   # what an SFT target would be (full worked answer)
    solution: str      # the final answer the verifier compares against
    messages: Optional[List[Dict[str, str]]] = None   # verl: the prompt as chat messages (the chat template renders them)
    data_source: str = ""                             # verl: which scorer verl would pick (configs/compat/verl.py)
    extra_info: Optional[dict] = None                 # verl: the row's extra_info (its reward function reads it)
    where: str = ""                                   # file and line/item/row, for errors found later (too long)

    @property
    def extra_info_json(self) -> str:
        """extra_info as the MindRecord's extra_info column holds it: JSON, "" for none."""
        return json.dumps(self.extra_info, ensure_ascii=False) if self.extra_info else ""


# ---------------------------------------------------------------------------------------------- dataset types

@dataclass(frozen=True)
class DatasetType:
    """Which fields a row needs. Field names are the column names the type reads unless --map_keys renames
    them; `reference` holds the reference answer (whole, or with the final answer inside it)."""
    name: str
    question: str
    reference: str
    worked: Optional[str] = None         # optional worked solution (the SFT target when present)
    fallback: Optional[str] = None       # raw only: the reference's second choice of column
    reference_optional: bool = False
    extract: str = "whole"               # how the final answer comes out of the reference: whole, gsm8k, boxed,
                                         # verl (the reference is {style, ground_truth}; the question is messages)
    source: Optional[str] = None         # verl: the data_source column (required)
    query: Optional[str] = None          # alpaca: an optional column joined to the question by a newline
    about: str = ""

    @property
    def fields(self) -> Tuple[str, ...]:
        return tuple(f for f in (self.question, self.reference, self.worked, self.fallback, self.source, self.query)
                     if f)

    @property
    def required(self) -> Tuple[str, ...]:
        base = (self.question,) if self.reference_optional else (self.question, self.reference)
        return base + ((self.source,) if self.source else ())


DATASET_TYPES: Dict[str, DatasetType] = {t.name: t for t in (
    DatasetType("gsm8k", "question", "answer", extract="gsm8k",
                about="'question', 'answer' ending in '#### <number>' (the reference)"),
    DatasetType("math", "problem", "solution", extract="boxed",
                about="'problem', 'solution' whose last \\boxed{} is the reference"),
    DatasetType("deepscaler", "problem", "answer", worked="solution",
                about="'problem', 'answer' (the reference), optional 'solution'"),
    DatasetType("openr1math", "problem", "answer", worked="solution",
                about="'problem', 'answer' (the reference), optional 'solution'"),
    DatasetType("raw", "prompt", "answer", fallback="solution", reference_optional=True,
                about="'prompt', optional 'answer' (else 'solution') taken whole"),
    DatasetType("verl", "prompt", "reward_model", worked="extra_info", extract="verl", source="data_source",
                about="verl's RL parquet: 'prompt' (chat messages [{role, content}], rendered by the model folder's "
                      "chat template), 'reward_model' {style: rule, ground_truth} (the reference), 'data_source' "
                      "(picks the verifier), optional 'extra_info' {answer} (the SFT target)"),
    # MindSpeed-RL's handlers (mindspeed_rl/datasets/handler_utils.py), with its default column names
    DatasetType("alpaca", "instruction", "output", query="input",
                about="MindSpeed-RL's R1AlpacaStyleInstructionHandler rows: 'instruction' (the question), optional "
                      "'input' (joined to it by a newline), 'output' (the reference, whole)"),
    DatasetType("math17k", "instruction", "output", extract="math17k",
                about="MindSpeed-RL's Math17kAlpacaStyleInstructionHandler rows (DAPO-Math-17k): 'instruction' "
                      "chat messages whose first content is the question, 'output' the reference or a mapping "
                      "{ground_truth}"),
)}
VERL_ROLES = ("system", "user", "assistant", "tool")

# MindSpeed-RL's map_keys names (its field -> the file's column) and the field each one means here
MINDSPEED_KEYS = {"prompt": "question", "response": "reference", "query": "query"}
MINDSPEED_UNSUPPORTED = {
    "query": "MindSpeed-RL's instruction input appended to the prompt is read by --dataset_type alpaca only",
    "system": "a system message comes from --prompt_template chat --system_prompt",
}


def parse_map_keys(text: Optional[str]) -> Dict[str, str]:
    """--map_keys as given on the command line: a JSON object {our field: the column name in the file}."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"--map_keys: not valid JSON ({err}); expected e.g. "
                          f"'{{\"question\": \"problem\", \"answer\": \"solution\"}}'") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"--map_keys: expected a JSON object of field name -> column name (strings), got {text!r}")
    return value


class RowSpec:
    """A dataset type with its fields bound to the file's column names (after --map_keys)."""

    def __init__(self, dataset_type: str, map_keys: Optional[Dict[str, str]] = None):
        if dataset_type not in DATASET_TYPES:
            raise ConfigError(f"--dataset_type: expected one of {sorted(DATASET_TYPES)}, got {dataset_type!r}")
        self.kind = kind = DATASET_TYPES[dataset_type]
        self.column = {f: f for f in kind.fields}
        self.mapped = set()
        for key, col in (map_keys or {}).items():
            if key in kind.fields or (key not in MINDSPEED_KEYS and key not in MINDSPEED_UNSUPPORTED):
                field = key
            else:
                field = getattr(kind, MINDSPEED_KEYS[key]) if key in MINDSPEED_KEYS else None
            if field is None and key in MINDSPEED_UNSUPPORTED:
                if col:
                    raise ConfigError(f"--map_keys: {key!r} -> {col!r} is not supported "
                                      f"({MINDSPEED_UNSUPPORTED[key]}); give \"\" or leave it out")
                continue
            if field not in kind.fields:
                raise ConfigError(f"--map_keys: dataset_type={kind.name} has no field {key!r}; its fields are "
                                  f"{list(kind.fields)} (MindSpeed-RL's 'prompt'/'response' also work)")
            if not col and field != kind.query:      # MindSpeed-RL's query "": no query column
                raise ConfigError(f"--map_keys: {key!r} needs a column name, got \"\"")
            if field in self.mapped and self.column[field] != col:
                raise ConfigError(f"--map_keys: field {field!r} is given two columns ({self.column[field]!r}, {col!r})")
            self.column[field] = col
            self.mapped.add(field)

    @property
    def _fallback(self) -> bool:
        """raw's second choice of reference column, unless --map_keys named the first."""
        return bool(self.kind.fallback) and self.kind.reference not in self.mapped

    @property
    def row_fields(self) -> bool:
        """Rows carry verl's data_source and extra_info (what a verl-style reward function reads), which the
        converted files keep (data/mindrecord_io.VERL_SCHEMA)."""
        return self.kind.source is not None

    @property
    def columns(self) -> List[str]:
        """The file columns a row is read from (parquet reads only these)."""
        return list(dict.fromkeys(self.column[f] for f in self.kind.fields))

    def describe(self) -> str:
        cols = ", ".join(repr(self.column[f]) for f in self.kind.required)
        renamed = [f"{f}->{self.column[f]!r}" for f in self.kind.fields if f in self.mapped]
        return f"dataset_type={self.kind.name} reads {cols}" + (f" (--map_keys {', '.join(renamed)})"
                                                                if renamed else "")

    def missing(self, where: str, column: str, present: Sequence[str], what: str = "the row has") -> ConfigError:
        """The error for a needed column that is absent: what was expected, what was found, what would fit."""
        shown = ", ".join(repr(c) for c in list(present)[:12]) + (", ..." if len(present) > 12 else "")
        fits = [t.name for t in DATASET_TYPES.values() if t.name != self.kind.name and
                all(c in present for c in t.required)]
        hint = f"--dataset_type {' or '.join(fits)} reads these" if fits else ""
        field = next(f for f in self.kind.fields if self.column[f] == column)
        others = [c for c in present if c not in self.column.values()]
        if others:
            example = f"--map_keys '{{\"{field}\": \"{others[0]}\"}}'"
            hint = f"{hint}, or rename with {example}" if hint else f"rename with {example}"
        return ConfigError(f"{where}: missing key {column!r} ({self.describe()}; {what} {shown or 'nothing'})"
                           + (f"; {hint}" if hint else ""))

    def check_columns(self, where: str, present: Sequence[str]):
        for field in self.kind.required:
            if self.column[field] not in present and not (field == self.kind.reference and self._fallback
                                                            and self.column[self.kind.fallback] in present):
                raise self.missing(where, self.column[field], present, "the file has")

    def example(self, obj: dict, where: str) -> Example:
        kind, col = self.kind, self.column
        if kind.extract == "verl":
            return self._verl_example(obj, where)
        if kind.extract == "math17k":
            return self._math17k_example(obj, where)
        question = self._text(obj, col[kind.question], where, required=True)
        if kind.query:                # MindSpeed-RL joins the non-empty prompt and query
            question = "\n".join(x for x in (question, self._text(obj, col[kind.query], where, False)) if x)
        ref_col = col[kind.reference]
        if ref_col not in obj and self._fallback and col[kind.fallback] in obj:
            ref_col = col[kind.fallback]
        reference = self._text(obj, ref_col, where, required=not kind.reference_optional, scalar=True)
        if kind.extract == "gsm8k":
            solution = _gsm8k_final(reference, where, ref_col)
        elif kind.extract == "boxed":
            solution = _boxed_final(reference, where, ref_col)
        else:
            solution = reference.strip()
            if not solution and not kind.reference_optional:
                raise ConfigError(f"{where}: key {ref_col!r} is empty (a row without a reference answer cannot be "
                                  f"scored)")
        worked = self._text(obj, col[kind.worked], where, required=False) if kind.worked else ""
        return Example(question, worked or reference, solution)

    def _verl_example(self, obj: dict, where: str) -> Example:
        """A row as verl's RLHFDataset reads it: the messages of `prompt`, `reward_model.ground_truth`
        (verl's reward function gets it as is), `data_source`; `extra_info.answer`, when given, is the
        worked answer. Each bad field is named by its path in the row."""
        kind, col = self.kind, self.column
        for key in (col[kind.question], col[kind.reference], col[kind.source]):
            if obj.get(key) is None:
                raise self.missing(where, key, [k for k, v in obj.items() if v is not None])
        messages = _verl_messages(obj[col[kind.question]], where, col[kind.question])
        reward = obj[col[kind.reference]]
        ref = col[kind.reference]
        if not isinstance(reward, dict):
            raise ConfigError(f"{where}: {ref!r} must be a mapping {{style, ground_truth}}, got "
                              f"{type(reward).__name__} ({self.describe()})")
        style = reward.get("style", "rule")
        if style not in ("rule", None):
            raise ConfigError(f"{where}: {ref}.style: {style!r} is not supported (rule: the ground truth is scored "
                              f"by a verifier; a reward model is not)")
        truth = reward.get("ground_truth")
        if isinstance(truth, (int, float)) and not isinstance(truth, bool):
            truth = str(truth)
        if not isinstance(truth, str):
            got = "missing" if truth is None else f"a {type(truth).__name__}, not a string"
            raise ConfigError(f"{where}: {ref}.ground_truth: {got} (the reference answer the verifier compares "
                              f"against)")
        if not truth.strip():
            raise ConfigError(f"{where}: {ref}.ground_truth is empty (a row without a reference answer cannot be "
                              f"scored)")
        source = obj[col[kind.source]]
        if not isinstance(source, str) or not source:
            raise ConfigError(f"{where}: {col[kind.source]!r} must be a non-empty string (verl picks the row's "
                              f"scorer by it), got {source!r}")
        extra = obj.get(col[kind.worked]) if kind.worked else None
        worked = extra.get("answer") if isinstance(extra, dict) else None
        question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), messages[-1]["content"])
        return Example(question, worked if isinstance(worked, str) and worked else truth, truth.strip(),
                       messages=messages, data_source=source, extra_info=extra if isinstance(extra, dict) else None,
                       where=where)

    def _math17k_example(self, obj: dict, where: str) -> Example:
        """As MindSpeed-RL's convert_math17k_to_intermediate: the question is the first message's content, the
        reference the response column's ground_truth (a mapping) or the column itself (a string)."""
        kind, col = self.kind, self.column
        if obj.get(col[kind.question]) is None:
            raise self.missing(where, col[kind.question], [k for k, v in obj.items() if v is not None])
        question = _verl_messages(obj[col[kind.question]], where, col[kind.question])[0]["content"]
        ref = col[kind.reference]
        value = obj.get(ref)
        if isinstance(value, dict):
            value, ref = value.get("ground_truth"), f"{ref}.ground_truth"
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, str):
                raise ConfigError(f"{where}: {ref}: expected a string, got {type(value).__name__} "
                                  f"({self.describe()})")
        else:
            value = self._text(obj, ref, where, required=True, scalar=True)
        if not value.strip():
            raise ConfigError(f"{where}: {ref!r} is empty (a row without a reference answer cannot be scored)")
        return Example(question, value, value.strip())

    def _text(self, obj: dict, key: str, where: str, required: bool, scalar: bool = False) -> str:
        if key not in obj or (obj[key] is None and not required):
            if required:
                raise self.missing(where, key, list(obj))
            return ""
        value = obj[key]
        if isinstance(value, str):
            return value
        if scalar and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)          # a numeric final answer column
        got = "null" if value is None else type(value).__name__
        raise ConfigError(f"{where}: key {key!r} must be a string, got {got} ({self.describe()})")


def _verl_messages(value: Any, where: str, key: str) -> List[Dict[str, str]]:
    """verl's `prompt`: a non-empty list of {role, content} string pairs (parquet gives a list of structs)."""
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list) or not value:
        got = "an empty list" if isinstance(value, list) else type(value).__name__
        raise ConfigError(f"{where}: {key!r} must be a list of chat messages [{{role, content}}, ...], got {got}")
    out = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise ConfigError(f"{where}: {key}[{i}]: expected a message {{role, content}}, got {type(msg).__name__}")
        for part in ("role", "content"):
            if not isinstance(msg.get(part), str):
                got = "missing" if msg.get(part) is None else f"a {type(msg[part]).__name__}, not a string"
                raise ConfigError(f"{where}: {key}[{i}].{part}: {got}")
        if msg["role"] not in VERL_ROLES:
            raise ConfigError(f"{where}: {key}[{i}].role: {msg['role']!r} is not one of {', '.join(VERL_ROLES)}")
        out.append({"role": msg["role"], "content": msg["content"]})
    return out


def _gsm8k_final(answer: str, where: str, key: str) -> str:
    if "####" not in answer:
        raise ConfigError(f"{where}: {key!r} has no '#### <number>' final answer (dataset_type=gsm8k)")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not final:
        raise ConfigError(f"{where}: the final answer after '####' is empty (a row without a reference answer "
                          f"cannot be scored)")
    return final


def _boxed_final(solution: str, where: str, key: str) -> str:
    """The last \\boxed{...} (or \\fbox{...}) of a MATH solution, nested braces kept: MATH's graders take it
    as the reference answer."""
    start = max(solution.rfind("\\boxed"), solution.rfind("\\fbox"))
    if start < 0:
        raise ConfigError(f"{where}: {key!r} has no \\boxed{{...}} final answer (dataset_type=math takes the "
                          f"reference answer from the last one)")
    i = start + (len("\\boxed") if solution.startswith("\\boxed", start) else len("\\fbox"))
    while i < len(solution) and solution[i] == " ":
        i += 1
    if i < len(solution) and solution[i] != "{":      # '\boxed 5': the token after it
        rest = solution[i:].split("$")[0].split()
        final = rest[0] if rest else ""
    else:
        depth, j = 0, i
        for j in range(i, len(solution)):
            depth += {"{": 1, "}": -1}.get(solution[j], 0)
            if depth == 0:
                break
        if depth:
            raise ConfigError(f"{where}: {key!r}: the last \\boxed{{ is never closed")
        final = solution[i + 1:j]
    if not final.strip():
        raise ConfigError(f"{where}: {key!r}: the last \\boxed{{}} is empty (a row without a reference answer "
                          f"cannot be scored)")
    return final.strip()


# ----------------------------------------------------------------------------------------------- input files

def input_files(path: str) -> Tuple[List[str], List[str]]:
    """(the data files --file_path names, in reading order; the names a directory holds that are skipped).

    A trailing slash on a file's name is accepted (MindRLHF's tutorial writes `--file_path train.jsonl/`).
    A directory's .jsonl/.json/.parquet files directly inside it are read in sorted order; its subfolders
    are not entered (a dataset download keeps other splits there)."""
    if path.endswith(("/", os.sep)) and len(path) > 1 and os.path.isfile(path.rstrip("/" + os.sep)):
        path = path.rstrip("/" + os.sep)
    if os.path.isfile(path):
        return [path], []
    if not os.path.isdir(path):
        raise ConfigError(f"--file_path: file not found: {path}")
    files, skipped = [], []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.startswith("."):
            continue
        (files if os.path.isfile(full) and name.endswith(DATA_SUFFIXES) else skipped).append(full)
    if not files:
        found = ", ".join(os.path.basename(s) for s in skipped) or "nothing"
        raise ConfigError(f"--file_path {path}: the directory holds no {'/'.join(DATA_SUFFIXES)} files "
                          f"(found: {found})")
    return files, skipped


def file_format(path: str) -> str:
    """parquet, json_array or jsonl: parquet by its magic bytes, then a JSON array if the text opens with
    '[' (a `.json` may be either: Hugging Face writes jsonl under that name too)."""
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if head[:4] == b"PAR1":
        return "parquet"
    if path.endswith(".parquet"):
        raise ConfigError(f"{path}: not a parquet file (no PAR1 magic at the start)")
    text = head.lstrip(b"\xef\xbb\xbf").lstrip()
    return "json_array" if text[:1] == b"[" else "jsonl"


class Source:
    """--file_path's rows as Examples, one file after another, never a whole file in memory (except a JSON
    array's current item)."""

    def __init__(self, path: Union[str, Sequence[str]], dataset_type: str, map_keys: Optional[Dict[str, str]] = None):
        """`path`: one file or directory, or a list of them (verl's data.train_files), read in that order."""
        self.spec = RowSpec(dataset_type, map_keys)
        self.files, self.skipped = [], []
        for one in [path] if isinstance(path, str) else path:
            files, skipped = input_files(one)
            self.files += files
            self.skipped += skipped
        self.formats = [file_format(f) for f in self.files]

    def count(self) -> int:
        """Rows in all files (the progress bar's total): jsonl lines, JSON array items, parquet metadata."""
        total = 0
        for path, fmt in zip(self.files, self.formats):
            if fmt == "parquet":
                total += _parquet_file(path).metadata.num_rows
            elif fmt == "json_array":
                total += sum(1 for _ in _json_array_items(path))
            else:
                with open(path, "rb") as fh:
                    total += sum(1 for raw in fh if raw.strip())
        return total

    def examples(self) -> Iterator[Example]:
        for path, fmt in zip(self.files, self.formats):
            rows = {"parquet": self._parquet_rows, "json_array": self._array_rows, "jsonl": self._jsonl_rows}[fmt]
            count = 0
            for where, obj in rows(path):
                count += 1
                example = self.spec.example(obj, where)
                example.where = where
                yield example
            if not count:
                raise ConfigError(f"{path}: the file has no rows")

    def _jsonl_rows(self, path: str) -> Iterator[Tuple[str, dict]]:
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise ConfigError(f"{path}:{lineno}: not UTF-8 ({err.reason} at byte {err.start} of the "
                                      f"line)") from None
                if lineno == 1:
                    line = line.lstrip("\ufeff")
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as err:
                    raise ConfigError(f"{path}:{lineno}: not valid JSON ({err})") from None
                if not isinstance(obj, dict):
                    raise ConfigError(f"{path}:{lineno}: expected a JSON object per line, got "
                                      f"{type(obj).__name__}")
                yield f"{path}:{lineno}", obj

    def _array_rows(self, path: str) -> Iterator[Tuple[str, dict]]:
        for index, line, obj in _json_array_items(path):
            where = f"{path}:item {index} (line {line})"
            if not isinstance(obj, dict):
                raise ConfigError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            yield where, obj

    def _parquet_rows(self, path: str) -> Iterator[Tuple[str, dict]]:
        pf = _parquet_file(path)
        names = pf.schema_arrow.names
        self.spec.check_columns(path, names)
        wanted = [c for c in self.spec.columns if c in names]
        row = 0
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=wanted):
            cols = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
            for i in range(batch.num_rows):
                yield f"{path}:row {row}", {c: values[i] for c, values in cols.items()}
                row += 1


def _parquet_file(path: str):
    """pyarrow is needed only for parquet input, so it is imported here and its absence named."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ConfigError(f"{path}: reading parquet needs pyarrow ({err}); pip install pyarrow "
                          f"(with numpy<2: pip install 'pyarrow<26')") from None
    try:
        return pq.ParquetFile(path)
    except Exception as err:            # pyarrow's ArrowInvalid / OSError on a damaged file
        raise ConfigError(f"{path}: pyarrow cannot read this parquet file ({err})") from None


def _json_array_items(path: str) -> Iterator[Tuple[int, int, object]]:
    """(index, line, value) of each item of a file holding one JSON array, decoded an item at a time from
    JSON_READ_CHARS-sized reads: the file is never held whole (DeepScaleR's is ~40k objects)."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as fh:
        text = _Chars(fh, path)
        text.skip_space()
        if text.next() != "[":
            raise ConfigError(f"{path}: expected a JSON array ('[' first)")
        text.skip_space()
        index = 0
        if text.peek() == "]":
            text.next()
        else:
            while True:
                line = text.line()
                yield index, line, text.decode(decoder, f"{path}:item {index} (line {line})")
                index += 1
                text.skip_space()
                c = text.next()
                if c == "]":
                    break
                if c != ",":
                    raise ConfigError(f"{path}: line {text.line()}: expected ',' or ']' after item {index - 1}, "
                                      f"got {c or 'the end of the file'!r}")
                text.skip_space()
        text.skip_space()
        if text.peek():
            raise ConfigError(f"{path}: line {text.line()}: text after the array's closing ']'")


class _Chars:
    """A text file read in chunks, with a cursor and the cursor's line number (counted once per char)."""

    def __init__(self, fh, path: str):
        self.fh, self.path = fh, path
        self.buf, self.pos, self.eof = "", 0, False
        self.lines, self.counted = 1, 0          # line of buf[counted]

    def _fill(self, chars: Optional[int] = None) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.fh.read(chars or JSON_READ_CHARS)
        except UnicodeDecodeError as err:
            raise ConfigError(f"{self.path}: line {self.line()}: not UTF-8 ({err.reason})") from None
        if not chunk:
            self.eof = True
            return False
        self.line()
        if not self.buf:
            chunk = chunk.lstrip("\ufeff")
        self.buf, self.counted, self.pos = self.buf[self.pos:] + chunk, 0, 0
        return True

    def line(self) -> int:
        self.lines += self.buf.count("\n", self.counted, self.pos)
        self.counted = self.pos
        return self.lines

    def peek(self) -> str:
        while self.pos >= len(self.buf):
            if not self._fill():
                return ""
        return self.buf[self.pos]

    def next(self) -> str:
        c = self.peek()
        self.pos += len(c)
        return c

    def skip_space(self):
        while self.peek() in (" ", "\t", "\r", "\n"):
            self.pos += 1

    def decode(self, decoder: json.JSONDecoder, where: str):
        want = JSON_READ_CHARS
        while True:
            try:
                value, end = decoder.raw_decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof:       # a number at the buffer's end may continue
                    self.pos = end
                    return value
            except ValueError as err:
                if self.eof:
                    lineno = self.line() + self.buf.count("\n", self.pos, getattr(err, "pos", self.pos))
                    raise ConfigError(f"{where}: not valid JSON ({getattr(err, 'msg', err)}, line {lineno})") from None
            self._fill(want)                 # the item runs past the buffer: read more, more each time
            want *= 2
