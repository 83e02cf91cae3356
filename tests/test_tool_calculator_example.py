"""examples/grpo/tool_calculator: its data, its chat template, and the token-in / token-out match between the
conversations SFT trains on and the episodes GRPO rolls out (a mismatch would train one token sequence and
sample another). Uses SmolLM2's real tokenizer (the 2-layer slice of tests/test_real_model.py)."""
import json
import os
import sys

import pytest

from msrun_util import REPO
from mindrlhf.data.chat_template import ChatTemplate
from mindrlhf.data.tokenizer import load_tokenizer
from mindrlhf.reward.verifiers import accuracy_reward
from mindrlhf.tools.registry import CODE_INTERPRETER_SCHEMA

EXAMPLE = os.path.join(REPO, "examples", "grpo", "tool_calculator")
sys.path.insert(0, EXAMPLE)
import make_data  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from test_real_model import smollm2
    out = str(tmp_path_factory.mktemp("tool_calculator"))
    make_data.main([out, "--model", smollm2(2), "--train", "300", "--test", "60", "--sft", "40"])
    return out


def _rows(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _pair(question):
    nums = [int(w) for w in question.replace("?", " ").replace(".", " ").split() if w.isdigit()]
    return tuple(sorted(nums))


def test_held_out_pairs_never_occur_in_training(data):
    test = {_pair(r["question"]) for r in _rows(os.path.join(data, "test.jsonl"))}
    seen = {_pair(r["question"]) for r in _rows(os.path.join(data, "train.jsonl"))}
    seen |= {_pair(r["messages"][1]["content"]) for r in _rows(os.path.join(data, "sft.jsonl"))}
    assert len(test) > 40 and not test & seen
    for r in _rows(os.path.join(data, "test.jsonl")):
        a, b = _pair(r["question"])
        assert 11 <= a <= 99 and 100 <= b <= 999
        assert accuracy_reward(r["answer"], str(a * b)) == 1.0


def test_sft_conversations_call_the_interpreter_and_answer_its_result(data):
    from mindrlhf.tools import CodeInterpreter
    for row in _rows(os.path.join(data, "sft.jsonl"))[:3]:
        assert row["tools"] == [CODE_INTERPRETER_SCHEMA]
        call = row["messages"][2]["tool_calls"][0]["function"]
        result = CodeInterpreter()(**call["arguments"])             # the sandbox, as an episode runs it
        assert str(result) == row["messages"][3]["content"]
        assert accuracy_reward(row["messages"][4]["content"], result.strip()) == 1.0


def test_template_renders_as_transformers(data):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.join(data, "model"))
    ours = ChatTemplate(os.path.join(data, "model"))
    row = _rows(os.path.join(data, "sft.jsonl"))[0]
    for n, gen in ((2, True), (5, False)):
        assert ours.render(row["messages"][:n], tools=row["tools"], add_generation_prompt=gen) == \
            tok.apply_chat_template(row["messages"][:n], tools=row["tools"], tokenize=False, add_generation_prompt=gen)


def test_episode_tokens_are_the_sft_conversations_tokens(data):
    """prompt + the model's call + the tool turn the episode appends + the answer = the SFT row, token by token."""
    folder = os.path.join(data, "model")
    template, tokenizer = ChatTemplate(folder), load_tokenizer(tokenizer_dir=folder)
    for row in _rows(os.path.join(data, "sft.jsonl"))[:5]:
        msgs, tools = row["messages"], row["tools"]
        whole = tokenizer.encode(template.render(msgs, tools=tools, add_generation_prompt=False))
        call = template.render(msgs[:3], tools=tools, add_generation_prompt=False)
        call = call[len(template.render(msgs[:2], tools=tools)):-len("<|im_end|>\n")]
        assert call.startswith("<tool_call>\n") and call.endswith("</tool_call>")
        pieces = [template.render(msgs[:2], tools=tools), call, template.tool_delta([msgs[3]]),
                  msgs[4]["content"] + "<|im_end|>\n"]
        assert sum((tokenizer.encode(p) for p in pieces), []) == whole


@pytest.mark.slow          # ~2 min: the README's commands, scaled down, on the 2-layer slice
def test_readme_commands_run_end_to_end(tmp_path):
    """make_data -> SFT -> rlhf_data with the tools -> GRPO with the interpreter -> eval, as README.md runs them."""
    import subprocess
    from test_real_model import smollm2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    d, tools = str(tmp_path), os.path.join(EXAMPLE, "tools.py")
    system = make_data.SYSTEM_PROMPT

    def run(*args):
        out = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return out.stdout

    run(os.path.join(EXAMPLE, "make_data.py"), f"{d}/data", "--model", smollm2(2), "--train", "16", "--test", "8",
        "--sft", "8")
    run("-m", "mindrlhf.sft", "--model", f"{d}/data/model", "--dataset", f"{d}/data/sft.jsonl", "--output_dir",
        f"{d}/sft", "--max_length", "320", "--batch_size", "4", "--total_steps", "2", "--lr", "2e-5")
    for s in ("train", "test"):
        run(os.path.join(REPO, "examples/grpo/qwen_grpo_tutorial/rlhf_data.py"), "--vocab_path", f"{d}/sft/hf_policy",
            "--file_path", f"{d}/data/{s}.jsonl", "--output_path", f"{d}/data/{s}.mindrecord", "--prompt_template",
            "chat", "--system_prompt", system, "--tool_module", tools, "--max_prompt_length", "224",
            "--seq_length", "320")
    run(os.path.join(REPO, "examples/grpo/qwen_grpo_tutorial/grpo_one_stage.py"), "--config",
        os.path.join(EXAMPLE, "grpo_config.yaml"), "--sft_path_train", f"{d}/sft/hf_policy", "--mind_dataset_dir",
        f"{d}/data/train.mindrecord", "--eval_dataset", f"{d}/data/test.mindrecord", "--save_ckpt_dir", f"{d}/run",
        "--total_steps", "1", "--save_steps", "1", "--eval_steps", "0", "--batch_size", "2", "--num_generations", "2",
        "--micro_batch_size", "4", "--progress", "False")
    rows = _rows(f"{d}/run/metrics.jsonl")
    assert rows[-1]["step"] == 1 and "tools/code_interpreter/calls" in rows[-1]
    out = run("-m", "mindrlhf.eval", "--model", f"{d}/run/hf_policy", "--dataset", f"{d}/data/test.jsonl",
              "--prompt_template", "chat", "--system_prompt", system, "--max_prompt_length", "224", "--max_tokens",
              "96", "--max_tool_calls", "2", "--tool_module", tools, "--limit", "4", "--progress", "false")
    assert json.loads(out.strip().splitlines()[-1])["prompts"] == 4
