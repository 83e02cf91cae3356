"""MindRLHF's files and names: the flat grpo_config.yaml, its model YAMLs, its flags. Each mapped field
reaches the code that uses it, each inert key is reported, each key we cannot honour is refused."""
import dataclasses
import math
import os

import numpy as np
import pytest
import yaml

from grpo_helpers import make_grpo_assets
from mindrlhf.configs import ConfigError, load_model_yaml
from mindrlhf.configs.compat import mindformers, mindrlhf_grpo as upstream
from mindrlhf.configs.grpo_load import config_from_argv, load_grpo_config, resolved_config_text
from mindrlhf.trainer.optim import mindrlhf_lr

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "upstream")
FLAT = os.path.join(FIXTURES, "grpo_config.yaml")
FINETUNE = os.path.join(FIXTURES, "finetune_qwen2_5_tiny.yaml")
PREDICT = os.path.join(FIXTURES, "predict_qwen2_5_tiny_instruct.yaml")


def _single_process_copy(src, dst):
    """The fixture with a one-rank layout (the unit tests run in one process)."""
    with open(src) as fh:
        doc = yaml.safe_load(fh)
    doc["parallel_config"].update(data_parallel=1, model_parallel=1)
    with open(dst, "w") as fh:
        yaml.safe_dump(doc, fh)
    return dst


def _write(path, doc):
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh)
    return str(path)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("upstream")
    out = make_grpo_assets(str(root))
    out["sft_path_train"] = _single_process_copy(FINETUNE, str(root / "finetune.yaml"))
    out["sft_path_infer"] = _single_process_copy(PREDICT, str(root / "predict.yaml"))
    return out


# ---- the flat grpo_config.yaml --------------------------------------------------------------------------
RENAMED_VALUES = {"beta": 0.25, "num_generations": 6, "num_iterations": 3, "epsilon_low": 0.15, "epsilon_high": 0.28,
                  "batch_size": 5, "epochs": 7, "beta1": 0.8, "beta2": 0.97, "eps": 1e-7, "weight_decay": 0.03,
                  "opt_offload": True, "mind_dataset_dir": "/d/x.mindrecord", "save_ckpt_dir": "/d/ck",
                  "save_data_file": "/d/exp.mindrecord", "save_strategy_dir": "/d/st", "only_save_strategy": True,
                  "use_parallel": True, "tensorboard_dir": "/d/tb", "max_num_seqs": 48, "max_model_len": 999,
                  "start_lr": 3e-5, "end_lr": 1e-11, "warmup_step": 4, "decay_steps": 40}


def test_every_renamed_key_is_tested():
    assert set(RENAMED_VALUES) == set(upstream.GRPO_RENAMES)


@pytest.mark.parametrize("key", sorted(RENAMED_VALUES))
def test_flat_key_maps_to_our_field(tmp_path, key):
    cfg = load_grpo_config(_write(tmp_path / "g.yaml", {key: RENAMED_VALUES[key]}))
    sec, field = upstream.GRPO_RENAMES[key]
    assert getattr(getattr(cfg, sec), field) == RENAMED_VALUES[key]
    assert f"{sec}.{field}" in cfg.explicit


def test_combined_keys(tmp_path):
    cfg = load_grpo_config(_write(tmp_path / "g.yaml", {"chunk_size": 3, "num_rollouts": 2, "sync_ref_model": True,
                                                       "ref_model_sync_steps": 7, "use_vllm": 0}))
    assert cfg.rl.batch_size == 6 and cfg.rl.ref_sync_steps == 7 and cfg.run.rollout_backend == "mindspore"
    # a missing partner takes upstream's default: num_rollouts 4; sync_ref_model False
    cfg = load_grpo_config(_write(tmp_path / "h.yaml", {"chunk_size": 2, "ref_model_sync_steps": 7}))
    assert cfg.rl.batch_size == 8 and cfg.rl.ref_sync_steps == 0
    # the schedule: any of its four keys selects upstream's schedule, the others at upstream's defaults
    cfg = load_grpo_config(_write(tmp_path / "i.yaml", {"start_lr": 1e-5}))
    assert (cfg.optim.lr_schedule, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.optim.decay_steps) == \
        ("mindrlhf_cosine", 1e-5, 1e-10, 10, 200000)
    cfg = load_grpo_config(_write(tmp_path / "j.yaml", {"use_vllm": 1}))
    assert cfg.run.rollout_backend == "vllm_mindspore"
    cfg = load_grpo_config(_write(tmp_path / "k.yaml", {"save_prompt_completions_data": True,
                                                       "save_prompt_completions_dir": "/d/pc"}))
    assert cfg.run.rollout_log_file == "/d/pc/prompt_completions.mindrecord"


def test_the_fixture_and_the_shipped_example_load_with_their_inert_keys_listed():
    for path in (FLAT, os.path.join(os.path.dirname(__file__), "..", "examples", "grpo", "qwen_grpo_tutorial",
                                    "grpo_config.yaml")):
        cfg = load_grpo_config(path)
        with open(path) as fh:
            raw = yaml.safe_load(fh)
        inert = {k for k in raw if upstream.GRPO_TABLE[k].status == upstream.INERT}
        assert {key for _, key, _ in cfg.ignored} == inert and "grpo_epochs" in inert and "lr" in inert


def test_flat_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"g.yaml: bogus_key: unknown field"):
        load_grpo_config(_write(tmp_path / "g.yaml", {"beta": 0.1, "bogus_key": 1}))
    with pytest.raises(ConfigError, match="mixes sections"):
        load_grpo_config(_write(tmp_path / "m.yaml", {"rl": {"beta": 0.1}, "chunk_size": 1}))
    with pytest.raises(ConfigError, match="optimizer: 'lamb' is not implemented"):
        load_grpo_config(_write(tmp_path / "o.yaml", {"optimizer": "lamb"}))
    with pytest.raises(ConfigError, match="use_vllm: expected 0"):
        load_grpo_config(_write(tmp_path / "v.yaml", {"use_vllm": 3}))
    with pytest.raises(ConfigError, match="end_lr.*expected < lr"):
        load_grpo_config(_write(tmp_path / "l.yaml", {"start_lr": 1e-6, "end_lr": 1e-5}))
    with pytest.raises(ConfigError, match="chunk_size: expected a positive integer"):
        load_grpo_config(_write(tmp_path / "c.yaml", {"chunk_size": 0}))


def test_upstream_flags(tmp_path):
    cfg = config_from_argv(["--use_vllm", "1", "--reward_funcs", "accuracy_reward", "format_reward",
                            "--reward_weights", "1", "0.5", "--tensorboard_dir", "/d/tb", "--load_ckpt_format",
                            "safetensors", "--pre_num_generations", "1", "--custom_model_name", "qwen"])
    assert cfg.run.rollout_backend == "vllm_mindspore" and cfg.run.log_dir == "/d/tb"
    assert cfg.reward.verifier_function == ["accuracy_reward", "format_reward"] and cfg.reward.verifier_weight == [1, .5]
    assert {k for _, k, _ in cfg.ignored} == {"--load_ckpt_format", "--pre_num_generations"}
    with pytest.raises(ConfigError, match="--custom_model_name: 'deepseek' is not supported"):
        config_from_argv(["--custom_model_name", "deepseek"])
    # our flags still win over the file
    cfg = config_from_argv(["--config", FLAT, "--beta", "0.5"])
    assert cfg.rl.beta == 0.5 and cfg.rl.num_generations == 4


# ---- the learning-rate schedule ------------------------------------------------------------------------
def test_mindrlhf_schedule_against_a_hand_computed_table():
    # start 1e-5, end 1e-6, warmup 2, decay 6; t counts updates from 0
    cosine = [0.0, 5.0, 7.75, 5.5, 3.25, 1 + 4.5 * (1 + math.cos(5 * math.pi / 6)), 1.0, 1.0, 1.0]
    poly = [0.0, 5.0, 7.0, 5.5, 4.0, 2.5, 1.0, 1.0, 1.0]
    for t in range(9):
        assert mindrlhf_lr(t, 1e-5, 1e-6, 2, 6) * 1e6 == pytest.approx(cosine[t], abs=1e-9)
        assert mindrlhf_lr(t, 1e-5, 1e-6, 2, 6, "polynomial") * 1e6 == pytest.approx(poly[t], abs=1e-9)


def test_mindrlhf_schedule_equals_mindspores_lr_cells():
    """Upstream's LearningRate is MindSpore's WarmUpLR + CosineDecayLR / PolynomialDecayLR: compare with them."""
    import mindspore as ms
    from mindspore import nn
    warm, cos = nn.WarmUpLR(3e-4, 5), nn.CosineDecayLR(2e-5, 3e-4, 30)
    poly = nn.PolynomialDecayLR(3e-4, 2e-5, 30, 1.0)
    for t in (0, 1, 4, 5, 6, 17, 29, 30, 45):
        step = ms.Tensor(t, ms.int32)
        ref_cos = float(warm(step).asnumpy()) if t < 5 else float(cos(step).asnumpy())
        ref_poly = float(warm(step).asnumpy()) if t < 5 else float(poly(step).asnumpy())
        assert mindrlhf_lr(t, 3e-4, 2e-5, 5, 30) == pytest.approx(ref_cos, rel=1e-5, abs=1e-12)
        assert mindrlhf_lr(t, 3e-4, 2e-5, 5, 30, "polynomial") == pytest.approx(ref_poly, rel=1e-5, abs=1e-12)


# ---- model YAMLs ---------------------------------------------------------------------------------------
def test_upstream_model_yamls_load_and_report_every_inert_key():
    for path in (FINETUNE, PREDICT):
        y = load_model_yaml(path)
        with open(path) as fh:
            raw = yaml.safe_load(fh)
        reported = {k for k, _ in y.ignored}
        expected = {k for k in raw if k not in ("model", "parallel_config", "micro_batch_interleave_num")}
        expected |= {f"model.model_config.{k}" for k in raw["model"]["model_config"] if k in mindformers.MODEL_INERT}
        expected |= {f"parallel_config.{k}" for k in raw["parallel_config"] if k in mindformers.PARALLEL_INERT}
        if raw["parallel_config"].get("pipeline_stage", 1) == 1:    # pipeline settings without stages
            expected |= {"parallel_config.micro_batch_num"}           # (offset 0 is the split without stages)
        assert reported == expected
    finetune = load_model_yaml(FINETUNE)            # model_parallel 2: sequence parallelism is on, not reported
    assert finetune.parallel.use_seq_parallel and "parallel_config.use_seq_parallel" not in dict(finetune.ignored)
    assert load_model_yaml(PREDICT).generation == {"max_tokens": 8, "min_tokens": 2, "temperature": 1.2, "top_k": 50,
                                                   "top_p": 1.0, "repetition_penalty": 1.0}


@pytest.mark.parametrize("section,key,value", [
    ("model", "rotary_pct", 0.5), ("model", "kv_channels", 8), ("model", "extend_method", "NTK"),
    ("model", "rotary_emb_base", 500), ("parallel", "context_parallel", 2)])
def test_model_keys_that_would_change_results_are_refused(tmp_path, section, key, value):
    with open(PREDICT) as fh:
        doc = yaml.safe_load(fh)
    (doc["model"]["model_config"] if section == "model" else doc["parallel_config"])[key] = value
    with pytest.raises(ConfigError, match=f"{key}: .* is not supported"):
        load_model_yaml(_write(tmp_path / "m.yaml", doc))


# ---- values reach the trainer --------------------------------------------------------------------------
def _trainer(assets, tmp_path, path=FLAT, **flags):
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    lines = []
    return GRPOTrainer(_config(assets, tmp_path, path, **flags), log=lambda *a, **k: lines.append(" ".join(map(str, a)))), lines


def _config(assets, tmp_path, path=FLAT, **flags):
    argv = ["--config", path, "--save_ckpt_dir", str(tmp_path), "--progress", "False", "--export_hf", "False"]
    for k in ("vocab_path", "merges_file_path", "mind_dataset_dir", "sft_path_train", "sft_path_infer"):
        argv += [f"--{k}", assets[k]]
    for k, v in flags.items():
        argv += [f"--{k}", str(v)]
    return config_from_argv(argv)


@pytest.mark.slow       # ~30 s; the tutorial's own files run in tests/test_tutorial.py
def test_flat_config_and_predict_yaml_reach_the_trainer(assets, tmp_path):
    trainer, lines = _trainer(assets, tmp_path)
    # chunk_size 2 x num_rollouts 1 prompts per rollout replica; batch_size 4 sequences per update
    assert trainer.dataset.batch_size == 2 and trainer.geometry.mini_batch == 4 and trainer.geometry.minibatches == 2
    assert trainer.ref_model is not None and trainer.cfg.rl.ref_sync_steps == 2       # beta 0.01, sync every 2
    assert trainer.engine.max_num_seqs == 4
    # epochs 1 over 64 prompts at 2 per step
    assert trainer.cfg.run.total_steps == 32
    params = trainer.run.sampling()       # the predict YAML's generation fields
    assert (params.max_tokens, params.min_tokens, params.temperature, params.top_k, params.top_p) == (8, 2, 1.2, 50, 1.0)
    text = "\n".join(lines)
    for key in ("grpo_epochs", "ppo_epochs", "lr (never read", "auto_tune", "use_seq_parallel", "micro_batch_num",
                "model.model_config.do_sample", "max_position_embeddings"):
        assert key in text, key
    assert trainer.run.micro_batches == 2          # micro_batch_interleave_num 2 (top level): honoured, not inert
    # 8 sequences (2 prompts x 4 samples), 4 per update: 2 updates per step at upstream's schedule (update 0 has
    # lr 0: its warmup starts at 0), so the policy leaves the reference only in step 2
    history = [trainer.train_one_step() for _ in range(2)]
    for step, metrics in enumerate(history):
        expected_lr = np.mean([mindrlhf_lr(t, 1e-3, 1e-4, 1, 4) for t in (2 * step, 2 * step + 1)])
        assert metrics["lr"] == pytest.approx(expected_lr, rel=1e-6)
    assert history[0]["kl"] == 0 and history[1]["kl"] > 0       # the reference model is active


def test_resolution_leaves_the_loaded_config_as_it_was_and_freezes_the_run(assets, tmp_path):
    """The infer YAML's generation fields and epochs -> total_steps are the resolved run's; the config the
    caller loaded is not changed, and the run's cannot be."""
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    cfg = _config(assets, tmp_path)
    loaded = dataclasses.asdict(cfg)
    trainer = GRPOTrainer(cfg, log=lambda *a, **k: None)
    assert dataclasses.asdict(cfg) == loaded and cfg.run.total_steps == 100 and cfg.sampling.max_tokens == 64
    assert trainer.cfg.run.total_steps == 32 and trainer.cfg.sampling.max_tokens == 8
    for section, field in (("sampling", "max_tokens"), ("run", "total_steps"), ("rl", "beta")):
        with pytest.raises(dataclasses.FrozenInstanceError, match="resolved"):
            setattr(getattr(trainer.cfg, section), field, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        trainer.cfg.rl = None


def test_grpo_config_wins_over_the_predict_yaml_and_total_steps_over_epochs(assets, tmp_path):
    trainer, _ = _trainer(assets, tmp_path, max_tokens=6, temperature=0.7, total_steps=3)
    params = trainer.run.sampling()
    assert (params.max_tokens, params.temperature, params.top_k) == (6, 0.7, 50)
    assert trainer.cfg.run.total_steps == 3


def test_reference_checkpoint_without_beta_is_reported(assets, tmp_path):
    _, lines = _trainer(assets, tmp_path, beta=0.0, load_ref_checkpoint=assets["mind_dataset_dir"])
    assert any("load_ref_checkpoint" in line and "not loaded: rl.beta is 0" in line for line in lines)


def test_a_reference_yaml_of_another_model_is_refused(assets, tmp_path):
    with open(assets["sft_path_train"]) as fh:
        doc = yaml.safe_load(fh)
    doc["model"]["model_config"]["num_layers"] = 3
    with pytest.raises(ConfigError, match="sft_path_ref .* describes another model"):
        _trainer(assets, tmp_path, sft_path_ref=_write(tmp_path / "ref.yaml", doc))


def test_max_model_len_is_checked(assets, tmp_path):
    with pytest.raises(ConfigError, match="max_model_len: prompt length 16 \\+ max_tokens 8 = 24 exceeds"):
        _trainer(assets, tmp_path, max_model_len=20)


@pytest.mark.slow       # ~24 s
def test_save_data_file_holds_the_experience_in_mindrlhfs_schema(assets, tmp_path):
    import mindspore.dataset as ds
    from mindrlhf.trainer.grpo_math import group_advantages
    exp, log = str(tmp_path / "exp.mindrecord"), str(tmp_path / "log.mindrecord")
    trainer, _ = _trainer(assets, tmp_path, save_data_file=exp, rollout_log_file=log, total_steps=1)
    trainer.fit()
    rows = list(ds.MindDataset(exp, shuffle=False).create_dict_iterator(output_numpy=True, num_epochs=1))
    assert len(rows) == 8 and set(rows[0]) == set(upstream_schema())
    readable = list(ds.MindDataset(log, shuffle=False).create_dict_iterator(output_numpy=True, num_epochs=1))
    rewards = np.array([float(r["reward"]) for r in readable], np.float32)
    expected_adv = group_advantages(rewards, 4, True)
    for row, adv in zip(rows, expected_adv):
        p_mask, r_mask = row["prompts_mask"], row["responses_mask"]
        assert len(row["prompt_completion_ids"]) == len(p_mask) == len(r_mask) == len(row["ref_per_token_logps"]) + 1
        assert not np.any(p_mask & r_mask) and p_mask.sum() > 0 and r_mask.sum() > 0
        ref = row["ref_per_token_logps"]
        on_response = r_mask[1:].astype(bool)          # logp at t predicts token t + 1
        assert np.all(ref[on_response] < 0) and np.all(ref[~on_response] == 0)
        assert float(row["advantages"][0]) == pytest.approx(float(adv), abs=1e-6)


def upstream_schema():
    from mindrlhf.trainer.experience_file import SCHEMA
    return SCHEMA


@pytest.mark.slow       # ~11 s
def test_max_num_seqs_gives_the_same_samples_in_chunks(assets):
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.rollout.engine import GenerationEngine
    from mindrlhf.rollout.sampling import SamplingParams
    model = CausalLM(load_model_yaml(assets["sft_path_train"]).model)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    params = SamplingParams(temperature=1.0, max_tokens=6, n=3, seed=3, eos_token_ids=[2])
    keys = [(1, i) for i in range(4)]
    whole = GenerationEngine(model, 0, 8).generate(prompts, params, keys)
    chunked = GenerationEngine(model, 0, 8, max_num_seqs=6).generate(prompts, params, keys)   # 2 prompts at once
    np.testing.assert_array_equal(whole.response_ids, chunked.response_ids)
    np.testing.assert_array_equal(whole.prompt_index, chunked.prompt_index)
    np.testing.assert_allclose(whole.logprobs, chunked.logprobs, atol=1e-5)


# ---- defaults: what upstream runs, and every field's origin at start-up -------------------------------------
def test_our_defaults_are_what_upstream_runs_except_the_listed_differences():
    from mindrlhf.configs.grpo_config import field_defaults
    ours = field_defaults()
    for key, (theirs, why) in upstream.RUN_DEFAULTS.items():
        if why:
            assert ours[key] != theirs, f"{key}: listed as differing ({why}) but equal: drop the reason"
        else:
            assert ours[key] == theirs, f"{key}: ours {ours[key]!r}, upstream runs {theirs!r}"


def test_the_tutorials_command_without_a_config_runs_upstreams_defaults(assets, tmp_path):
    """grpo_one_stage.py with only the tutorial's file flags: KL 0.01 with a reference synced every 50 steps,
    accuracy + format rewards, MindRLHF's warmup-cosine from 5e-7, 10 passes over the data."""
    from mindrlhf.trainer.resolve import resolve
    argv = ["--sft_path_train", assets["sft_path_train"], "--sft_path_infer", assets["sft_path_infer"],
            "--vocab_path", assets["vocab_path"], "--merges_file_path", assets["merges_file_path"],
            "--mind_dataset_dir", assets["mind_dataset_dir"], "--save_ckpt_dir", str(tmp_path)]
    lines = []
    run = resolve(config_from_argv(argv), 0, 1, lambda *a, **k: lines.append(" ".join(map(str, a))))
    cfg = run.cfg
    assert (cfg.rl.beta, cfg.rl.kl_estimator, cfg.rl.ref_sync_steps, cfg.rl.loss_agg) == \
        (0.01, "k3", 50, "seq-mean-token-mean")
    assert cfg.reward.verifier_function == ["accuracy_reward", "format_reward"] and run.reward_fn is not None
    assert (cfg.optim.lr_schedule, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.optim.beta2) == \
        ("mindrlhf_cosine", 5e-7, 1e-10, 10, 0.95)
    assert cfg.run.total_steps == 10 * (64 // 4)            # epochs 10 over 64 prompts, 4 per step
    text = "\n".join(lines)
    assert "total_steps = 160  <- run.epochs 10 x 16 steps per pass" in text
    assert f"sft_path_train = {assets['sft_path_train']!r}  <- --sft_path_train" in text
    assert "beta = " not in text                             # at its default: only in config_resolved.yaml
    assert "beta: 0.01  # default\n" in resolved_config_text(cfg)
    assert "seed = 1  <- default; MindRLHF runs None" in text    # a default upstream runs otherwise is said
    # the predict YAML's generation fields, named as their source
    assert f"max_tokens = 8  <- {assets['sft_path_infer']} (model_config)" in text


def test_an_eval_dataset_that_eval_steps_0_leaves_unused_is_said(assets, tmp_path):
    from mindrlhf.trainer.resolve import resolve
    argv = ["--eval_dataset", assets["mind_dataset_dir"], "--max_tokens", "8", "--save_ckpt_dir", str(tmp_path)]
    for k in ("vocab_path", "merges_file_path", "mind_dataset_dir", "sft_path_train"):
        argv += [f"--{k}", assets[k]]
    for extra, said in (([], True), (["--eval_steps", "5"], False)):
        lines = []
        run = resolve(config_from_argv(argv + extra), 0, 1, lambda *a, **k: lines.append(" ".join(map(str, a))))
        unused = [line for line in lines if "no evaluation" in line]
        assert bool(unused) == said and (run.eval_dataset is None) == said
        if said:
            assert f"run.eval_dataset {assets['mind_dataset_dir']}: no evaluation, run.eval_steps is 0" in unused[0]


def test_start_up_lists_what_is_not_default_and_the_run_dir_every_field(assets, tmp_path):
    """Start-up prints the fields set or derived (value and origin); config_resolved.yaml holds every field
    with its origin and loads back as the same config."""
    from mindrlhf.configs.grpo_config import _section_fields
    from mindrlhf.trainer.resolve import resolve
    path = _write(tmp_path / "g.yaml", {"rl": {"beta": 0.2, "num_generations": 4}, "optim": {"lr": 1e-4}})
    argv = ["--config", path, "--lr", "3e-4", "--total_steps", "2", "--max_tokens", "8", "--save_ckpt_dir",
            str(tmp_path)]
    for k in ("vocab_path", "merges_file_path", "mind_dataset_dir", "sft_path_train"):
        argv += [f"--{k}", assets[k]]
    lines = []
    run = resolve(config_from_argv(argv), 0, 1, lambda *a, **k: lines.extend(" ".join(map(str, a)).split("\n")))
    fields = [line.strip() for line in lines if line.startswith("    ") and " = " in line]
    origin = dict(line.split(" = ", 1) for line in fields)
    assert origin["beta"] == f"0.2  <- {path}" and origin["num_generations"] == f"4  <- {path}"
    assert origin["lr"] == "0.0003  <- --lr"            # the flag wins over the file, and says so
    assert origin["total_steps"] == "2  <- --total_steps"
    assert origin["max_tokens"] == "8  <- --max_tokens" and "min_p" not in origin
    assert len(fields) < len(list(_section_fields())) // 2
    assert all("<- default" not in f or "MindRLHF runs" in f for f in fields)
    text = resolved_config_text(run.cfg)
    entries = [line for line in text.splitlines() if line.startswith("  ")]
    assert len(entries) == len(list(_section_fields()))
    assert "  min_p: 0.0  # default" in entries and f"  beta: 0.2  # {path}" in entries
    reloaded = load_grpo_config(_write(tmp_path / "resolved.yaml", yaml.safe_load(text)))
    for sec, f in _section_fields():
        assert getattr(getattr(reloaded, sec), f.name) == getattr(getattr(run.cfg, sec), f.name), (sec, f.name)


def test_settings_that_rule_out_a_default_replace_it_and_say_so(tmp_path):
    cfg = load_grpo_config(None, {"lora_rank": 4})
    assert cfg.rl.ref_sync_steps == 0 and "lora" in cfg.origin["rl.ref_sync_steps"]
    assert any(line.startswith("rl.ref_sync_steps: 0") for line in cfg.derived)
    with pytest.raises(ConfigError, match="ref_sync_steps"):       # set by the user: still refused
        load_grpo_config(None, {"lora_rank": 4, "ref_sync_steps": 10})
    cfg = load_grpo_config(None, {"sequence_packing": True})
    assert cfg.rl.loss_agg == "token-mean" and "rl.loss_agg" in cfg.origin
    assert load_grpo_config(None, {"sequence_packing": False}).rl.loss_agg == "seq-mean-token-mean"
    cfg = load_grpo_config(None, {"verifier_function": "accuracy_reward"})     # weights left out: 1 each
    assert cfg.reward.verifier_weight == [1.0] and "reward.verifier_weight" in cfg.origin


def test_the_layout_sizes_can_come_from_the_grpo_config_and_win_over_the_yaml(assets, tmp_path):
    """parallel.<role>_* (flags or the GRPO config) replace the model YAML's parallel_config sizes, said at
    start-up; data_parallel not given is what the other sizes leave; the infer layout keeps its own file's."""
    from mindrlhf.configs.grpo_load import load_grpo_config as load
    from mindrlhf.trainer.resolve import resolve
    from grpo_helpers import model_yaml
    train = model_yaml(str(tmp_path / "train.yaml"), dp=2)
    infer = model_yaml(str(tmp_path / "infer.yaml"), dp=2)
    base = ["--sft_path_train", train, "--sft_path_infer", infer, "--vocab_path", assets["vocab_path"],
            "--merges_file_path", assets["merges_file_path"], "--mind_dataset_dir", assets["mind_dataset_dir"],
            "--save_ckpt_dir", str(tmp_path / "ck"), "--num_generations", "4", "--batch_size", "2",
            "--use_parallel", "True"]
    lines = []
    run = resolve(config_from_argv(base + ["--train_model_parallel", "2"]), 0, 2, lines.append)
    assert (run.train_mesh.dp, run.train_mesh.tp) == (1, 2) and (run.infer_mesh.dp, run.infer_mesh.tp) == (2, 1)
    assert "update: one graph for the model (engine.layerwise_update false" in run.describe()
    layerwise = resolve(config_from_argv(base + ["--train_model_parallel", "2", "--layerwise_update", "True"]), 0, 2,
                        lambda *a: None)
    assert "update: a graph per decoder layer (engine.layerwise_update" in layerwise.describe()
    note = [line for line in lines if line.startswith("train layout from parallel.train_*")]
    assert note and "--train_model_parallel" in note[0] and "model_parallel 1 -> 2" in note[0] \
        and "data_parallel 2 -> 1" in note[0] and train in note[0]
    path = _write(tmp_path / "g.yaml", {"parallel": {"infer_model_parallel": 2, "infer_data_parallel": 1}})
    run = resolve(config_from_argv(base + ["--config", path]), 0, 2, lambda *a: None)
    assert (run.train_mesh.dp, run.train_mesh.tp) == (2, 1) and (run.infer_mesh.dp, run.infer_mesh.tp) == (1, 2)
    with pytest.raises(ConfigError, match="parallel.train_model_parallel x train_pipeline_stage = 3 x 1 does not "
                                          "divide the 2 rank"):
        resolve(config_from_argv(base + ["--train_model_parallel", "3"]), 0, 2, lambda *a: None)
    with pytest.raises(ConfigError, match="parallel.infer_model_parallel: expected >= 0"):
        load(None, {"infer_model_parallel": -1})


def test_the_train_offset_splits_the_pipeline_stages_as_given(assets, tmp_path):
    """parallel.train_offset (MindFormers' per-stage offset; verl's Megatron pipeline split gives it) replaces the
    YAML's: 3 layers over 2 stages go 1 + 2 with [0, 1] instead of MindFormers' default 2 + 1, said at start-up,
    and each stage's model builds those layers; offsets that do not add up to the depth are named with the flag."""
    from mindrlhf.configs.model_config import layer_split
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.parallel.mesh import Mesh
    from mindrlhf.trainer.resolve import resolve
    from grpo_helpers import model_yaml
    train = model_yaml(str(tmp_path / "train.yaml"), dp=2, num_layers=3, tie_word_embeddings=False)
    base = ["--sft_path_train", train, "--vocab_path", assets["vocab_path"], "--merges_file_path",
            assets["merges_file_path"], "--mind_dataset_dir", assets["mind_dataset_dir"], "--save_ckpt_dir",
            str(tmp_path / "ck"), "--num_generations", "4", "--batch_size", "2", "--use_parallel", "True",
            "--train_pipeline_stage", "2"]
    plain = resolve(config_from_argv(base), 0, 2, lambda *a: None).model_cfg
    assert [len(r) for r in layer_split(3, 2, plain.offset)] == [2, 1]
    lines = []
    cfg = resolve(config_from_argv(base + ["--train_offset", "0,1"]), 0, 2, lines.append).model_cfg
    assert cfg.offset == [0, 1] and [len(r) for r in layer_split(3, 2, cfg.offset)] == [1, 2]
    note = [line for line in lines if line.startswith("train layout from parallel.train_*")]
    assert note and "offset 0 -> [0, 1] (layers per stage [1, 2])" in note[0] and "--train_offset" in note[0]
    held = [{p.name for p in CausalLM(cfg, Mesh(1, 1, rank, pp=2)).get_parameters()} for rank in range(2)]
    assert {n.split(".")[2] for n in held[0] if n.startswith("model.layers.")} == {"0"}
    assert {n.split(".")[2] for n in held[1] if n.startswith("model.layers.")} == {"1", "2"}
    with pytest.raises(ConfigError, match=r"parallel.train_offset \(--train_offset\): \[1, 1\] gives stages \[2, 2\] "
                                          r"layers, 4 in all, but num_layers is 3"):
        resolve(config_from_argv(base + ["--train_offset", "1,1"]), 0, 2, lambda *a: None)


def test_a_model_path_that_is_not_there_or_not_a_model_says_what_was_expected(tmp_path):
    # --sft_path_train /nonexist used to say "model config file not found", a folder without config.json the
    # same, and `hf_config DIR` "not readable JSON ([Errno 2] ...)"
    from mindrlhf.configs.compat.hf import model_config_from_hf
    missing, empty = str(tmp_path / "nowhere"), tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"nowhere: not found \(expected a model YAML file or an HF model folder"):
        load_model_yaml(missing)
    with pytest.raises(ConfigError, match=r"empty: a folder without config.json \(expected a model YAML file or an "
                                          r"HF model folder"):
        load_model_yaml(str(empty))
    with pytest.raises(ConfigError, match=r"nowhere: not found \(expected an HF model folder"):
        model_config_from_hf(missing)
    with pytest.raises(ConfigError, match=r"empty: a folder without config.json"):
        model_config_from_hf(str(empty))
