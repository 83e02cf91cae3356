"""MindRecord schema for GRPO prompts, an atomic writer and the reader (input rows: data/sources.py).

Columns (all int64 arrays right-padded with `pad_token_id`, as MindRLHF writes them, plus two of ours):

    prompt_ids     [max_prompt_length]  the prompt (after the template), right-padded
    pretrain_ids   [seq_length]         prompt + reference answer text, right-padded (SFT warm-up)
    loss_mask      [seq_length]         1 on the answer tokens of pretrain_ids, else 0
    prompt_length  int64                number of real tokens in prompt_ids          (mindrlhf)
    solution       string               the reference final answer for the verifier  (mindrlhf)

verl's rows (--dataset_type verl) add two more, what verl's reward function gets besides the completion and the
ground truth (a verl-style custom reward function reads them: reward/custom_function.py):

    data_source    string               the row's data_source
    extra_info     string               the row's extra_info mapping as JSON ("" when the row has none)

Files holding only MindRLHF's three columns load too (prompt_length is then recovered from the padding).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np

from mindrlhf.configs.errors import ConfigError
from mindrlhf.utils.atomic import fsync_path

SCHEMA = {
    "prompt_ids": {"type": "int64", "shape": [-1]},
    "pretrain_ids": {"type": "int64", "shape": [-1]},
    "loss_mask": {"type": "int64", "shape": [-1]},
    "prompt_length": {"type": "int64"},
    "solution": {"type": "string"},
}
VERL_SCHEMA = dict(SCHEMA, data_source={"type": "string"}, extra_info={"type": "string"})
MINDRLHF_COLUMNS = ("prompt_ids", "pretrain_ids", "loss_mask")
WRITE_BATCH_ROWS = 8192    # rows per MindRecord write call (the page layout, so the file's bytes, depend on it)

PROMPT_TEMPLATES = {
    "none": "{question}",
    "plain": "Question: {question}\nAnswer:",
    "qwen_chat": ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                  "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"),
    "qwen_r1": ("<|im_start|>system\nA conversation between User and Assistant. The user asks a question, and "
                "the Assistant solves it. The Assistant first thinks about the reasoning process and then "
                "provides the answer. The reasoning process and answer are enclosed within <think> </think> and "
                "<answer> </answer> tags, respectively, and the final answer is put in \\boxed{{}}.<|im_end|>\n"
                "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"),
}


def write_mindrecord(path: str, columns: Dict[str, Sequence], schema: Dict[str, dict],
                     index_fields: Optional[List[str]] = None, batch_rows: int = WRITE_BATCH_ROWS):
    """Write rows to `path` (+ `.db`): both files appear or none (see _install_pair), fsynced.

    `columns` maps each schema field to its values in row order: a 2-D array (one row per line) or a list
    for array fields, a 1-D array or list for scalar fields. `index_fields`: the scalar fields MindRecord
    indexes in the `.db` (default: all of them; each costs commit time).
    """
    with MindRecordWriter(path, schema, index_fields) as out:
        out.write(columns, batch_rows)
        out.commit()


class MindRecordWriter:
    """Rows to `path` (+ `.db`) a batch at a time, so a writer need not hold the whole table: they go to a
    temp pair beside `path` that `commit` installs (fsynced, see _install_pair); leaving the `with` block
    without `commit` leaves `path` as it was.

    append=True continues the existing pair (MindRecord's open_for_append) on a copy of it: appending
    rewrites the header and the index in place, and a crash half-way would leave neither pair readable.
    """

    def __init__(self, path: str, schema: Dict[str, dict], index_fields: Optional[List[str]] = None,
                 append: bool = False):
        from mindspore.mindrecord import FileWriter
        out_dir = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(out_dir):
            raise ConfigError(f"--output_path: the directory {out_dir} does not exist")
        self.path, self.schema = path, schema
        self._tmp_dir = tempfile.mkdtemp(prefix=".tmp_mindrecord_", dir=out_dir)
        self._tmp_file = os.path.join(self._tmp_dir, os.path.basename(path))
        try:
            if append:
                for suffix in ("", ".db"):
                    shutil.copyfile(path + suffix, self._tmp_file + suffix)
                self._writer = FileWriter.open_for_append(self._tmp_file)
            else:
                self._writer = FileWriter(self._tmp_file, shard_num=1, overwrite=True)
                self._writer.set_page_size(1 << 20)    # MindRecord's default 32 MB page bloats small prompt files
                self._writer.set_header_size(1 << 20)
                self._writer.add_schema(schema, "mindrlhf_grpo_prompts")
                if index_fields:
                    self._writer.add_index(list(index_fields))
        except BaseException:
            self.close()
            raise

    def write(self, columns: Dict[str, Sequence], batch_rows: int = WRITE_BATCH_ROWS):
        """Every row of `columns` (as write_mindrecord takes them), `batch_rows` per MindRecord write call:
        the page layout, so the file's bytes, depend on where the calls split the rows."""
        n = len(next(iter(columns.values())))
        for start in range(0, n, batch_rows):
            stop = min(n, start + batch_rows)
            if not _write_serialised(self._writer, columns, self.schema, start, stop):
                self._writer.write_raw_data([{k: columns[k][i] for k in columns} for i in range(start, stop)])

    def commit(self):
        self._writer.commit()
        _install_pair(self._tmp_file, self.path)
        self.close()

    def close(self):
        shutil.rmtree(self._tmp_dir, ignore_errors=True)

    def __enter__(self) -> "MindRecordWriter":
        return self

    def __exit__(self, *exc):
        self.close()


def _install_pair(tmp_file: str, path: str):
    """Move a finished (file, file.db) pair onto `path`: readers open `path` and find `path.db` beside it,
    so `path` goes first and comes back last. At every instant `path` is absent or pairs with its own .db;
    a crash in between leaves no `path` (the old pair is gone, the new one not yet in place), never a mix."""
    for suffix in ("", ".db"):
        fsync_path(tmp_file + suffix)
    if os.path.exists(path):
        os.remove(path)
    os.replace(tmp_file + ".db", path + ".db")
    os.replace(tmp_file, path)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def _write_serialised(writer, columns, schema, start: int, stop: int) -> bool:
    """Hand rows [start, stop) to MindRecord's C++ writer already serialised; False if this is not possible.

    FileWriter.write_raw_data checks and serialises every row in Python (~70% of a 20k-row conversion);
    here each array field is one contiguous block: a row's blob is, per blob field in header order, an
    8-byte big-endian byte count and the values (one field: the values alone), which is what FileWriter
    builds row by row. Falls back (returns False) on ragged arrays, dtypes other than the schema's, or
    if MindSpore's internals differ.
    """
    try:
        from mindspore import _c_mindrecord
    except ImportError:
        return False
    shard = getattr(writer, "_writer", None)
    c_writer = getattr(shard, "_writer", None)
    header = getattr(writer, "_header", None)
    if c_writer is None or header is None or not hasattr(shard, "is_open") or getattr(writer, "_parallel_writer", True):
        return False
    blob_fields = list(header.blob_fields)
    blocks = []
    for field in blob_fields:
        try:
            values = np.asarray(columns[field][start:stop])
        except ValueError:                                          # ragged rows
            return False
        if values.ndim != 2 or values.dtype != np.dtype(schema[field]["type"]):
            return False          # ragged, or a dtype FileWriter's own checks should report
        flat = np.ascontiguousarray(values).view(np.uint8).reshape(stop - start, -1)
        if len(blob_fields) > 1:
            size = np.frombuffer(flat.shape[1].to_bytes(8, "big"), np.uint8)
            blocks.append(np.broadcast_to(size, (stop - start, 8)))
        blocks.append(flat)
    if not shard.is_open:
        shard.open(writer._paths, writer._overwrite)
    if not shard.get_shard_header():
        shard.set_shard_header(writer._header)
    # each row's blob joined straight from the column blocks: one copy of the batch, not three
    blob_rows = [b"".join([block[i] for block in blocks]) for i in range(stop - start)] if blocks else []
    scalar_fields = [f for f in schema if f not in blob_fields]
    scalars = {f: [v.item() if isinstance(v, np.generic) else v for v in columns[f][start:stop]]
               for f in scalar_fields}
    raw_rows = [{f: scalars[f][i] for f in scalar_fields} for i in range(stop - start)] if scalar_fields else []
    status = c_writer.write_raw_data({0: raw_rows} if raw_rows else {}, blob_rows, True, False)
    if status != _c_mindrecord.MSRStatus.SUCCESS:
        raise RuntimeError(f"MindRecord writer failed ({status}) writing rows {start}..{stop - 1}")
    return True


def read_mindrecord(path: str, columns: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
    """The rows of a prompt MindRecord as column arrays, in file order (our schema or MindRLHF's): the
    `columns` asked for (default: all) that the file has, each filled in place (no per-row copies kept).
    A file MindSpore cannot read (cut short, overwritten) is a ConfigError naming it."""
    if not os.path.isfile(path):
        raise ConfigError(f"--mind_dataset_dir: MindRecord file not found: {path}")
    try:
        return _read_mindrecord(path, columns)
    except RuntimeError as err:        # MindSpore's reader: a long message whose useful line names the fault
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip().startswith("[ERROR]")]
        raise ConfigError(f"{path}: MindSpore cannot read this MindRecord (cut short or corrupted? re-run "
                          f"rlhf_data.py): {lines[0] if lines else str(err).splitlines()[0]}") from None


def _read_mindrecord(path: str, columns: Optional[Sequence[str]]) -> Dict[str, np.ndarray]:
    from mindspore.mindrecord import FileReader
    reader = FileReader(path)
    try:
        header_cols = set(reader.schema().keys()) if hasattr(reader, "schema") else None
    finally:
        reader.close()
    present = [c for c in VERL_SCHEMA if header_cols is None or c in header_cols]
    missing = [c for c in MINDRLHF_COLUMNS if c not in present]
    if missing:
        raise ConfigError(f"{path}: MindRecord lacks column(s) {missing}; expected at least {MINDRLHF_COLUMNS}")
    cols = [c for c in present if columns is None or c in columns]
    n = _dataset(path, cols).get_dataset_size()
    if n == 0:
        raise ConfigError(f"{path}: the MindRecord has no rows")
    result = {}
    for i, row in enumerate(iter_rows(path, cols)):
        for c in cols:
            value = row[c]
            if c not in result:
                result[c] = np.empty(n, object) if isinstance(value, str) else np.empty((n,) + value.shape, value.dtype)
            elif not isinstance(value, str) and value.shape != result[c].shape[1:]:
                raise ConfigError(f"{path}: row {i} of {c} has shape {value.shape}, row 0 {result[c].shape[1:]}; "
                                  f"the columns must be padded to one width")
            result[c][i] = value
    if "prompt_length" in result:
        result["prompt_length"] = result["prompt_length"].reshape(-1)
    return result


def _dataset(path: str, cols: List[str]):
    import mindspore.dataset as ds
    return ds.MindDataset(path, columns_list=cols, shuffle=False)


def iter_rows(path: str, cols: List[str]) -> Iterator[Dict[str, object]]:
    """Each row's values of `cols` as MindDataset gives them, in file order; strings decoded."""
    for row in _dataset(path, cols).create_dict_iterator(num_epochs=1, output_numpy=True):
        yield {c: _as_str(row[c]) if row[c].dtype.kind in "SUO" else row[c] for c in cols}


def iter_chunks(path: str, cols: List[str], rows: int) -> Iterator[Dict[str, list]]:
    """read_columns `rows` rows at a time: columns too big to hold whole can still be read through."""
    chunk: Dict[str, list] = {c: [] for c in cols}
    for row in iter_rows(path, cols):
        for c in cols:
            chunk[c].append(row[c])
        if len(chunk[cols[0]]) == rows:
            yield chunk
            chunk = {c: [] for c in cols}
    if chunk[cols[0]]:
        yield chunk


def read_columns(path: str, cols: List[str]) -> Dict[str, list]:
    """Every row's values of `cols` as MindDataset gives them, in file order; strings decoded."""
    out: Dict[str, list] = {c: [] for c in cols}
    for row in iter_rows(path, cols):
        for c in cols:
            out[c].append(row[c])
    return out


def _as_str(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return _as_str(value.item())
    return str(value)
