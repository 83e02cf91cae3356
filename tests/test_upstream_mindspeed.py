"""MindSpeed-RL's GRPO YAML: its sections and `defaults` model files are read, each mapped key reaches the run,
each inert key is reported at start-up, each key we cannot honour (or do not know) is refused by name."""
import math
import os
import shutil

import numpy as np
import pytest
import yaml

from grpo_helpers import make_grpo_assets
from mindrlhf.configs import ConfigError, load_model_yaml
from mindrlhf.configs.compat import mindspeed as ms
from mindrlhf.configs.grpo_load import config_from_argv, load_grpo_config
from mindrlhf.trainer.optim import megatron_lr

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "upstream", "mindspeed")
MODEL = "tiny_qwen25"


def _doc():
    with open(os.path.join(FIXTURE, "grpo_tiny.yaml")) as fh:
        return yaml.safe_load(fh)


def _write(folder, doc, model_edits=None, name="grpo.yaml"):
    """The fixture (edited) in `folder`, with its model/ file beside it as Hydra expects."""
    folder = str(folder)
    shutil.copytree(os.path.join(FIXTURE, "model"), os.path.join(folder, "model"), dirs_exist_ok=True)
    if model_edits is not None:
        path = os.path.join(folder, "model", f"{MODEL}.yaml")
        with open(path) as fh:
            model = yaml.safe_load(fh)
        model_edits(model[MODEL])
        with open(path, "w") as fh:
            yaml.safe_dump(model, fh)
    path = os.path.join(folder, name)
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh)
    return path


def _edited(**edits):
    """The fixture with {"section.key": value} set (value None deletes the key)."""
    doc = _doc()
    for dotted, value in edits.items():
        *parents, key = dotted.split(".")
        node = doc
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(key, None)
        else:
            node[key] = value
    return doc


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from hf_reference import make_hf_model
    root = tmp_path_factory.mktemp("mindspeed")
    out = make_grpo_assets(str(root))
    make_hf_model(str(root / "Qwen2.5-tiny"), vocab=416)
    out["hf_dir"] = str(root / "Qwen2.5-tiny")
    out["tokenizer_dir"] = os.path.dirname(out["vocab_path"])       # vocab.json + merges.txt
    return out


def _with_assets(doc, assets):
    doc["megatron_training"].update(tokenizer_name_or_path=assets["tokenizer_dir"],
                                    data_path=assets["mind_dataset_dir"])
    doc["actor_config"]["load"] = assets["hf_dir"]
    return doc


# ---- the translation -------------------------------------------------------------------------------------
def test_the_example_maps_onto_our_fields(tmp_path):
    path = _write(tmp_path, _edited(**{"rl_config.n_samples_per_prompt": 5, "rl_config.mini_batch_size": 2,
                                       "megatron_training.global_batch_size": 4}))
    cfg = load_grpo_config(path)
    run, rl, smp, opt = cfg.run, cfg.rl, cfg.sampling, cfg.optim
    assert rl.num_generations == 5 and rl.batch_size == 4 and rl.mini_batch_size == 10   # 2 prompts x 5 samples
    assert (cfg.engine.micro_batch_size, rl.num_iterations, rl.beta, rl.kl_estimator, rl.clip_low, rl.clip_high) == \
        (3, 1, 0.001, "k3", 0.2, 0.2)
    assert (smp.max_tokens, smp.top_k, smp.top_p, smp.min_p, smp.temperature) == (8, 0, 1.0, 0.0, 1.0)
    assert (opt.lr, opt.min_lr, opt.lr_schedule, opt.decay_steps, opt.warmup_steps) == \
        (1e-3, 1e-4, "megatron_cosine", 2 * 4 // 2, 0)           # train_iters x global_batch / mini_batch
    assert (opt.beta1, opt.beta2, opt.max_grad_norm, opt.weight_decay) == (0.9, 0.95, 1.0, 0.01)
    assert (run.total_steps, run.save_steps, run.seed, run.save_ckpt_dir, run.load_sft_checkpoint_train) == \
        (2, 100, 1, "./ckpt", "./Qwen2.5-tiny")
    assert (run.vocab_path, run.mind_dataset_dir, run.max_num_seqs, run.max_model_len) == \
        ("./tokenizer", "./dataset/data", 6, 64)
    assert run.sft_path_train == run.sft_path_infer == path and not run.use_parallel and not run.tensorboard
    assert cfg.swap.offload_train_optimizer and cfg.swap.offload_train_param
    assert cfg.reward.verifier_function == ["digit_fraction_test"]
    assert "rl.batch_size: 4 (global_batch_size 4 / infer data_parallel 1)" in cfg.derived
    # our flags still win over the file
    cfg = config_from_argv(["--config", path, "--num_generations", "4", "--lr", "0.5"])
    assert cfg.rl.num_generations == 4 and cfg.optim.lr == 0.5


def test_clip_ratio_sets_both_ends_of_our_clip_range(tmp_path):
    """rl_config.clip_ratio (GRPO's symmetric clip) becomes rl.clip_low and rl.clip_high, and the loss clips
    with it: values unlike our default 0.2 (the fixture's 0.2 would pass with the key ignored)."""
    import mindspore as mstype
    from mindrlhf.trainer.grpo_math import clipped_policy_loss
    losses = {}
    for ratio in (0.15, 0.35):
        cfg = load_grpo_config(_write(tmp_path / str(ratio), _edited(**{"rl_config.clip_ratio": ratio})))
        assert (cfg.rl.clip_low, cfg.rl.clip_high) == (ratio, ratio)
        # a token whose ratio is 1.3 with advantage 1, and one of 0.7 with advantage -1: clipped at 1 +- clip_ratio
        logp = mstype.Tensor(np.log(np.array([[1.3], [0.7]], np.float32)))
        loss, _, _ = clipped_policy_loss(logp, mstype.Tensor(np.zeros((2, 1), np.float32)),
                                         mstype.Tensor(np.array([1.0, -1.0], np.float32)), cfg.rl.clip_low,
                                         cfg.rl.clip_high)
        losses[ratio] = loss.asnumpy()
    np.testing.assert_allclose(losses[0.15], [[-1.15], [0.85]], rtol=0, atol=1e-5)    # both clipped
    np.testing.assert_allclose(losses[0.35], [[-1.3], [0.7]], rtol=0, atol=1e-5)      # neither: exp(log r) in fp32


def test_every_inert_key_is_listed_and_nothing_else(tmp_path):
    path = _write(tmp_path, _doc())
    cfg = load_grpo_config(path)
    doc = _doc()
    expected = {f"{sec}.{k}" for sec, table in (("megatron_training", ms.MEGATRON), ("actor_config", ms.MEGATRON),
                                                ("rl_config", ms.RL), ("generate_config", ms.GENERATE))
                for k in doc[sec] if table[k].status == ms.INERT}
    expected |= {f"generate_config.sampling_config.{k}" for k in doc["generate_config"]["sampling_config"]
                 if ms.SAMPLING[k].status == ms.INERT}
    assert {key for source, key, _ in cfg.ignored if source == path} == expected
    assert {"megatron_training.bf16", "rl_config.gamma", "generate_config.dtype"} <= expected
    with open(os.path.join(FIXTURE, "model", f"{MODEL}.yaml")) as fh:
        model_keys = yaml.safe_load(fh)[MODEL]
    assert {k for k, _ in load_model_yaml(path).ignored} == \
        {f"model.{MODEL}.{k}" for k in model_keys if ms.MEGATRON[k].status == ms.INERT}


def test_the_model_entry_and_the_layouts(tmp_path):
    path = _write(tmp_path, _edited(**{"rl_config.actor_resource": {"num_npus": 8},
                                       "actor_config.tensor_model_parallel_size": 2,
                                       "actor_config.pipeline_model_parallel_size": 2,
                                       "actor_config.num_layer_list": "1,1",
                                       "megatron_training.sequence_parallel": True,
                                       "megatron_training.global_batch_size": 8, "rl_config.mini_batch_size": 2,
                                       "generate_config.infer_tensor_parallel_size": 2}))
    train, infer = load_model_yaml(path), load_model_yaml(path, role="infer")
    m = train.model
    assert (m.num_layers, m.hidden_size, m.intermediate_size, m.num_heads, m.n_kv_heads, m.vocab_size) == \
        (2, 64, 96, 4, 2, 416)
    assert (m.theta, m.rms_norm_eps, m.max_position_embedding, m.seq_length, m.qkv_has_bias, m.tie_word_embeddings) == \
        (10000.0, 1e-6, 64, 64, True, False)
    assert m.offset == [0, 0] and m.extend_method == "None"
    p, q = train.parallel, infer.parallel
    assert (p.data_parallel, p.model_parallel, p.pipeline_stage, p.use_seq_parallel) == (2, 2, 2, True)
    assert (q.data_parallel, q.model_parallel, q.pipeline_stage) == (4, 2, 1)
    cfg = load_grpo_config(path)
    assert cfg.run.use_parallel and cfg.rl.batch_size == 2          # 8 prompts over 4 rollout replicas
    assert cfg.rl.mini_batch_size == 3                              # 2 prompts x 3 samples over 2 train ranks
    # Megatron's defaults where the entry is silent: tied embeddings, no q/k/v bias, eps 1e-5, theta 10000, MHA
    path = _write(tmp_path / "b", _doc(), model_edits=lambda e: [e.pop(k) for k in (
        "untie_embeddings_and_output_weights", "add_qkv_bias", "norm_epsilon", "rotary_base", "group_query_attention")])
    m = load_model_yaml(path).model
    assert (m.tie_word_embeddings, m.qkv_has_bias, m.rms_norm_eps, m.theta, m.n_kv_heads) == (True, False, 1e-5,
                                                                                             10000.0, 4)
    # Llama 3's RoPE scaling (tests/st/configs/model/llama32-1b.yaml's keys)
    path = _write(tmp_path / "c", _doc(), model_edits=lambda e: e.update(
        rope_scaling_type="llama3", rope_scaling_factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16))
    m = load_model_yaml(path).model
    assert m.extend_method == "LLAMA3" and m.scaling_factor == {"factor": 32.0, "low_freq_factor": 1.0,
                                                                "high_freq_factor": 4.0,
                                                                "original_max_position_embeddings": 16.0}


def test_noop_layers_leave_the_real_layers_in_their_pipeline_stages(tmp_path):
    """MindSpeed's no-op layers pad the depth for the pipeline (Qwen3-235B-A22B: 96 over 16 stages, identities at
    5 and 95, for its 94 layers): the model has the real layers, each stage the real ones of its range."""
    from mindrlhf.configs.model_config import layer_split
    path = os.path.join(SHIPPED, "grpo_qwen3_235b_a22b_A2.yaml")
    train, infer = load_model_yaml(path), load_model_yaml(path, role="infer")
    assert train.model.num_layers == infer.model.num_layers == 94
    assert [len(r) for r in layer_split(94, 16, train.model.offset)] == [5] + [6] * 14 + [5]
    assert (train.parallel.pipeline_stage, train.parallel.expert_parallel, infer.parallel.expert_parallel) == (16, 4, 8)
    two_stages = {"rl_config.actor_resource": {"num_npus": 2}, "actor_config.pipeline_model_parallel_size": 2,
                  "megatron_training.global_batch_size": 2, "rl_config.mini_batch_size": 1}
    six = lambda e: e.update(num_layers=6)  # noqa: E731
    model = load_model_yaml(_write(tmp_path / "a", _edited(**two_stages, **{"actor_config.noop_layers": "5"}),
                                   model_edits=six)).model
    assert model.num_layers == 5 and [len(r) for r in layer_split(5, 2, model.offset)] == [3, 2]
    model = load_model_yaml(_write(tmp_path / "b", _edited(**two_stages, **{"actor_config.noop_layers": [0, 1]}),
                                   model_edits=six)).model
    assert model.num_layers == 4 and [len(r) for r in layer_split(4, 2, model.offset)] == [1, 3]
    with pytest.raises(ConfigError, match=r"noop_layers: '3,4,5' leaves pipeline stage 1 without a real layer"):
        load_model_yaml(_write(tmp_path / "c", _edited(**two_stages, **{"actor_config.noop_layers": "3,4,5"}),
                               model_edits=six))
    with pytest.raises(ConfigError, match=r"noop_layers: '0,0' must name distinct layer indices in \[0, num_layers=2\)"):
        load_model_yaml(_write(tmp_path / "d", _edited(**{"actor_config.noop_layers": "0,0"})))
    assert load_model_yaml(_write(tmp_path / "e", _edited(**{"actor_config.noop_layers": [1]}))).model.num_layers == 1


def test_the_mini_batch_divides_over_train_data_parallel(tmp_path):
    path = _write(tmp_path, _edited(**{"rl_config.actor_resource": {"num_npus": 2}, "rl_config.mini_batch_size": 2,
                                       "megatron_training.global_batch_size": 4}))
    cfg = load_grpo_config(path)
    assert cfg.rl.mini_batch_size == 3 and cfg.rl.batch_size == 2     # 2 prompts x 3 samples / 2 ranks
    with pytest.raises(ConfigError, match=r"rl_config.mini_batch_size: 1 prompts x 3 samples do not split over"):
        load_grpo_config(_write(tmp_path / "b", _edited(**{"rl_config.actor_resource": {"num_npus": 2}})))


@pytest.mark.parametrize("dotted", ["bogus_section", "megatron_training.bogus", "actor_config.lr-max",
                                    "rl_config.kl_coeff", "rl_config.actor_resource.num_cpus",
                                    "generate_config.bogus", "generate_config.sampling_config.best_of"])
def test_an_unknown_key_names_the_file_and_the_key(tmp_path, dotted):
    path = _write(tmp_path, _edited(**{dotted: 1}))
    shown = dotted.replace("-", "_")
    what = "unknown top-level section" if "." not in dotted else "unknown field"
    with pytest.raises(ConfigError, match=f"{path}: {shown}: {what}"):
        load_grpo_config(path)


def test_an_unknown_key_in_a_model_file_names_that_file(tmp_path):
    path = _write(tmp_path, _doc(), model_edits=lambda e: e.update(moe_expert_capacity=2))
    model_file = os.path.join(tmp_path, "model", f"{MODEL}.yaml")
    with pytest.raises(ConfigError, match=f"{model_file}: {MODEL}.moe_expert_capacity: unknown field"):
        load_grpo_config(path)


@pytest.mark.parametrize("dotted,value,message", [
    ("rl_config.adv_estimator", "gae", r"rl_config.adv_estimator: 'gae' is not supported \(we implement group_norm"),
    ("rl_config.kl_ctrl_type", "adaptive", r"kl_ctrl_type: 'adaptive' is not supported \(we implement fixed"),
    ("rl_config.kl_penalty", "abs", r"kl_penalty: 'abs' is not supported \(we implement kl, mse, low_var_kl"),
    ("rl_config.rule_reward", False, r"rule_reward: False is not supported"),
    ("megatron_training.stage", "ray_ppo", r"megatron_training.stage: 'ray_ppo' is not supported"),
    ("actor_config.optimizer", "sgd", r"actor_config.optimizer: 'sgd' is not supported \(we implement adam"),
    ("actor_config.lr_decay_style", "WSD", r"actor_config.lr_decay_style: 'WSD' is not supported"),
    ("actor_config.context_parallel_size", 2, r"context_parallel_size: 2 is not supported"),
    ("actor_config.lr_warmup_fraction", 0.3, r"lr_warmup_fraction: 0.3 x 4 decay updates .* = 1.2 is not supported"),
    ("generate_config.infer_pipeline_parallel_size", 2, r"infer_pipeline_parallel_size: 2 is not supported"),
    ("megatron_training.split", "98,1,1", r"megatron_training.split: '98,1,1' is not supported"),
    ("rl_config.use_integrated_worker", None, None)])
def test_a_value_we_cannot_honour_is_refused(tmp_path, dotted, value, message):
    if message is None:             # ref_config while the integrated worker is on: upstream refuses it too
        dotted, value, message = "ref_config", {"load": "/x"}, "ref_config: given while rl_config.use_integrated_worker"
    with pytest.raises(ConfigError, match=message):
        load_grpo_config(_write(tmp_path, _edited(**{dotted: value})))


def test_the_entropy_bonus_is_ours(tmp_path):
    """rl_config.entropy_coeff: grpo_actor_loss_func subtracts it times the masked-mean token entropy, as
    rl.entropy_coeff does (the loss itself: tests/test_loss_reference.py)."""
    assert load_grpo_config(_write(tmp_path, _edited(**{"rl_config.entropy_coeff": 0.01}))).rl.entropy_coeff == 0.01


def test_a_model_default_we_do_not_implement_is_refused_when_absent(tmp_path):
    path = _write(tmp_path, _doc(), model_edits=lambda e: e.pop("normalization"))
    with pytest.raises(ConfigError, match=f"model.{MODEL}.normalization: not given, so MindSpeed-RL would run its "
                                          f"default 'LayerNorm', which is not supported \\(we implement RMSNorm"):
        load_grpo_config(path)
    path = _write(tmp_path / "b", _doc(), model_edits=lambda e: e.update(normalization="LayerNorm"))
    with pytest.raises(ConfigError, match=f"model.{MODEL}.normalization: 'LayerNorm' is not supported"):
        load_grpo_config(path)


def test_defaults_and_files_we_cannot_read(tmp_path):
    doc = _edited(defaults=[{"model": ["qwen_missing"]}])
    with pytest.raises(ConfigError, match=r"defaults\[0\].model: qwen_missing: .*model/qwen_missing.yaml not found"):
        load_grpo_config(_write(tmp_path, doc))
    with pytest.raises(ConfigError, match=r"defaults\[0\].data: only the model group is read"):
        load_grpo_config(_write(tmp_path, _edited(defaults=[{"data": ["x"]}])))
    # the model entry inline, without defaults, and `_self_`
    doc = _edited(defaults=["_self_"])
    with open(os.path.join(FIXTURE, "model", f"{MODEL}.yaml")) as fh:
        doc["model"] = yaml.safe_load(fh)
    assert load_model_yaml(_write(tmp_path / "inline", doc)).model.num_layers == 2
    # a Megatron checkpoint and a Megatron dataset prefix are not what we read
    megatron = tmp_path / "qwen-tp1"
    megatron.mkdir()
    (megatron / "latest_checkpointed_iteration.txt").write_text("release")
    with pytest.raises(ConfigError, match=r"actor_config.load: .* is a Megatron checkpoint"):
        load_grpo_config(_write(tmp_path, _edited(**{"actor_config.load": str(megatron)})))
    (tmp_path / "data_packed_input_ids_document.idx").write_text("")
    with pytest.raises(ConfigError, match=r"megatron_training.data_path: .* is a Megatron indexed dataset"):
        load_grpo_config(_write(tmp_path, _edited(**{"megatron_training.data_path": str(tmp_path / "data")})))


def test_warmup_and_the_megatron_schedule():
    # Megatron's scheduler in updates: lr 1e-3, min 1e-4, warmup 2, decay 6 (cosine and linear)
    cosine = [0.0, 0.5, 1.0, 0.1 + 0.45 * (1 + math.cos(math.pi / 4)), 0.55,
              0.1 + 0.45 * (1 + math.cos(3 * math.pi / 4)), 0.1, 0.1, 0.1]
    linear = [0.0, 0.5, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1, 0.1]
    for t in range(9):
        assert megatron_lr(t, 1e-3, 1e-4, 2, 6, "cosine") * 1e3 == pytest.approx(cosine[t], abs=1e-12)
        assert megatron_lr(t, 1e-3, 1e-4, 2, 6, "linear") * 1e3 == pytest.approx(linear[t], abs=1e-12)
        assert megatron_lr(t, 1e-3, 1e-4, 2, 6, "constant") * 1e3 == pytest.approx(min(t / 2, 1.0), abs=1e-12)


def test_the_tables_are_whole():
    n = ms.counts()
    assert n[ms.MAPPED] > 50 and n[ms.CHECKED] > 30 and n[ms.INERT] > 150
    for table in (ms.MEGATRON, ms.RL, ms.GENERATE, ms.SAMPLING):
        assert all(k.status in (ms.MAPPED, ms.INERT, ms.CHECKED) and k.ours for k in table.values())
    assert set(ms.MEGATRON_CHECKS) <= set(ms.MEGATRON) and set(ms.RL_CHECKS) <= set(ms.RL)


# ---- a run -----------------------------------------------------------------------------------------------
def test_two_grpo_steps_from_the_mindspeed_yaml(assets, tmp_path):
    """2 prompts x n_samples_per_prompt 3 per step, one prompt per update (2 updates per step) on Megatron's
    cosine schedule over train_iters 2 x 2 updates; init_kl_coef turns the reference model on."""
    import mindspore.dataset as ds
    from hf_reference import make_hf_model
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    path = _write(tmp_path / "cfg", _with_assets(_doc(), assets))
    log_file, save = str(tmp_path / "rollouts.mindrecord"), str(tmp_path / "run")
    # share_prompt off: its graphs compile slower, and its own tests are elsewhere
    cfg = config_from_argv(["--config", path, "--save_ckpt_dir", save, "--rollout_log_file", log_file,
                            "--progress", "False", "--export_hf", "False", "--share_prompt", "False"])
    lines = []
    trainer = GRPOTrainer(cfg, log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    startup = "\n".join(lines)
    ignored_line = next(line for line in lines if line.startswith(f"ignored in {path}:"))
    for key in ("megatron_training.use_flash_attn", "megatron_training.bf16", "actor_config.no_load_optim",
                "rl_config.gamma", "rl_config.use_integrated_worker", "generate_config.gpu_memory_utilization",
                "generate_config.sampling_config.logprobs", f"model.{MODEL}.use_mcore_models"):
        assert key in ignored_line, key
    assert "rl.mini_batch_size: 3 (mini_batch_size 1 x n_samples_per_prompt 3" in startup
    assert trainer.geometry.sequences == 6 and trainer.geometry.minibatches == 2 and trainer.ref_model is not None
    # the weights of actor_config.load
    hf = make_hf_model(str(tmp_path / "again"), vocab=416)
    embedding = {p.name: p for p in trainer.policy.get_parameters()}["model.tok_embeddings.embedding_weight"]
    np.testing.assert_allclose(embedding.asnumpy(), hf.model.embed_tokens.weight.detach().numpy(), atol=1e-6)
    history = trainer.fit()
    assert len(history) == 2
    for step, metrics in enumerate(history):
        expected = np.mean([megatron_lr(t, 1e-3, 1e-4, 0, 4, "cosine") for t in (2 * step, 2 * step + 1)])
        assert metrics["lr"] == pytest.approx(expected, rel=1e-6)
    assert history[0]["kl"] == 0 and history[1]["kl"] > 0        # the reference is active, the policy moved
    rows = list(ds.MindDataset(log_file, shuffle=False).create_dict_iterator(output_numpy=True, num_epochs=1))
    steps = [int(r["step"]) for r in rows]
    assert steps.count(1) == steps.count(2) == 2 * 3          # global_batch_size x n_samples_per_prompt


def test_keys_the_file_leaves_out_take_mindspeeds_defaults_not_mindrlhfs(tmp_path):
    """Our defaults are MindRLHF's; a MindSpeed-RL file without these keys runs as MindSpeed-RL would."""
    path = _write(tmp_path, _edited(**{"actor_config.adam_beta2": None, "actor_config.min_lr": None,
                                       "actor_config.lr_warmup_fraction": None, "megatron_training.train_iters": None,
                                       "rl_config.verifier_function": None, "rl_config.verifier_weight": None,
                                       "rl_config.init_kl_coef": None}))
    cfg = load_grpo_config(path)
    assert (cfg.optim.beta2, cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.optim.decay_steps) == (0.999, 0.0, 0, 0)
    assert (cfg.rl.loss_agg, cfg.rl.ref_sync_steps, cfg.run.epochs) == ("token-mean", 0, 0)
    assert (cfg.reward.verifier_function, cfg.reward.verifier_weight) == (["base_acc"], [1.0])
    assert "optim.beta2: 0.999 (Megatron's adam_beta2 default; the file leaves it out)" in cfg.derived
    assert cfg.rl.beta == 0.01          # init_kl_coef absent: 0.01, MindSpeed-RL's default and MindRLHF's


# ---- the outcome reward model (rl_config.reward_resource + reward_config) ----------------------------------
def _orm(tmp_path, **rl):
    from hf_reference import make_hf_classifier
    rm_dir = str(tmp_path / "orm")
    make_hf_classifier(rm_dir, vocab=416, layers=1)
    edits = {"rl_config.use_integrated_worker": False, "rl_config.reward_resource": {"num_npus": 1},
             "rl_config.rule_reward": False,
             "reward_config": {"model": MODEL, "load": rm_dir, "tensor_model_parallel_size": 1}}
    edits.update(rl)
    return rm_dir, _write(tmp_path / "cfg", _edited(**edits))


def test_the_outcome_reward_model_maps_onto_reward_model(tmp_path):
    rm_dir, path = _orm(tmp_path)
    cfg = load_grpo_config(path)
    assert cfg.reward.reward_model == rm_dir and cfg.reward.reward_model_weight == 1.0
    assert cfg.reward.verifier_function == [] and cfg.reward.verifier_weight == []
    assert cfg.reward.reward_model_parallel == 1        # its tensor_model_parallel_size: the reward model's layout
    ignored = {key: why for _, key, why in cfg.ignored}
    assert "reward_config.tensor_model_parallel_size" not in ignored
    assert "runs in its layout" in ignored["reward_config.model"]
    assert "job's ranks" in ignored["rl_config.reward_resource.num_npus"]


@pytest.mark.parametrize("edit,message", [
    ({"rl_config.rule_reward": True}, r"rl_config.rule_reward: True with reward_resource is not supported: upstream's "
                                      r"reward model and rule reward each write"),
    ({"reward_config": {"model": MODEL}}, r"rl_config.reward_resource: given without reward_config.load"),
    ({"reward_config": {"load": "/nonexistent/orm"}}, r"reward_config.load: /nonexistent/orm is not a Hugging Face "
                                                      r"folder with config.json")])
def test_an_outcome_reward_model_we_cannot_read_is_refused(tmp_path, edit, message):
    with pytest.raises(ConfigError, match=message):
        load_grpo_config(_orm(tmp_path, **edit)[1])


# ---- MindSpeed-RL's own files, as its repository ships them ----------------------------------------------
SHIPPED = os.path.join(FIXTURE, "shipped")
# every GRPO / DAPO file under its configs/ for a model we implement (commit 05a90d7; before_acb2c70/: the
# 7B file as of 63fefd0, the last to spell shuffle_minibatch), with the model/ entries their defaults name
RUNS = ["grpo_qwen25_7b_A3.yaml", "before_acb2c70/grpo_qwen25_7b_A3.yaml", "grpo_qwen25_32b_A3.yaml",
        "grpo_qwen25_32b_A2.yaml", "grpo_qwen3_8b_A3.yaml", "dapo_qwen25_32b_A3.yaml", "dapo_qwen3_32b_A3.yaml",
        "dapo_qwen25_7b_A2_multi_turn.yaml", "dapo_qwen3_30b_a3b_A3.yaml", "grpo_qwen3_235b_a22b_A2.yaml"]
# what we do not implement, refused by name at load
REFUSED = {
    "dapo_qwen25_32b_A2_20k.yaml": r"actor_config.context_parallel_size: 2 is not supported \(we implement 1\)",
    "dapo_qwen25_32b_A3_32k.yaml": r"actor_config.context_parallel_size: 2 is not supported \(we implement 1\)",
    "grpo_lora_qwen25_32b_A2.yaml": r"megatron_training.lora_target_modules: \[.*\] is not supported",
}


def test_every_shipped_file_is_here_and_names_its_source():
    files = sorted(os.path.relpath(os.path.join(d, f), SHIPPED) for d, _, fs in os.walk(SHIPPED) for f in fs)
    runs = [f for f in files if f.split("/")[-2:-1] not in (["model"], ["tools"], ["datasets"])]
    assert sorted(runs) == sorted(RUNS + list(REFUSED))     # datasets/: tests/test_mindspeed_datasets.py
    for f in files:
        if f.endswith(".json"):             # no comments in JSON: a .origin file beside it names the source
            f += ".origin"
        with open(os.path.join(SHIPPED, f)) as fh:
            first = fh.readline()
        assert first.startswith("# from github.com/Ascend/MindSpeed-RL configs/") and " at commit " in first, f


# the 235B file's 128 ranks' strategy files take ~20 s: -m slow (its layouts load in the default run: noop_layers' test)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if "235b" in n else n for n in RUNS])
def test_a_shipped_file_loads_unchanged_and_writes_its_strategies(name, tmp_path):
    """load_grpo_config and both model entries, then --only_save_strategy's writer in-process: one strategy
    file per rank of each role's layout."""
    from mindrlhf.cli import save_role_strategies
    path = os.path.join(SHIPPED, name)
    cfg = load_grpo_config(path)
    train, infer = load_model_yaml(path), load_model_yaml(path, role="infer")
    with open(path) as fh:
        doc = yaml.safe_load(fh)
    world = doc["rl_config"]["actor_resource"]["num_npus"]
    assert train.parallel.world_size == infer.parallel.world_size == world
    assert cfg.run.use_parallel and cfg.run.shuffle == (not doc["megatron_training"].get("no_shuffle", False))
    cfg.run.save_ckpt_dir = str(tmp_path)
    written = save_role_strategies(cfg)
    for role in ("train", "infer"):
        folder = tmp_path / "strategy" / f"{role}_strategy"
        assert len([f for f in os.listdir(folder) if f.endswith(".ckpt")]) == world, role
    assert written


def test_moe_tp_extend_ep_lays_whole_experts_over_the_tensor_ranks(tmp_path):
    """The shipped Qwen3-30B-A3B DAPO file sets moe_tp_extend_ep (tp 4, ep 2 of its 16 ranks): the train layout
    holds 128 / (2 x 4) = 16 whole experts a rank (moe_ffn_hidden_size 768 unsplit) while attention stays split
    over tp 4, and its strategy files say so; without the key, each rank holds 64 experts at a quarter width."""
    from mindrlhf.cli import save_role_strategies
    from mindrlhf.models.specs import layouts_for
    from mindrlhf.parallel.strategy import read_strategy
    path = os.path.join(SHIPPED, "dapo_qwen3_30b_a3b_A3.yaml")
    par, model = load_model_yaml(path).parallel, load_model_yaml(path).model
    assert par.moe_tp_extend_ep and (par.model_parallel, par.expert_parallel, par.data_parallel) == (4, 2, 4)
    w1, wq = "model.layers.0.feed_forward.routed_experts.ffn.w1.weight", "model.layers.0.attention.wq.weight"
    whole = layouts_for(model, par.data_parallel, 4, ep=2, experts_over_tp=True)
    shares = layouts_for(model, par.data_parallel, 4, ep=2)
    assert whole[w1].shard_shape == (16, 2048, 768) and shares[w1].shard_shape == (64, 2048, 192)
    assert whole[wq].shard_shape == shares[wq].shard_shape
    assert [whole[w1].shard_slices(r)[0].start for r in range(8)] == [16 * i for i in range(8)]
    cfg = load_grpo_config(path)
    cfg.run.save_ckpt_dir = str(tmp_path)
    save_role_strategies(cfg)
    entry = read_strategy(str(tmp_path / "strategy" / "train_strategy" / "ckpt_strategy_rank_5.ckpt"))[w1]
    assert tuple(entry.dev_matrix) == (2, 8) and tuple(entry.tensor_map) == (0, -1, -1)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_shipped_file_we_cannot_run_is_refused_by_name(name):
    path = os.path.join(SHIPPED, name)
    with pytest.raises(ConfigError, match=f"{path}: {REFUSED[name]}"):
        load_grpo_config(path)


def test_shuffle_minibatch_of_older_files_is_inert():
    path = os.path.join(SHIPPED, "before_acb2c70", "grpo_qwen25_7b_A3.yaml")
    ignored = {key: why for _, key, why in load_grpo_config(path).ignored}
    assert "never read" in ignored["rl_config.shuffle_minibatch"]


def test_finetune_false_starts_from_the_weights_and_says_so():
    cfg = load_grpo_config(os.path.join(SHIPPED, "grpo_qwen3_8b_A3.yaml"))
    assert cfg.run.load_sft_checkpoint_train == "./qwen3-8b-tp2-pp2/" and not cfg.run.resume
    assert any(line.startswith("actor_config.finetune: false read as true") and "--resume" in line
               for line in cfg.derived)


def test_stage_ray_dapo_sets_dapo(tmp_path):
    """The multi-turn file: no KL, token-mean, clip-higher, prompts in file order, tool episodes; its disabled
    overlong and group-filter keys are reported."""
    path = os.path.join(SHIPPED, "dapo_qwen25_7b_A2_multi_turn.yaml")
    cfg = load_grpo_config(path)
    rl = cfg.rl
    assert (rl.beta, rl.loss_agg, rl.clip_low, rl.clip_high, rl.dynamic_sampling) == (0.0, "token-mean", 0.2, 0.28,
                                                                                      False)
    assert not cfg.run.shuffle and cfg.tools.max_tool_calls == 1
    # the tool file it names (configs/tools/retool_config.yaml, from MindSpeed-RL's root) reads as our tools
    from mindrlhf.tools import load_tool_config
    assert cfg.tools.tool_config_path == "./configs/tools/retool_config.yaml"
    notes = []
    tools = load_tool_config(os.path.join(SHIPPED, "tools", "retool_config.yaml"), notes=notes)
    assert [t.name for t in tools] == ["code_interpreter"] and any("num_workers = 128 is inert" in n for n in notes)
    line = next(d for d in cfg.derived if d.startswith("stage ray_dapo"))
    assert "rl.beta 0" in line and "rl.clip_low 0.2 / rl.clip_high 0.28" in line
    ignored = {key for _, key, _ in cfg.ignored}
    assert {"rl_config.filter_groups_metric", "rl_config.filter_groups_max_batches",
            "rl_config.overlong_buffer"} <= ignored
    # with the group filter: dynamic sampling; upstream's -1 ('no limit') keeps our bound, said at start-up
    cfg = load_grpo_config(os.path.join(SHIPPED, "dapo_qwen3_32b_A3.yaml"))
    assert cfg.rl.dynamic_sampling and cfg.rl.max_num_gen_batches == 4 and cfg.rl.overlong_buffer_len == 512
    assert {"rl_config.init_kl_coef", "rl_config.kl_penalty"} <= {key for _, key, _ in cfg.ignored}
    assert "filter_groups_max_batches -1 is upstream's 'no limit'" in next(
        d for d in cfg.derived if d.startswith("stage ray_dapo"))
    # the DAPO keys in a GRPO file are reported, not read; clip_higher_enable false clips with clip_ratio
    cfg = load_grpo_config(_write(tmp_path / "g", _edited(**{"rl_config.clip_higher_enable": True,
                                                             "rl_config.clip_ratio_high": 0.3})))
    assert cfg.rl.clip_high == 0.2 and "rl_config.clip_higher_enable" in {key for _, key, _ in cfg.ignored}
    cfg = load_grpo_config(_write(tmp_path / "d", _edited(**{"megatron_training.stage": "ray_dapo",
                                                             "rl_config.token_level_loss": False,
                                                             "rl_config.clip_ratio_high": 0.3})))
    assert (cfg.rl.loss_agg, cfg.rl.clip_low, cfg.rl.clip_high, cfg.rl.beta) == ("seq-mean-token-mean", 0.2, 0.2, 0)
    with pytest.raises(ConfigError, match=r"rl_config.filter_groups_train_batch_size: 3 is not supported"):
        load_grpo_config(_write(tmp_path / "e", _edited(**{"megatron_training.stage": "ray_dapo",
                                                           "rl_config.filter_groups_enable": True,
                                                           "rl_config.filter_groups_train_batch_size": 3})))


def test_no_shuffle_keeps_the_file_order(assets, tmp_path):
    from mindrlhf.trainer.resolve import resolve
    for no_shuffle in (True, False):
        doc = _with_assets(_edited(**{"megatron_training.no_shuffle": no_shuffle}), assets)
        run = resolve(load_grpo_config(_write(tmp_path / str(no_shuffle), doc)), 0, 1, lambda *a, **k: None)
        order = run.dataset.epoch_steps(0).reshape(-1)
        assert (list(order) == sorted(order)) == no_shuffle
