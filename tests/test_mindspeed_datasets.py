"""MindSpeed-RL's dataset YAMLs (configs/datasets/*.yaml, copies in fixtures/upstream/mindspeed/shipped/datasets)
as rlhf_data.py --config: each shipped file converts a tiny input (paths as the file gives them, from the
current directory) or is refused by name; prompts are rendered with templates.json as MindSpeed-RL renders them
(text hand-written here, ids encoded piece by piece as its Template._encode does); flags win over the file."""
import json
import os
import re
import shutil

import pytest
import yaml

from data_helpers import make_tokenizer_files
from mindrlhf.configs import ConfigError
from mindrlhf.configs.compat import mindspeed_data
from mindrlhf.data.convert import main, parse_args, resolve_template
from mindrlhf.data.mindrecord_io import read_mindrecord
from mindrlhf.data.tokenizer import load_qwen2_tokenizer, load_tokenizer

SHIPPED = os.path.join(os.path.dirname(__file__), "fixtures", "upstream", "mindspeed", "shipped")
DATASETS = os.path.join(SHIPPED, "datasets")
TEMPLATES = os.path.join(SHIPPED, "model", "templates.json")
WIDTHS = ["--max_prompt_length", "700", "--seq_length", "900", "--no_progress"]

R1_INSTRUCTION = ("A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
                  "The assistant first thinks about the reasoning process in the mind and then provides the user "
                  "with the answer. The reasoning process and answer are enclosed within <think> </think> and "
                  "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think><answer> "
                  "answer here </answer>. Put your final answer within \\boxed{}.\n")
DEEPSCALER_ROWS = [{"problem": "What is 2 + 3?", "answer": "5", "solution": "2 + 3 = 5"},
                   {"problem": "Let x = 4. Find 2x.", "answer": "8"}]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A Hugging Face-style tokenizer folder (tokenizer.json + tokenizer_config.json), as tokenizer_name_or_path."""
    root = tmp_path_factory.mktemp("tok")
    vocab, merges = make_tokenizer_files(str(root / "bpe"))
    folder = root / "qwen"
    folder.mkdir()
    load_qwen2_tokenizer(vocab, merges)._tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
                                                             "pad_token": "<|endoftext|>"}))
    return str(folder)


@pytest.fixture(scope="module")
def tok(tok_dir):
    return load_tokenizer(tok_dir)


@pytest.fixture
def workdir(tmp_path, monkeypatch, tok_dir):
    """The layout the shipped files name: ./dataset/ and ./model_from_hf/<model>, as run from a checkout."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dataset").mkdir()
    for name in ("qwen25-7b", "Qwen3"):
        shutil.copytree(tok_dir, tmp_path / "model_from_hf" / name)
    return tmp_path


def _rows(tok, path):
    """(prompt text with special tokens, prompt ids, answer text, solution) per written row."""
    table = read_mindrecord(str(path))
    out = []
    for i, solution in enumerate(table["solution"]):
        n = int(table["prompt_length"][i])
        ids = table["prompt_ids"][i, :n].tolist()
        answer = tok.decode(table["pretrain_ids"][i][table["loss_mask"][i] == 1].tolist())
        out.append((tok.decode(ids, skip_special_tokens=False), ids, answer.strip(), solution))
    return out


def _mindspeed_ids(tok, pieces):
    """MindSpeed-RL's Template._convert_elements_to_ids: each piece encoded alone, the ids joined."""
    return [i for piece in pieces if piece for i in tok.encode(piece)]


def _yaml(tmp_path, name, **edits):
    """A shipped file with keys changed (None removes one), written beside a model/templates.json as upstream."""
    with open(os.path.join(DATASETS, name)) as fh:
        doc = yaml.safe_load(fh)
    for key, value in edits.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    folder = tmp_path / "configs" / "datasets"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(os.path.dirname(TEMPLATES), tmp_path / "configs" / "model", dirs_exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


# ------------------------------------------------------------------------------------------- templates.json

@pytest.mark.parametrize("prompt_type,expected", [
    ("qwen_r1", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n" + R1_INSTRUCTION +
     "What is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen_math_r1", "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}."
                     "<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen3", "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ("empty", "What is 2 + 3?"),
    ("default", "Human: What is 2 + 3?\nAssistant:"),
    ("deepseek3", "<BOS><\uff5cUser\uff5c>What is 2 + 3?<\uff5cAssistant\uff5c>"),
])
def test_templates_render_as_mindspeed(prompt_type, expected, tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<BOS>"}))
    render = resolve_template(None, str(tmp_path), prompt_type=prompt_type, prompt_type_path=TEMPLATES)
    assert render("What is 2 + 3?") == expected


def test_template_details(tmp_path):
    render = resolve_template(None, "", prompt_type="qwen3", prompt_type_path=TEMPLATES, enable_thinking=True)
    assert render("q") == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    thinking_off = resolve_template(None, "", prompt_type="qwen3", prompt_type_path=TEMPLATES)
    assert thinking_off("q", "<think>a</think> 5").endswith("assistant\n")   # the answer's own thought: none added
    # no bos token in the tokenizer: the ["bos_token"] slot adds nothing (MindSpeed-RL checks bos_token_id)
    assert resolve_template(None, "", prompt_type="trl", prompt_type_path=TEMPLATES)("q") == "q"
    assert resolve_template(None, "", "Be brief.", prompt_type="qwen", prompt_type_path=TEMPLATES)("q") == \
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ConfigError, match=r"enable_thinking: template 'qwen_r1' has no thinking switch"):
        resolve_template(None, "", prompt_type="qwen_r1", prompt_type_path=TEMPLATES, enable_thinking=False)
    with pytest.raises(ConfigError, match=r"prompt_type 'qwen9' is not in .*templates\.json \(it has default, "):
        resolve_template(None, "", prompt_type="qwen9", prompt_type_path=TEMPLATES)
    with pytest.raises(ConfigError, match=r"--prompt_type qwen_r1 and --prompt_template chat: give one of them"):
        resolve_template("chat", "", prompt_type="qwen_r1", prompt_type_path=TEMPLATES)


# ------------------------------------------------------------------------------------------- the shipped files

def test_deepscaler_yaml_converts_as_mindspeed(workdir, tok, capsys):
    (workdir / "dataset" / "deepscaler.json").write_text(json.dumps(DEEPSCALER_ROWS))
    assert main(["--config", os.path.join(DATASETS, "deepscaler.yaml"), *WIDTHS]) == 0
    out = capsys.readouterr().out
    assert "ignored in " + os.path.join(DATASETS, "deepscaler.yaml") + ": workers (how many processes" in out
    assert "log_interval (progress logging" in out
    rows = _rows(tok, workdir / "dataset" / "data")       # written at output_prefix itself
    assert os.path.isfile(workdir / "dataset" / "data.db")
    system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    for (text, ids, answer, solution), row in zip(rows, DEEPSCALER_ROWS):
        user = f"<|im_start|>user\n{R1_INSTRUCTION}{row['problem']}<|im_end|>\n<|im_start|>assistant\n"
        assert text == system + user
        assert ids == _mindspeed_ids(tok, [system, user])
        assert solution == row["answer"] and answer == row["answer"]   # the response column, whole (no worked answer)
    assert len(rows) == 2


def test_math_17k_yaml_converts_as_mindspeed(workdir, tok):
    import pyarrow as pa
    import pyarrow.parquet as pq
    prompts = ["Solve 1 + 1. Answer: $Answer", "Compute 3 * 3."]
    pq.write_table(pa.table({
        "data_source": ["math_dapo"] * 2,
        "prompt": [[{"role": "user", "content": p}] for p in prompts],
        "ability": ["MATH"] * 2,
        "reward_model": [{"ground_truth": "2", "style": "rule"}, {"ground_truth": "9", "style": "rule"}],
    }), str(workdir / "dataset" / "dapo-math-17k.parquet"))
    assert main(["--config", os.path.join(DATASETS, "math_17k.yaml"), *WIDTHS]) == 0
    rows = _rows(tok, workdir / "dataset" / "data")
    assert [(r[0], r[1], r[3]) for r in rows] == [(p, tok.encode(p), s) for p, s in zip(prompts, ["2", "9"])]


def test_orca_rlhf_yaml_is_refused_by_name(workdir, capsys):
    path = os.path.join(DATASETS, "orca_rlhf.yaml")
    assert main(["--config", path, *WIDTHS]) == 2
    out = capsys.readouterr().out
    assert f"error: {path}: handler_name: 'AlpacaStylePairwiseHandler' is not supported (chosen / rejected pairs" in out
    assert "R1AlpacaStyleInstructionHandler or Math17kAlpacaStyleInstructionHandler" in out


def test_qwen3_thinking_seq_length_and_a_query_column(workdir, tok, tmp_path, capsys):
    """orca_rlhf's qwen3 / enable_thinking / seq_length keys on the GRPO handler: thinking on means no empty
    thought; a prompt whose ids reach seq_length is dropped; the query column is joined by a newline."""
    rows = [{"q": "Add 1 and 2.", "ctx": "Use integers.", "a": "3"}, {"q": "word " * 200, "ctx": "", "a": "1"}]
    with open(workdir / "dataset" / "rows.jsonl", "w") as fh:
        fh.write("\n".join(json.dumps(r) for r in rows))
    path = _yaml(tmp_path, "orca_rlhf.yaml", handler_name="R1AlpacaStyleInstructionHandler",
                 input="./dataset/rows.jsonl", map_keys={"prompt": "q", "query": "ctx", "response": "a", "system": ""},
                 seq_length=64)
    assert main(["--config", path, "--no_progress"]) == 0
    out = capsys.readouterr().out
    assert "--max_prompt_length 63 --on_long_prompt skip --seq_length 127" in out
    got = _rows(tok, workdir / "dataset" / "dpo")
    user = "<|im_start|>user\nAdd 1 and 2.\nUse integers.<|im_end|>\n<|im_start|>assistant\n"
    assert [(r[0], r[1], r[3]) for r in got] == [(user, tok.encode(user), "3")]
    assert "prompts > max_prompt_length: 0 truncated, 1 skipped" in out


def test_flags_win_over_the_file(workdir, tok, tmp_path, capsys):
    (workdir / "dataset" / "deepscaler.json").write_text(json.dumps(DEEPSCALER_ROWS))
    other = tmp_path / "elsewhere.jsonl"
    other.write_text(json.dumps({"problem": "Is 7 prime?", "answer": "yes"}) + "\n")
    out_path = tmp_path / "mine.mindrecord"
    assert main(["--config", os.path.join(DATASETS, "deepscaler.yaml"), "--file_path", str(other),
                 "--output_path", str(out_path), "--prompt_type", "qwen_math_r1", *WIDTHS]) == 0
    assert "the command line's --file_path, --output_path, --prompt_type win over the file" in capsys.readouterr().out
    assert not os.path.exists(workdir / "dataset" / "data")
    [(text, _, _, solution)] = _rows(tok, out_path)
    assert text.endswith("<|im_start|>user\nIs 7 prime?<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\nPlease reason step by step") and solution == "yes"


def test_the_yaml_alone_gives_paths_and_hyphenated_keys_work(tmp_path, tok_dir):
    """MindSpeed-RL's own test file spells keys with '-' (tests/st/datasets/test_orca_rlhf.yaml)."""
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump({"input": "in.jsonl", "tokenizer-name-or-path": tok_dir, "output-prefix": "o",
                                    "handler_name": "R1AlpacaStyleInstructionHandler", "prompt-type": "qwen",
                                    "prompt_type_path": TEMPLATES}))
    args = parse_args(["--config", str(path)])
    assert (args.file_path, args.vocab_path, args.output_path, args.dataset_type, args.prompt_type) == \
        ("in.jsonl", tok_dir, "o", "alpaca", "qwen")


@pytest.mark.parametrize("edits,pattern", [
    ({"shuffle_rows": True}, r"deepscaler\.yaml: shuffle_rows: not a key of MindSpeed-RL's dataset YAML"),
    ({"map_keys": {"prompt": "problem", "response": "answer", "system": "sys"}},
     r"deepscaler\.yaml: map_keys\.system: 'sys' is not supported \(a system column per row is not read"),
    ({"map_keys": {"prompt": "problem", "label": "x"}}, r"map_keys\.label: not one of MindSpeed-RL's columns"),
    ({"tokenizer_type": "PretrainedFromHF"}, r"deepscaler\.yaml: tokenizer_type: 'PretrainedFromHF' is not supported "
                                             r"\(we implement HuggingFaceTokenizer\)"),
    ({"dataset_additional_keys": ["labels", "level"]}, r"dataset_additional_keys: \['labels', 'level'\] is not "
                                                       r"supported"),
    ({"pack": True}, r"deepscaler\.yaml: pack: True is not supported"),
    ({"handler_name": None}, r"handler_name: required"),
    ({"handler_name": "AlpacaStyleInstructionHandler"}, r"'AlpacaStyleInstructionHandler' is not supported \(SFT data"),
    ({"prompt_type": "qwen_r2"}, r"prompt_type 'qwen_r2' is not in .*configs/model/templates\.json"),
])
def test_keys_we_cannot_honour_are_named(workdir, tmp_path, edits, pattern, capsys):
    (workdir / "dataset" / "deepscaler.json").write_text(json.dumps(DEEPSCALER_ROWS))
    assert main(["--config", _yaml(tmp_path, "deepscaler.yaml", **edits), *WIDTHS]) == 2
    assert re.search(pattern, capsys.readouterr().out)


def test_templates_json_is_looked_for_beside_the_yaml(tmp_path, workdir, capsys):
    path = tmp_path / "deepscaler.yaml"
    shutil.copy(os.path.join(DATASETS, "deepscaler.yaml"), path)
    (workdir / "dataset" / "deepscaler.json").write_text(json.dumps(DEEPSCALER_ROWS))
    assert main(["--config", str(path), *WIDTHS]) == 2
    want = os.path.normpath(str(tmp_path / ".." / "model" / "templates.json"))
    assert f"the templates file {want} does not exist" in capsys.readouterr().out
    assert main(["--config", str(path), "--prompt_type_path", TEMPLATES, *WIDTHS]) == 0


def test_every_key_has_a_status_and_the_docs_table_lists_it():
    text = mindspeed_data.table_markdown()
    for key in ("input", "map_keys", "prompt_type", "workers", "tokenizer_not_use_fast", "pack", "seq_length"):
        assert f"| `{key}` |" in text
