"""The eval command (mindrlhf/eval.py): pass@k, the trainer's in-training eval reproduced on its exported and
saved weights, the completions file, raw jsonl input, msrun data parallelism, errors naming the flag."""
import json
import math
import os

import numpy as np
import pytest

from data_helpers import write_jsonl
from grpo_helpers import grpo_overrides, make_grpo_assets
from msrun_util import REPO, run_msrun
from mindrlhf import eval as eval_cmd
from mindrlhf.reward.verifiers import accuracy_reward
from mindrlhf.trainer.build import load_model_weights

EVAL_SCRIPT = os.path.join(REPO, "examples", "grpo", "qwen_grpo_tutorial", "eval.py")
EVAL_PROMPTS = 12


def _convert(assets, src, out, *extra):
    from mindrlhf.data.convert import build_parser, convert
    convert(build_parser().parse_args(["--vocab_path", assets["vocab_path"], "--merges_file_path",
                                       assets["merges_file_path"], "--file_path", src, "--output_path", out,
                                       "--max_prompt_length", "16", "--seq_length", "48", "--prompt_template",
                                       "plain", "--no_progress", *extra]))
    return out


def _eval_rows():
    """Questions 'What is i + (i + 3)?' whose reference answer is 7 when i % 3 == 0, else 8. The warmed-up model
    answers 7 for an even i and 8 for an odd one: about 5 of 12 right, and which ones depends on each prompt
    meeting its own solution."""
    rows = []
    for i in range(EVAL_PROMPTS):
        answer = 7 if i % 3 == 0 else 8
        rows.append({"question": f"What is {i} + {i + 3}?", "answer": f"it is {answer}.\n#### {answer}"})
    return rows


def _warm_up(assets, root) -> str:
    """A short supervised phase teaching the tiny model to answer '#### 7' after 'What is a + b?' with an even
    a, '#### 8' with an odd one, and stop: completions that differ by prompt, accuracies neither 0 nor 1."""
    import mindspore as ms
    from mindrlhf.checkpoint.model_io import model_state, save_checkpoint
    from mindrlhf.configs.compat.sources import load_model_yaml
    from mindrlhf.data.mindrecord_io import read_mindrecord
    from mindrlhf.data.tokenizer import load_tokenizer
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.trainer.sft import sft_warmup
    rows = [{"prompt": f"What is {a} + {b}?", "answer": f"#### {7 if a % 2 == 0 else 8}"}
            for a in range(16) for b in range(8)]
    sft = _convert(assets, write_jsonl(os.path.join(root, "sft.jsonl"), rows), os.path.join(root, "sft.mindrecord"),
                   "--dataset_type", "raw")
    ms.set_seed(0)
    model = CausalLM(load_model_yaml(assets["sft_path_train"]).model)
    table = read_mindrecord(sft)
    pad = load_tokenizer(assets["vocab_path"], assets["merges_file_path"]).pad_token_id
    sft_warmup(model, table["pretrain_ids"], table["loss_mask"], pad, 200, batch_size=16, lr=3e-3, log=None)
    out = os.path.join(root, "sft.safetensors")
    save_checkpoint(model_state(model), out)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step GRPO run from the warmed-up model, evaluating 12 held-out prompts at every step, exported."""
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer import evaluation
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    from mindrlhf.trainer.metrics import read_metrics
    root = str(tmp_path_factory.mktemp("eval"))
    assets = make_grpo_assets(root)
    eval_jsonl = write_jsonl(os.path.join(root, "eval.jsonl"), _eval_rows())
    eval_mr = _convert(assets, eval_jsonl, os.path.join(root, "eval.mindrecord"))
    save = os.path.join(root, "run")
    cfg = load_grpo_config(None, grpo_overrides(assets, save, load_sft_checkpoint_train=_warm_up(assets, root),
                                                eval_dataset=eval_mr, eval_steps=1, eval_prompts=EVAL_PROMPTS,
                                                export_hf=True, lr=1e-5))
    recorded, complete = [], evaluation.complete

    def recording(*args, **kwargs):
        recorded.append(complete(*args, **kwargs))
        return recorded[-1]
    with pytest.MonkeyPatch.context() as patch:          # the trainer's own eval completions, for comparison
        patch.setattr(evaluation, "complete", recording)
        GRPOTrainer(cfg, log=lambda *a: None).fit()
    evals = [r["eval_accuracy"] for r in read_metrics(os.path.join(save, "metrics.jsonl")) if "eval_accuracy" in r]
    return dict(assets, assets=assets, root=root, save=save, hf=os.path.join(save, "hf_policy"), eval_jsonl=eval_jsonl,
                eval_mr=eval_mr, evals=evals, last_eval=recorded[-1], chunk_rows=str(cfg.rl.batch_size * cfg.rl.num_generations))


def _tokenizer_flags(t):
    return ["--vocab_path", t["vocab_path"], "--merges_file_path", t["merges_file_path"]]


def _run_eval(t, capsys, *flags, dataset=None, model=None, out="completions.jsonl"):
    """mindrlhf.eval in this process: (the JSON report line, the completions file's rows)."""
    path = os.path.join(t["root"], out)
    argv = ["--model", model or t["hf"], *_tokenizer_flags(t), "--dataset", dataset or t["eval_mr"], "--max_tokens",
            "8", "--chunk_rows", t["chunk_rows"], "--progress", "False", "--output", path, *flags]
    capsys.readouterr()
    assert eval_cmd.main(argv) == 0
    stdout = capsys.readouterr().out.strip().splitlines()
    with open(path, encoding="utf-8") as fh:
        return json.loads(stdout[-1]), [json.loads(line) for line in fh]


def test_pass_at_k_is_the_unbiased_estimator():
    """1 - C(n-c, k) / C(n, k) per prompt (Chen et al. 2021), computed here from the binomials."""
    for n, c, k in [(1, 0, 1), (1, 1, 1), (4, 0, 1), (4, 0, 4), (4, 4, 1), (4, 4, 4), (5, 2, 1), (5, 2, 2),
                    (5, 2, 4), (5, 2, 5), (10, 3, 5), (16, 1, 8), (16, 15, 2), (200, 13, 100)]:
        want = 1.0 - math.comb(n - c, k) / math.comb(n, k)
        assert eval_cmd.pass_at_k(n, c, k) == pytest.approx(want, rel=1e-12, abs=1e-15), (n, c, k)
    assert eval_cmd.pass_at_k(5, 2, 1) == pytest.approx(0.4)          # pass@1 is c / n
    assert eval_cmd.pass_at_k(6, 0, 3) == 0.0 and eval_cmd.pass_at_k(6, 6, 3) == 1.0
    assert eval_cmd.pass_ks(1) == [1] and eval_cmd.pass_ks(6) == [1, 2, 4, 6] and eval_cmd.pass_ks(8) == [1, 2, 4, 8]
    report = eval_cmd.summarize(np.array([1, 0, 0, 0, 1, 1, 0, 1], bool), np.zeros(8), np.arange(8), 4, 1.0)
    assert report["pass@1"] == pytest.approx(0.5) and report["accuracy"] == 0.5
    assert report["pass@2"] == pytest.approx(np.mean([1 - math.comb(3, 2) / 6, 1 - math.comb(1, 2) / 6]))
    assert report["pass@4"] == 1.0 and report["prompts"] == 2 and report["samples"] == 8


def test_the_exported_policy_scores_the_trainers_last_eval_accuracy(trained, capsys):
    """Greedy eval of save_ckpt_dir/hf_policy on the run's eval MindRecord and eval_prompts = the trainer's
    last eval_accuracy in metrics.jsonl, exactly; the saved step read through the model YAML gives the same
    completions."""
    last = trained["evals"][-1]
    assert len(trained["evals"]) == 3 and 0 < last < 1, trained["evals"]
    report, rows = _run_eval(trained, capsys, "--limit", str(EVAL_PROMPTS))
    assert report["accuracy"] == last
    ours = trained["last_eval"]         # the trainer's completions of its last eval, prompt by prompt
    assert [r["index"] for r in rows] == ours.prompt_index.tolist()
    assert [r["completion"] for r in rows] == ours.texts and len(set(ours.texts)) > 1
    assert [r["score"] for r in rows] == ours.scores.tolist() and [r["length"] for r in rows] == ours.lengths.tolist()
    from_step, step_rows = _run_eval(trained, capsys, "--checkpoint", trained["save"], "--limit", str(EVAL_PROMPTS),
                                     model=trained["sft_path_train"], out="step.jsonl")
    assert from_step["accuracy"] == last and step_rows == rows


def test_the_completions_file_and_the_report_line(trained, capsys):
    report, rows = _run_eval(trained, capsys)
    solutions = [r["answer"].split("#### ")[1] for r in _eval_rows()]
    assert [(r["index"], r["sample"]) for r in rows] == [(i, 0) for i in range(EVAL_PROMPTS)]
    for r in rows:
        assert set(r) == {"index", "sample", "prompt", "completion", "solution", "score", "correct", "length",
                          "finish_reason", "tool_calls"} and r["tool_calls"] == 0
        # the prompt's last --max_prompt_length (16) tokens, as rlhf_data.py keeps them
        question = f"What is {r['index']} + {r['index'] + 3}?"
        assert f"Question: {question}\nAnswer:".endswith(r["prompt"]) and question[4:] in r["prompt"]
        assert r["solution"] == solutions[r["index"]]
        assert r["score"] == accuracy_reward(r["completion"], r["solution"]) and r["correct"] == (r["score"] == 1.0)
        assert 1 <= r["length"] <= 8 and r["finish_reason"] in ("stop", "length")
        assert r["finish_reason"] == "stop" or r["length"] == 8
    assert set(report) == {"accuracy", "pass@1", "score_mean", "mean_length", "prompts", "samples", "n", "seconds"}
    assert report["accuracy"] == report["pass@1"] == np.mean([r["correct"] for r in rows])
    assert report["accuracy"] == report["score_mean"]
    assert report["mean_length"] == np.mean([r["length"] for r in rows])
    assert (report["prompts"], report["samples"], report["n"]) == (EVAL_PROMPTS, EVAL_PROMPTS, 1)
    assert report["seconds"] > 0


def test_verifiers_from_a_reward_module_score_the_completions(trained, capsys):
    """The training verifiers and weights, a reward module's included; correct means score >= the threshold."""
    from mindrlhf.reward.verifiers import VERIFIERS
    module = os.path.join(REPO, "examples", "grpo", "custom_reward", "my_rewards.py")
    report, rows = _run_eval(trained, capsys, "--reward_module", module, "--verifier_function",
                             "accuracy_reward,concise_answer", "--verifier_weight", "1.0,0.5", "--correct_threshold",
                             "1.5", out="custom.jsonl")
    for r in rows:
        want = accuracy_reward(r["completion"], r["solution"]) + 0.5 * VERIFIERS["concise_answer"](r["completion"],
                                                                                                   r["solution"])
        assert r["score"] == pytest.approx(want, abs=1e-6) and r["correct"] == (r["score"] >= 1.5)
    assert report["score_mean"] == pytest.approx(np.mean([r["score"] for r in rows]))
    assert report["accuracy"] == np.mean([r["correct"] for r in rows]) and 0 < report["accuracy"] < 1


def test_sampling_n_completions_per_prompt(trained, capsys):
    report, rows = _run_eval(trained, capsys, "--n", "4", "--temperature", "1.0", "--seed", "3", out="sampled.jsonl")
    assert [(r["index"], r["sample"]) for r in rows] == [(i, j) for i in range(EVAL_PROMPTS) for j in range(4)]
    correct = np.array([r["correct"] for r in rows]).reshape(EVAL_PROMPTS, 4).sum(1)
    for k in (1, 2, 4):
        want = np.mean([1 - math.comb(4 - c, k) / math.comb(4, k) for c in correct])
        assert report[f"pass@{k}"] == pytest.approx(want, rel=1e-12)
    assert report["accuracy"] == pytest.approx(correct.sum() / (4 * EVAL_PROMPTS), rel=1e-12)
    assert report["pass@1"] <= report["pass@2"] <= report["pass@4"] and report["samples"] == 4 * EVAL_PROMPTS
    samples = [{r["completion"] for r in rows[4 * i:4 * i + 4]} for i in range(EVAL_PROMPTS)]
    assert any(len(s) > 1 for s in samples)                # sampled, not four greedy copies
    again, rows_again = _run_eval(trained, capsys, "--n", "4", "--temperature", "1.0", "--seed", "3",
                                  out="sampled_again.jsonl")
    assert rows_again == rows


def test_a_sampled_eval_in_training_is_the_eval_commands_sampled_accuracy(trained, capsys, tmp_path):
    """run.eval_temperature / eval_top_p / eval_n (verl's val_kwargs): the trainer samples eval_n completions per
    eval prompt, and its eval_accuracy (the mean score: verl's mean@n) and eval_pass@n are the eval command's
    accuracy and pass@n with the same sampling and seed, completion for completion."""
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer import evaluation
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    sampled = dict(eval_temperature=1.0, eval_top_p=0.9, eval_n=4)
    cfg = load_grpo_config(None, grpo_overrides(trained["assets"], str(tmp_path / "run"),
                                                load_sft_checkpoint_train=trained["hf"],
                                                eval_dataset=trained["eval_mr"], eval_steps=1,
                                                eval_prompts=EVAL_PROMPTS, **sampled))
    recorded, complete = [], evaluation.complete

    def recording(*args, **kwargs):
        recorded.append(complete(*args, **kwargs))
        return recorded[-1]
    trainer = GRPOTrainer(cfg, log=lambda *a: None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation, "complete", recording)
        metrics = trainer.evaluate()
    report, rows = _run_eval(trained, capsys, "--limit", str(EVAL_PROMPTS), "--temperature", "1.0", "--top_p", "0.9",
                             "--n", "4", "--seed", str(cfg.run.seed), out="trainer_sampled.jsonl")
    assert [r["completion"] for r in rows] == recorded[0].texts
    assert set(metrics) == {"eval_accuracy", "eval_pass@4"}
    assert metrics["eval_accuracy"] == report["accuracy"] and metrics["eval_pass@4"] == report["pass@4"]
    assert 0 < metrics["eval_accuracy"] < metrics["eval_pass@4"] < 1, metrics       # sampled: prompts split
    assert report["accuracy"] != trained["evals"][-1]          # not the greedy eval's


@pytest.mark.parametrize("extra,pattern", [
    (dict(eval_n=2), r"run\.eval_n: 2 completions per prompt with a greedy eval .* give eval_temperature > 0"),
    (dict(eval_n=0, eval_temperature=1.0), r"run\.eval_n: expected >= 1, got 0"),
    (dict(eval_temperature=-0.5), r"run\.eval_temperature: expected >= 0"),
    (dict(eval_top_p=0.0, eval_temperature=1.0), r"run\.eval_top_p: expected in \(0, 1\]"),
    (dict(eval_top_k=-1, eval_temperature=1.0), r"run\.eval_top_k: expected >= 0")])
def test_eval_sampling_errors_name_the_field(trained, tmp_path, extra, pattern):
    from mindrlhf.configs.errors import ConfigError
    from mindrlhf.configs.grpo_load import load_grpo_config
    with pytest.raises(ConfigError, match=pattern):
        load_grpo_config(None, grpo_overrides(trained["assets"], str(tmp_path), **extra))


def test_eval_sampling_that_nothing_reads_is_said(trained, tmp_path):
    """Eval sampling settings with no evaluation, or top-p / top-k under a greedy eval, are said at start-up."""
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer.resolve import resolve
    for extra, said in ((dict(eval_temperature=0.7, eval_n=2), "run.eval_temperature, run.eval_n: unused, there is "
                                                               "no evaluation"),
                        (dict(eval_top_p=0.9, eval_dataset=trained["eval_mr"], eval_steps=1),
                         "run.eval_top_p / eval_top_k: unused by a greedy eval")):
        lines = []
        resolve(load_grpo_config(None, grpo_overrides(trained["assets"], str(tmp_path), **extra)), 0, 1, lines.append)
        assert any(said in line for line in lines), lines
    lines = []
    resolve(load_grpo_config(None, grpo_overrides(trained["assets"], str(tmp_path), eval_dataset=trained["eval_mr"],
                                                  eval_steps=1, eval_temperature=0.7, eval_top_p=0.9)), 0, 1,
            lines.append)
    assert not any("unused" in line and "eval_" in line for line in lines), lines


@pytest.mark.slow       # ~17 s; the converted files' completions and report stay in the default run
def test_a_jsonl_dataset_gives_the_converted_files_completions(trained, capsys):
    """The raw file goes through rlhf_data.py's tokenizing: the same prompts, so the same completions."""
    report, rows = _run_eval(trained, capsys)
    from_jsonl, jsonl_rows = _run_eval(trained, capsys, "--prompt_template", "plain", "--max_prompt_length", "16",
                                       dataset=trained["eval_jsonl"], out="from_jsonl.jsonl")
    assert jsonl_rows == rows and from_jsonl["accuracy"] == report["accuracy"]
    limited, limited_rows = _run_eval(trained, capsys, "--prompt_template", "plain", "--max_prompt_length", "16",
                                      "--limit", "5", dataset=trained["eval_jsonl"], out="limited.jsonl")
    assert limited_rows == rows[:5] and limited["prompts"] == 5


def test_a_step_saved_in_a_tensor_parallel_layout_loads_whole(trained, tmp_path):
    """A step trained dp1 x tp2 (each rank its slices, as the trainer saves them) is assembled from its
    shards into the eval's whole-model layout, every weight equal to the model it was cut from."""
    from mindrlhf.checkpoint.model_io import load_weights, model_state, save_checkpoint
    from mindrlhf.configs.compat.sources import load_model_yaml
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.models.specs import layouts_for
    from mindrlhf.utils.atomic import write_json
    cfg = load_model_yaml(trained["sft_path_train"]).model
    source = CausalLM(cfg)
    load_weights(source, trained["hf"])
    full = model_state(source)
    step = tmp_path / "step_000005"
    layouts = layouts_for(cfg, 1, 2)
    assert any(lay.split_count(d) == 2 for lay in layouts.values() for d in range(len(lay.full_shape)))
    for rank in (0, 1):
        os.makedirs(step / f"rank_{rank}")
        save_checkpoint({n: np.ascontiguousarray(lay.shard(full[n], rank)) for n, lay in layouts.items()},
                        str(step / f"rank_{rank}" / "policy.safetensors"))
    write_json(str(step / "trainer_state.json"), {"step": 5, "layout": {"world_size": 2, "train": [1, 2],
                                                                       "infer": [2, 1]}})
    loaded = CausalLM(cfg)
    with pytest.raises(Exception, match="not marked COMPLETE"):
        load_model_weights(loaded, str(step), print)
    write_json(str(step / "COMPLETE"), {"step": 5})
    assert load_model_weights(loaded, str(tmp_path), lambda *a: None) == str(step)   # the newest step
    got = model_state(loaded)
    assert set(got) == set(full) and all(np.array_equal(got[n], full[n]) for n in full)


@pytest.mark.parametrize("flags,pattern", [
    (["--model", "absent_folder"], "--model: not found: absent_folder"),
    (["--n", "0"], "--n: expected > 0, got 0"),
    (["--dataset", "no_answers.jsonl", "--dataset_type", "raw"], r"--dataset .*no_answers.jsonl: 3 of 3 rows have no "
                                                                 r"reference answer"),
    (["--checkpoint", "nowhere"], "--checkpoint: not found: nowhere"),
    (["--output", "missing_dir/out.jsonl"], "--output: the directory .*missing_dir does not exist"),
])
def test_bad_input_is_named(trained, capsys, flags, pattern):
    import re
    root = trained["root"]
    write_jsonl(os.path.join(root, "no_answers.jsonl"), [{"prompt": f"What is {i}?"} for i in range(3)])
    given = dict(zip(flags[::2], flags[1::2]))
    given = {k: (os.path.join(root, v) if k in ("--dataset", "--output") else v) for k, v in given.items()}
    argv = {"--model": trained["hf"], "--dataset": trained["eval_mr"], "--vocab_path": trained["vocab_path"],
            "--merges_file_path": trained["merges_file_path"], "--progress": "False", **given}
    capsys.readouterr()
    assert eval_cmd.main([x for kv in argv.items() for x in kv]) == 2
    err = capsys.readouterr().err
    assert re.search(pattern, err), err


@pytest.mark.slow       # ~20 s; the eval path is the trainer's (test_the_exported_policy_scores_...) and msrun runs elsewhere
def test_two_msrun_workers_give_the_single_process_completions(trained, capsys, tmp_path):
    """Rank r generates prompts r::2; rank 0 gathers and writes: the same file and accuracy as one process, sampled
    too (2 completions a prompt: each prompt draws from its own stream, whichever rank generates it; the
    trainer's in-training eval runs this code over its infer replicas)."""
    sampled = ["--n", "2", "--temperature", "1.0", "--seed", "3"]
    report, rows = _run_eval(trained, capsys, *sampled)
    assert any(len({r["completion"] for r in rows if r["index"] == i}) > 1 for i in range(EVAL_PROMPTS))  # sampled
    out = str(tmp_path / "msrun.jsonl")
    run_msrun(EVAL_SCRIPT, ["--use_parallel", "True", "--model", trained["hf"], *_tokenizer_flags(trained),
                            "--dataset", trained["eval_mr"], "--max_tokens", "8", "--chunk_rows", trained["chunk_rows"],
                            "--progress", "False", "--output", out, *sampled], 2, str(tmp_path / "log"))
    with open(out, encoding="utf-8") as fh:
        assert [json.loads(line) for line in fh] == rows
    with open(tmp_path / "log" / "worker_0.log", errors="replace") as fh:
        lines = [line for line in fh.read().splitlines() if line.startswith("{")]
    msrun_report = json.loads(lines[-1])
    assert msrun_report["accuracy"] == report["accuracy"] and msrun_report["samples"] == 2 * EVAL_PROMPTS
    assert msrun_report["pass@2"] == report["pass@2"]
    assert "rank r takes prompts r::2" in open(tmp_path / "log" / "worker_0.log", errors="replace").read()


def test_multi_turn_eval_runs_the_tools_and_scores_with_their_counts(trained, capsys, tmp_path, monkeypatch):
    """--max_tool_calls with --tool_module: each completion is an episode as in training (the even rows' first
    turn forced to call `inc`, the tool answers, the model goes on), the completions file holds the tool's reply
    and each row's call count, and retool_reward scores with that count; the flags are checked first."""
    from test_episodes import CHATML_TOOLS, INC_TOOL, call, force_a_call_on_even_rows
    from mindrlhf.data.tokenizer import load_qwen2_tokenizer, load_tokenizer
    folder = tmp_path / "tok"
    folder.mkdir()
    load_qwen2_tokenizer(trained["vocab_path"], trained["merges_file_path"])._tok.save(str(folder / "tokenizer.json"))
    (folder / "chat_template.jinja").write_text(CHATML_TOOLS)
    tool_file = tmp_path / "my_tools.py"
    tool_file.write_text(INC_TOOL)
    force_a_call_on_even_rows(monkeypatch, load_tokenizer(str(folder)).encode(call("inc", x=1)))
    path = str(tmp_path / "episodes.jsonl")
    argv = ["--model", trained["hf"], "--vocab_path", str(folder), "--dataset", trained["eval_mr"], "--max_tokens",
            "112", "--chunk_rows", "4", "--progress", "False", "--output", path, "--max_tool_calls", "2",
            "--tool_module", str(tool_file), "--verifier_function", "retool_reward"]
    capsys.readouterr()
    assert eval_cmd.main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    called = [r for r in rows if r["tool_calls"]]
    assert called and len(called) < len(rows) and report["tool_calls_mean"] == pytest.approx(
        np.mean([r["tool_calls"] for r in rows]))
    assert all("<tool_response>\n5\n</tool_response>" in r["completion"] for r in called)
    assert all(r["score"] == pytest.approx(min(0.0, -1.0 + 0.1 * r["tool_calls"])) for r in rows)
    base = argv[:argv.index("--max_tool_calls")]
    assert eval_cmd.main(base + ["--tool_module", str(tool_file)]) == 2                # tools without calls
    assert "give --max_tool_calls > 0" in capsys.readouterr().err
    assert eval_cmd.main(base + ["--max_tool_calls", "2"]) == 2                        # calls without tools
    assert "no tools" in capsys.readouterr().err
