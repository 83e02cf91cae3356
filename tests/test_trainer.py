"""The GRPO loop in one process: first-step invariants, resume equality, crash-safe checkpoints, bad config."""
import json
import os

import numpy as np
import pytest

from grpo_helpers import WORKER, cli_args, grpo_overrides, make_grpo_assets, model_yaml
from mindrlhf.checkpoint.model_io import model_state
from mindrlhf.configs import CheckpointError, ConfigError
from mindrlhf.configs.grpo_load import load_grpo_config
from mindrlhf.trainer import checkpointing, grpo_trainer
from mindrlhf.trainer.grpo_trainer import GRPOTrainer, TrainingError
from mindrlhf.trainer.resolve import ResolvedRun
from mindrlhf.trainer.metrics import read_metrics


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_grpo_assets(str(tmp_path_factory.mktemp("grpo")))


def _computed(row):
    """What a step's metrics row says the run computed, as JSON text (NaN too): times, rates and peak memory,
    which change between equal runs, left out."""
    return {k: json.dumps(v) for k, v in row.items() if not (k.startswith(("time", "peak_mb")) or k.endswith("_per_s"))}


def _trainer(assets, save_dir, log=lambda *a: None, **extra):
    return GRPOTrainer(load_grpo_config(None, grpo_overrides(assets, str(save_dir), **extra)), log=log)


def test_first_step_kl_zero_ratio_one_no_clip(assets, tmp_path):
    trainer = _trainer(assets, tmp_path, beta=0.05, total_steps=1, rollout_log_file=str(tmp_path / "rollouts.mindrecord"))
    metrics = trainer.fit()[0]
    assert metrics["kl"] == 0.0 and metrics["clip_frac"] == 0.0
    assert metrics["rollout_train_logprob_gap"] <= 1e-4
    rows = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert rows[0]["step"] == 1 and "time_rollout" in rows[0] and "peak_mb_train" in rows[0]
    import mindspore.dataset as ds
    saved = list(ds.MindDataset(str(tmp_path / "rollouts.mindrecord"), shuffle=False).create_dict_iterator(
        output_numpy=True, num_epochs=1))
    assert len(saved) == 2 * 4 and all(int(r["step"]) == 1 for r in saved)
    assert float(np.mean([r["reward"] for r in saved])) == pytest.approx(metrics["reward_mean"], abs=1e-6)


@pytest.mark.slow       # ~11 s; a separate rollout model receiving every update stays in the default run
def test_updates_change_the_policy_and_rollout_sees_them(assets, tmp_path):
    logs = []
    trainer = _trainer(assets, tmp_path, log=logs.append, total_steps=2, mini_batch_size=4,
                       verifier_function="digit_fraction_test", weight_decay=0.0)
    before = model_state(trainer.policy)
    history = trainer.fit()
    # the first step (it compiles as it goes) says so and reports each phase as it ends; the second is quiet
    first = [i for i, line in enumerate(logs) if line.startswith("step 1: the first of this process")]
    assert len(first) == 1
    phases = [line for line in logs if line.startswith("  step ")]
    assert [p.split(":")[0] for p in phases][:3] == ["  step 1 rollout", "  step 1 gather", "  step 1 reward"]
    assert "  step 1 train" in [p.split(":")[0] for p in phases] and not any(p.startswith("  step 2") for p in phases)
    assert logs.index(phases[0]) > first[0]
    after = model_state(trainer.policy)
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    # several updates per rollout: later minibatches are off-policy, so ratios move and the first-step
    # logprob gap check still holds because rollout and policy share weights at rollout time
    assert all(m["rollout_train_logprob_gap"] <= 1e-4 for m in history)


@pytest.mark.slow       # ~40 s; test_resume_with_a_moving_reference_is_exact covers it in the default run
def test_resume_matches_uninterrupted_run(assets, tmp_path):
    from mindrlhf.checkpoint.model_io import save_checkpoint
    from mindrlhf.configs import load_model_yaml
    from mindrlhf.models.qwen2 import CausalLM
    init = str(tmp_path / "init.safetensors")
    save_checkpoint(model_state(CausalLM(load_model_yaml(assets["sft_path_train"]).model)), init)
    common = dict(verifier_function="digit_fraction_test", load_sft_checkpoint_train=init, total_steps=4,
                  save_steps=2)
    full = _trainer(assets, tmp_path / "full", **common)
    full_hist = full.fit()
    full_state = model_state(full.policy)

    stopped = _trainer(assets, tmp_path / "split", **common)   # a 4-step run that stops after step 2
    for _ in range(2):
        stopped.train_one_step()
    stopped.save()
    first_state = model_state(stopped.policy)
    resumed = _trainer(assets, tmp_path / "split", resume=True, **common)
    assert resumed.step == 2
    hist = resumed.fit()
    state = model_state(resumed.policy)
    assert any(not np.array_equal(state[k], first_state[k]) for k in state)   # steps 3-4 did learn
    for k in full_state:
        np.testing.assert_allclose(state[k], full_state[k], rtol=0, atol=1e-6, err_msg=k)
    for a, b in zip(hist, full_hist[2:]):
        assert a["reward_mean"] == b["reward_mean"] and a["loss"] == pytest.approx(b["loss"], abs=1e-6)


def test_crash_while_saving_resumes_from_previous(assets, tmp_path, monkeypatch):
    trainer = _trainer(assets, tmp_path, total_steps=4, save_steps=2)
    real_save = checkpointing.save_params
    calls = {"n": 0}

    def failing_save(params, path):
        calls["n"] += 1
        if "step_000004" in path or calls["n"] > 2:   # the second save dies half-way
            raise KeyboardInterrupt("killed")
        return real_save(params, path)

    monkeypatch.setattr(checkpointing, "save_params", failing_save)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    assert checkpointing.complete_steps(str(tmp_path)) == [2]
    assert not os.path.exists(tmp_path / "step_000004" / "COMPLETE")
    monkeypatch.setattr(checkpointing, "save_params", real_save)
    resumed = _trainer(assets, tmp_path, total_steps=4, save_steps=2, resume=True)
    assert resumed.step == 2
    resumed.fit()
    assert checkpointing.complete_steps(str(tmp_path)) == [2, 4]


def test_nan_loss_stops_with_a_clear_error(assets, tmp_path):
    trainer = _trainer(assets, tmp_path, total_steps=1)
    for p in trainer.policy.trainable_params():
        if p.name.endswith("norm_out.weight"):
            from mindspore import Tensor
            p.copy_(Tensor(np.full(p.shape, np.nan, np.float32)))
    trainer.weight_sync.sync()
    with pytest.raises(TrainingError, match="loss or gradient norm is not finite"):
        trainer.fit()


@pytest.mark.parametrize("extra,pattern", [
    ({"mind_dataset_dir": "/nonexistent/x.mindrecord"}, r"MindRecord file not found: /nonexistent"),
    ({"max_tokens": 200}, r"sampling.max_tokens: prompt length 16 .* exceeds model.model_config.seq_length=128"),
    ({"mini_batch_size": 3}, r"rl.mini_batch_size: 3 does not divide"),
    ({"load_sft_checkpoint_train": "/nope.ckpt"}, r"load_sft_checkpoint_train: not found: /nope.ckpt"),
])
def test_bad_config_is_named(assets, tmp_path, extra, pattern):
    with pytest.raises(ConfigError, match=pattern):
        _trainer(assets, tmp_path, **extra)


@pytest.mark.parametrize("field,value,pattern", [
    ("num_generations", 1, r"rl.num_generations: 1 .* at least 2"),
    ("temperature", float("nan"), r"sampling.temperature: expected a finite number, got nan"),
    ("beta", float("nan"), r"rl.beta: expected a finite number, got nan"),
    ("lr", float("inf"), r"optim.lr: expected a finite number, got inf"),
])
def test_values_that_would_train_silently_wrong_are_refused(field, value, pattern):
    """A group of one has advantage 0 (no gradient, every dynamic-sampling step skipped); NaN slips through
    `< 0` checks."""
    with pytest.raises(ConfigError, match=pattern):
        load_grpo_config(None, {field: value})


def test_model_vocab_smaller_than_tokenizer(assets, tmp_path):
    small = model_yaml(str(tmp_path / "small.yaml"), vocab_size=128)
    with pytest.raises(ConfigError, match=r"tokenizer has \d+ tokens but model.model_config.vocab_size is 128"):
        _trainer(assets, tmp_path, sft_path_train=small)


def test_parallel_yaml_without_use_parallel(assets, tmp_path):
    two = model_yaml(str(tmp_path / "tp2.yaml"), tp=2)
    with pytest.raises(ConfigError, match=r"use_parallel is False but .*tp2.yaml asks for 2 ranks"):
        _trainer(assets, tmp_path, sft_path_train=two)


def test_grpo_config_yaml_and_cli_precedence(tmp_path):
    from mindrlhf.configs.grpo_load import config_from_argv
    cfg_file = tmp_path / "g.yaml"
    cfg_file.write_text("rl:\n  num_generations: 16\n  beta: 0.04\nsampling:\n  max_tokens: 32\n")
    cfg = config_from_argv(["--config", str(cfg_file), "--beta", "0.1"])
    assert cfg.rl.num_generations == 16 and cfg.rl.beta == 0.1 and cfg.sampling.max_tokens == 32
    assert cfg.rl.batch_size == 4  # an absent flag does not override anything
    cfg_file.write_text("rl:\n  num_generation: 16\n")
    with pytest.raises(ConfigError, match=r"g.yaml: rl.num_generation: unknown field"):
        config_from_argv(["--config", str(cfg_file)])
    with pytest.raises(ConfigError, match=r"--loss_agg: expected one of"):
        config_from_argv(["--loss_agg", "mean"])


def test_engine_switches_written_in_their_earlier_sections_still_load(tmp_path):
    """The engine switches moved to one section (engine.*); a file that writes them where they were (run.*,
    rl.*) loads the same values with a one-line note each, the flags never changed, and both spellings at once
    is an error."""
    from mindrlhf.configs.grpo_config import MOVED_FIELDS
    from mindrlhf.configs.grpo_load import config_from_argv
    old = tmp_path / "old.yaml"
    old.write_text("run:\n  layerwise_update: true\n  share_prompt: false\n  seed: 3\nrl:\n  micro_batch_size: 4\n"
                   "  sequence_packing: true\n  max_packing_token_size: 512\n  beta: 0.0\n")
    new = tmp_path / "new.yaml"
    new.write_text("run:\n  seed: 3\nengine:\n  layerwise_update: true\n  share_prompt: false\n  micro_batch_size: 4\n"
                   "  sequence_packing: true\n  max_packing_token_size: 512\nrl:\n  beta: 0.0\n")
    from_old, from_new = config_from_argv(["--config", str(old)]), config_from_argv(["--config", str(new)])
    assert vars(from_old.engine) == vars(from_new.engine) == {
        "share_prompt": False, "layerwise_update": True, "micro_batch_size": 4, "sequence_packing": True,
        "max_packing_token_size": 512}
    assert from_old.explicit == from_new.explicit
    notes = [line for line in from_old.derived if "deprecated" in line]
    assert len(notes) == len(MOVED_FIELDS) == 5 and not any("deprecated" in line for line in from_new.derived)
    assert any(line.startswith("engine.micro_batch_size: 4 (written rl.micro_batch_size") for line in notes)
    assert config_from_argv(["--micro_batch_size", "2"]).engine.micro_batch_size == 2
    both = tmp_path / "both.yaml"
    both.write_text("run:\n  layerwise_update: true\nengine:\n  layerwise_update: false\n")
    with pytest.raises(ConfigError, match="run.layerwise_update and engine.layerwise_update are both given"):
        config_from_argv(["--config", str(both)])


@pytest.mark.msrun
@pytest.mark.slow       # ~41 s; the default run keeps the single-process layout errors (test_upstream_compat)
def test_world_size_mismatch_under_msrun_exits_cleanly(assets, tmp_path):
    """Every rank fails the same validation before any collective: non-zero exit, message, no hang."""
    import subprocess
    from msrun_util import free_port
    dp4 = model_yaml(str(tmp_path / "dp4.yaml"), dp=4, vocab_size=416)
    script = os.path.join(os.path.dirname(__file__), "..", "examples", "grpo", "qwen_grpo_tutorial",
                          "grpo_one_stage.py")
    cmd = ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "--join=True", f"--log_dir={tmp_path / 'log'}", script,
           "--use_parallel", "True", "--sft_path_train", dp4, "--vocab_path", assets["vocab_path"],
           "--merges_file_path", assets["merges_file_path"], "--mind_dataset_dir", assets["mind_dataset_dir"],
           "--save_ckpt_dir", str(tmp_path / "ckpt")]
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), ".."))
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert proc.returncode != 0
    for r in range(2):
        log = (tmp_path / "log" / f"worker_{r}.log").read_text(errors="replace")
        assert "error: train (sft_path_train) parallel_config: data_parallel=4 x model_parallel=1 x pipeline_stage=1 " \
               "= 4 ranks, but the job has 2" in log


@pytest.mark.parametrize("at_start,evaluated_at", [      # true (the default) in the default run: test_eval's fixture
    pytest.param(True, [0, 1], marks=pytest.mark.slow), (False, [1])])
def test_eval_at_start_decides_the_eval_before_the_first_step(assets, tmp_path, at_start, evaluated_at):
    """run.eval_at_start (verl's val_before_train) false: the first evaluation comes after step eval_steps."""
    trainer = _trainer(assets, tmp_path, total_steps=1, eval_steps=1, eval_dataset=assets["mind_dataset_dir"],
                       eval_at_start=at_start)
    steps = []
    trainer.evaluate = lambda: steps.append(trainer.step) or {"eval_accuracy": 0.5}
    trainer.fit()
    assert steps == evaluated_at
    rows = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in rows if "eval_accuracy" in r] == evaluated_at


@pytest.mark.slow       # ~16 s; the layout-invariance runs sync the reference at step 2
def test_reference_sync_every_n_steps(assets, tmp_path):
    trainer = _trainer(assets, tmp_path, total_steps=2, beta=0.05, ref_sync_steps=2, mini_batch_size=4,
                       verifier_function="digit_fraction_test")
    start = model_state(trainer.ref_model)
    trainer.train_one_step()
    assert all(np.array_equal(v, start[k]) for k, v in model_state(trainer.ref_model).items())   # not yet
    trainer.train_one_step()
    ref, pol = model_state(trainer.ref_model), model_state(trainer.policy)
    assert all(np.array_equal(ref[k], pol[k]) for k in pol)
    assert any(not np.array_equal(ref[k], start[k]) for k in pol)


def test_export_of_bf16_policy_matches_its_weights(tmp_path):
    """Exported HF weights are the policy's values (bf16 parameters are widened, not reinterpreted): the
    trainer's export path (exchange.write_full_policy into export_hf) on a bf16 model."""
    from mindrlhf.checkpoint.hf_interop import export_hf, iter_hf_as_ms
    from mindrlhf.configs import load_model_yaml
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.trainer import exchange
    from mindrlhf.utils.params import param_as_f32
    cfg = load_model_yaml(model_yaml(str(tmp_path / "bf16.yaml"), param_init_type="bfloat16")).model
    policy = CausalLM(cfg)
    exchange.write_full_policy(policy, lambda full: export_hf(full, str(tmp_path / "hf"), cfg))
    exported = dict(iter_hf_as_ms(str(tmp_path / "hf")))
    for p in policy.get_parameters():
        assert str(p.dtype) == "BFloat16" and np.array_equal(exported[p.name], param_as_f32(p)), p.name


def test_the_export_holds_one_full_tensor_at_a_time(tmp_path):
    """The trainer's export (exchange.write_full_policy into export_hf) gathers each full tensor as the writer
    takes it: numpy's peak allocation (tracemalloc) while exporting an 8-layer model stays under half of its
    weights, where gathering them all first held every one (+540 MB for SmolLM2 at the end of each run); the
    folder holds the model's values, the tied head left out."""
    import tracemalloc
    from mindrlhf.checkpoint.hf_interop import export_hf, iter_hf_as_ms
    from mindrlhf.configs import load_model_yaml
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.trainer import exchange
    from mindrlhf.utils.params import param_as_f32
    cfg = load_model_yaml(model_yaml(str(tmp_path / "deep.yaml"), num_layers=8)).model
    policy = CausalLM(cfg)
    total = sum(param_as_f32(p).nbytes for p in policy.get_parameters())
    tracemalloc.start()
    try:
        exchange.write_full_policy(policy, lambda full: export_hf(full, str(tmp_path / "hf"), cfg,
                                                                  max_shard_bytes=total // 3))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < total / 2, f"{peak} bytes held while exporting {total}"
    exported = dict(iter_hf_as_ms(str(tmp_path / "hf")))
    assert sorted(exported) == sorted(p.name for p in policy.get_parameters())
    for p in policy.get_parameters():
        assert np.array_equal(exported[p.name], param_as_f32(p)), p.name


def test_a_bf16_policy_is_refused_on_cpu_at_set_up(assets, tmp_path):
    """MindSpore 2.10's CPU Assign kernel has no bfloat16, so AdamW cannot write a bf16 policy: a set-up error
    naming the field (it once surfaced as a type error deep in the first update's compile)."""
    bf16 = model_yaml(str(tmp_path / "bf16.yaml"), param_init_type="bfloat16")
    with pytest.raises(ConfigError, match="param_init_type bfloat16 cannot be trained on MindSpore's CPU"):
        _trainer(assets, tmp_path, sft_path_train=bf16, total_steps=1)


# ~8 s; the default run checks the gap at T 0.8 + top_p on every step (test_layout_invariance), filters in test_rollout
@pytest.mark.slow
def test_rollout_and_train_logprobs_agree_at_temperature(assets, tmp_path):
    """Old, reference and current log-probs follow the rollout's temperature (log softmax(logits / T)):
    on the first step the rollout-vs-train gap is float noise and the KL to the identical reference is 0."""
    trainer = _trainer(assets, tmp_path, total_steps=1, temperature=0.5, top_p=0.9, top_k=30, beta=0.05)
    metrics = trainer.fit()[0]
    assert metrics["rollout_train_logprob_gap"] <= 1e-4
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-7)


@pytest.mark.slow       # ~35 s; the default run keeps test_reference_sync_every_n_steps and exact resumes
def test_resume_with_a_moving_reference_is_exact(assets, tmp_path):
    """beta > 0 with ref_sync_steps: the synced reference is checkpointed, so a resumed run equals an
    uninterrupted one; metrics.jsonl holds each step once and the rollout log keeps the earlier rows."""
    import mindspore.dataset as ds
    common = dict(verifier_function="digit_fraction_test", total_steps=4, save_steps=2, beta=0.2, ref_sync_steps=2,
                  num_iterations=2, mini_batch_size=4)
    full = _trainer(assets, tmp_path / "full", rollout_log_file=str(tmp_path / "full.mindrecord"), **common)
    full.fit()
    split_dir = tmp_path / "split"
    log = str(tmp_path / "split.mindrecord")
    stopped = _trainer(assets, split_dir, rollout_log_file=log, **common)
    for _ in range(3):                      # step 2 syncs the reference; step 3 is logged, then trained again
        stopped.metrics.log(stopped.step + 1, stopped.train_one_step(), echo=None)
        if stopped.step == 2:
            stopped.save()
    stopped.rollout_log.flush()             # step 3's rows on disk, its checkpoint never written: resume drops them
    resumed = _trainer(assets, split_dir, rollout_log_file=log, resume=True, **common)
    assert resumed.step == 2
    resumed.fit()
    want, got = model_state(full.policy), model_state(resumed.policy)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-6, err_msg=k)
    rows, ref_rows = read_metrics(str(split_dir / "metrics.jsonl")), read_metrics(str(tmp_path / "full" / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for a, b in zip(rows, ref_rows):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["kl"] == pytest.approx(b["kl"], abs=1e-6)

    def read(path):
        return [(int(r["step"]), str(r["response"])) for r in ds.MindDataset(path, shuffle=False)
                .create_dict_iterator(output_numpy=True, num_epochs=1)]
    assert read(log) == read(str(tmp_path / "full.mindrecord"))


def test_resume_refuses_a_checkpoint_of_another_layout(assets, tmp_path):
    import json
    from mindrlhf.configs.errors import CheckpointError
    _trainer(assets, tmp_path, total_steps=1).fit()
    state_path = tmp_path / "step_000001" / "trainer_state.json"
    state = json.loads(state_path.read_text())
    state["layout"] = {"world_size": 2, "train": [1, 2], "infer": [2, 1]}
    state_path.write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=r"saved with layout world_size=2, train dp1 x tp2, infer dp2 x tp1, "
                                              r"but this run has world_size=1, train dp1 x tp1"):
        _trainer(assets, tmp_path, total_steps=2, resume=True)


def test_empty_prompt_is_refused_at_set_up(tmp_path):
    from mindrlhf.data.dataset import PromptDataset
    table = {"prompt_ids": np.array([[5, 6, 0], [0, 0, 0], [7, 0, 0]]), "pretrain_ids": np.zeros((3, 4), np.int64),
             "loss_mask": np.zeros((3, 4), np.int64)}
    with pytest.raises(ConfigError, match=r"1 prompt\(s\) are empty .* first at row 1"):
        PromptDataset("prompts.mindrecord", 1, columns=table, pad_token_id=0)


def test_a_separate_rollout_model_receives_every_update(assets, tmp_path):
    """With an fp16 rollout model (a separate object), after training its weights are the policy's,
    rounded to fp16: the sync really moved them (the shared-model case cannot show that)."""
    import mindspore as ms
    from mindrlhf.utils.params import param_as_f32
    infer = model_yaml(str(tmp_path / "infer_fp16.yaml"), param_init_type="float16")
    trainer = _trainer(assets, tmp_path, sft_path_infer=infer, total_steps=2, mini_batch_size=4,
                       verifier_function="digit_fraction_test", weight_decay=0.0)
    assert trainer.rollout_model is not trainer.policy
    before = {p.name: param_as_f32(p).copy() for p in trainer.rollout_model.get_parameters()}
    trainer.fit()
    policy = {p.name: p for p in trainer.policy.get_parameters()}
    moved = 0
    for p in trainer.rollout_model.get_parameters():
        want = policy[p.name].astype(ms.float16).float().asnumpy()
        assert np.array_equal(param_as_f32(p), want), p.name
        moved += not np.array_equal(param_as_f32(p), before[p.name])
    assert moved > 0


@pytest.mark.slow       # ~38 s; the default run keeps the crash inside a save and its resume
def test_resume_syncs_a_separate_rollout_model_from_the_restored_policy(assets, tmp_path):
    """An fp16 rollout model is a separate object: after a resume it must hold the restored policy (rounded to
    fp16), not the initial weights it was built from, so the step after the resume samples what the
    uninterrupted run sampled. A constant lr: update 1 moves the policy, so the two differ."""
    import mindspore as ms
    from mindrlhf.utils.params import param_as_f32
    infer = model_yaml(str(tmp_path / "infer_fp16.yaml"), param_init_type="float16")
    common = dict(sft_path_infer=infer, verifier_function="digit_fraction_test", total_steps=2, save_steps=1,
                  lr_schedule="constant")
    full = _trainer(assets, tmp_path / "full", **common)
    assert full.rollout_model is not full.policy
    full.fit()
    stopped = _trainer(assets, tmp_path / "split", **common)
    initial = {p.name: param_as_f32(p).copy() for p in stopped.rollout_model.get_parameters()}
    stopped.metrics.log(1, stopped.train_one_step(), echo=None)
    stopped.save()
    resumed = _trainer(assets, tmp_path / "split", resume=True, **common)
    assert resumed.step == 1
    policy = {p.name: p for p in resumed.policy.get_parameters()}
    moved = 0
    for p in resumed.rollout_model.get_parameters():
        assert np.array_equal(param_as_f32(p), policy[p.name].astype(ms.float16).float().asnumpy()), p.name
        moved += not np.array_equal(param_as_f32(p), initial[p.name])
    assert moved > 0                       # the restored policy is not the initial one
    resumed.fit()
    rows, want = read_metrics(str(tmp_path / "split" / "metrics.jsonl")), read_metrics(str(tmp_path / "full" / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2]
    assert [_computed(r) for r in rows] == [_computed(r) for r in want]
    got, expected = model_state(resumed.policy), model_state(full.policy)
    for k in expected:
        assert np.array_equal(got[k], expected[k]), k


def test_tensorboard_events_are_written(tmp_path):
    """TensorBoard scalars are written when a writer is installed (tensorboard is a test extra)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from mindrlhf.trainer.metrics import MetricsLogger
    logger = MetricsLogger(str(tmp_path))
    logger.log(1, {"reward_mean": 0.25}, echo=None)
    logger.log(2, {"reward_mean": 0.5}, echo=None)
    logger.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward_mean")] == [(1, 0.25), (2, 0.5)]


@pytest.mark.slow       # ~8 s; the default run keeps the events being written (test_tensorboard_events_are_written)
def test_tensorboard_off_writes_no_events(assets, tmp_path):
    """run.tensorboard False: metrics JSONL only, no event files (and no writer import)."""
    from mindrlhf.trainer.metrics import MetricsLogger
    logger = MetricsLogger(str(tmp_path), tensorboard=False)
    logger.log(1, {"reward_mean": 0.25}, echo=None)
    logger.close()
    assert logger._tb is None and not (tmp_path / "tensorboard").exists()
    assert (tmp_path / "metrics.jsonl").read_text().count("reward_mean") == 1
    assert _trainer(assets, tmp_path / "off", tensorboard=False).metrics._tb is None
    assert _trainer(assets, tmp_path / "on").metrics._tb is not None      # the default, tensorboard installed


def _msrun_grpo(assets, tmp_path, extra_flags, env_extra=None, timeout=400):
    import subprocess
    import time
    from msrun_util import free_port
    flags = dict(use_parallel=True, sft_path_train=model_yaml(str(tmp_path / "tp2.yaml"), tp=2),
                 sft_path_infer=model_yaml(str(tmp_path / "dp2.yaml"), dp=2), vocab_path=assets["vocab_path"],
                 merges_file_path=assets["merges_file_path"], mind_dataset_dir=assets["mind_dataset_dir"],
                 save_ckpt_dir=str(tmp_path / "ckpt"), total_steps=3, max_tokens=6, num_generations=2, batch_size=2,
                 progress=False, export_hf=False, verifier_function="digit_fraction_test")
    flags.update(extra_flags)
    cmd = ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "--join=True", f"--log_dir={tmp_path / 'log'}", WORKER]
    cmd += cli_args(flags)
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), ".."), **(env_extra or {}))
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    logs = [(tmp_path / "log" / f"worker_{r}.log").read_text(errors="replace") for r in range(2)]
    return proc.returncode, logs, time.time() - t0


@pytest.mark.msrun
@pytest.mark.slow       # ~60 s; the default run keeps other msrun tests within its time budget
def test_an_exception_inside_a_step_ends_every_rank(assets, tmp_path):
    """Rank 1 fails inside step 2's update while rank 0 goes on into a collective: the job still ends,
    non-zero, well before any collective timeout, and the failing worker's log names the error."""
    code, logs, seconds = _msrun_grpo(assets, tmp_path, {}, {"MINDRLHF_TEST_FAIL_AT": "1:2"})
    assert code != 0 and seconds < 300
    assert "injected failure on rank 1 in step 2" in logs[1]


@pytest.mark.msrun
@pytest.mark.slow       # ~45 s
def test_too_few_eval_prompts_for_the_infer_replicas_is_a_set_up_error(assets, tmp_path):
    code, logs, _ = _msrun_grpo(assets, tmp_path, {"eval_dataset": assets["mind_dataset_dir"], "eval_steps": 1,
                                                   "eval_prompts": 1})
    assert code != 0
    for log in logs:
        assert "error: run.eval_prompts: 1 eval prompt(s)" in log and "infer data-parallel replicas" in log


@pytest.mark.slow       # ~17 s: two runs; the default run trains through the skipped pass in every one-mini-batch test
def test_one_update_per_rollout_skips_the_old_policy_pass(assets, tmp_path, monkeypatch):
    """num_iterations 1 and one mini-batch: no separate old-policy pass, and the same losses, gradients and
    weights as with it (the ratio is 1 with the gradient of log p either way)."""
    common = dict(total_steps=2, beta=0.05, verifier_function="digit_fraction_test", temperature=0.7)
    fast = _trainer(assets, tmp_path / "fast", **common)
    assert fast.run.on_policy
    fast_hist = fast.fit()
    assert all("time_old_logprob" not in m for m in fast_hist)
    monkeypatch.setattr(ResolvedRun, "on_policy", property(lambda self: False))
    slow = _trainer(assets, tmp_path / "slow", **common)
    slow_hist = slow.fit()
    assert all("time_old_logprob" in m for m in slow_hist)
    for a, b in zip(fast_hist, slow_hist):
        for key in ("loss", "pg_loss", "kl", "grad_norm", "entropy", "reward_mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
        assert a["rollout_train_logprob_gap"] <= 1e-4 and b["rollout_train_logprob_gap"] <= 1e-4
    want, got = model_state(slow.policy), model_state(fast.policy)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-6, err_msg=k)


@pytest.mark.slow       # ~28 s
def test_the_training_step_compiles_at_set_up_and_the_first_update_only_runs_it(assets, tmp_path, monkeypatch):
    """The trainer compiles its training graph before the first rollout (utils/compile_ahead.py says why);
    no update compiles anything then, and the run equals one whose training graph compiles at its first
    update, bit for bit (compiling ahead runs nothing: weights, moments and the step count are untouched)."""
    from mindspore.graph.api import ms_compile_cache
    compiled = []
    real_update = GRPOTrainer.update

    def update(self, *args):
        before = set(ms_compile_cache)
        out = real_update(self, *args)
        compiled.append(len(set(ms_compile_cache) - before))
        return out
    monkeypatch.setattr(GRPOTrainer, "update", update)
    common = dict(total_steps=2, beta=0.05, verifier_function="digit_fraction_test", temperature=0.7)
    ahead = _trainer(assets, tmp_path / "ahead", **common)
    assert int(ahead.optimizer.step.asnumpy()[0]) == 0
    ahead_hist = ahead.fit()
    assert compiled == [0, 0]
    compiled.clear()
    monkeypatch.setattr(grpo_trainer, "compile_train_step", lambda *args: None)
    lazy_hist = _trainer(assets, tmp_path / "lazy", **common).fit()
    assert compiled == [1, 0]

    assert [_computed(r) for r in ahead_hist] == [_computed(r) for r in lazy_hist]
    assert ahead_hist[1]["grad_norm"] > 0 and ahead_hist[1]["kl"] > 0


def _three_column_copy(src: str, dst: str, answer_edit=None):
    """The file MindRLHF's rlhf_data.py would write: prompt_ids, pretrain_ids, loss_mask only."""
    from mindrlhf.data.mindrecord_io import SCHEMA, read_mindrecord, write_mindrecord
    table = read_mindrecord(src)
    cols = {k: list(table[k]) for k in ("prompt_ids", "pretrain_ids", "loss_mask")}
    if answer_edit:
        answer_edit(cols)
    write_mindrecord(dst, cols, {k: SCHEMA[k] for k in cols})
    return table


def test_three_column_mindrlhf_file_trains_with_its_solutions(assets, tmp_path):
    """Solutions come back from the answer part of pretrain_ids (not all-zero rewards)."""
    path = str(tmp_path / "upstream.mindrecord")
    ours = _three_column_copy(assets["mind_dataset_dir"], path)
    trainer = _trainer(assets, tmp_path, mind_dataset_dir=path, total_steps=1)
    assert trainer.dataset.table["solution"].tolist() == ours["solution"].tolist()
    assert all(trainer.dataset.table["solution"])
    trainer.fit()


def test_three_column_file_without_final_answers_is_refused(assets, tmp_path):
    path = str(tmp_path / "upstream.mindrecord")

    def drop_answers(cols):
        cols["loss_mask"] = [np.zeros_like(m) for m in cols["loss_mask"]]

    _three_column_copy(assets["mind_dataset_dir"], path, drop_answers)
    with pytest.raises(ConfigError, match=r"no 'solution' column .* 64 of 64 rows have no final answer .* first at "
                                          r"row 0: rewards would all be 0"):
        _trainer(assets, tmp_path, mind_dataset_dir=path)


@pytest.mark.slow       # ~25 s; shared-prompt log-probs and gradients against transformers stay in the default run
def test_shared_prompt_gives_the_whole_rows_trajectory(assets, tmp_path):     # (test_model_parity.py)
    """engine.share_prompt (each prompt runs once for its group in the reference and training forwards): the same
    losses, KL, gradient norms and weights as every row run whole; a layout it cannot serve says so."""
    common = dict(total_steps=2, beta=0.05, verifier_function="digit_fraction_test", temperature=0.7,
                  num_iterations=2)          # two groups a mini-batch; the old-policy pass runs too
    shared = _trainer(assets, tmp_path / "shared", share_prompt=True, **common)
    assert shared.run.shared_prompt == (4, shared.run.prompt_width)
    whole = _trainer(assets, tmp_path / "whole", share_prompt=False, **common)
    assert whole.run.shared_prompt == (0, 0)
    for a, b in zip(shared.fit(), whole.fit()):
        for key in ("loss", "pg_loss", "kl", "grad_norm", "entropy", "reward_mean", "clip_frac"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    # four AdamW updates at lr 1e-3: an element whose gradient is float noise may move differently by a
    # sliver of one update (seen: 1.4e-6 on one embedding element); a wrong prompt moves every element by ~lr
    want, got = model_state(whole.policy), model_state(shared.policy)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-5, err_msg=k)
    diff = np.sqrt(sum(np.sum((got[k] - want[k]) ** 2) for k in want))
    assert diff <= 1e-6 * np.sqrt(sum(np.sum(want[k] ** 2) for k in want))
    logs = []
    split = GRPOTrainer(load_grpo_config(None, grpo_overrides(assets, str(tmp_path / "split"), mini_batch_size=2,
                                                              share_prompt=True)), log=logs.append)
    assert split.run.shared_prompt == (0, 0)
    assert any("engine.share_prompt" in m and "mini-batches of 2 rows split groups of 4" in m for m in logs), logs


# ---- run.enable_compile_cache: one cache directory per job -----------------------------------------------
def test_compile_cache_directory_changes_with_anything_that_changes_the_graphs(assets, tmp_path):
    """MindSpore's compile cache hands out graphs by compile order and checks only the Python sources, so
    a job that compiles other graphs (another temperature baked into the log-prob graphs, another model, a
    resumed run starting elsewhere) must not read this one's cache; the same job must."""
    from mindrlhf.trainer.node_check import compile_cache_dir

    def key(**extra):
        return compile_cache_dir(load_grpo_config(None, grpo_overrides(assets, str(tmp_path), **extra)), 0)

    base = key()
    assert os.path.dirname(base) == str(tmp_path / "compile_cache") and key() == base
    assert key(temperature=0.7) != base and key(max_tokens=6) != base and key(num_generations=2) != base
    other_model = model_yaml(str(tmp_path / "kv1.yaml"), n_kv_heads=1)
    assert key(sft_path_train=other_model) != base
    assert compile_cache_dir(load_grpo_config(None, grpo_overrides(assets, str(tmp_path))), 2) != base


def _run_grpo_worker(assets, save, env=None, **extra):
    """One grpo_one_stage run in its own process (MindSpore's compile cache is per process); its stdout."""
    import subprocess
    import sys
    from grpo_helpers import REPO
    args = cli_args(dict(grpo_overrides(assets, save, **extra), rollout_log_file=""))
    proc = subprocess.run([sys.executable, WORKER] + args, env=dict(os.environ, PYTHONPATH=REPO, **(env or {})),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    if extra.get("enable_compile_cache"):
        assert "compile cache: " + os.path.join(save, "compile_cache") in proc.stdout
    return proc.stdout


@pytest.mark.slow       # two subprocess runs, ~40 s
def test_a_changed_model_does_not_run_the_previous_jobs_cached_graphs(assets, tmp_path):
    """With enable_compile_cache, a second job in the same save_ckpt_dir with another model (1 kv head
    instead of 2) trains: it compiles its own graphs. Measured before the cache was keyed by job: the
    second job loaded the first one's graphs and failed in an Assign kernel."""
    save = str(tmp_path / "ckpt")
    for yaml_path in (assets["sft_path_train"], model_yaml(str(tmp_path / "kv1.yaml"), n_kv_heads=1)):
        _run_grpo_worker(assets, save, sft_path_train=yaml_path, total_steps=1, save_steps=0,
                         enable_compile_cache=True, overwrite_ckpt_dir=True)     # the compile cache stays
    assert len(os.listdir(os.path.join(save, "compile_cache"))) == 2


@pytest.mark.slow       # ~17 s
def test_mindspores_own_cache_variable_does_not_run_another_jobs_graphs(assets, tmp_path):
    """MS_COMPILER_CACHE_ENABLE=1 in the environment turns on MindSpore's cache keyed by the Python sources
    only: measured before this fix, the second job here (another model) loaded the first one's graphs and
    failed in an Assign kernel. With run.enable_compile_cache off the trainer turns MindSpore's cache off too
    and says the variable is ignored."""
    env = {"MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": str(tmp_path / "ms_cache")}
    for name, yaml_path in (("kv2", assets["sft_path_train"]),
                            ("kv1", model_yaml(str(tmp_path / "kv1.yaml"), n_kv_heads=1))):
        out = _run_grpo_worker(assets, str(tmp_path / name), env=env, sft_path_train=yaml_path, total_steps=1,
                               save_steps=0)
        assert "MS_COMPILER_CACHE_ENABLE=1 ignored" in out, out[-2000:]
    assert not os.path.exists(tmp_path / "ms_cache")


# ~15 s each: the micro-batch, layerwise and packed graphs' cache runs are -m slow (one_graph stays)
@pytest.mark.parametrize("update", [{}, pytest.param({"micro_batch_size": 2}, marks=pytest.mark.slow),
                                    pytest.param({"layerwise_update": True}, marks=pytest.mark.slow),
                                    pytest.param({"sequence_packing": True}, marks=pytest.mark.slow)],
                         ids=["one_graph", "micro_batches", "layerwise", "packed"])
def test_a_rerun_from_the_compile_cache_trains_the_same_and_starts_without_compiling(assets, tmp_path, update):
    """The same job twice with enable_compile_cache: the second run reads the first one's graphs (none
    written again; its first step, all compile in the first run, takes under half the time) and its
    metrics are the first run's, bit for bit (a dense reward, temperature 0.7 and a KL term: every graph
    does work), for each way of running the update. Measured before utils.params.hold_reads: the re-run
    stopped on a NaN loss at step 2 with micro-batches (the optimizer's step counter, read by a graph that
    did not hold it, came back unbound), failed layerwise (the template layer's weights in its backward
    graph) and left the first run's metrics at step 2 with packed rows. The README's warm-start figures
    rest on this."""
    save = str(tmp_path / "ckpt")
    runs = []
    for _ in range(2):
        _run_grpo_worker(assets, save, total_steps=2, save_steps=0, enable_compile_cache=True,
                         verifier_function="response_length_test", temperature=0.7, beta=0.04,
                         overwrite_ckpt_dir=True, **update)      # the same job again: the compile cache stays
        files = {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
                 for d, _, names in os.walk(os.path.join(save, "compile_cache")) for f in names}
        runs.append((read_metrics(os.path.join(save, "metrics.jsonl")), files))
        os.rename(os.path.join(save, "metrics.jsonl"), os.path.join(save, f"metrics{len(runs)}.jsonl"))
    (cold, cold_files), (warm, warm_files) = runs
    assert any(f.endswith(".mindir") for f in cold_files) and warm_files == cold_files
    assert warm[0]["time_step"] < 0.5 * cold[0]["time_step"], (warm[0]["time_step"], cold[0]["time_step"])
    assert len(cold) == len(warm) == 2
    for c, w in zip(cold, warm):
        assert _computed(w) == _computed(c), c["step"]
    assert cold[1]["grad_norm"] > 0 and cold[1]["kl"] > 0 and cold[0]["loss"] != 0


@pytest.mark.slow       # ~29 s
def test_a_fresh_run_refuses_another_runs_directory_and_overwrite_starts_over(assets, tmp_path):
    """A second run into a save_ckpt_dir holding a run is refused (before any model is built) unless told to
    overwrite; overwriting leaves only the new run's checkpoints and metrics; a complete step is never
    written again, and resume refuses a step another run wrote."""
    first = _trainer(assets, tmp_path, total_steps=1)
    first.fit()
    old_run = json.load(open(tmp_path / "RUN"))["run_id"]
    with pytest.raises(ConfigError, match=r"holds another run's state \(RUN, step_000001, metrics.jsonl, ...\)"):
        _trainer(assets, tmp_path, total_steps=1)
    assert checkpointing.complete_steps(str(tmp_path)) == [1]
    second = _trainer(assets, tmp_path, total_steps=1, overwrite_ckpt_dir=True, seed=7)
    second.fit()
    new_run = json.load(open(tmp_path / "RUN"))["run_id"]
    assert new_run != old_run
    assert [r["step"] for r in read_metrics(str(tmp_path / "metrics.jsonl"))] == [1]
    assert json.load(open(tmp_path / "step_000001" / "trainer_state.json"))["run_id"] == new_run
    before = open(tmp_path / "step_000001" / "rank_0" / "policy.safetensors", "rb").read()
    with pytest.raises(CheckpointError, match="already marked complete"):
        second.save()
    assert open(tmp_path / "step_000001" / "rank_0" / "policy.safetensors", "rb").read() == before
    with open(tmp_path / "RUN", "w") as fh:
        json.dump({"run_id": old_run}, fh)
    with pytest.raises(CheckpointError, match="written by run .* mixes two runs"):
        _trainer(assets, tmp_path, total_steps=2, resume=True)


def test_a_run_that_ended_before_saving_anything_does_not_block_the_next(tmp_path):
    """A fresh run writes RUN at start, before its model paths are checked: one that stopped there (a typo in
    --sft_path_train) left RUN alone, and the corrected run was refused as 'another run's state (RUN)'. A RUN
    with nothing beside it (no step, export, metrics, TensorBoard or rollout log) is replaced, said in the log;
    RUN beside any of those still refuses."""
    from types import SimpleNamespace
    from mindrlhf.trainer import run_dir
    run = SimpleNamespace(save_ckpt_dir=str(tmp_path), log_dir="", rollout_log_file="", overwrite_ckpt_dir=False)
    said = []
    old = run_dir.claim(run, 0, True, said.append)
    assert not said
    new = run_dir.claim(run, 0, True, said.append)
    assert new != old and json.load(open(tmp_path / "RUN"))["run_id"] == new
    assert len(said) == 1 and "RUN of a run that saved nothing" in said[0] and str(tmp_path) in said[0]
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"holds another run's state \(RUN, metrics.jsonl\)"):
        run_dir.claim(run, 0, True, said.append)


def _log_step(log, step, rows=3):
    """One step's rows into a RolloutLog, with stand-ins for the samples and the tokenizer."""
    from types import SimpleNamespace
    samples = SimpleNamespace(prompt_ids=np.tile([[step, 2, 0]], (rows, 1)),
                              prompt_mask=np.tile([[1, 1, 0]], (rows, 1)), solution_index=[0] * rows)
    tokenizer = SimpleNamespace(decode_batch=lambda ids, skip_special_tokens: [" ".join(map(str, r)) for r in ids])
    log.add(step, samples, [f"step {step} sample {i}" for i in range(rows)], np.arange(rows) / rows, [str(step)],
            tokenizer)


def _log_rows(path):
    from mindrlhf.data.mindrecord_io import read_columns
    from mindrlhf.trainer.rollout_log import SCHEMA
    cols = read_columns(path, list(SCHEMA))
    return list(zip(*[[str(v) for v in cols[k]] for k in SCHEMA]))


def test_the_rollout_log_holds_only_the_rows_since_the_last_checkpoint(tmp_path):
    """Each checkpoint appends the rows since the previous one and forgets them: memory does not grow with
    the run. Resume cuts the file back to the resumed step's rows without loading them, and the resumed
    log equals the uninterrupted one."""
    from mindrlhf.trainer.rollout_log import RolloutLog
    full = RolloutLog(str(tmp_path / "full.mindrecord"))
    for step in range(1, 7):
        _log_step(full, step)
        assert len(full.rows["step"]) <= 2 * 3
        if step % 2 == 0:
            full.flush()
            assert len(full.rows["step"]) == 0
    want = _log_rows(full.path)
    assert [int(r[0]) for r in want] == [s for s in range(1, 7) for _ in range(3)]

    path = str(tmp_path / "split.mindrecord")
    earlier = RolloutLog(path)
    _log_step(earlier, 9)
    earlier.flush()                                 # an earlier run's file: a fresh run replaces it
    stopped = RolloutLog(path)
    for step in range(1, 6):
        _log_step(stopped, step)
        if step in (2, 4, 5):                       # 5: flushed, but the run died before step 5's checkpoint
            stopped.flush()
    resumed = RolloutLog(path)
    resumed.restore(4)
    assert len(resumed.rows["step"]) == 0
    assert _log_rows(path) == want[:4 * 3]
    for step in (5, 6):
        _log_step(resumed, step)
    resumed.flush()
    assert _log_rows(path) == want


@pytest.mark.slow       # ~9 s; a reward module's verifiers scoring completions stay in the default run (test_eval)
def test_verifiers_from_a_reward_module_score_the_run(assets, tmp_path):
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "grpo", "custom_reward", "my_rewards.py")
    metrics = _trainer(assets, tmp_path, total_steps=1, reward_module=example,
                       verifier_function="accuracy_reward,concise_answer", verifier_weight="1.0,0.5").fit()[0]
    assert "reward/concise_answer" in metrics and "reward/accuracy_reward" in metrics
    with pytest.raises(ConfigError, match="reward.reward_module: no such file"):
        _trainer(assets, tmp_path / "other", total_steps=1, reward_module=str(tmp_path / "absent.py"))


def test_the_compile_cache_is_refused_with_pipeline_stages():
    """A re-run from the cache with pipeline stages is not covered by the rerun test above: refused by name,
    before anything compiles."""
    from types import SimpleNamespace
    from mindrlhf.trainer.startup import set_compile_cache
    run = SimpleNamespace(cfg=SimpleNamespace(run=SimpleNamespace(enable_compile_cache=True)),
                          train_mesh=SimpleNamespace(pp=2))
    with pytest.raises(ConfigError, match=r"run.enable_compile_cache: not verified with pipeline stages "
                                          r"\(pipeline_stage 2\)"):
        set_compile_cache(run, log=lambda *a: None)


def test_progress_line_shows_the_sft_loss(tmp_path):
    """The SFT command's progress lines carry its loss and eval loss (they once showed only gnorm and lr)."""
    from mindrlhf.trainer.metrics import MetricsLogger
    lines = []
    MetricsLogger(str(tmp_path), tensorboard=False).log(
        3, {"loss": 0.12345, "grad_norm": 2.0, "lr": 1e-5, "eval_loss": 0.25}, echo=lines.append)
    assert lines == ["step 3 | loss 0.1235 | gnorm 2.000 | lr 1.00e-05 | eval_loss 0.2500"]


def test_progress_line_shows_a_moe_runs_expert_load_and_aux_loss(tmp_path):
    """A Qwen3-MoE run's progress lines carry the expert load and the aux loss (moe/ metrics), a dense run's not."""
    from mindrlhf.trainer.metrics import MetricsLogger
    lines = []
    logger = MetricsLogger(str(tmp_path), tensorboard=False)
    logger.log(1, {"loss": 0.5, "moe/expert_load_max_over_mean": 1.234, "moe/aux_loss": 2.0312}, echo=lines.append)
    logger.log(2, {"loss": 0.5}, echo=lines.append)
    assert lines == ["step 1 | loss 0.5000 | load 1.23 | aux 2.031", "step 2 | loss 0.5000"]
