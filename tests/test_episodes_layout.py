"""A multi-turn GRPO run's trajectory does not depend on the layout: single process against train tp2 /
infer dp2 and train pp2 (two pipeline stages, 1F1B) / infer dp2 (2 msrun workers; untied embeddings, as stages
need). Every sample's first turn is a tool call (tests/workers/episode_worker.py forces
those tokens), the tool answers, the model continues from the KV cache; rewards, losses, KL, gradient norms
and the tool counters agree as tests/test_layout_invariance.py's do."""
import json
import os
import subprocess
import sys

import mindspore as ms
import pytest

from data_helpers import arithmetic_rows, make_tokenizer_files, write_jsonl
from grpo_helpers import TEST_DEFAULTS, cli_args, model_yaml
from msrun_util import REPO, run_msrun
from test_episodes import CHATML_TOOLS
from mindrlhf.checkpoint.model_io import model_state, save_checkpoint
from mindrlhf.configs import load_model_yaml
from mindrlhf.data.convert import build_parser, convert
from mindrlhf.data.tokenizer import load_tokenizer
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.trainer.metrics import read_metrics

pytestmark = pytest.mark.msrun
WORKER = os.path.join(REPO, "tests", "workers", "episode_worker.py")
COMPARED = ("reward_mean", "loss", "pg_loss", "kl", "grad_norm", "entropy", "response_len_mean", "tokens_generated",
            "episode/tool_calls_mean", "episode/tool_tokens_mean", "tools/inc/calls", "tools/inc/errors")
ABS_TOL = {"kl": 1e-7, "loss": 1e-6, "pg_loss": 1e-6}


@pytest.mark.slow       # ~75 s on 2 msrun workers; keeps the default run near 20 minutes
def test_multi_turn_trajectory_is_layout_invariant(tmp_path, monkeypatch):
    root = str(tmp_path)
    vocab, merges = make_tokenizer_files(os.path.join(root, "tok"), vocab_size=400)
    with open(os.path.join(root, "tok", "chat_template.jinja"), "w") as fh:
        fh.write(CHATML_TOOLS)
    src = write_jsonl(os.path.join(root, "train.jsonl"), arithmetic_rows(32, seed=3))
    data = os.path.join(root, "train.mindrecord")
    convert(build_parser().parse_args(["--vocab_path", vocab, "--merges_file_path", merges, "--file_path", src,
                                       "--output_path", data, "--max_prompt_length", "16", "--seq_length", "48",
                                       "--prompt_template", "plain", "--no_progress"]))
    tool = os.path.join(root, "tools.py")
    with open(tool, "w") as fh:
        fh.write('def inc(x: int) -> int:\n    """Add 4.\n\n    Args:\n        x: a number\n    """\n    return x + 4\n\n'
                 'TOOLS = [inc]\n')
    call = '<tool_call>{"name": "inc", "arguments": {"x": 1}}</tool_call>'
    monkeypatch.setenv("MINDRLHF_TEST_FORCED_IDS", ",".join(map(str, load_tokenizer(vocab, merges).encode(call))))
    yamls = {(dp, tp, pp): model_yaml(os.path.join(root, f"m_{dp}x{tp}x{pp}.yaml"), dp=dp, tp=tp, pp=pp,
                                      micro_batch_num=2, tie_word_embeddings=False)
             for dp, tp, pp in ((1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 2))}
    ms.set_seed(5)
    init = os.path.join(root, "init.safetensors")
    save_checkpoint(model_state(CausalLM(load_model_yaml(yamls[(1, 1, 1)]).model)), init)

    def run(name, train, infer, batch):
        out = os.path.join(root, name)
        flags = {**TEST_DEFAULTS, "sft_path_train": yamls[train], "sft_path_infer": yamls[infer],
                 "vocab_path": vocab, "merges_file_path": merges, "mind_dataset_dir": data,
                 "load_sft_checkpoint_train": init, "save_ckpt_dir": out, "use_parallel": name != "single",
                 "total_steps": 2, "save_steps": 2, "seed": 7, "batch_size": batch, "num_generations": 4,
                 "mini_batch_size": 8, "beta": 0.04, "temperature": 0.8, "max_tokens": 112, "lr": 1e-4, "eps": 1e-6,
                 "verifier_function": "digit_fraction_test", "max_tool_calls": 2, "tool_module": tool,
                 "progress": False, "export_hf": False}
        if name == "single":
            proc = subprocess.run([sys.executable, WORKER] + cli_args(flags), env=dict(os.environ, PYTHONPATH=REPO),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
            assert proc.returncode == 0, proc.stdout.decode(errors="replace")[-4000:]
        else:
            run_msrun(WORKER, cli_args(flags), 2, os.path.join(out, "log"))
        return read_metrics(os.path.join(out, "metrics.jsonl"))

    single = run("single", (1, 1, 1), (1, 1, 1), 4)
    for name, train in (("train_tp2_infer_dp2", (1, 2, 1)), ("train_pp2_infer_dp2", (1, 1, 2))):
        other = run(name, train, (2, 1, 1), 2)
        assert len(single) == len(other) == 2
        for a, b in zip(single, other):
            assert a["episode/tool_calls_mean"] >= 1 and a["tools/inc/calls"] >= 16
            for key in COMPARED:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=ABS_TOL.get(key, 0.0)), \
                    (name, key, json.dumps([a, b]))
