"""A real pretrained model end to end: SmolLM2-135M-Instruct's HF folder (scripts/get_smollm2.py), its own
tokenizer.json and chat template, against Hugging Face transformers on the same files.

The default run uses a slice of it (the first 2 of its 30 decoder layers, the real embedding, tokenizer
and chat template); the whole 30-layer model runs in the slow tests.
"""
import json
import os
import sys

import numpy as np
import pytest

from msrun_util import REPO, run_msrun
from grpo_helpers import TEST_DEFAULTS
from mindrlhf.configs.errors import ConfigError
from mindrlhf.reward.verifiers import register_verifier

sys.path.insert(0, os.path.join(REPO, "scripts"))
CACHE = os.environ.get("MINDRLHF_TEST_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "mindrlhf"))
QUESTIONS = ["Tom has 3 apples and gets 4 more. How many apples does Tom have now? End your answer with "
             "'#### <number>'.", "What is 7 + 5?", "Mia has 9 coins and gets 2 more. How many coins?",
             "Li has {2} books and \\boxed{} more."]


@register_verifier("response_length_test")
def response_length(completion, solution):
    """Varies within every group (a 2-layer slice writes no answers): advantages are not all zero."""
    return len(completion) / 50.0


def smollm2(layers: int) -> str:
    from get_smollm2 import convert
    return convert(os.path.join(CACHE, f"smollm2_{layers or 30}l"), layers)


@pytest.fixture(scope="module")
def slice_dir():
    return smollm2(2)


def _hf_model(path):
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _hf_logprobs(model, prompt_ids, response_ids, temperature=1.0):
    """log p(response token) under softmax(logits / temperature), one unpadded row at a time."""
    import torch
    out = []
    for p, r in zip(prompt_ids, response_ids):
        ids = torch.tensor([list(p) + list(r)])
        with torch.no_grad():
            logits = model(ids).logits[0].double() / temperature
        logp = torch.log_softmax(logits, -1)
        out.append(np.array([float(logp[len(p) - 1 + k, tok]) for k, tok in enumerate(r)]))
    return out


# ---- the folder as a model config --------------------------------------------------------------------------
def test_config_json_maps_to_the_model_config(slice_dir):
    from transformers import AutoConfig
    from mindrlhf.configs.compat.hf import model_config_from_hf
    ignored = []
    cfg = model_config_from_hf(slice_dir, ignored)
    hf = AutoConfig.from_pretrained(slice_dir)
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.n_kv_heads, cfg.intermediate_size, cfg.vocab_size) == \
        (hf.hidden_size, 2, hf.num_attention_heads, hf.num_key_value_heads, hf.intermediate_size, hf.vocab_size) == \
        (576, 2, 9, 3, 1536, 49152)
    assert cfg.tie_word_embeddings and not cfg.qkv_has_bias and cfg.theta == 100000.0
    assert cfg.rms_norm_eps == pytest.approx(1e-5) and cfg.eos_token_ids == [2] and cfg.pad_token_id == 2
    assert {"transformers_version", "use_cache", "pretraining_tp"} <= {k for k, _ in ignored}


def test_model_yaml_written_from_the_folder_reads_back_the_same(slice_dir, tmp_path):
    from mindrlhf.configs.compat.hf import main, model_config_from_hf
    from mindrlhf.configs.compat.sources import load_model_yaml
    out = tmp_path / "finetune.yaml"
    assert main([slice_dir, "--data_parallel", "2", "-o", str(out)]) == 0
    spec = load_model_yaml(str(out))
    assert spec.model == model_config_from_hf(slice_dir) and spec.parallel.data_parallel == 2


def _with_config(tmp_path, src, **changes):
    with open(os.path.join(src, "config.json")) as fh:
        raw = json.load(fh)
    raw.update(changes)
    with open(tmp_path / "config.json", "w") as fh:
        json.dump(raw, fh)
    return str(tmp_path)


@pytest.mark.parametrize("changes,message", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn' is not supported"),
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "GPT2LMHeadModel"),
    ({"qk_norm": True}, "qk_norm: unknown config.json key"),
    ({"hidden_act": "gelu"}, "hidden_act: 'gelu' is not supported"),
])
def test_config_json_values_we_cannot_honour_are_refused_by_name(slice_dir, tmp_path, changes, message):
    from mindrlhf.configs.compat.hf import model_config_from_hf
    with pytest.raises(ConfigError, match=message):
        model_config_from_hf(_with_config(tmp_path, slice_dir, **changes))


def test_tp2_is_a_setup_error_naming_both_head_counts(slice_dir):
    from mindrlhf.configs.compat.hf import model_yaml_from_hf
    from mindrlhf.configs.model_config import ParallelConfig
    with pytest.raises(ConfigError, match=r"model_parallel=2 does not divide .*num_heads=9, n_kv_heads=3.*model_"
                                          r"parallel 1 or 3 would"):
        model_yaml_from_hf(slice_dir, ParallelConfig(model_parallel=2))


def test_llama3_rope_scaling_matches_transformers(tmp_path, rng):
    """Llama 3.x RoPE scaling with random weights: our logits against transformers' at positions beyond
    the scaled wavelengths (a long sequence, a small original context)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from hf_reference import hf_logits
    from model_helpers import load_ours, model_inputs
    from mindrlhf.configs.compat.hf import model_config_from_hf
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    hf_cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=96, vocab_size=160, max_position_embeddings=128, rope_theta=500000.0,
                         rope_scaling=scaling, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(hf_cfg).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    cfg = model_config_from_hf(str(tmp_path))
    assert cfg.extend_method == "LLAMA3" and cfg.scaling_factor["factor"] == 8.0
    ours = load_ours(str(tmp_path), cfg)
    ids = rng.randint(0, 160, (2, 96))
    got = ours.full_logits(*model_inputs(ids)).asnumpy()
    assert np.abs(got - hf_logits(hf, ids)).max() <= 1e-4
    plain = load_ours(str(tmp_path), model_config_from_hf(str(tmp_path), extend_method="None", scaling_factor=None))
    assert np.abs(plain.full_logits(*model_inputs(ids)).asnumpy() - got).max() > 1e-3   # the scaling matters (10x the tolerance)


# ---- the folder's tokenizer and chat template ---------------------------------------------------------------
def test_chat_template_renders_as_transformers(slice_dir):
    from transformers import AutoTokenizer
    from mindrlhf.data.chat_template import ChatTemplate
    tok = AutoTokenizer.from_pretrained(slice_dir)
    ours = ChatTemplate(slice_dir)
    for q in QUESTIONS:
        for system in ("", "Answer briefly. Put the result in \\boxed{}."):
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": q}]
            assert ours.prompt(q, system) == tok.apply_chat_template(messages, tokenize=False,
                                                                     add_generation_prompt=True)


def test_rlhf_data_chat_prompts_are_transformers_token_ids(slice_dir, tmp_path):
    from transformers import AutoTokenizer
    from data_helpers import write_jsonl
    from mindrlhf.data.convert import build_parser, convert
    from mindrlhf.data.mindrecord_io import read_mindrecord
    src = write_jsonl(str(tmp_path / "q.jsonl"), [{"question": q, "answer": "x\n#### 7"} for q in QUESTIONS])
    out = str(tmp_path / "q.mindrecord")
    convert(build_parser().parse_args(["--vocab_path", slice_dir, "--file_path", src, "--output_path", out,
                                       "--prompt_template", "chat", "--system_prompt", "Be brief.",
                                       "--max_prompt_length", "64", "--seq_length", "80", "--no_progress"]))
    table = read_mindrecord(out)
    tok = AutoTokenizer.from_pretrained(slice_dir)
    for i, q in enumerate(QUESTIONS):
        want = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}],
                                       tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
        n = table["prompt_length"][i]
        assert table["prompt_ids"][i][:n].tolist() == list(want)
        assert (table["prompt_ids"][i][n:] == tok.pad_token_id).all()      # the folder's pad id (2)


def test_chat_template_needs_the_model_folder(tmp_path):
    from mindrlhf.data.convert import resolve_template
    with pytest.raises(ConfigError, match="give the folder as --vocab_path"):
        resolve_template("chat", str(tmp_path / "vocab.json"))
    with pytest.raises(ConfigError, match="no chat template") as err:
        resolve_template("chat", str(tmp_path))
    assert "--vocab_path" not in str(err.value)     # it was the folder: no advice to pass the folder


# ---- a GRPO run from the folder: log-probs, KL, export ------------------------------------------------------
def _grpo_assets(model_dir, root, rows=16, prompt_len=64):
    from data_helpers import write_jsonl
    from mindrlhf.data.convert import build_parser, convert
    src = write_jsonl(os.path.join(root, "train.jsonl"),
                      [{"question": f"Ann has {a} pens and gets {b} more. How many pens does Ann have?",
                        "answer": f"{a} + {b} = {a + b}\n#### {a + b}"} for a, b in zip(range(2, 2 + rows),
                                                                                     range(9, 9 + rows))])
    out = os.path.join(root, "train.mindrecord")
    convert(build_parser().parse_args(["--vocab_path", model_dir, "--file_path", src, "--output_path", out,
                                       "--prompt_template", "chat", "--max_prompt_length", str(prompt_len),
                                       "--seq_length", str(prompt_len + 32), "--no_progress"]))
    return out


def _trainer(model_dir, tmp_path, **flags):
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    overrides = dict(TEST_DEFAULTS, sft_path_train=model_dir, mind_dataset_dir=_grpo_assets(model_dir, str(tmp_path)),
                     save_ckpt_dir=str(tmp_path / "ckpt"), total_steps=1, batch_size=2, num_generations=4,
                     max_tokens=12, temperature=0.7, beta=0.04, progress=False, tensorboard=False,
                     lr=1e-5, verifier_function="response_length_test", verifier_weight="1.0")
    overrides.update(flags)
    lines = []
    trainer = GRPOTrainer(load_grpo_config(None, overrides), log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    return trainer, lines


def _check_logprobs_against_transformers(model_dir, tmp_path, tolerance):
    trainer, lines = _trainer(model_dir, tmp_path, num_iterations=2)    # 2 passes: a separate old-policy pass
    assert any("Hugging Face folder" in line for line in lines)
    assert trainer.run.pad_id == 2 and trainer.run.eos_ids == [2]
    batch, _ = trainer.collect(lambda name, fn, *a: fn(*a))
    samples = batch.samples
    old = trainer.logprobs(trainer.policy_logprob, samples)
    ref = trainer.logprobs(trainer.ref_logprob, samples)
    prompts = [row[m == 1] for row, m in zip(samples.prompt_ids, samples.prompt_mask)]
    responses = [row[m == 1] for row, m in zip(samples.response_ids, samples.response_mask)]
    want = _hf_logprobs(_hf_model(model_dir), prompts, responses, temperature=0.7)
    worst = 0.0
    for i, w in enumerate(want):
        n = len(w)
        assert n > 0
        for got in (samples.rollout_logp[i][:n], old[i][:n], ref[i][:n]):
            worst = max(worst, float(np.abs(got - w).max()))
    assert worst <= tolerance, worst
    # left padding really happened: rows with shorter prompts than the width
    assert (samples.prompt_mask == 0).any()
    print(f"largest |log-prob - transformers'| over rollout, old and reference: {worst:.2e}")


def test_rollout_old_and_reference_logprobs_equal_transformers(slice_dir, tmp_path):
    _check_logprobs_against_transformers(slice_dir, tmp_path, 1e-4)


# ~22 s; the real model's rollout, old and reference log-probs against transformers stay in the default run
@pytest.mark.slow
def test_first_step_kl_against_an_independent_reference(slice_dir, tmp_path):
    """With a reference model that differs from the policy (its weights perturbed), step 1's KL metric, and the
    reference log-probs the step trained with (the experience file), against transformers running both models
    on the step's own samples: k3 = exp(ref - pi) - (ref - pi) - 1, the mean over the trained tokens."""
    import torch
    from mindrlhf.data.mindrecord_io import read_columns
    ref_dir = str(tmp_path / "ref")
    ref_hf = _hf_model(slice_dir)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in ref_hf.parameters():
            p.add_(0.02 * p.abs().mean() * torch.randn(p.shape, generator=gen))
    ref_hf.save_pretrained(ref_dir)
    data_file = str(tmp_path / "experience.mindrecord")
    trainer, _ = _trainer(slice_dir, tmp_path, load_ref_checkpoint=ref_dir, save_data_file=data_file,
                          kl_estimator="k3", loss_agg="token-mean")
    kl = trainer.fit()[0]["kl"]
    rows = read_columns(data_file, ["prompt_completion_ids", "prompts_mask", "responses_mask",
                                    "ref_per_token_logps"])
    policy_hf = _hf_model(slice_dir)
    terms, worst_ref = [], 0.0
    for ids, pmask, rmask, ref_logp in zip(rows["prompt_completion_ids"], rows["prompts_mask"],
                                          rows["responses_mask"], rows["ref_per_token_logps"]):
        ids, pmask, rmask, ref_logp = (np.asarray(x) for x in (ids, pmask, rmask, ref_logp))
        start = int(np.nonzero(pmask)[0][-1]) + 1        # prompts are left-padded: the response starts here
        prompt, trained = ids[:start][pmask[:start] == 1], rmask[start:] == 1
        if not trained.any():
            continue
        response = ids[start:][: int(np.nonzero(trained)[0][-1]) + 1]
        pi = _hf_logprobs(policy_hf, [prompt], [response], temperature=0.7)[0]
        ref = _hf_logprobs(ref_hf, [prompt], [response], temperature=0.7)[0]
        mask = trained[:len(response)]
        got_ref = ref_logp[start - 1:start - 1 + len(response)]
        worst_ref = max(worst_ref, float(np.abs(got_ref[mask] - ref[mask]).max()))
        d = ref[mask] - pi[mask]
        terms.append(np.exp(d) - d - 1)
    want = float(np.concatenate(terms).mean())
    assert worst_ref <= 1e-4, worst_ref                  # the reference pass is transformers' on these samples
    assert want > 1e-4                                    # the two models differ: the KL is no longer 0
    assert abs(kl - want) <= 1e-3 * want, (kl, want)      # float32 sums over ~100 tokens


# ~15 s; the default run keeps the KL against an independent reference (above) and the export against
# transformers (test_layout_invariance)
@pytest.mark.slow
def test_first_step_kl_is_zero_and_export_loads_in_transformers(slice_dir, tmp_path):
    import torch
    from mindrlhf.checkpoint.safetensors_io import SafeTensorsFile
    trainer, _ = _trainer(slice_dir, tmp_path, export_hf=True, save_steps=1)
    history = trainer.fit()
    assert history[0]["kl"] <= 1e-6                  # the first update sees the whole batch: policy == reference
    assert history[0]["grad_norm"] > 0
    out = str(tmp_path / "ckpt" / "hf_policy")
    hf = _hf_model(out)
    assert hf.config.tie_word_embeddings and hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    ours = {p.name: p.asnumpy() for p in trainer.policy.get_parameters()}
    from mindrlhf.checkpoint.hf_interop import ms_to_hf_name
    state = hf.state_dict()
    for name, value in ours.items():
        assert np.array_equal(state[ms_to_hf_name(name)].numpy(), value), name
    assert "lm_head.weight" not in SafeTensorsFile(os.path.join(out, "model.safetensors")).keys()
    # the export is a usable folder: tokenizer and chat template come along
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True) \
        .endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        assert torch.isfinite(hf(torch.tensor([[1, 2, 3]])).logits).all()


@pytest.mark.slow       # ~43 s: a 2-worker run and a single process on the folder
@pytest.mark.msrun
def test_dp2_train_dp2_infer_under_msrun_from_the_folder(slice_dir, tmp_path):
    """Two msrun workers (every rank data-parallel, as a folder trains) follow the single process's trajectory:
    the same samples, rewards, losses and KL, step by step (the layout-invariance tests' bounds)."""
    import subprocess
    import sys
    data = _grpo_assets(slice_dir, str(tmp_path))
    worker = os.path.join(REPO, "tests", "workers", "grpo_worker.py")
    flags = ["--sft_path_train", slice_dir, "--mind_dataset_dir", data, "--total_steps", "2", "--batch_size", "1",
             "--num_generations", "4", "--max_tokens", "8", "--beta", "0.04", "--progress", "False", "--export_hf",
             "False", "--verifier_function", "response_length_test", "--lr", "1e-5", "--lr_schedule", "constant",
             "--warmup_steps", "0"]
    run_msrun(worker, flags + ["--save_ckpt_dir", str(tmp_path / "dp2"), "--use_parallel", "True"], 2,
              str(tmp_path / "log"))
    # one process, two prompts per step as the two replicas' one each (prompt i's samples keyed by (step, i))
    single = flags + ["--save_ckpt_dir", str(tmp_path / "one"), "--batch_size", "2"]
    proc = subprocess.run([sys.executable, worker] + single, env=dict(os.environ, PYTHONPATH=REPO),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    assert proc.returncode == 0, proc.stdout.decode(errors="replace")[-3000:]
    from mindrlhf.trainer.metrics import read_metrics
    rows, ref = (read_metrics(str(tmp_path / d / "metrics.jsonl")) for d in ("dp2", "one"))
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["kl"] <= 1e-6
    assert ref[1]["kl"] > 0 and ref[0]["grad_norm"] > 0
    for a, b in zip(rows, ref):
        for key in ("reward_mean", "response_len_mean", "loss", "pg_loss", "kl", "grad_norm", "entropy"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6 if "loss" in key else 1e-7), (a["step"], key)
    with open(tmp_path / "log" / "worker_0.log", errors="replace") as fh:
        assert "layout data_parallel=2" in fh.read()


# ---- the whole 30-layer model ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_30_layer_logprobs_equal_transformers(tmp_path):
    _check_logprobs_against_transformers(smollm2(0), tmp_path, 1e-3)


@pytest.mark.slow
def test_30_layer_first_step_kl_is_zero(tmp_path):
    trainer, _ = _trainer(smollm2(0), tmp_path)
    assert trainer.fit()[0]["kl"] <= 1e-6


def test_compile_cache_key_and_node_check_read_the_folders_files(slice_dir, tmp_path):
    """A folder given as sft_path_train is read by content: the same path holding another model (a
    rewritten config.json) gets another compile cache (stale graphs would run otherwise) and another node
    fingerprint."""
    import shutil
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer.node_check import _file_crc, compile_cache_dir
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(slice_dir, name), folder / name)
    cfg = load_grpo_config(None, {"sft_path_train": str(folder), "save_ckpt_dir": str(tmp_path / "ck")})
    key, crc = compile_cache_dir(cfg, 0), _file_crc(str(folder))
    _with_config(folder, slice_dir, num_hidden_layers=1)
    assert compile_cache_dir(cfg, 0) != key and _file_crc(str(folder)) != crc
