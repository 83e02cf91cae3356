"""Coming from verl: its RL parquet rows (examples/data_preprocess/gsm8k.py's schema) convert with
rlhf_data.py --dataset_type verl, the prompt rendered by the model folder's chat template as transformers'
apply_chat_template renders it; bad rows are named by file, row and field; its GRPO quickstart's overrides
translate to our fields (configs/compat/verl.py); unknown and refused keys are errors naming the key; and
`python -m mindrlhf.verl_main ...` runs two GRPO steps on the tiny model."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from data_helpers import arithmetic_rows, make_tokenizer_files
from mindrlhf.configs import ConfigError
from mindrlhf.configs.compat import verl
from mindrlhf.configs.grpo_config import _field_of
from mindrlhf.data.convert import build_parser, convert
from mindrlhf.data.mindrecord_io import read_mindrecord
from mindrlhf.data.tokenizer import load_qwen2_tokenizer, load_tokenizer

REPO = os.path.join(os.path.dirname(__file__), "..")
# a Qwen2.5-style template (a default system turn unless the messages open with one)
CHAT_TEMPLATE = ("{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
                 "<|im_start|>system\nBe brief.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
                 "{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
                 "<|im_start|>assistant\n{% endif %}")
INSTRUCTION = "Answer after ####."


def make_model_folder(folder, weights=False):
    """A model folder as verl's actor_rollout_ref.model.path: tokenizer.json, tokenizer_config.json with a chat
    template, and (weights) a tiny Qwen2 with random weights."""
    os.makedirs(folder, exist_ok=True)
    vocab, merges = make_tokenizer_files(os.path.join(folder, "bpe"), vocab_size=400)
    load_qwen2_tokenizer(vocab, merges)._tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump({"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "tokenizer_class": "PreTrainedTokenizerFast"}, fh)
    if weights:
        from hf_reference import make_hf_model
        make_hf_model(str(folder), vocab=416)
    return str(folder)


def verl_rows(n, split="train", source="openai/gsm8k", seed=0):
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them."""
    rows = []
    for i, r in enumerate(arithmetic_rows(n, seed)):
        truth = r["answer"].split("####")[1].strip()
        rows.append({"data_source": source,
                     "prompt": [{"role": "user", "content": r["question"] + " " + INSTRUCTION}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": truth},
                     "extra_info": {"split": split, "index": i, "answer": r["answer"], "question": r["question"]}})
    return rows


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_model_folder(tmp_path_factory.mktemp("model") / "tiny")


def _convert(folder, src, out, *extra):
    return convert(build_parser().parse_args(["--vocab_path", folder, "--file_path", str(src), "--output_path",
                                              str(out), "--dataset_type", "verl", "--max_prompt_length", "64",
                                              "--seq_length", "160", "--no_progress", *extra]))


def test_verl_parquet_converts_with_the_chat_template_as_transformers_renders_it(tmp_path, folder):
    from transformers import PreTrainedTokenizerFast
    rows = verl_rows(5)
    rows[1]["prompt"] = [{"role": "system", "content": "Think first."}, rows[1]["prompt"][0]]
    src = write_parquet(tmp_path / "train.parquet", rows)
    summary = _convert(folder, src, tmp_path / "train.mindrecord")
    assert summary.rows_written == 5 and summary.data_sources == {"openai/gsm8k": 5}
    hf = PreTrainedTokenizerFast.from_pretrained(folder)
    tok = load_tokenizer(folder)
    table = read_mindrecord(str(tmp_path / "train.mindrecord"))
    for i, row in enumerate(rows):
        text = hf.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        assert text.endswith("<|im_start|>assistant\n") and row["prompt"][-1]["content"] in text
        n = int(table["prompt_length"][i])
        assert table["prompt_ids"][i, :n].tolist() == tok.encode(text)
        assert table["solution"][i] == str(row["reward_model"]["ground_truth"])
        answer = tok.decode(table["pretrain_ids"][i][table["loss_mask"][i] == 1].tolist())
        assert answer.strip() == row["extra_info"]["answer"]          # the worked answer is the SFT target
    assert "Think first." in tok.decode(table["prompt_ids"][1, :int(table["prompt_length"][1])].tolist())
    from mindrlhf.data.sources import RowSpec
    numeric = dict(rows[0], reward_model={"style": "rule", "ground_truth": 42})   # a number is read as its text
    assert RowSpec("verl").example(numeric, "x:row 0").solution == "42"


def test_the_conversion_names_each_data_source_and_its_verifier(tmp_path, folder, capsys):
    rows = verl_rows(3) + verl_rows(2, source="math_dapo")
    src = write_parquet(tmp_path / "mixed.parquet", rows)
    out = str(tmp_path / "out.mindrecord")
    from mindrlhf.data.convert import main
    assert main(["--vocab_path", folder, "--file_path", src, "--output_path", out, "--dataset_type", "verl",
                 "--max_prompt_length", "64", "--seq_length", "160", "--no_progress"]) == 0
    text = capsys.readouterr().out
    assert "data_source openai/gsm8k: 3 rows, scored by accuracy_reward (verl: gsm8k.compute_score" in text
    assert "data_source math_dapo: 2 rows, no verifier here stands for verl's scorer" in text
    with pytest.raises(ConfigError, match="data_source 'math_dapo' \\(2 rows\\)"):
        verl.verifiers_for({"openai/gsm8k": 3, "math_dapo": 2}, "mixed.parquet")


@pytest.mark.parametrize("row,pattern", [
    ({"prompt": "What is 1 + 1?"}, r"row 1: 'prompt' must be a list of chat messages"),
    ({"prompt": []}, r"row 1: 'prompt' must be a list of chat messages .* got an empty list"),
    ({"prompt": [{"role": "user"}]}, r"row 1: prompt\[0\]\.content: missing"),
    ({"prompt": [{"role": "robot", "content": "hi"}]}, r"row 1: prompt\[0\]\.role: 'robot' is not one of"),
    ({"reward_model": {"style": "rule"}}, r"row 1: reward_model\.ground_truth: missing"),
    ({"reward_model": {"style": "model", "ground_truth": "2"}}, r"row 1: reward_model\.style: 'model' is not"),
    ({"reward_model": {"style": "rule", "ground_truth": " "}}, r"row 1: reward_model\.ground_truth is empty"),
    ({"data_source": None}, r"row 1: missing key 'data_source'"),
])
def test_malformed_verl_rows_are_named_by_file_row_and_field(tmp_path, folder, row, pattern):
    rows = verl_rows(3)
    rows[1].update(row)
    # one row at a time through the jsonl reader (parquet would need one type per column)
    src = tmp_path / "bad.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=pattern.replace("row 1", "bad.jsonl:2")):
        _convert(folder, src, tmp_path / "bad.mindrecord")
    if "prompt" in row and isinstance(row["prompt"], list) or "reward_model" in row:
        path = write_parquet(tmp_path / "bad.parquet", rows)
        with pytest.raises(ConfigError, match=pattern.replace("row 1", "bad.parquet:row 1")):
            _convert(folder, path, tmp_path / "bad2.mindrecord")


def test_verl_rows_need_a_chat_template_and_long_prompts_follow_the_truncation_rule(tmp_path, folder):
    src = write_parquet(tmp_path / "train.parquet", verl_rows(3))
    with pytest.raises(ConfigError, match="train.parquet:row 0: the prompt is a list of chat messages"):
        _convert(folder, src, tmp_path / "a.mindrecord", "--prompt_template", "plain")
    args = ["--max_prompt_length", "8", "--seq_length", "160"]
    with pytest.raises(ConfigError, match="train.parquet:row 0: the prompt is .* tokens, over --max_prompt_length=8"):
        _convert(folder, src, tmp_path / "b.mindrecord", *args, "--on_long_prompt", "error")
    with pytest.raises(ConfigError, match="every row was skipped"):
        _convert(folder, src, tmp_path / "c.mindrecord", *args, "--on_long_prompt", "skip")


QUICKSTART = [
    "algorithm.adv_estimator=grpo", "data.train_files=/data/gsm8k/train.parquet",
    "data.val_files=/data/gsm8k/test.parquet", "data.train_batch_size=1024", "data.max_prompt_length=512",
    "data.max_response_length=1024", "data.filter_overlong_prompts=True", "data.truncation=error",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", "trainer.logger=['console','wandb']",
    "trainer.project_name=verl_grpo_example_gsm8k", "trainer.experiment_name=qwen2_5_3b_function_rm",
    "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
    "trainer.default_local_dir=/ckpt/gsm8k", "trainer.total_epochs=15"]


def _translate(args):
    return verl.translate(verl.parse_overrides(args), _field_of)


def test_the_grpo_quickstart_translates_to_our_fields():
    tr = _translate(QUICKSTART)
    s = tr.sections
    assert (tr.world, tr.infer_tp) == (8, 2)
    assert s["rl"]["batch_size"] == 1024 // 4              # prompts over the job / 4 rollout replicas of TP 2
    assert s["rl"]["mini_batch_size"] == 256 * 5 // 8      # prompts per update x n -> sequences per rank
    assert s["engine"]["micro_batch_size"] == 16 and s["rl"]["num_generations"] == 5
    assert (s["rl"]["beta"], s["rl"]["kl_estimator"], s["rl"]["adv_estimator"]) == (0.001, "k3", "grpo")
    assert (s["rl"]["clip_low"], s["rl"]["clip_high"], s["rl"]["loss_agg"]) == (0.2, 0.2, "token-mean")
    assert s["rl"]["ref_sync_steps"] == 0
    assert s["optim"] == {"lr": 1e-6, "lr_schedule": "constant", "warmup_steps": 0, "min_lr": 0.0, "beta2": 0.999,
                          "max_grad_norm": 1.0}
    assert s["sampling"] == {"max_tokens": 1024}
    assert s["swap"] == {"offload_train_param": False, "offload_train_optimizer": False, "offload_ref_param": True}
    assert {k: s["run"][k] for k in ("sft_path_train", "vocab_path", "save_ckpt_dir", "epochs", "save_steps",
                                     "eval_steps", "use_parallel")} == {
        "sft_path_train": "Qwen/Qwen2.5-3B-Instruct", "vocab_path": "Qwen/Qwen2.5-3B-Instruct",
        "save_ckpt_dir": "/ckpt/gsm8k", "epochs": 15, "save_steps": 20, "eval_steps": 5, "use_parallel": True}
    plan = tr.data
    assert (plan.train_files, plan.val_files, plan.max_prompt_length, plan.on_long_prompt) == \
        (["/data/gsm8k/train.parquet"], ["/data/gsm8k/test.parquet"], 512, "skip")
    inert = dict(tr.ignored)
    assert "vLLM" in inert["actor_rollout_ref.rollout.name"] and "critic" in inert["trainer.critic_warmup"]
    assert "actor_rollout_ref.actor.fsdp_config.param_offload" not in inert    # mapped: swap.offload_train_param
    lines = verl.startup_lines(tr)
    assert len(lines) == len({line.split(":")[0] for line in lines})           # one line per key group
    actor = next(line for line in lines if line.startswith("verl actor_rollout_ref.actor:"))
    assert "ppo_mini_batch_size -> rl.mini_batch_size = 160" in actor
    rollout = next(line for line in lines if line.startswith("verl actor_rollout_ref.rollout:"))
    assert "inert" in rollout and "gpu_memory_utilization" in rollout


def test_verl_router_replay_modes_map_to_ours():
    for mode, ours in (("disabled", "none"), ("R2", "r2"), ("R3", "r3")):
        tr = _translate(QUICKSTART + [f"actor_rollout_ref.actor.router_replay.mode={mode}"])
        assert tr.sections["rl"]["router_replay"] == ours


def test_val_before_train_decides_the_eval_before_the_first_step():
    """trainer.val_before_train=False (verl's examples set it beside test_freq) skips the eval before step 1; with
    val files and test_freq -1, where verl still validates once, the conversion says nothing is evaluated."""
    tr = _translate(QUICKSTART + ["trainer.val_before_train=False"])
    assert tr.sections["run"]["eval_at_start"] is False and "trainer.val_before_train" not in dict(tr.ignored)
    assert "eval_at_start" not in _translate(QUICKSTART).sections["run"]          # our default: true, as verl's
    no_freq = [a for a in QUICKSTART if not a.startswith("trainer.test_freq=")] + ["trainer.test_freq=-1"]
    said = " ".join(_translate(no_freq).derived)
    assert "not evaluated" in said and "verl would validate once before training" in said
    said = " ".join(_translate(no_freq + ["trainer.val_before_train=False"]).derived)
    assert "not evaluated" in said and "validate once" not in said


def test_val_kwargs_do_sample_gives_a_sampled_eval():
    """verl's rollout.val_kwargs: do_sample true samples validation with its temperature / top_p / top_k, n per
    prompt (run.eval_*); do_sample false (its default) is greedy whatever the sampling keys say, and n equal greedy
    answers are evaluated once, said at conversion; a bad n or top_k is named."""
    v = "actor_rollout_ref.rollout.val_kwargs."
    sampled = _translate(QUICKSTART + [v + "do_sample=True", v + "temperature=0.6", v + "top_p=0.95", v + "top_k=-1",
                                       v + "n=4"]).sections["run"]
    assert (sampled["eval_temperature"], sampled["eval_top_p"], sampled["eval_top_k"], sampled["eval_n"]) == \
        (0.6, 0.95, 0, 4)
    assert _translate(QUICKSTART + [v + "do_sample=True", v + "temperature=1", v + "top_k=20"]).sections["run"][
        "eval_top_k"] == 20
    for greedy in ([v + "do_sample=False", v + "temperature=0.6", v + "n=3"],
                   [v + "do_sample=True", v + "temperature=0", v + "n=3"]):
        tr = _translate(QUICKSTART + greedy)
        assert not {"eval_temperature", "eval_n", "eval_top_p"} & set(tr.sections["run"])
        assert any("run.eval_n: 1" in d and "mean@3 is the greedy accuracy" in d for d in tr.derived)
    assert not any("eval_n" in d for d in _translate(QUICKSTART).derived)
    for bad, pattern in (([v + "temperature=1", v + "n=0"], r"val_kwargs\.n: expected >= 1"),
                         ([v + "temperature=1", v + "top_k=-2"], r"val_kwargs\.top_k: expected -1 \(off\) or >= 0"),
                         ([v + "temperature=-1"], r"val_kwargs\.temperature: expected >= 0")):
        with pytest.raises(ConfigError, match=pattern):
            _translate(QUICKSTART + [v + "do_sample=True"] + bad)


def test_ulysses_sequence_parallelism_is_tensor_parallelism_with_sequence_parallelism():
    """actor.ulysses_sequence_parallel_size N (verl's FSDP actor; three of its NPU scripts set 2 or 4): a group of
    N ranks shares each row's tokens, here as tensor parallelism N with Megatron sequence parallelism (another
    split of the same math, said at conversion); the data-parallel groups, and so the per-rank batch sizes, are
    verl's world / N. A size that does not divide the ranks, or under the Megatron backend, is refused."""
    key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size="
    tr = _translate(QUICKSTART + [key + "4"])                      # QUICKSTART: 8 ranks
    assert {k: v for k, v in tr.sections["parallel"].items() if k.startswith("train_")} == \
        {"train_model_parallel": 4, "train_use_seq_parallel": True}
    assert tr.sections["rl"]["mini_batch_size"] == 256 * 5 // 2          # 8 ranks / 4: two groups of rows
    assert any("ulysses_sequence_parallel_size 4: train layout tensor 4 with sequence parallelism" in d
               for d in tr.derived)
    assert "train_model_parallel" not in _translate(QUICKSTART + [key + "1"]).sections.get("parallel", {})
    with pytest.raises(ConfigError, match=r"ulysses_sequence_parallel_size: 3 must be a positive size dividing the "
                                          r"8 rank"):
        _translate(QUICKSTART + [key + "3"])
    with pytest.raises(ConfigError, match=r"ulysses_sequence_parallel_size: read with the FSDP backend only"):
        _translate_argv(MEGATRON_EXAMPLE + [key + "2"])


def test_the_entropy_bonus_is_ours():
    """actor.entropy_coeff: verl's actor subtracts it times the token entropy aggregated as loss_agg_mode says, as
    rl.entropy_coeff does (the loss itself: tests/test_loss_reference.py)."""
    base = [a for a in QUICKSTART if not a.startswith("actor_rollout_ref.actor.entropy_coeff=")]
    assert _translate(base + ["actor_rollout_ref.actor.entropy_coeff=0.001"]).sections["rl"]["entropy_coeff"] == 0.001


def test_resume_from_path_is_read_only_under_resume_path():
    """verl reads trainer.resume_from_path only with resume_mode resume_path (refused here); with auto (its
    default, as its Qwen3-32B NPU script leaves it) or disable the path is not read: accepted and said."""
    tr = _translate(QUICKSTART + ["trainer.resume_from_path=checkpoints/"])
    assert any(k == "trainer.resume_from_path" and "checked" in v for k, v in tr.mapped)
    with pytest.raises(ConfigError, match=r"trainer\.resume_from_path: 'checkpoints/global_step_5' is not supported "
                                          r"\(we implement null, or a path verl does not read \(resume_mode auto"):
        _translate(QUICKSTART + ["trainer.resume_from_path=checkpoints/global_step_5",
                                 "trainer.resume_mode=resume_path"])


def test_verl_defaults_apply_when_the_command_leaves_a_key_out():
    tr = _translate(["algorithm.adv_estimator=grpo", "data.train_files=t.parquet", "actor_rollout_ref.model.path=m",
                     "actor_rollout_ref.rollout.n=4", "data.train_batch_size=8",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=4"])
    s = tr.sections
    assert s["rl"]["beta"] == 0.0                           # use_kl_loss false: no KL term
    assert s["run"]["save_ckpt_dir"] == "checkpoints/verl_examples/gsm8k"
    assert s["run"]["epochs"] == 30 and s["sampling"]["max_tokens"] == 512
    assert tr.data.on_long_prompt == "error" and tr.world == 1 and "use_parallel" not in s["run"]
    assert s["rl"]["batch_size"] == 8 and s["rl"]["mini_batch_size"] == 16


@pytest.mark.parametrize("extra,pattern", [
    (["trainer.not_a_key=1"], r"trainer\.not_a_key: unknown verl key"),
    (["reward_model.enable=True"], r"reward_model\.model\.path: missing with reward_model\.enable=True"),
    (["algorithm.adv_estimator=gae"], r"algorithm\.adv_estimator: 'gae' is not supported"),
    (["algorithm.use_kl_in_reward=True"], r"algorithm\.use_kl_in_reward: True is not supported"),
    (["actor_rollout_ref.actor.kl_loss_type=abs"], r"actor_rollout_ref\.actor\.kl_loss_type: 'abs' is not supported"),
    (["actor_rollout_ref.actor.router_replay.mode=record"], r"router_replay\.mode: 'record' is not supported"),
    (["actor_rollout_ref.actor.router_replay.record_file=/r.pt"], r"router_replay\.record_file: '/r\.pt' is not"),
    (["data.truncation=right"], r"data\.truncation: 'right' is not supported"),
    (["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum"], r"loss_agg_mode: 'seq-mean-token-sum' is not"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=300"], r"ppo_mini_batch_size: 300 must divide data\.train_batch"),
    (["~trainer.logger"], r"~trainer\.logger: Hydra's delete override is not supported"),
])
def test_unknown_and_refused_keys_are_named(extra, pattern):
    base = [a for a in QUICKSTART if not any(a.startswith(e.split("=")[0].lstrip("~") + "=") for e in extra)]
    with pytest.raises(ConfigError, match=pattern):
        _translate(base + extra)


def test_a_verl_reward_model_becomes_ours_and_scores_alone():
    """reward_model.enable=True with reward_model.model.path: our reward model role, and no rule verifier (verl's
    naive reward manager returns rm_scores unchanged when they exist); its batch size mapped, its FSDP keys
    inert; the sections load and validate as a GRPO config. data.shuffle=False keeps the file's order."""
    from mindrlhf.configs.grpo_config import GRPOConfig
    tr = _translate(QUICKSTART + ["reward_model.enable=True", "reward_model.model.path=/models/rm",
                                  "reward_model.micro_batch_size_per_gpu=4", "reward_model.model.fsdp_config."
                                  "param_offload=True", "data.shuffle=False"])
    r = tr.sections["reward"]
    assert (r["reward_model"], r["reward_model_batch_size"], r["verifier_function"], r["verifier_weight"]) == \
        ("/models/rm", 4, [], [])
    assert tr.sections["run"]["shuffle"] is False
    assert "reward_model.model.fsdp_config.param_offload" in dict(tr.ignored)
    assert any("reward model's score alone" in line for line in tr.derived)
    cfg = GRPOConfig()
    for sec, values in tr.sections.items():
        for k, v in values.items():
            setattr(getattr(cfg, sec), k, v)
    cfg.validate()


def test_gae_by_default_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="algorithm.adv_estimator: 'gae' .*verl default"):
        _translate([a for a in QUICKSTART if not a.startswith("algorithm.adv_estimator")])


def _verl_main(cwd, args) -> str:
    """python -m mindrlhf.verl_main args in `cwd`, which must succeed: its output."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "mindrlhf.verl_main", *args], cwd=str(cwd), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    log = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, log[-4000:]
    return log


def test_verl_main_runs_two_grpo_steps(tmp_path):
    model = make_model_folder(tmp_path / "Qwen-tiny", weights=True)
    train = write_parquet(tmp_path / "train.parquet", verl_rows(4))
    test = write_parquet(tmp_path / "test.parquet", verl_rows(2, split="test", seed=1))
    out = tmp_path / "ckpt"
    args = ["algorithm.adv_estimator=grpo", f"data.train_files={train}", f"data.val_files={test}",
            "data.train_batch_size=2", "data.max_prompt_length=40", "data.max_response_length=8",
            "data.truncation=left", f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
            "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
            "trainer.total_epochs=1", "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.logger=['console']",
            f"trainer.default_local_dir={out}",
            "--progress", "False", "--export_hf", "False", "--share_prompt", "False", "--tensorboard", "False"]
    log = _verl_main(tmp_path, args)
    assert "verl actor_rollout_ref.actor: mapped" in log and "ppo_mini_batch_size -> rl.mini_batch_size = 8" in log
    assert "verl actor_rollout_ref.rollout: mapped n -> rl.num_generations = 4" in log and "vLLM" in log
    assert "data_source openai/gsm8k: 4 rows, scored by accuracy_reward" in log
    with open(out / "metrics.jsonl") as fh:
        steps = [json.loads(line) for line in fh]
    assert [r["step"] for r in steps] == [1, 2]                 # 4 prompts, 2 a step, one epoch
    assert all(np.isfinite(r["loss"]) for r in steps if "loss" in r)
    import yaml
    cfg = yaml.safe_load(open(out / "verl_config.yaml"))
    assert cfg["rl"]["beta"] == 0.001 and cfg["reward"]["verifier_function"] == ["accuracy_reward"]
    assert cfg["run"]["mind_dataset_dir"] == str(out / "verl_data" / "train.mindrecord")


VERL_REWARD = """
import json

def compute_score(data_source, solution_str, ground_truth, extra_info=None, log_path=None, weight=1.0):
    with open(log_path, "a") as fh:
        fh.write(json.dumps([data_source, solution_str, ground_truth, extra_info]) + "\\n")
    return {"score": weight * (extra_info["index"] + len(solution_str) / 100.0)}
"""


def test_verl_main_scores_with_a_custom_reward_function(tmp_path):
    """custom_reward_function.path / name / reward_kwargs, as verl calls it: every row (here of a data_source no
    verifier of ours stands for) goes to the file's function with its data_source, ground truth and extra_info
    (kept by the conversion), the keyword arguments given; the step's reward_mean is the mean of its scores."""
    model = make_model_folder(tmp_path / "Qwen-tiny", weights=True)
    train = write_parquet(tmp_path / "train.parquet", verl_rows(2, source="my/custom"))
    (tmp_path / "my_reward.py").write_text(VERL_REWARD)
    calls, out = tmp_path / "calls.jsonl", tmp_path / "ckpt"
    args = ["algorithm.adv_estimator=grpo", f"data.train_files={train}", "data.train_batch_size=2",
            "data.max_prompt_length=40", "data.max_response_length=8", "data.truncation=left",
            f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.n=2", "trainer.total_epochs=1", f"trainer.default_local_dir={out}",
            f"custom_reward_function.path={tmp_path / 'my_reward.py'}", "custom_reward_function.name=compute_score",
            f"+custom_reward_function.reward_kwargs.log_path={calls}", "+custom_reward_function.reward_kwargs.weight=2",
            "--progress", "False", "--export_hf", "False", "--share_prompt", "False", "--tensorboard", "False"]
    log = _verl_main(tmp_path, args)
    assert "scored by custom_reward_function" in log and "verifier compute_score:" in log
    rows = [json.loads(line) for line in open(calls)]
    assert len(rows) == 4                                        # 2 prompts x 2 samples, each scored once
    truths = {r["extra_info"]["index"]: r["reward_model"]["ground_truth"] for r in verl_rows(2, source="my/custom")}
    for source, text, truth, info in rows:
        assert source == "my/custom" and info["split"] == "train" and truth == truths[info["index"]]
    want = np.mean([2 * (info["index"] + len(text) / 100.0) for _, text, _, info in rows])
    step = [json.loads(line) for line in open(out / "metrics.jsonl")][0]
    assert step["reward_mean"] == pytest.approx(want, rel=1e-6)


def test_the_eval_command_scores_a_verl_parquet_with_its_custom_reward_function(tmp_path, capsys):
    """mindrlhf.eval --custom_reward_function on verl's parquet: every completion's score is what the function
    returns for it, called with the row's data_source, ground truth and extra_info (and the keyword arguments)."""
    from mindrlhf import eval as eval_cmd
    model = make_model_folder(tmp_path / "Qwen-tiny", weights=True)
    data = write_parquet(tmp_path / "test.parquet", verl_rows(3, split="test", source="my/custom"))
    (tmp_path / "my_reward.py").write_text(VERL_REWARD)
    calls, out = tmp_path / "calls.jsonl", tmp_path / "completions.jsonl"
    argv = ["--model", model, "--dataset", data, "--dataset_type", "verl", "--prompt_template", "chat",
            "--max_prompt_length", "40", "--max_tokens", "6", "--progress", "False", "--output", str(out),
            "--custom_reward_function", f"{tmp_path / 'my_reward.py'}:compute_score", "--verifier_function",
            "compute_score", "--custom_reward_kwargs", json.dumps({"log_path": str(calls), "weight": 3}),
            "--correct_threshold", "100"]
    assert eval_cmd.main(argv) == 0
    rows = [json.loads(line) for line in open(out)]
    logged = [json.loads(line) for line in open(calls)]
    assert len(rows) == len(logged) == 3
    for row, (source, text, truth, info) in zip(rows, sorted(logged, key=lambda c: c[3]["index"])):
        assert source == "my/custom" and info["split"] == "test" and info["index"] == row["index"]
        assert text == row["completion"] and truth == row["solution"]
        assert row["score"] == pytest.approx(3 * (info["index"] + len(text) / 100.0), rel=1e-6)
    capsys.readouterr()
    unnamed = argv[:-6] + ["--verifier_function", "accuracy_reward"] + argv[-4:-2]     # the function not listed
    assert eval_cmd.main(unnamed) == 2
    assert "registers the verifier 'compute_score', which verifier_function (accuracy_reward) does not name" in \
        capsys.readouterr().err


def test_rollout_tensor_parallel_writes_both_layouts_from_the_folder(tmp_path):
    from mindrlhf.configs.compat.sources import load_model_yaml
    from mindrlhf.verl_main import _layout_yamls
    model = make_model_folder(tmp_path / "Qwen-tiny", weights=True)
    train, infer = _layout_yamls(model, 4, 2, str(tmp_path))
    t, i = load_model_yaml(train, role="train"), load_model_yaml(infer, role="infer")
    assert (t.parallel.data_parallel, t.parallel.model_parallel) == (4, 1)      # verl's FSDP actor: all ranks DP
    assert (i.parallel.data_parallel, i.parallel.model_parallel) == (2, 2)      # rollout replicas of TP 2
    assert t.model.num_layers == i.model.num_layers == 2 and t.model.vocab_size == 416


def test_our_flags_follow_the_overrides_and_config_is_refused():
    from mindrlhf.verl_main import split_argv
    assert split_argv(["a.b=1", "c=2", "--seed", "3"]) == (["a.b=1", "c=2"], ["--seed", "3"])
    with pytest.raises(ConfigError, match="--config: the verl overrides are this run's config"):
        split_argv(["a.b=1", "--config", "x.yaml"])


def test_other_ranks_take_rank_0s_conversion_and_ignore_a_stale_one(tmp_path, monkeypatch):
    import time
    from mindrlhf import verl_main
    plan = verl.DataPlan(["t.parquet"], [], 40, 8, "error", "prompt", "tok", str(tmp_path))
    ready = tmp_path / "verl_data" / verl_main.READY
    ready.parent.mkdir()
    ready.write_text(json.dumps({"train": "old"}))
    old = time.time() - 10 * verl_main.STALE_SECONDS
    os.utime(ready, (old, old))                       # a previous run's: waited past, then replaced
    monkeypatch.setenv("RANK_ID", "1")
    import threading
    from mindrlhf.utils.atomic import write_text      # as rank 0 writes it: a reader never sees it half-written
    threading.Timer(1.0, lambda: write_text(str(ready), json.dumps({"train": "new", "train_sources": {}}))).start()
    assert verl_main.prepare_data(plan, False)["train"] == "new"


def test_msruns_scheduler_waits_for_rank_0s_conversion_instead_of_writing_it(tmp_path, monkeypatch):
    """msrun's scheduler process runs the script too, with no RANK_ID: it read as rank 0 and converted the data
    beside worker 0, two writers of one MindRecord (a run failed with the file missing). It waits as a rank."""
    from mindrlhf import verl_main
    from mindrlhf.utils.atomic import write_text
    import threading
    plan = verl.DataPlan([str(tmp_path / "missing.parquet")], [], 40, 8, "error", "prompt", "tok", str(tmp_path))
    ready = tmp_path / "verl_data" / verl_main.READY
    for name in ("RANK_ID", "MS_NODE_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MS_ROLE", "MS_SCHED")
    timer = threading.Timer(1.0, lambda: ready.parent.mkdir(exist_ok=True) or write_text(
        str(ready), json.dumps({"train": "rank 0's", "train_sources": {}})))
    timer.start()
    assert verl_main.prepare_data(plan, False)["train"] == "rank 0's"
    assert not (tmp_path / "verl_data" / "train.mindrecord").exists()


@pytest.mark.slow       # ~60 s: two msrun workers
def test_verl_main_under_msrun_with_a_tensor_parallel_rollout(tmp_path):
    """Two ranks: rank 0 converts, rank 1 waits for it; verl's rollout TP 2 becomes an infer layout of one replica
    of 2 while both ranks train data-parallel (as verl's FSDP actor)."""
    from msrun_util import run_msrun
    model = make_model_folder(tmp_path / "Qwen-tiny", weights=True)
    train = write_parquet(tmp_path / "train.parquet", verl_rows(8))
    out, logs = tmp_path / "ckpt", tmp_path / "log"
    run_msrun(os.path.join(REPO, "mindrlhf", "verl_main.py"), [
        "algorithm.adv_estimator=grpo", f"data.train_files={train}", "data.train_batch_size=4",
        "data.max_prompt_length=40", "data.max_response_length=8", "data.truncation=left",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.actor.use_kl_loss=True",
        "trainer.n_gpus_per_node=2", "trainer.total_epochs=1", f"trainer.default_local_dir={out}",
        "--progress", "False", "--export_hf", "False"], 2, str(logs))
    log = open(logs / "worker_0.log", errors="replace").read()
    assert "train layout dp=2 tp=1; infer layout dp=1 tp=2; 4 prompts x 4 samples per step" in log
    assert "rl.mini_batch_size: 8 (ppo_mini_batch_size 4 x rollout.n 4 / 2 ranks)" in log
    with open(out / "metrics.jsonl") as fh:
        assert [json.loads(line)["step"] for line in fh] == [1, 2]


# verl's examples/grpo_trainer/run_qwen3-8b_npu.sh (its Ascend GRPO run), overrides as written, shell variables filled in
NPU_EXAMPLE = """algorithm.adv_estimator=grpo data.train_files=/data/dapo-math-17k.parquet data.val_files=/data/aime-2024.parquet
data.train_batch_size=256 data.max_prompt_length=512 data.max_response_length=1024 data.filter_overlong_prompts=True
data.truncation='error' actor_rollout_ref.model.path=/models/Qwen3-8B actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=64
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=10 actor_rollout_ref.actor.use_kl_loss=True
actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.kl_loss_type=low_var_kl
actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.actor.use_torch_compile=False
actor_rollout_ref.ref.use_torch_compile=False actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 actor_rollout_ref.rollout.tensor_model_parallel_size=2
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=["console","wandb"] trainer.project_name=GRPO
trainer.experiment_name=GRPO-Qwen3-8B-npu trainer.n_gpus_per_node=8 trainer.nnodes=1
trainer.default_local_dir=/ckpts/GRPO/GRPO-Qwen3-8B-npu trainer.device=npu trainer.resume_mode=auto
actor_rollout_ref.actor.fsdp_config.forward_prefetch=True actor_rollout_ref.ref.fsdp_config.forward_prefetch=True
++actor_rollout_ref.actor.entropy_from_logits_with_chunking=True ++actor_rollout_ref.ref.entropy_from_logits_with_chunking=True
trainer.val_before_train=True trainer.save_freq=5 trainer.test_freq=5 trainer.total_epochs=15""".split()


def test_verls_ascend_grpo_example_translates_key_by_key():
    tr = _translate(NPU_EXAMPLE)
    s = tr.sections
    assert (s["rl"]["batch_size"], s["rl"]["mini_batch_size"], s["engine"]["micro_batch_size"]) == (64, 40, 10)
    assert tr.data.on_long_prompt == "skip" and s["run"]["save_ckpt_dir"] == "/ckpts/GRPO/GRPO-Qwen3-8B-npu"
    inert = dict(tr.ignored)
    assert {"trainer.device", "actor_rollout_ref.actor.entropy_from_logits_with_chunking",
            "actor_rollout_ref.ref.fsdp_config.forward_prefetch"} <= set(inert)
    assert s["run"]["eval_at_start"] is True and s["run"]["eval_steps"] == 5
    # its data is DAPO-Math (data_source math_dapo): verl scores it with math_dapo.compute_score, we refuse it
    with pytest.raises(ConfigError, match="data_source 'math_dapo'"):
        verl.verifiers_for({"math_dapo": 17917}, "dapo-math-17k.parquet")


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["data.train_files=/nowhere/train.parquet", "--help"]])
def test_help_prints_the_usage_and_does_nothing_else(argv, capsys):
    # `--help` used to be read as our flags with no overrides: "error: no verl overrides given", exit 2; after
    # overrides it would have converted the data first
    from mindrlhf import verl_main
    assert verl_main.main(argv) == 0
    out = capsys.readouterr().out
    assert "python -m mindrlhf.verl_main key=value" in out and "docs/UPSTREAM.md" in out
    assert "grpo_one_stage.py --help" in out


# verl's examples/grpo_trainer/run_qwen2-7b_math_megatron.sh (its Megatron backend), as written, $HOME filled in
MEGATRON_EXAMPLE = """--config-path=config --config-name=ppo_megatron_trainer.yaml algorithm.adv_estimator=grpo
data.train_files=['/home/u/data/gsm8k/train.parquet','/home/u/data/math/train.parquet']
data.val_files=['/home/u/data/gsm8k/test.parquet','/home/u/data/math/test.parquet'] data.return_raw_chat=True
data.train_batch_size=1024 data.max_prompt_length=1024 data.max_response_length=1024 data.filter_overlong_prompts=True
data.truncation=error actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct actor_rollout_ref.model.use_fused_kernels=True
actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=256
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2
actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 actor_rollout_ref.actor.use_kl_loss=True
actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.kl_loss_type=low_var_kl
actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2
actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2 algorithm.use_kl_in_reward=False trainer.critic_warmup=0
trainer.logger=["console","wandb"] trainer.project_name=verl_grpo_example_gsm8k_math
trainer.experiment_name=qwen2_7b_megatron trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20
trainer.test_freq=5 trainer.total_epochs=15""".split()

# verl's examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh (Qwen3-30B-A3B, DAPO's data), as written
MOE_EXAMPLE = """--config-path=./config --config-name=ppo_megatron_trainer data.train_files=/d/dapo-math-17k.parquet
data.val_files=[''] data.prompt_key=prompt data.truncation=left data.max_prompt_length=2048
data.max_response_length=8192 data.train_batch_size=512 actor_rollout_ref.rollout.n=16 algorithm.adv_estimator=grpo
algorithm.use_kl_in_reward=False algorithm.kl_ctrl.kl_coef=0.0 actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B-Base
actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.kl_loss_coef=0.0
actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28
actor_rollout_ref.actor.clip_ratio_c=10.0
+actor_rollout_ref.model.override_config.model_config.max_position_embeddings=10240
actor_rollout_ref.model.use_fused_kernels=False actor_rollout_ref.actor.use_dynamic_bsz=True
actor_rollout_ref.actor.ppo_mini_batch_size=128 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
actor_rollout_ref.actor.ppo_max_token_len_per_gpu=10240 actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.actor.optim.lr_warmup_steps=10 actor_rollout_ref.actor.optim.lr_decay_style=constant
actor_rollout_ref.actor.optim.weight_decay=0.1
+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction=1.
+actor_rollout_ref.actor.optim.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d=True
+actor_rollout_ref.actor.optim.override_optimizer_config.use_precision_aware_optimizer=True
+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=True
actor_rollout_ref.actor.megatron.use_mbridge=True actor_rollout_ref.actor.megatron.use_dist_checkpointing=False
actor_rollout_ref.actor.megatron.param_offload=True actor_rollout_ref.actor.megatron.grad_offload=True
actor_rollout_ref.actor.megatron.optimizer_offload=True actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1
actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1
actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=null
actor_rollout_ref.actor.megatron.context_parallel_size=1 actor_rollout_ref.actor.megatron.expert_model_parallel_size=8
actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1
+actor_rollout_ref.actor.megatron.override_transformer_config.apply_rope_fusion=True
+actor_rollout_ref.actor.megatron.override_transformer_config.masked_softmax_fusion=True
+actor_rollout_ref.actor.megatron.override_transformer_config.bias_activation_fusion=True
+actor_rollout_ref.actor.megatron.override_transformer_config.bias_dropout_fusion=True
+actor_rollout_ref.actor.megatron.override_transformer_config.gradient_accumulation_fusion=True
+actor_rollout_ref.actor.megatron.override_transformer_config.deallocate_pipeline_outputs=True
+actor_rollout_ref.actor.megatron.override_transformer_config.persist_layer_norm=True
+actor_rollout_ref.actor.megatron.override_transformer_config.moe_grouped_gemm=True
+actor_rollout_ref.actor.megatron.override_transformer_config.moe_permute_fusion=True
+actor_rollout_ref.actor.megatron.override_transformer_config.moe_token_dispatcher_type=flex
+actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype=fp32
+actor_rollout_ref.actor.megatron.override_transformer_config.moe_enable_deepep=True
actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.actor.loss_agg_mode=token-mean
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2
actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=10240 actor_rollout_ref.rollout.gpu_memory_utilization=0.7
actor_rollout_ref.rollout.tensor_model_parallel_size=4 actor_rollout_ref.rollout.enable_chunked_prefill=True
actor_rollout_ref.rollout.max_num_batched_tokens=10240 actor_rollout_ref.rollout.temperature=1.0
actor_rollout_ref.rollout.top_p=1.0 actor_rollout_ref.rollout.top_k=-1
actor_rollout_ref.rollout.val_kwargs.temperature=1.0 actor_rollout_ref.rollout.val_kwargs.top_p=0.7
actor_rollout_ref.rollout.val_kwargs.top_k=-1 actor_rollout_ref.rollout.val_kwargs.do_sample=True
actor_rollout_ref.rollout.val_kwargs.n=1 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.enforce_eager=True actor_rollout_ref.rollout.free_cache_engine=True
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=10240
actor_rollout_ref.ref.megatron.use_dist_checkpointing=False actor_rollout_ref.ref.megatron.param_offload=True
actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1
actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=1
actor_rollout_ref.ref.megatron.virtual_pipeline_model_parallel_size=null
actor_rollout_ref.ref.megatron.context_parallel_size=1 actor_rollout_ref.ref.megatron.expert_model_parallel_size=8
actor_rollout_ref.ref.megatron.expert_tensor_parallel_size=1 reward_model.reward_manager=dapo
+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True +reward_model.reward_kwargs.overlong_buffer_cfg.len=4096
+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
+reward_model.reward_kwargs.overlong_buffer_cfg.log=False +reward_model.reward_kwargs.max_resp_len=8192
trainer.logger=[console,wandb] trainer.project_name=DAPO-Qwen3-30b-MATH
trainer.experiment_name=DAPO-Qwen3-30b-MATH-megatron trainer.n_gpus_per_node=8 trainer.nnodes=1
trainer.val_before_train=False trainer.test_freq=10 trainer.save_freq=100 trainer.total_epochs=10
trainer.resume_mode=auto trainer.log_val_generations=10""".split()


def _translate_argv(argv):
    """As verl_main reads a command line: Hydra's --config-* flags, then the overrides."""
    from mindrlhf.verl_main import hydra_flags, split_argv
    hydra, rest = hydra_flags(argv)
    overrides, _ = split_argv(rest)
    return verl.translate(verl.parse_overrides(overrides), _field_of, hydra.get("--config-name", "ppo_trainer"))


def test_verls_megatron_example_gives_its_train_layout():
    """--config-name ppo_megatron_trainer: the actor's tensor x pipeline sizes are our train layout (with verl's
    sequence_parallel default on), the data-parallel groups they leave set the per-rank batch sizes, and the
    scheduler is Megatron's."""
    tr = _translate_argv(MEGATRON_EXAMPLE)
    s = tr.sections
    assert s["parallel"] == {"train_model_parallel": 2, "train_pipeline_stage": 2, "train_use_seq_parallel": True}
    assert (tr.world, tr.infer_tp, s["rl"]["batch_size"]) == (8, 2, 1024 // 4)
    assert s["rl"]["mini_batch_size"] == 256 * 5 // 2          # 8 ranks / (tp 2 x pp 2) = 2 train data-parallel groups
    assert s["engine"]["micro_batch_size"] == 4 and s["optim"]["lr_schedule"] == "megatron_constant"
    assert "rl.mini_batch_size: 640 (ppo_mini_batch_size 256 x rollout.n 5 / 2 train data-parallel group(s))" \
        in tr.derived
    assert "train layout: data_parallel 2 (of which expert 1) x tensor 2 x pipeline 2 (actor.megatron)" in tr.derived


def test_megatrons_pipeline_split_counting_embedding_and_loss_is_our_train_offset():
    """account_for_embedding / loss_in_pipeline_split (verl's Qwen3-235B-A22B script sets both, pp 8): each stage
    holds (num_layers + counted) / pp layer slots, the first (last) one fewer: MindFormers' offset [1 - embedding,
    1, ..., 1, 1 - loss], the same for every depth Megatron accepts (94 layers over 8 stages: 11, 12 x 6, 11); a
    depth it refuses is refused when the folder's is read; one stage: no effect, said; null: off."""
    from mindrlhf.configs.compat.verl_megatron import megatron_offset
    from mindrlhf.configs.model_config import layer_split
    key = "+actor_rollout_ref.actor.megatron.override_transformer_config.account_for_{}_in_pipeline_split="
    both = _translate_argv(MEGATRON_EXAMPLE + [key.format("embedding") + "True", key.format("loss") + "True"])
    assert both.sections["parallel"]["train_offset"] == [0, 0]        # pp 2: an even depth, halves (odd: refused)
    assert any("train_offset [0, 0]: Megatron's pipeline split counting the embedding and loss" in d
               for d in both.derived)
    embedding = _translate_argv(MEGATRON_EXAMPLE + [key.format("embedding") + "True"])
    assert embedding.sections["parallel"]["train_offset"] == [0, 1]
    loss = _translate_argv(MEGATRON_EXAMPLE + [key.format("loss") + "True", key.format("embedding") + "null"])
    assert loss.sections["parallel"]["train_offset"] == [1, 0]
    assert [len(r) for r in layer_split(94, 8, megatron_offset(8, True, True))] == [11] + [12] * 6 + [11]
    assert [len(r) for r in layer_split(7, 4, megatron_offset(4, True, False))] == [1, 2, 2, 2]
    with pytest.raises(ConfigError, match="add up to num_layers"):
        layer_split(95, 8, megatron_offset(8, True, True))             # 97 slots over 8: Megatron asserts too
    one = [a.replace("pipeline_model_parallel_size=2", "pipeline_model_parallel_size=1") for a in MEGATRON_EXAMPLE]
    tr = _translate_argv(one + [key.format("embedding") + "True"])
    assert "train_offset" not in tr.sections["parallel"]
    assert any("account_for_embedding_in_pipeline_split: no effect with one pipeline stage" in d for d in tr.derived)


def test_verls_qwen3_moe_megatron_example_translates_as_shipped_laid_out_over_experts():
    """verl's Qwen3-30B-A3B Megatron DAPO script as shipped: its one model override (max_position_embeddings, prompt
    + response) is our max_model_len bound, any other model override is refused naming it; its sampled validation
    is our sampled eval, expert_model_parallel_size 8 is our train layout's ep, DAPO's reward manager with its
    overlong buffer is our overlong penalty, the Megatron offloads are our host swap, the optimizer's CPU-offload
    options inert, the warm-up Megatron's. With tensor 2, its expert_tensor_parallel_size 1 folds the 8 expert
    ranks onto the tensor ranks first, as Megatron does: whole experts over tp2 x ep4 (train_moe_tp_extend_ep); a
    tensor size that does not divide the expert ranks is refused."""
    argv = list(MOE_EXAMPLE)
    with pytest.raises(ConfigError, match=r"override_config\.model_config\.num_hidden_layers: not supported \(the "
                                          r"folder's config\.json is the model"):
        _translate_argv(argv + ["+actor_rollout_ref.model.override_config.model_config.num_hidden_layers=2"])
    assert _translate_argv(argv + ["actor_rollout_ref.rollout.max_model_len=9000"]).sections["run"][
        "max_model_len"] == 9000                               # the smaller bound
    tr = _translate_argv(argv)
    s = tr.sections
    assert {k: v for k, v in s["run"].items() if k.startswith("eval_") and k != "eval_at_start"} == \
        {"eval_steps": 10, "eval_temperature": 1.0, "eval_n": 1, "eval_top_p": 0.7, "eval_top_k": 0}
    assert (s["rl"]["overlong_buffer_len"], s["rl"]["overlong_penalty_factor"]) == (4096, 1.0)   # DAPO's buffer
    assert s["parallel"] == {"train_expert_parallel": 8, "train_model_parallel": 1, "train_pipeline_stage": 1}
    assert s["rl"]["mini_batch_size"] == 128 * 16               # ep 8 of 8 ranks: one group of rows
    assert s["swap"] == {"offload_train_param": True, "offload_train_optimizer": True, "offload_ref_param": True}
    assert (s["optim"]["lr_schedule"], s["optim"]["warmup_steps"], s["optim"]["decay_steps"]) == \
        ("megatron_constant", 10 * 512 // 128, 0)               # 10 steps x 4 updates a step; decay: the run's
    assert s["run"]["eval_at_start"] is False and s["run"]["max_model_len"] == 10240
    assert "train layout: data_parallel 8 (of which expert 8) x tensor 1 x pipeline 1 (actor.megatron)" in tr.derived
    etp = [a.replace("megatron.tensor_model_parallel_size=1", "megatron.tensor_model_parallel_size=2") for a in argv]
    folded = _translate_argv(etp + ["trainer.n_gpus_per_node=16"])
    assert folded.sections["parallel"] == {"train_model_parallel": 2, "train_pipeline_stage": 1,
                                           "train_moe_tp_extend_ep": True, "train_expert_parallel": 4,
                                           "train_use_seq_parallel": True}
    assert folded.sections["rl"]["mini_batch_size"] == 128 * 16 // 2      # 16 / (tp 2 x ep 4): two groups of rows
    assert "train layout: data_parallel 8 (of which expert 4) x tensor 2 (whole experts over them) x pipeline 1 " \
        "(actor.megatron)" in folded.derived
    width = _translate_argv([a.replace("expert_tensor_parallel_size=1", "expert_tensor_parallel_size=2")
                             for a in etp] + ["trainer.n_gpus_per_node=16"])
    assert width.sections["parallel"]["train_expert_parallel"] == 8 and "train_moe_tp_extend_ep" not in \
        width.sections["parallel"]                                  # ETP = TP: each expert's width over tp
    with pytest.raises(ConfigError, match=r"expert_model_parallel_size: 8 expert ranks with expert_tensor_parallel_"
                                          r"size 1 and tensor 16: .* give a multiple of 16"):
        _translate_argv([a.replace("megatron.tensor_model_parallel_size=1", "megatron.tensor_model_parallel_size=16")
                         for a in argv] + ["trainer.n_gpus_per_node=16"])
    inert = dict(tr.ignored)
    assert "CPU offload" in inert["actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload"]
    assert "token-dispatch" in inert["actor_rollout_ref.actor.megatron.override_transformer_config."
                                     "moe_token_dispatcher_type"]


def test_rollout_correction_token_is_is_our_tis_and_the_rest_is_named():
    """verl's algorithm.rollout_correction (newer than the table's first reading): rollout_is token (decoupled
    Token-TIS, min(pi_old / pi_rollout, threshold)) is rl.tis with rl.tis_cap the threshold; its default null
    leaves TIS off whatever the threshold; sequence-level IS, rejection sampling and bypass mode are refused by
    key; checkpoint_engine's bucket size is inert. Other keys newer than the table's first reading (an adapter to
    start from, the rollout's own EP size) are refused naming what to do instead."""
    base = [a for a in QUICKSTART if not a.startswith("algorithm.rollout_correction.")]
    on = _translate_argv(base + ["algorithm.rollout_correction.rollout_is=token",
                                 "algorithm.rollout_correction.rollout_is_threshold=3.0"]).sections["rl"]
    assert on["tis"] is True and on["tis_cap"] == 3.0
    off = _translate_argv(base + ["algorithm.rollout_correction.rollout_is_threshold=2.0",
                                  "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096"])
    assert "tis" not in off.sections["rl"]
    assert "re-layout" in dict(off.ignored)["actor_rollout_ref.rollout.checkpoint_engine."
                                            "update_weights_bucket_megabytes"]
    for extra, pattern in ((["algorithm.rollout_correction.rollout_is=sequence"], r"rollout_is: 'sequence' is not "
                                                                                    r"supported"),
                           (["algorithm.rollout_correction.rollout_rs=token_k1"], r"rollout_rs: 'token_k1' is not"),
                           (["algorithm.rollout_correction.bypass_mode=True"], r"bypass_mode: .* is not supported"),
                           # newer keys of verl's examples, named with what we do instead
                           (["actor_rollout_ref.model.lora_adapter_path=/saved/adapter"],
                            r"lora_adapter_path: '/saved/adapter' is not supported \(we implement null"),
                           (["actor_rollout_ref.rollout.expert_parallel_size=4"],
                            r"rollout.expert_parallel_size: 4 is not supported .*infer_expert_parallel"),
                           # DAPO's manager's keyword arguments: not for the naive manager; its buffer must end
                           # at max_response_length, where ours does
                           (["+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True"],
                            r"reward_kwargs.overlong_buffer_cfg.enable: read by reward_model.reward_manager=dapo"),
                           (["reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.max_resp_len=99"],
                            r"max_resp_len: 99 is not supported \(we implement data.max_response_length"),
                           (["reward_model.reward_manager=dapo", "reward_model.enable=True",
                             "reward_model.model.path=/rm",
                             "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
                             "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4"],
                            r"overlong_buffer_cfg.enable: with reward_model.enable verl's dapo manager returns")):
        with pytest.raises(ConfigError, match=pattern):
            _translate_argv(base + extra)


@pytest.mark.parametrize("megatron,extra,pattern", [
    (False, ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"],
     r"megatron\.tensor_model_parallel_size: a key of verl's ppo_megatron_trainer\.yaml .* --config-name"),
    (True, ["actor_rollout_ref.actor.fsdp_config.param_offload=True"],
     r"fsdp_config\.param_offload: a key of verl's FSDP backend"),
    (True, ["--config-name", "my_trainer"], r"--config-name my_trainer: not supported"),
    (True, ["actor_rollout_ref.actor.megatron.expert_model_parallel_size=3"], r"expert 3 does not divide the 8 rank"),
    (True, ["actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4"],
     r"ref\.megatron\.tensor_model_parallel_size: 4 is not supported \(we implement the actor's value"),
    (True, ["actor_rollout_ref.actor.megatron.context_parallel_size=2"], r"context_parallel_size: 2 is not supported"),
    (True, ["actor_rollout_ref.model.lora.rank=32"],
     r"lora\.rank: 32 is not supported .*lora_rank / lora_alpha / target_modules instead"),
    (True, ["actor_rollout_ref.actor.optim.lr_decay_style=WSD"], r"lr_decay_style: 'WSD' is not supported"),
])
def test_megatron_keys_out_of_place_or_beyond_us_are_named(megatron, extra, pattern):
    """A Megatron key without --config-name ppo_megatron_trainer, an FSDP key with it (verl refuses both), and the
    Megatron settings we do not implement: each an error naming the key."""
    base = MEGATRON_EXAMPLE if megatron else QUICKSTART
    keys = [a.split("=")[0] + "=" for a in extra if "=" in a]
    base = [a for a in base if not any(a.startswith(k) for k in keys)]
    if extra[0] == "--config-name":
        base = [a for a in base if not a.startswith("--config-name")]
    with pytest.raises(ConfigError, match=pattern):
        _translate_argv(extra + base if extra[0].startswith("--") else base + extra)


@pytest.mark.slow       # ~150 s: two 2-worker msrun jobs
def test_a_megatron_command_on_a_qwen3_moe_folder_trains_as_its_fsdp_twin(tmp_path):
    """verl's Megatron form (--config-path / --config-name ppo_megatron_trainer first, the actor's
    expert_model_parallel_size 2) on a tiny Qwen3-MoE folder under msrun: train layout ep2 (the two ranks hold
    half the experts each and see the same rows); the same command in verl's FSDP form (both ranks data-parallel)
    gives the same rewards, gradient norms (1e-5), loss and KL (1e-7) and exported weights (within 1% of how far
    each tensor moved): the layout changes, the run does not."""
    import shutil
    from hf_reference import make_qwen3_moe_model
    from msrun_util import run_msrun
    from mindrlhf.checkpoint.hf_interop import iter_hf_as_ms
    from mindrlhf.trainer.metrics import read_metrics
    tok = make_model_folder(tmp_path / "tok")
    model = str(tmp_path / "Qwen3-MoE-tiny")
    make_qwen3_moe_model(model, vocab=416, experts=4, aux_coef=0.0)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, name), model)
    train = write_parquet(tmp_path / "train.parquet", verl_rows(8))
    verifier = tmp_path / "digits.py"         # a dense reward a random model moves (gsm8k's is 0 for all samples)
    verifier.write_text("from mindrlhf.reward.verifiers import register_verifier\n\n\n"
                        "@register_verifier('digit_fraction_test')\ndef digits(completion, solution):\n"
                        "    return sum(c.isdigit() for c in completion) / max(1, len(completion))\n")
    common = ["algorithm.adv_estimator=grpo", f"data.train_files={train}", "data.train_batch_size=4",
              "data.max_prompt_length=40", "data.max_response_length=8", "data.truncation=left",
              f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-4",
              "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=4",
              "actor_rollout_ref.actor.use_kl_loss=True", "trainer.n_gpus_per_node=2", "trainer.total_epochs=1"]
    megatron = ["--config-path=config", "--config-name=ppo_megatron_trainer"] + common + [
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
        "actor_rollout_ref.ref.megatron.expert_model_parallel_size=2"]
    for name, argv in (("fsdp", common), ("megatron", megatron)):
        run_msrun(os.path.join(REPO, "mindrlhf", "verl_main.py"),
                  argv + [f"trainer.default_local_dir={tmp_path / name}", "--progress", "False", "--reward_module",
                          str(verifier), "--verifier_function", "digit_fraction_test"], 2, str(tmp_path / f"log_{name}"))
    log = open(tmp_path / "log_megatron" / "worker_0.log", errors="replace").read()
    assert "verl --config-name ppo_megatron_trainer: the keys of verl's ppo_megatron_trainer.yaml" in log
    assert "train layout dp=1 ep=2 tp=1" in log
    want = read_metrics(str(tmp_path / "fsdp" / "metrics.jsonl"))
    got = read_metrics(str(tmp_path / "megatron" / "metrics.jsonl"))
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2]
    assert all(r["reward_std"] > 0 for r in want)           # advantages that are not all zero: updates that matter
    for a, b in zip(got, want):                             # the same samples, so the same rewards, bit for bit
        assert (a["reward_mean"], a["reward_std"]) == (b["reward_mean"], b["reward_std"]), a["step"]
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * b["grad_norm"], a["step"]
        for key in ("loss", "kl"):       # means of terms that cancel (advantages sum to 0): absolute, not relative
            assert abs(a[key] - b[key]) <= 1e-7, (a["step"], key, a[key], b[key])
    weights = dict(iter_hf_as_ms(str(tmp_path / "fsdp" / "hf_policy")))
    start = dict(iter_hf_as_ms(model))
    for key, value in iter_hf_as_ms(str(tmp_path / "megatron" / "hf_policy")):
        moved = np.abs(weights[key] - start[key]).max()
        assert moved > 1e-5 and np.abs(value - weights[key]).max() <= 0.01 * moved, key
