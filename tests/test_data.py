"""Tokenizer parity with transformers, jsonl -> MindRecord conversion, bad input, and the sharded reader."""
import json
import os

import numpy as np
import pytest

from data_helpers import TEXT_SAMPLES, arithmetic_rows, make_tokenizer_files, write_jsonl
from mindrlhf.configs import ConfigError
from mindrlhf.data.convert import build_parser, convert
from mindrlhf.data.dataset import PromptDataset
from mindrlhf.data.mindrecord_io import SCHEMA, read_mindrecord, write_mindrecord
from mindrlhf.data.tokenizer import load_qwen2_tokenizer, load_tokenizer


@pytest.fixture(scope="module")
def tok_files(tmp_path_factory):
    return make_tokenizer_files(str(tmp_path_factory.mktemp("tok")))


def test_token_ids_match_transformers_qwen2(tok_files):
    from transformers import Qwen2Tokenizer
    vocab, merges = tok_files
    ours = load_qwen2_tokenizer(vocab, merges)
    ref = Qwen2Tokenizer(vocab=vocab, merges=merges, additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    texts = TEXT_SAMPLES + ["<|im_start|>user\n你好😀<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>x",
                            "   leading and trailing   ", "x = [1, 2, 3]  # code\n\tif x: pass", "1234567890" * 3,
                            "Ａｂｃ full-width + e\u0301 combining"]
    for text in texts:
        got = ours.encode(text)
        assert got == ref(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(got, skip_special_tokens=False) == ref.decode(got, skip_special_tokens=False)
    assert ours.encode_batch(texts) == [ours.encode(t) for t in texts]
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert ours.encode(special) == [ours.token_to_id(special)]


def test_tokenizer_json_directory(tok_files, tmp_path):
    vocab, merges = tok_files
    ours = load_qwen2_tokenizer(vocab, merges)
    ours._tok.save(str(tmp_path / "tokenizer.json"))
    again = load_tokenizer(tokenizer_dir=str(tmp_path))
    assert again.encode("What is 3 + 4?") == ours.encode("What is 3 + 4?")


def test_a_model_folder_without_tokenizer_json_uses_its_vocab_and_merges(tok_files, tmp_path):
    """A folder with a slow tokenizer's files only (Qwen2's vocab.json + merges.txt), as --vocab_path or as
    sft_path_train's folder: what eval already read (and transformers would); eos / pad from its
    tokenizer_config.json. A folder with no tokenizer names what it expected."""
    import shutil
    for f in tok_files:
        shutil.copy(f, tmp_path)
    want = load_qwen2_tokenizer(*tok_files)
    ours = load_tokenizer(str(tmp_path))
    assert ours.encode("What is 3 + 4?") == want.encode("What is 3 + 4?")
    assert (ours.eos_token_id, ours.pad_token_id) == (want.token_to_id("<|im_end|>"), want.token_to_id("<|endoftext|>"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|endoftext|>"}}))
    assert load_tokenizer(tokenizer_dir=str(tmp_path)).eos_token_id == want.token_to_id("<|endoftext|>")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=f"{empty}: holds no tokenizer .expected one of: tokenizer.json; "
                                          r"vocab.json \+ merges.txt; tokenizer.model"):
        load_tokenizer(str(empty))


def test_mismatched_vocab_and_merges(tmp_path, tok_files):
    _, merges = tok_files
    other_vocab, _ = make_tokenizer_files(str(tmp_path), vocab_size=280, extra_texts=["zzzz qqqq"] * 5)
    with pytest.raises(ConfigError, match=r"merges\.txt:\d+: token .* is not in .*vocab\.json"):
        load_qwen2_tokenizer(other_vocab, merges)


def _args(tok_files, src, out, *extra):
    vocab, merges = tok_files
    return build_parser().parse_args(["--vocab_path", vocab, "--merges_file_path", merges, "--file_path", str(src),
                                      "--output_path", str(out), "--no_progress", *extra])


def test_convert_reads_back_exactly(tmp_path, tok_files):
    rows = arithmetic_rows(50)
    src = write_jsonl(str(tmp_path / "train.jsonl"), rows)
    out = tmp_path / "train.mindrecord"
    summary = convert(_args(tok_files, src, out, "--max_prompt_length", "24", "--seq_length", "48"))
    assert summary.rows_written == 50 and summary.prompts_truncated == 0
    table = read_mindrecord(str(out))
    tok = load_qwen2_tokenizer(*tok_files)
    for i, row in enumerate(rows):
        p = tok.encode(row["question"])
        assert table["prompt_length"][i] == len(p)
        assert table["prompt_ids"][i, :len(p)].tolist() == p
        assert (table["prompt_ids"][i, len(p):] == tok.pad_token_id).all()
        assert table["solution"][i] == row["answer"].split("####")[1].strip()
        full = table["pretrain_ids"][i]
        answer = full[table["loss_mask"][i] == 1].tolist()
        assert tok.decode(answer).strip() == row["answer"].strip()
    assert table["prompt_ids"].dtype == np.int64 and table["loss_mask"].shape == (50, 48)


def test_long_prompts_truncated_or_skipped(tmp_path, tok_files):
    rows = arithmetic_rows(10) + [{"question": "word " * 60, "answer": "#### 1"}] * 3
    src = write_jsonl(str(tmp_path / "t.jsonl"), rows)
    s1 = convert(_args(tok_files, src, tmp_path / "a.mindrecord", "--max_prompt_length", "16", "--seq_length", "32"))
    assert (s1.rows_written, s1.prompts_truncated) == (13, 3)
    s2 = convert(_args(tok_files, src, tmp_path / "b.mindrecord", "--max_prompt_length", "16", "--seq_length", "32",
                       "--on_long_prompt", "skip"))
    assert (s2.rows_written, s2.prompts_skipped) == (10, 3)


@pytest.mark.parametrize("lines,pattern", [
    (['{"question": "a", "answer": "#### 1"}', '{"question": "b", "answer": '], r"t\.jsonl:2: not valid JSON"),
    (['{"question": "a", "answer": "#### 1"}', '{"answer": "#### 2"}'], r"t\.jsonl:2: missing key 'question'"),
    (['{"question": "a"}'], r"t\.jsonl:1: missing key 'answer'"),
    ([], r"t\.jsonl: the file has no rows"),
])
def test_bad_jsonl_names_file_and_line(tmp_path, tok_files, lines, pattern):
    src = write_jsonl(str(tmp_path / "t.jsonl"), lines)
    with pytest.raises(ConfigError, match=pattern):
        convert(_args(tok_files, src, tmp_path / "o.mindrecord"))
    assert not [f for f in os.listdir(tmp_path) if "mindrecord" in f]


def test_output_in_missing_directory(tmp_path, tok_files):
    src = write_jsonl(str(tmp_path / "t.jsonl"), arithmetic_rows(3))
    with pytest.raises(ConfigError, match=r"--output_path: the directory .*nope does not exist"):
        convert(_args(tok_files, src, tmp_path / "nope" / "o.mindrecord"))


def _table(n):
    return {"prompt_ids": np.arange(n * 4, dtype=np.int64).reshape(n, 4) + 1,
            "pretrain_ids": np.ones((n, 8), np.int64), "loss_mask": np.zeros((n, 8), np.int64)}


def test_mindrlhf_three_column_file_is_accepted(tmp_path):
    table = _table(6)
    table["prompt_ids"][:, 3] = 0  # right padding
    path = str(tmp_path / "old.mindrecord")
    schema = {k: SCHEMA[k] for k in ("prompt_ids", "pretrain_ids", "loss_mask")}
    write_mindrecord(path, {k: list(v) for k, v in table.items()}, schema)
    ds = PromptDataset(path, batch_size=2, pad_token_id=0, shuffle=False)
    batch = ds.next_batch()
    assert batch["prompt_ids"].tolist() == table["prompt_ids"][:2].tolist()
    assert batch["prompt_length"].tolist() == [3, 3]


def test_dp_shards_are_disjoint_and_cover_the_epoch():
    table = _table(20)
    shards = [PromptDataset("mem", batch_size=2, dp_size=2, dp_rank=r, seed=3, columns=dict(table)) for r in range(2)]
    seen = [np.concatenate([s.next_batch()["row_index"] for _ in range(s.batches_per_epoch)]) for s in shards]
    assert not set(seen[0]) & set(seen[1])
    assert sorted(np.concatenate(seen).tolist()) == list(range(20))


def test_epochs_differ_and_resume_continues_exactly():
    table = _table(12)
    ds = PromptDataset("mem", batch_size=3, seed=5, columns=dict(table))
    assert not np.array_equal(ds.epoch_rows(0), ds.epoch_rows(1))
    taken = [ds.next_batch()["row_index"] for _ in range(5)]    # crosses into epoch 1
    state = ds.state_dict()
    rest = [ds.next_batch()["row_index"] for _ in range(4)]
    resumed = PromptDataset("mem", batch_size=3, seed=5, columns=dict(table))
    resumed.load_state_dict(state)
    assert [resumed.next_batch()["row_index"].tolist() for _ in range(4)] == [r.tolist() for r in rest]
    assert state == {"epoch": 1, "index": 1} and len(taken) == 5


def test_llama_sentencepiece_tokenizer(tmp_path):
    import sentencepiece as spm
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(["the cat sat on the mat", "What is 12 + 7? The answer is 19.", "hello world"] * 50))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "sp"), vocab_size=60,
                                   model_type="bpe", bos_id=1, eos_id=2, unk_id=0, pad_id=-1, minloglevel=2)
    ours = load_tokenizer(str(tmp_path / "sp.model"))
    texts = ["the cat sat", "What is 12 + 7?", "hello world"]
    assert ours.encode_batch(texts) == [ours.encode(t) for t in texts]
    for t in texts:
        assert ours.decode(ours.encode(t)) == t
        assert 0 not in ours.encode(t)            # in-vocabulary text never maps to <unk>
    assert ours.eos_token_id == 2 and ours.pad_token_id == 2 and ours.vocab_size == 60
    with pytest.raises(ConfigError, match="not a sentencepiece model"):
        (tmp_path / "bad.model").write_bytes(b"garbage")
        load_tokenizer(str(tmp_path / "bad.model"))


def _read_all(path, schema):
    from mindspore.mindrecord import FileReader
    reader = FileReader(path)
    rows = [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()} for r in reader.get_next()]
    reader.close()
    return rows


def test_serialised_writer_matches_filewriter_rows(tmp_path, monkeypatch):
    """The pre-serialised fast path writes the same rows FileWriter's own per-row path writes, for the
    prompt schema and for a schema with one blob field; ragged arrays fall back to the per-row path."""
    import mindrlhf.data.mindrecord_io as mio
    rng = np.random.default_rng(0)
    n = 37
    table = {"prompt_ids": rng.integers(0, 1000, (n, 5)), "pretrain_ids": rng.integers(0, 1000, (n, 9)),
             "loss_mask": rng.integers(0, 2, (n, 9)), "prompt_length": rng.integers(0, 5, n),
             "solution": [f"ans {i} ✓" for i in range(n)]}
    one_blob = {"prompt_ids": SCHEMA["prompt_ids"], "solution": SCHEMA["solution"]}
    ragged = {"prompt_ids": [np.arange(i % 4 + 1) for i in range(n)], "solution": table["solution"]}
    calls = []
    real = mio._write_serialised
    monkeypatch.setattr(mio, "_write_serialised", lambda *a: calls.append(real(*a)) or calls[-1])
    for name, schema, cols in (("full", SCHEMA, table), ("one", one_blob, table), ("ragged", one_blob, ragged)):
        cols = {k: cols[k] for k in schema}
        fast, slow = str(tmp_path / f"{name}_fast.mindrecord"), str(tmp_path / f"{name}_slow.mindrecord")
        calls.clear()
        write_mindrecord(fast, cols, schema, batch_rows=16)
        assert calls == [name != "ragged"] * 3
        monkeypatch.setattr(mio, "_write_serialised", lambda *a: False)
        write_mindrecord(slow, cols, schema, batch_rows=16)
        monkeypatch.setattr(mio, "_write_serialised", lambda *a: calls.append(real(*a)) or calls[-1])
        got, want = _read_all(fast, schema), _read_all(slow, schema)
        assert len(got) == n and got == want
        assert got[3]["solution"] == table["solution"][3]
    from mindspore.mindrecord import FileWriter
    writer = FileWriter(str(tmp_path / "dtype.mindrecord"), shard_num=1, overwrite=True)
    writer.add_schema(one_blob, "x")
    floats = {"prompt_ids": np.ones((4, 3), np.float64), "solution": ["a"] * 4}
    assert real(writer, floats, one_blob, 0, 4) is False      # left to FileWriter's own dtype check


def test_atomic_files_are_fsynced_before_the_rename(tmp_path, monkeypatch):
    import os
    from mindrlhf.utils.atomic import write_json
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a))), real_replace(a, b))[1])
    write_json(str(tmp_path / "state.json"), {"step": 3})
    kinds = [(k, os.path.basename(p)) for k, p in events]
    tmp = next(p for k, p in kinds if k == "replace")
    assert kinds.index(("fsync", tmp)) < kinds.index(("replace", tmp))        # data on disk before the name
    assert kinds[-1] == ("fsync", os.path.basename(str(tmp_path)))              # and the rename itself


def test_mindrecord_pair_is_never_mixed(tmp_path, monkeypatch):
    """A crash between the two renames leaves no file rather than a new file beside an old .db."""
    import os
    from mindrlhf.data.mindrecord_io import write_mindrecord
    schema = {"step": {"type": "int64"}, "text": {"type": "string"}}
    path = str(tmp_path / "log.mindrecord")
    write_mindrecord(path, {"step": [1], "text": ["old"]}, schema)
    real_replace, calls = os.replace, []

    def dying_replace(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed between the renames")
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        write_mindrecord(path, {"step": [1, 2], "text": ["new", "newer"]}, schema)
    monkeypatch.setattr(os, "replace", real_replace)
    assert not os.path.exists(path)
    from mindrlhf.data.mindrecord_io import read_columns
    write_mindrecord(path, {"step": [1, 2], "text": ["new", "newer"]}, schema)
    assert read_columns(path, ["text"])["text"] == ["new", "newer"]


@pytest.mark.parametrize("row,pattern", [
    ({"question": "a", "answer": "x\n#### "}, r"t\.jsonl:1: the final answer after '####' is empty"),
    ({"question": "a", "answer": "x\n####"}, r"t\.jsonl:1: the final answer after '####' is empty"),
])
def test_empty_reference_answers_are_refused_at_conversion(tmp_path, tok_files, row, pattern):
    src = write_jsonl(str(tmp_path / "t.jsonl"), [json.dumps(row)])
    with pytest.raises(ConfigError, match=pattern):
        convert(_args(tok_files, src, tmp_path / "o.mindrecord"))


def test_empty_solutions_are_refused_at_load(tmp_path):
    from mindrlhf.data.dataset import PromptDataset
    table = dict(_table(4), prompt_length=np.full(4, 4, np.int64), solution=np.array(["1", "2", "", "4"], object))
    with pytest.raises(ConfigError, match=r"p\.mindrecord: 1 row\(s\) have an empty solution, first at row 2"):
        PromptDataset(str(tmp_path / "p.mindrecord"), 2, columns=table)


def test_non_utf8_jsonl_names_file_and_line(tmp_path, tok_files):
    src = tmp_path / "t.jsonl"
    src.write_bytes(b'{"question": "a", "answer": "#### 1"}\n{"question": "\xff\xfe", "answer": "#### 2"}\n')
    with pytest.raises(ConfigError, match=r"t\.jsonl:2: not UTF-8"):
        convert(_args(tok_files, str(src), tmp_path / "o.mindrecord"))


def test_a_template_file_with_literal_braces(tmp_path, tok_files):
    """A template file may hold braces (\\boxed{}); only {question} is filled in."""
    from mindrlhf.data.convert import resolve_template
    path = tmp_path / "tpl.txt"
    path.write_text("Put the answer in \\boxed{}. Q: {question}\nA:")
    assert resolve_template(str(path))("1+1?") == "Put the answer in \\boxed{}. Q: 1+1?\nA:"


def _array_bytes(obj) -> int:
    """Bytes of the numpy arrays an object keeps (in its attributes, dicts and lists, one level each)."""
    total = 0
    for value in vars(obj).values():
        for item in (value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]):
            total += item.nbytes if isinstance(item, np.ndarray) else 0
    return total


def _wide_file(path, n=64, prompt=8, seq=2048, columns=tuple(SCHEMA)):
    """A prompt MindRecord whose pretrain_ids/loss_mask dwarf the prompt columns (as at seq_length 8192);
    the answer part of row i is the tokens [10 + i, 7]."""
    prompt_ids = np.zeros((n, prompt), np.int64)
    prompt_ids[:, :3] = 5
    pretrain = np.zeros((n, seq), np.int64)
    mask = np.zeros((n, seq), np.int64)
    pretrain[:, :3], pretrain[:, 3], pretrain[:, 4] = 5, 10 + np.arange(n), 7
    mask[:, 3:5] = 1
    table = {"prompt_ids": prompt_ids, "pretrain_ids": pretrain, "loss_mask": mask,
             "prompt_length": np.full(n, 3, np.int64), "solution": [str(i) for i in range(n)]}
    write_mindrecord(path, {k: table[k] for k in columns}, {k: SCHEMA[k] for k in columns})
    return n * prompt * 8


def test_the_reader_keeps_only_the_prompt_columns(tmp_path):
    """GRPO never reads pretrain_ids/loss_mask: a rank must not hold them (~29 GB for 220k rows at 8192)."""
    path = str(tmp_path / "wide.mindrecord")
    prompt_bytes = _wide_file(path)
    ds = PromptDataset(path, batch_size=4, pad_token_id=0)
    assert sorted(ds.table) == ["prompt_ids", "prompt_length", "solution"]
    assert _array_bytes(ds) <= 2 * prompt_bytes          # prompt_ids, prompt_length, the solutions' pointers
    assert ds.next_batch()["prompt_ids"].shape == (4, 8)
    assert read_mindrecord(path)["pretrain_ids"].shape == (64, 2048)     # the SFT warm-up still reads them all


def test_three_column_solutions_are_recovered_a_chunk_at_a_time(tmp_path, monkeypatch):
    """A MindRLHF file's solutions come from the answer part of pretrain_ids, read in chunks and dropped:
    only the solution strings stay."""
    import mindrlhf.data.dataset as dataset_module
    path = str(tmp_path / "old.mindrecord")
    prompt_bytes = _wide_file(path, columns=("prompt_ids", "pretrain_ids", "loss_mask"))
    monkeypatch.setattr(dataset_module, "ANSWER_CHUNK_ROWS", 10)
    ds = PromptDataset(path, batch_size=4, pad_token_id=0)
    calls = []

    def decode(rows):
        calls.append(len(rows))
        return [" ".join(map(str, r)) for r in rows]

    ds.recover_solutions(decode, lambda text: text.split()[0])
    assert ds.table["solution"].tolist() == [str(10 + i) for i in range(64)]
    assert sum(calls) == 64 and max(calls) <= 10
    assert "pretrain_ids" not in ds.table and _array_bytes(ds) <= 2 * prompt_bytes


def _convert_peak(tmp_path, tok_files, n, name):
    import tracemalloc
    src = write_jsonl(str(tmp_path / f"{name}.jsonl"), arithmetic_rows(n))
    tracemalloc.start()
    try:
        convert(_args(tok_files, src, tmp_path / f"{name}.mindrecord", "--max_prompt_length", "24",
                      "--seq_length", "512"))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_conversion_holds_a_bounded_number_of_rows(tmp_path, tok_files, monkeypatch):
    """rlhf_data.py streams: the jsonl is read line by line and rows go to the file a write batch at a
    time, so four times the rows does not take four times the memory (whole arrays: n x 512 x 16 bytes)."""
    import mindrlhf.data.convert as convert_module
    monkeypatch.setattr(convert_module, "TOKENIZE_ROWS", 64)
    monkeypatch.setattr(convert_module, "WRITE_BATCH_ROWS", 64)
    warm = write_jsonl(str(tmp_path / "warm.jsonl"), arithmetic_rows(3))
    convert(_args(tok_files, warm, tmp_path / "warm.mindrecord"))
    small = _convert_peak(tmp_path, tok_files, 400, "small")      # (after one-off imports and set-up)
    large = _convert_peak(tmp_path, tok_files, 1600, "large")
    assert large < 1.5 * small, (small, large)


def test_streamed_conversion_writes_what_one_whole_table_write_does(tmp_path, tok_files, monkeypatch):
    """Rows reach MindRecord in the same write batches as write_mindrecord's: the bytes are the same (the
    page layout depends on the batches), here over several batches and pages and a skipped row."""
    import mindrlhf.data.convert as convert_module
    monkeypatch.setattr(convert_module, "TOKENIZE_ROWS", 7)
    monkeypatch.setattr(convert_module, "WRITE_BATCH_ROWS", 16)
    rows = arithmetic_rows(120)
    rows[20] = {"question": "word " * 60, "answer": "#### 1"}
    src = write_jsonl(str(tmp_path / "t.jsonl"), rows)
    out = str(tmp_path / "streamed.mindrecord")
    summary = convert(_args(tok_files, src, out, "--max_prompt_length", "24", "--seq_length", "8192",
                            "--on_long_prompt", "skip"))             # 128 KB rows: several 1 MB pages
    assert (summary.rows_in, summary.rows_written) == (120, 119)
    os.mkdir(tmp_path / "whole")
    whole = str(tmp_path / "whole" / "streamed.mindrecord")    # the header names the file: the same name
    write_mindrecord(whole, read_mindrecord(out), SCHEMA, index_fields=["prompt_length"], batch_rows=16)
    for suffix in ("", ".db"):
        with open(out + suffix, "rb") as a, open(whole + suffix, "rb") as b:
            assert a.read() == b.read(), suffix


def test_an_empty_or_damaged_prompt_mindrecord_is_named(tmp_path):
    """A MindRecord with no rows, or one cut short or overwritten in the middle, stops with the file named."""
    from mindspore.mindrecord import FileWriter
    empty = str(tmp_path / "empty.mindrecord")
    writer = FileWriter(empty, shard_num=1, overwrite=True)
    writer.add_schema({"prompt_ids": {"type": "int64", "shape": [-1]}, "pretrain_ids": {"type": "int64", "shape": [-1]},
                       "loss_mask": {"type": "int64", "shape": [-1]}}, "empty")
    writer.commit()
    with pytest.raises(ConfigError, match=r"empty\.mindrecord: the MindRecord has no rows"):
        PromptDataset(empty, batch_size=1)
    good = str(tmp_path / "good.mindrecord")
    write_mindrecord(good, _table(40), {k: v for k, v in SCHEMA.items() if k in _table(1)})
    size = os.path.getsize(good)
    with open(good, "r+b") as fh:              # cut short: the tail of the data pages is gone
        fh.truncate(size // 2)
    with pytest.raises(ConfigError, match=r"good\.mindrecord: MindSpore cannot read this MindRecord .*Failed to read"):
        PromptDataset(good, batch_size=1)
