"""rlhf_data.py's inputs as users download them: MindRLHF's `--file_path train.jsonl/`, DeepScaleR's JSON
array, Hugging Face parquet (GSM8K, OpenR1-Math), MATH's \\boxed{} answers, a directory of mixed files,
--map_keys, MindRLHF's --is_dataset_gsm8k; bad rows named by file and line/item/row. Every conversion is
checked on what the MindRecord holds (decoded prompt, answer tokens, solution column)."""
import json
import os
import subprocess
import sys

import pytest

from data_helpers import arithmetic_rows, make_tokenizer_files, write_jsonl
from mindrlhf.configs import ConfigError
from mindrlhf.data import sources
from mindrlhf.data.convert import build_parser, convert, main
from mindrlhf.data.mindrecord_io import read_mindrecord
from mindrlhf.data.tokenizer import load_qwen2_tokenizer

REPO = os.path.join(os.path.dirname(__file__), "..")
WIDTHS = ("--max_prompt_length", "96", "--seq_length", "320")

MATH_ROWS = [
    {"problem": "What is $\\frac{1}{2}+\\frac{1}{2}$?", "solution": "Add: $\\boxed{1}$.", "level": "Level 1"},
    {"problem": "Simplify $\\frac{2}{4}$.", "solution": "Divide by 2: $\\boxed{\\frac{1}{2}}$.", "level": "Level 2"},
    {"problem": "Pick one.", "solution": "Not $\\boxed{3}$ but $\\boxed{\\{4, 5\\}}$.", "level": "Level 3"},
    {"problem": "Old style?", "solution": "So $\\fbox{7}$.", "level": "Level 1"},
]
DEEPSCALER_ROWS = [
    {"problem": "Let $x = 3$. Find $x^2$.", "answer": "9", "solution": "Square it: 9."},
    {"problem": "数 12 + 7?", "answer": "19", "solution": "12 + 7 = 19 😀"},
    {"problem": "What is 2 + 2?", "answer": "4"},           # no worked solution: the answer is the SFT target
]


@pytest.fixture(scope="module")
def tok_files(tmp_path_factory):
    return make_tokenizer_files(str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def tok(tok_files):
    return load_qwen2_tokenizer(*tok_files)


def _argv(tok_files, src, out, *extra):
    vocab, merges = tok_files
    return ["--vocab_path", vocab, "--merges_file_path", merges, "--file_path", str(src), "--output_path", str(out),
            "--no_progress", *extra]


def _convert(tok_files, src, out, *extra):
    return convert(build_parser().parse_args(_argv(tok_files, src, out, *extra)))


def _contents(tok, path):
    """(prompt text, answer text, solution) per row of a written MindRecord, in file order."""
    table = read_mindrecord(str(path))
    rows = []
    for i, solution in enumerate(table["solution"]):
        n = int(table["prompt_length"][i])
        prompt = tok.decode(table["prompt_ids"][i, :n].tolist())
        answer = tok.decode(table["pretrain_ids"][i][table["loss_mask"][i] == 1].tolist())
        rows.append((prompt, answer.strip(), solution))
    return rows


def _gsm8k_expected(rows):
    return [(r["question"], r["answer"], r["answer"].split("####")[1].strip()) for r in rows]


def _write_parquet(path, columns, row_group_size=None):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table(columns), str(path), row_group_size=row_group_size)
    return str(path)


def _gsm8k_columns(rows):
    return {"question": [r["question"] for r in rows], "answer": [r["answer"] for r in rows]}


def test_the_tutorials_trailing_slash_spelling(tmp_path, tok_files, tok):
    """MindRLHF's README writes `--file_path /{path}/train.jsonl/ --dataset_type gsm8k`: run as written."""
    rows = arithmetic_rows(6)
    src = write_jsonl(str(tmp_path / "train.jsonl"), rows)
    out = tmp_path / "gsm8k_train.mindrecord"
    vocab, merges = tok_files
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(REPO, "examples", "grpo", "qwen_grpo_tutorial", "rlhf_data.py"),
                           "--vocab_path", vocab, "--merges_file_path", merges, "--file_path", src + "/",
                           "--output_path", str(out), "--dataset_type", "gsm8k"],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    text = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "--max_prompt_length 256 (MindRLHF's default: 2048), --seq_length 512 (MindRLHF's default: 4096)" in text
    assert "--dataset_type gsm8k (MindRLHF" not in text          # given, so not a default
    assert _contents(tok, out) == _gsm8k_expected(rows)
    assert read_mindrecord(str(out))["prompt_ids"].shape == (6, 256)


def test_defaults_line_names_only_the_defaults_used(tmp_path, tok_files, capsys):
    src = write_jsonl(str(tmp_path / "t.jsonl"), arithmetic_rows(2))
    _convert(tok_files, src, tmp_path / "a.mindrecord")
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("defaults that differ")]
    assert line == ["defaults that differ from MindRLHF's rlhf_data.py (give the flag to choose): "
                    "--max_prompt_length 256 (MindRLHF's default: 2048), --seq_length 512 (MindRLHF's default: "
                    "4096), --dataset_type gsm8k (MindRLHF's default: none, i.e. 'question' + 'answer' taken whole)"]
    _convert(tok_files, src, tmp_path / "b.mindrecord", *WIDTHS, "--dataset_type", "gsm8k")
    assert "defaults that differ" not in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"--seq_length \(512, the default\) must exceed --max_prompt_length "
                                          r"\(1024\)"):
        _convert(tok_files, src, tmp_path / "c.mindrecord", "--max_prompt_length", "1024")


def test_deepscaler_json_array_streamed_in_small_reads(tmp_path, tok_files, tok, monkeypatch):
    """DeepScaleR's deepscaler.json is one indented JSON array; with 7-character reads every item straddles
    reads (multi-byte characters too), and the reader never holds more than an item and a read."""
    src = tmp_path / "deepscaler.json"
    src.write_text(json.dumps(DEEPSCALER_ROWS * 20, indent=2, ensure_ascii=False), encoding="utf-8")
    monkeypatch.setattr(sources, "JSON_READ_CHARS", 7)
    longest = []
    fill = sources._Chars._fill

    def watched(self, chars=None):
        grew = fill(self, chars)
        longest.append(len(self.buf))
        return grew
    monkeypatch.setattr(sources._Chars, "_fill", watched)
    summary = _convert(tok_files, src, tmp_path / "d.mindrecord", *WIDTHS, "--dataset_type", "deepscaler")
    assert summary.rows_written == 60
    expected = [(r["problem"], r.get("solution", r["answer"]), r["answer"]) for r in DEEPSCALER_ROWS] * 20
    assert _contents(tok, tmp_path / "d.mindrecord") == expected
    assert max(longest) < os.path.getsize(src) / 20          # ~130 of ~5100 characters


def test_gsm8k_parquet_read_a_batch_at_a_time_and_only_the_needed_columns(tmp_path, tok_files, tok, monkeypatch):
    import pyarrow.parquet as pq
    rows = arithmetic_rows(11)
    cols = dict(_gsm8k_columns(rows), big=["x" * 1000] * 11)       # a column rlhf_data has no use for
    src = _write_parquet(tmp_path / "train-00000-of-00001.parquet", cols, row_group_size=4)
    monkeypatch.setattr(sources, "PARQUET_BATCH_ROWS", 3)
    calls = []
    iter_batches = pq.ParquetFile.iter_batches

    def watched(self, *args, **kwargs):
        calls.append(kwargs)
        return iter_batches(self, *args, **kwargs)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", watched)
    summary = _convert(tok_files, src, tmp_path / "g.mindrecord", *WIDTHS)
    assert summary.rows_written == 11
    assert calls == [{"batch_size": 3, "columns": ["question", "answer"]}]
    assert _contents(tok, tmp_path / "g.mindrecord") == _gsm8k_expected(rows)


def test_math_boxed_answers(tmp_path, tok_files, tok):
    src = write_jsonl(str(tmp_path / "math.jsonl"), MATH_ROWS)
    _convert(tok_files, src, tmp_path / "m.mindrecord", *WIDTHS, "--dataset_type", "math")
    assert _contents(tok, tmp_path / "m.mindrecord") == [
        (MATH_ROWS[0]["problem"], MATH_ROWS[0]["solution"], "1"),
        (MATH_ROWS[1]["problem"], MATH_ROWS[1]["solution"], "\\frac{1}{2}"),
        (MATH_ROWS[2]["problem"], MATH_ROWS[2]["solution"], "\\{4, 5\\}"),       # the last \boxed, nested braces
        (MATH_ROWS[3]["problem"], MATH_ROWS[3]["solution"], "7")]


@pytest.mark.parametrize("solution,pattern", [
    ("No box here, 5.", r"math\.jsonl:2: 'solution' has no \\boxed\{\.\.\.\} final answer"),
    ("Open $\\boxed{\\frac{1}{2}$", r"math\.jsonl:2: 'solution': the last \\boxed\{ is never closed"),
    ("Empty $\\boxed{ }$", r"math\.jsonl:2: 'solution': the last \\boxed\{\} is empty"),
])
def test_math_rows_without_a_usable_box_are_named(tmp_path, tok_files, solution, pattern):
    src = write_jsonl(str(tmp_path / "math.jsonl"), [MATH_ROWS[0], dict(MATH_ROWS[1], solution=solution)])
    with pytest.raises(ConfigError, match=pattern):
        _convert(tok_files, src, tmp_path / "m.mindrecord", *WIDTHS, "--dataset_type", "math")


def test_a_directory_of_mixed_files(tmp_path, tok_files, tok, capsys):
    """A directory's .jsonl/.json/.parquet files are read in sorted order; other files and subfolders (a
    download's other splits) are not, and the start-up line says so."""
    data = tmp_path / "data"
    (data / "test").mkdir(parents=True)
    rows = arithmetic_rows(9)
    write_jsonl(str(data / "a.jsonl"), rows[:3])
    (data / "b.json").write_text(json.dumps(rows[3:6]), encoding="utf-8")
    _write_parquet(data / "c.parquet", _gsm8k_columns(rows[6:]))
    (data / "README.md").write_text("# GSM8K\n", encoding="utf-8")
    write_jsonl(str(data / "test" / "test.jsonl"), arithmetic_rows(4, seed=9))
    _convert(tok_files, str(data) + "/", tmp_path / "dir.mindrecord", *WIDTHS)
    assert _contents(tok, tmp_path / "dir.mindrecord") == _gsm8k_expected(rows)
    out = capsys.readouterr().out
    assert "reading a.jsonl, b.json, c.parquet; skipped (not .jsonl/.json/.parquet): README.md, test" in out


def test_a_directory_without_data_files_is_named(tmp_path, tok_files):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("x", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"--file_path .*d: the directory holds no \.jsonl/\.json/\.parquet "
                                          r"files \(found: notes\.txt\)"):
        _convert(tok_files, tmp_path / "d", tmp_path / "o.mindrecord")


def test_map_keys_renames_columns(tmp_path, tok_files, tok):
    """--map_keys '{"question": "problem", "answer": "solution"}': a GSM8K file whose columns are named
    otherwise; MindSpeed-RL's own form ('prompt', 'response', empty 'query'/'system') also works."""
    rows = arithmetic_rows(4)
    renamed = [{"problem": r["question"], "solution": r["answer"]} for r in rows]
    src = write_jsonl(str(tmp_path / "renamed.jsonl"), renamed)
    _convert(tok_files, src, tmp_path / "r.mindrecord", *WIDTHS,
             "--map_keys", '{"question": "problem", "answer": "solution"}')
    assert _contents(tok, tmp_path / "r.mindrecord") == _gsm8k_expected(rows)

    shaped = [{"instruction": r["problem"], "label": r["answer"]} for r in DEEPSCALER_ROWS]
    src = _write_parquet(tmp_path / "ms.parquet", {k: [r[k] for r in shaped] for k in ("instruction", "label")})
    _convert(tok_files, src, tmp_path / "ms.mindrecord", *WIDTHS, "--dataset_type", "deepscaler", "--map_keys",
             '{"prompt": "instruction", "query": "", "response": "label", "system": ""}')
    assert _contents(tok, tmp_path / "ms.mindrecord") == [(r["problem"], r["answer"], r["answer"])
                                                          for r in DEEPSCALER_ROWS]


@pytest.mark.parametrize("map_keys,pattern", [
    ('{"problem": "q"}', r"--map_keys: dataset_type=gsm8k has no field 'problem'; its fields are "
                         r"\['question', 'answer'\]"),
    ('{"query": "input"}', r"--map_keys: 'query' -> 'input' is not supported"),
    ('["question"]', r"--map_keys: expected a JSON object"),
    ("{question: q}", r"--map_keys: not valid JSON"),
])
def test_bad_map_keys(tmp_path, tok_files, map_keys, pattern):
    src = write_jsonl(str(tmp_path / "t.jsonl"), arithmetic_rows(2))
    with pytest.raises(ConfigError, match=pattern):
        _convert(tok_files, src, tmp_path / "o.mindrecord", "--map_keys", map_keys)


def test_is_dataset_gsm8k(tmp_path, tok_files, tok, capsys):
    """MindRLHF's earlier flag: `--is_dataset_gsm8k True` reads the rows as gsm8k (the final answer after
    '####' is the solution) and says so."""
    rows = arithmetic_rows(5)
    src = write_jsonl(str(tmp_path / "train.jsonl"), rows)
    out = tmp_path / "g.mindrecord"
    assert main(_argv(tok_files, src, out, *WIDTHS, "--is_dataset_gsm8k", "True")) == 0
    printed = capsys.readouterr().out
    assert "--is_dataset_gsm8k True: read as --dataset_type gsm8k" in printed
    assert "--dataset_type gsm8k (MindRLHF" not in printed
    assert _contents(tok, out) == _gsm8k_expected(rows)
    assert main(_argv(tok_files, src, out, *WIDTHS, "--is_dataset_gsm8k", "False", "--dataset_type", "raw",
                      "--map_keys", '{"prompt": "question"}')) == 0
    assert "--is_dataset_gsm8k" not in capsys.readouterr().out
    assert _contents(tok, out) == [(r["question"], r["answer"], r["answer"]) for r in rows]
    assert main(_argv(tok_files, src, out, *WIDTHS, "--is_dataset_gsm8k", "True", "--dataset_type", "math")) == 2
    assert "--is_dataset_gsm8k True asks for gsm8k rows but --dataset_type is math" in capsys.readouterr().out
    assert main(_argv(tok_files, src, out, *WIDTHS, "--is_dataset_gsm8k", "maybe")) == 2
    assert "--is_dataset_gsm8k: expected True or False, got 'maybe'" in capsys.readouterr().out


def test_openr1math_parquet_in_mindrlhf_spelling(tmp_path, tok_files, tok):
    """OpenR1-Math's parquet shards (problem, solution, answer and long generation columns) by MindRLHF's
    `--dataset_type openR1math`."""
    cols = {"problem": [r["problem"] for r in DEEPSCALER_ROWS], "solution": ["Work: 9.", "Work: 19.", None],
            "answer": [9, 19, 4], "generations": [["long text"] * 3] * 3}      # numeric answers read as text
    src = _write_parquet(tmp_path / "default-00000.parquet", cols)
    _convert(tok_files, src, tmp_path / "o.mindrecord", *WIDTHS, "--dataset_type", "openR1math")
    assert _contents(tok, tmp_path / "o.mindrecord") == [
        (DEEPSCALER_ROWS[0]["problem"], "Work: 9.", "9"), (DEEPSCALER_ROWS[1]["problem"], "Work: 19.", "19"),
        (DEEPSCALER_ROWS[2]["problem"], "4", "4")]


def test_mindrlhf_shaped_openr1math_rows_with_map_keys(tmp_path, tok_files, tok):
    """MindRLHF's openR1math files carry 'question' + 'answer' (the final answer); here the type reads
    OpenR1-Math's own 'problem', so such files are renamed with --map_keys."""
    rows = [{"question": r["problem"], "answer": r["answer"]} for r in DEEPSCALER_ROWS]
    src = write_jsonl(str(tmp_path / "openr1.jsonl"), rows)
    _convert(tok_files, src, tmp_path / "o.mindrecord", *WIDTHS, "--dataset_type", "openR1math",
             "--map_keys", '{"problem": "question"}')
    assert _contents(tok, tmp_path / "o.mindrecord") == [(r["question"], r["answer"], r["answer"]) for r in rows]


def _array_file(tmp_path, rows):
    src = tmp_path / "d.json"
    src.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return src


def test_bad_rows_are_named_by_file_and_place(tmp_path, tok_files):
    """jsonl: file:line; a JSON array: file:item N (line L); parquet: file:row N, or the file's columns."""
    run = lambda src, *extra: _convert(tok_files, src, tmp_path / "o.mindrecord", *WIDTHS, *extra)  # noqa: E731
    # a JSON array: item 2 (0-based) lacks 'answer'; indent=1 puts item 2's "{" on line 12
    rows = [dict(r) for r in DEEPSCALER_ROWS[:2]] + [{"problem": "x"}]
    with pytest.raises(ConfigError, match=r"d\.json:item 2 \(line 12\): missing key 'answer' \(dataset_type="
                                          r"deepscaler reads 'problem', 'answer'; the row has 'problem'\)"):
        run(_array_file(tmp_path, rows), "--dataset_type", "deepscaler")
    broken = tmp_path / "broken.json"
    broken.write_text('[{"problem": "a", "answer": "1"},\n {"problem": "b", "answer": }]', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"broken\.json:item 1 \(line 2\): not valid JSON \(Expecting value, "
                                          r"line 2\)"):
        run(broken, "--dataset_type", "deepscaler")
    # parquet: a null answer in row 3 (0-based)
    rows = arithmetic_rows(5)
    cols = _gsm8k_columns(rows)
    cols["answer"][3] = None
    with pytest.raises(ConfigError, match=r"g\.parquet:row 3: key 'answer' must be a string, got null"):
        run(_write_parquet(tmp_path / "g.parquet", cols, row_group_size=2))
    # the wrong --dataset_type for the file's columns: what was expected, what was found, what would fit
    cols = {"problem": [r["problem"] for r in MATH_ROWS], "solution": [r["solution"] for r in MATH_ROWS]}
    with pytest.raises(ConfigError, match=r"m\.parquet: missing key 'question' \(dataset_type=gsm8k reads "
                                          r"'question', 'answer'; the file has 'problem', 'solution'\); "
                                          r"--dataset_type math reads these, or rename with --map_keys "
                                          r"'\{\"question\": \"problem\"\}'"):
        run(_write_parquet(tmp_path / "m.parquet", cols))
    # jsonl: GSM8K rows given to the math type
    with pytest.raises(ConfigError, match=r"t\.jsonl:1: missing key 'problem' \(dataset_type=math reads 'problem', "
                                          r"'solution'; the row has 'question', 'answer'\); --dataset_type gsm8k "
                                          r"reads these"):
        run(write_jsonl(str(tmp_path / "t.jsonl"), arithmetic_rows(2)), "--dataset_type", "math")
    assert not [f for f in os.listdir(tmp_path) if "mindrecord" in f]


def test_parquet_without_pyarrow_says_how_to_get_it(tmp_path, tok_files, monkeypatch):
    src = _write_parquet(tmp_path / "g.parquet", _gsm8k_columns(arithmetic_rows(2)))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ConfigError, match=r"g\.parquet: reading parquet needs pyarrow .*pip install pyarrow"):
        _convert(tok_files, src, tmp_path / "o.mindrecord")


def test_a_json_file_holding_jsonl_and_a_bom(tmp_path, tok_files, tok):
    """Hugging Face writes jsonl under .json too, and Windows editors add a BOM: both read as rows."""
    rows = arithmetic_rows(3)
    src = tmp_path / "train.json"
    src.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(r) for r in rows).encode())
    _convert(tok_files, src, tmp_path / "o.mindrecord", *WIDTHS)
    assert _contents(tok, tmp_path / "o.mindrecord") == _gsm8k_expected(rows)
    arr = tmp_path / "arr.json"
    arr.write_bytes(b"\xef\xbb\xbf " + json.dumps(rows).encode())
    _convert(tok_files, arr, tmp_path / "a.mindrecord", *WIDTHS)
    assert _contents(tok, tmp_path / "a.mindrecord") == _gsm8k_expected(rows)
