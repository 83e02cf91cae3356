"""A GRPO run's trajectory does not depend on the parallel layout, and a crash at any point resumes exactly.

Three steps with beta > 0, num_iterations = 2, two global mini-batches, ragged responses (many EOS ids),
T = 0.8 with top_p = 0.9, reference solutions longer than 255 bytes, and the GRPO variants on (DAPO's dynamic
sampling over a reward that is constant for half the prompts, truncated completions masked, TIS; the
overlong penalty, host numpy on every rank's copy of the samples, would make every group informative here),
in these layouts: single process; train dp1 x tp2 / infer dp2 x tp1; train dp2 x tp1 / infer dp1 x tp2 (2 msrun
workers, tied embeddings as the tiny Qwen2 YAML); and (slow), with untied embeddings (pipeline stages need them),
single process against train pp2 (two stages, 2 micro-batches per mini-batch, 1F1B) / infer dp2.
Per-step metrics agree to 1e-5 relative (KL: or 1e-7 absolute; loss and policy loss: or 1e-6) and the final weights to 1e-5 relative in
norm over the whole model (per tensor: see the bounds below); each exported HF policy equals its checkpoint
exactly and gives the policy's logits under `transformers`.
"""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import mindspore as ms
import pytest

from data_helpers import arithmetic_rows, make_tokenizer_files, write_jsonl
from grpo_helpers import TEST_DEFAULTS, WORKER, cli_args, model_yaml
from msrun_util import REPO, free_port, run_msrun
from mindrlhf.checkpoint.hf_interop import iter_hf_as_ms
from mindrlhf.checkpoint.model_io import model_state, read_checkpoint, save_checkpoint
from mindrlhf.configs import load_model_yaml
from mindrlhf.data.convert import build_parser, convert
from mindrlhf.data.mindrecord_io import read_columns
from mindrlhf.configs.lora import LoraSpec, parse_targets
from mindrlhf.models.lora import is_adapter
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.models.specs import layouts_for
from mindrlhf.trainer.metrics import read_metrics

pytestmark = pytest.mark.msrun

EOS = [2] + list(range(200, 260))          # ~15% of the vocabulary ends a response: ragged lengths
COMPARED = ("reward_mean", "reward/solution_length_test", "loss", "pg_loss", "kl", "grad_norm", "entropy", "clip_frac",
            "response_len_mean", "dynamic_sampling/rounds", "dynamic_sampling/kept_groups", "zero_std_groups_frac",
            "response_clipped_frac", "tis_ratio_mean", "tis_ratio_max")
# The KL is a small mean of functions of (logp - ref_logp), whose float32 inputs differ by ~1e-6 between
# layouts (TP reductions): measured up to 1.2e-8 absolute at KL ~1e-3 (1.1e-5 relative). A real layout bug
# (per-rank token normalisation, a wrong reference) moves it by 1e-5 or more.
# The loss and policy loss are sums of +-advantage x ratio terms of order 1 that cancel to a small total:
# their float noise between layouts is ~1e-7 absolute whatever the total (measured 2.9e-7 on a loss of
# -0.0135, 2.2e-5 relative), so they get 1e-6 absolute beside the 1e-5 relative. A real layout bug moves
# them by 1e-4 or more.
ABS_TOL = {"kl": 1e-7, "loss": 1e-6, "pg_loss": 1e-6}
# Adam's eps 1e-6 (not 1e-8): a gradient that is zero in exact arithmetic is float noise of ~1e-10 that differs
# between layouts, and with eps 1e-8 Adam turns it into an lr-sized step whose sign is the noise's; after the
# reference sync (step 2) the KL of step 3 is ~6e-6 and such steps moved it by 5% between layouts, one way or
# the other by which way the noise fell (observed with unrelated code changes). eps 1e-6 leaves real gradients'
# steps as they are and noise's at ~1e-4 of lr.
STEPS = 3
# name: (train dp, tp, pp), (infer dp, tp), prompts per infer-DP rank, sequences per train-DP rank per mini-batch,
# tied embeddings
LAYOUTS = {
    "single": ((1, 1, 1), (1, 1), 4, 8, True),
    "train_tp2_infer_dp2": ((1, 2, 1), (2, 1), 2, 8, True),
    "train_dp2_infer_tp2": ((2, 1, 1), (1, 2), 4, 4, True),
}
# slow (all_runs): pipeline stages need untied embeddings, so their own single-process reference
PIPELINE_LAYOUTS = {
    "single_untied": ((1, 1, 1), (1, 1), 4, 8, False),
    "train_pp2_infer_dp2": ((1, 1, 2), (2, 1), 2, 8, False),
}
REFERENCE = {True: "single", False: "single_untied"}
# 4 workers (slow): two stages x TP2 with sequence parallelism, rollout on 4 data-parallel replicas
SLOW_LAYOUTS = {"train_pp2_tp2_sp_infer_dp4": ((1, 2, 2), (4, 1), 1, 8, False)}
ALL_LAYOUTS = {**LAYOUTS, **PIPELINE_LAYOUTS, **SLOW_LAYOUTS}
MICRO_BATCHES = 2


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("inv"))
    vocab, merges = make_tokenizer_files(os.path.join(root, "tok"), vocab_size=400)
    rows = arithmetic_rows(32, seed=3)
    for i in range(0, len(rows), 3):          # long reference answers (> 255 bytes) on a third of the prompts
        rows[i]["answer"] += "\n#### " + "12345" * 60 + str(i % 10)
    src = write_jsonl(os.path.join(root, "train.jsonl"), rows)
    data = os.path.join(root, "train.mindrecord")
    convert(build_parser().parse_args(["--vocab_path", vocab, "--merges_file_path", merges, "--file_path", src,
                                       "--output_path", data, "--max_prompt_length", "16", "--seq_length", "48",
                                       "--prompt_template", "plain", "--no_progress"]))
    yamls, inits = {}, {}
    for train, infer, _, _, tie in ALL_LAYOUTS.values():
        for dp, tp, pp in (train, infer + (1,)):
            yamls[(dp, tp, pp, tie)] = model_yaml(os.path.join(root, f"m_{dp}x{tp}x{pp}_{tie}.yaml"), dp=dp, tp=tp,
                                                  pp=pp, micro_batch_num=MICRO_BATCHES, eos_token_id=EOS,
                                                  tie_word_embeddings=tie, seq_parallel=pp > 1 and tp > 1)
    ms.set_seed(5)                            # the same initial policies on every invocation: reproducible runs
    for tie in (True, False):                 # one initial policy for every layout of a model
        inits[tie] = os.path.join(root, f"init_{tie}.safetensors")
        save_checkpoint(model_state(CausalLM(load_model_yaml(yamls[(1, 1, 1, tie)]).model)), inits[tie])
    return {"root": root, "vocab": vocab, "merges": merges, "data": data, "yamls": yamls, "inits": inits}


def _args(assets, name, out_dir, **extra):
    train, infer, batch, mini, tie = ALL_LAYOUTS[name]
    flags = {**TEST_DEFAULTS, "sft_path_train": assets["yamls"][train + (tie,)], "sft_path_infer": assets["yamls"][infer + (1, tie)],
             "vocab_path": assets["vocab"], "merges_file_path": assets["merges"],
             "mind_dataset_dir": assets["data"], "load_sft_checkpoint_train": assets["inits"][tie], "save_ckpt_dir": out_dir,
             "use_parallel": not name.startswith("single"),
             "total_steps": STEPS, "save_steps": 1, "keep_checkpoints": 2, "seed": 7, "batch_size": batch,
             "num_generations": 4, "mini_batch_size": mini, "num_iterations": 2, "beta": 0.04,
             "ref_sync_steps": 2, "temperature": 0.8, "top_p": 0.9, "max_tokens": 8, "lr": 1e-4,
             "verifier_function": "half_constant_length_test,solution_length_test,scoring_rank_test",
             "verifier_weight": "1.0,1.0,0.0",
             "dynamic_sampling": True, "max_num_gen_batches": 3, "mask_truncated_completions": True, "tis": True,
             "tis_cap": 1.5, "eps": 1e-6,
             "rollout_log_file": os.path.join(out_dir, "rollouts.mindrecord"), "progress": False, "export_hf": True}
    flags.update(extra)
    return cli_args(flags)


def _run(assets, name, suffix="", **extra):
    out = os.path.join(assets["root"], name + suffix)
    if name.startswith("single"):
        env = dict(os.environ, PYTHONPATH=REPO)
        proc = subprocess.run([sys.executable, WORKER] + _args(assets, name, out, **extra), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
        assert proc.returncode == 0, proc.stdout.decode(errors="replace")[-4000:]
    else:
        run_msrun(WORKER, _args(assets, name, out, **extra), int(np.prod(ALL_LAYOUTS[name][0])),
                  os.path.join(out, "log"))
    return out


def _runs(assets, layouts):
    """The layouts' runs two at a time: much of each is graph compilation on one thread, so two jobs on the two
    cores finish sooner than one after the other (each run's numbers do not depend on what runs beside it)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_run, assets, name) for name in layouts}
    return {name: f.result() for name, f in futures.items()}


@pytest.fixture(scope="module")
def runs(assets):
    return _runs(assets, LAYOUTS)


@pytest.fixture(scope="module")
def all_runs(assets, runs):
    """runs and the pipeline layouts' (slow tests only)."""
    return {**runs, **_runs(assets, PIPELINE_LAYOUTS)}


def _full_weights(assets, out_dir, name, lora=None):
    """The final checkpoint's shards placed into full tensors by their layouts (independent of export); with
    `lora` (a LoraSpec) the adapters, which is all a LoRA run's checkpoint holds."""
    train, tie = ALL_LAYOUTS[name][0], ALL_LAYOUTS[name][4]
    cfg = load_model_yaml(assets["yamls"][(1, 1, 1, tie)]).model
    layouts = layouts_for(cfg, *train, lora)
    if lora:
        layouts = {n: lay for n, lay in layouts.items() if is_adapter(n)}
    step = os.path.join(out_dir, f"step_{STEPS:06d}")
    full = {n: np.zeros(l.full_shape, np.float32) for n, l in layouts.items()}
    filled = set()
    for rank in range(int(np.prod(train))):
        shards = read_checkpoint(os.path.join(step, f"rank_{rank}", "policy.safetensors"))
        for n, arr in shards.items():
            full[n][layouts[n].shard_slices(rank)] = arr
            filled.add(n)
    assert filled == set(layouts)          # every parameter is in some rank's shard (pipeline stages included)
    return full, cfg


def _check_reference(assets, runs, single):
    ref = read_metrics(os.path.join(runs[single], "metrics.jsonl"))
    assert [r["step"] for r in ref] == list(range(1, STEPS + 1))
    assert all(r["response_len_mean"] < r["response_len_max"] for r in ref)     # responses are ragged
    assert ref[-1]["kl"] != 0.0                                         # the reference model is active
    assert max(r["dynamic_sampling/rounds"] for r in ref) > 1           # groups were dropped and more sampled
    assert all(r["dynamic_sampling/kept_groups"] == 4 for r in ref)     # the step's batch is exact
    assert min(r["response_clipped_frac"] for r in ref) > 0              # some rows are masked as truncated
    assert all(abs(r["loss"]) > 1e-3 and r["grad_norm"] > 1e-2 for r in ref)    # signal far above float noise
    ref_weights, _ = _full_weights(assets, runs[single], single)
    init = read_checkpoint(assets["inits"][ALL_LAYOUTS[single][4]])
    moved = sum(np.linalg.norm(w - init[n]) ** 2 for n, w in ref_weights.items()) ** 0.5
    assert moved > 1e-3 * sum(np.linalg.norm(w) ** 2 for w in ref_weights.values()) ** 0.5   # >> the tolerance
    return ref, ref_weights


def _check_layout(assets, out_dir, name, ref, ref_weights, lora=None):
    rows = read_metrics(os.path.join(out_dir, "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), name
    for a, b in zip(rows, ref):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=ABS_TOL.get(key, 1e-8)), (name, a["step"], key)
        assert a["rollout_train_logprob_gap"] <= 1e-4, (name, a["step"])   # same T for rollout and train
    weights, _ = _full_weights(assets, out_dir, name, lora)
    # Whole model, relative in norm: <= 1e-5 (measured <= 1e-6). Per tensor, Adam turns float noise in
    # near-zero gradients into ~lr-sized steps, so small-gradient tensors drift more: <= 1e-4 (measured
    # <= 5e-6), and attention.wk.bias, whose gradient is 0 in exact arithmetic (softmax ignores the q.b_k
    # added to a whole row of scores), follows float noise alone: <= 1e-3 (measured up to 1.1e-4). A real
    # layout bug (a factor on a replicated weight, a lost shard) is orders of magnitude above these.
    diff = sum(np.linalg.norm(weights[n] - w) ** 2 for n, w in ref_weights.items()) ** 0.5
    assert diff <= 1e-5 * sum(np.linalg.norm(w) ** 2 for w in ref_weights.values()) ** 0.5, name
    for n, w in ref_weights.items():
        bound = 1e-3 if n.endswith("attention.wk.bias") else 1e-4
        assert np.linalg.norm(weights[n] - w) <= bound * np.linalg.norm(w), (name, n)


def test_trajectory_is_layout_invariant(assets, runs):
    ref = _check_reference(assets, runs, "single")
    for name in LAYOUTS:
        _check_layout(assets, runs[name], name, *ref)


@pytest.mark.slow       # ~50 s: two more runs (single process with untied embeddings, 2 msrun workers)
def test_pipeline_stages_trajectory_is_layout_invariant(assets, all_runs):
    """Train pp2 (two stages, 2 micro-batches, 1F1B) / infer dp2 against the single process with the same untied
    embeddings: the checks of test_trajectory_is_layout_invariant, and every sample scored once."""
    name = "train_pp2_infer_dp2"
    _check_layout(assets, all_runs[name], name, *_check_reference(assets, all_runs, "single_untied"))
    means = [r["reward/scoring_rank_test"] for r in read_metrics(os.path.join(all_runs[name], "metrics.jsonl"))]
    assert all(0.3 < m < 0.7 for m in means), means


@pytest.mark.slow
def test_pipeline_and_sequence_parallel_trajectory_on_four_workers(assets, all_runs, tmp_path):
    """Train pp2 x tp2 with sequence parallelism (2 micro-batches, 1F1B) / infer dp4 on 4 workers: the same
    3-step trajectory as the single process; killed inside step 2's checkpoint save and resumed, the same
    final weights as the uninterrupted run."""
    name = "train_pp2_tp2_sp_infer_dp4"
    out = _run(assets, name)
    _check_layout(assets, out, name, *_check_reference(assets, all_runs, "single_untied"))
    _crash_and_resume(assets, name, out, tmp_path)


# the GRPO family on the same fixture: sequence-level ratio (GSPO) with the leave-one-out baseline (RLOO), and
# CISPO's clipped IS weight on every token
VARIANTS = {"gspo_rloo": dict(loss_mode="gspo", adv_estimator="rloo"), "cispo": dict(loss_mode="cispo")}


@pytest.mark.slow       # ~3 min: two variants x (single process + 2 msrun workers)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_gspo_cispo_rloo_trajectories_are_layout_invariant(assets, variant):
    single = _run(assets, "single", "_" + variant, **VARIANTS[variant])
    ref = read_metrics(os.path.join(single, "metrics.jsonl"))
    assert all(abs(r["loss"]) > 1e-4 and r["grad_norm"] > 1e-2 for r in ref)     # signal above float noise
    if variant == "gspo_rloo":          # the default loss never clips on this fixture; GSPO's 3e-4 / 4e-4 does
        assert max(r["clip_frac"] for r in ref) > 0
    ref_weights, _ = _full_weights(assets, single, "single")
    name = "train_tp2_infer_dp2"
    _check_layout(assets, _run(assets, name, "_" + variant, **VARIANTS[variant]), name, ref, ref_weights)


def test_each_sample_is_scored_once_and_every_rank_uses_that_score(runs):
    """scoring_rank_test is 1 on rank 0 and 0 elsewhere (weight 0): on two ranks, about half of what rank 0
    reports came from rank 1's scoring; the equal trajectories (test_trajectory_is_layout_invariant) show
    every rank trained on the same rewards."""
    for name in LAYOUTS:
        means = [r["reward/scoring_rank_test"] for r in read_metrics(os.path.join(runs[name], "metrics.jsonl"))]
        if name.startswith("single"):
            assert means == [1.0] * STEPS, name
        else:
            assert all(0.3 < m < 0.7 for m in means), (name, means)


def test_long_solutions_reach_the_verifier_on_every_layout(runs):
    """Rewards depend on every byte of the solutions; they agree with the single process (checked above)
    and the rollout log holds the solutions whole."""
    for name in LAYOUTS:
        cols = read_columns(os.path.join(runs[name], "rollouts.mindrecord"), ["solution"])
        assert max(len(s) for s in cols["solution"]) > 255, name


def test_export_equals_checkpoint_and_matches_transformers(assets, runs):
    import torch
    from transformers import AutoModelForCausalLM
    from model_helpers import model_inputs
    from mindrlhf.checkpoint.model_io import load_full_weights
    ids = np.random.RandomState(0).randint(3, 390, (2, 12))
    for name in LAYOUTS:
        full, cfg = _full_weights(assets, runs[name], name)
        hf_dir = os.path.join(runs[name], "hf_policy")
        exported = dict(iter_hf_as_ms(hf_dir))
        assert set(exported) == set(full), name
        for n, w in full.items():
            assert np.array_equal(exported[n], w), (name, n)
        ours = CausalLM(cfg)
        load_full_weights(ours, full.items(), name)
        logits = ours.full_logits(*model_inputs(ids)).asnumpy()
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            ref = hf(torch.tensor(ids)).logits.numpy()
        assert np.abs(logits - ref).max() <= 1e-4, name


@pytest.mark.slow       # ~100 s; the default run keeps test_trainer's crash inside a save and resume
def test_sigkill_inside_a_checkpoint_save_then_resume_is_exact(assets, all_runs, tmp_path):
    """Kill every process of a 2-worker job (train layout: two pipeline stages) while rank 0 is inside step 2's
    checkpoint save (weights half written), resume: final weights, metrics.jsonl (each step once, equal values)
    and the rollout log equal the uninterrupted run's."""
    name = "train_pp2_infer_dp2"
    _crash_and_resume(assets, name, all_runs[name], tmp_path)


def _crash_and_resume(assets, name, uninterrupted, tmp_path):
    out = str(tmp_path / "crash")
    marker = str(tmp_path / "in_save")
    log_dir = str(tmp_path / "log")
    workers = int(np.prod(ALL_LAYOUTS[name][0]))
    cmd = ["msrun", f"--worker_num={workers}", f"--local_worker_num={workers}", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "--join=True", f"--log_dir={log_dir}", WORKER] + _args(assets, name, out)
    env = dict(os.environ, PYTHONPATH=REPO, MINDRLHF_TEST_PAUSE_IN_SAVE=f"2:{marker}")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 600
        while not os.path.exists(marker) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert os.path.exists(marker), "the job never reached step 2's checkpoint save"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert os.path.isdir(os.path.join(out, "step_000001")) and \
        not os.path.exists(os.path.join(out, "step_000002", "COMPLETE"))
    run_msrun(WORKER, _args(assets, name, out, resume=True), workers, str(tmp_path / "log2"))

    weights, _ = _full_weights(assets, out, name)
    expected, _ = _full_weights(assets, uninterrupted, name)
    for n, w in expected.items():
        np.testing.assert_allclose(weights[n], w, rtol=0, atol=1e-6, err_msg=n)
    rows = read_metrics(os.path.join(out, "metrics.jsonl"))
    ref = read_metrics(os.path.join(uninterrupted, "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for a, b in zip(rows, ref):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], rel=0, abs=1e-6), (a["step"], key)
    cols = ["step", "prompt", "response", "reward", "solution"]
    got = read_columns(os.path.join(out, "rollouts.mindrecord"), cols)
    want = read_columns(os.path.join(uninterrupted, "rollouts.mindrecord"), cols)
    for c in cols:
        assert [str(v) for v in got[c]] == [str(v) for v in want[c]], c


# LoRA on every linear layer (the reference is the base with the adapters off, so it never syncs); A is drawn
# from (seed, name) at full shape, so every layout starts from the same adapters
LORA_FLAGS = dict(lora_rank=4, lora_alpha=8, ref_sync_steps=0)
LORA = LoraSpec(4, 8.0, parse_targets("all-linear"), seed=7)


def _check_lora_layout(assets, single, name):
    ref_dir, out = _run(assets, single, "_lora", **LORA_FLAGS), _run(assets, name, "_lora", **LORA_FLAGS)
    ref = read_metrics(os.path.join(ref_dir, "metrics.jsonl"))
    assert ref[-1]["kl"] > 0.0                                          # the base as the reference
    assert all(abs(r["loss"]) > 1e-4 and r["grad_norm"] > 1e-3 for r in ref)
    ref_weights, _ = _full_weights(assets, ref_dir, single, LORA)
    assert min(np.abs(w).max() for n, w in ref_weights.items() if n.endswith("lora_b")) > 0   # every B moved
    _check_layout(assets, out, name, ref, ref_weights, LORA)


@pytest.mark.slow       # ~36 s: two runs (single, 2 msrun workers); LoRA's own run and resume stay (test_lora)
def test_lora_trajectory_is_layout_invariant_under_tp(assets):
    """Train tp2 (column-parallel B and row-parallel A split, the others summed over TP) / infer dp2 (a
    separate rollout model fed merged weights) against the single process."""
    _check_lora_layout(assets, "single", "train_tp2_infer_dp2")


@pytest.mark.slow
def test_lora_trajectory_is_layout_invariant_under_pipeline_stages(assets):
    _check_lora_layout(assets, "single_untied", "train_pp2_infer_dp2")


# sequence packing: rows of 23 (prompt 16 + 8 response tokens - 1), two per micro-batch; the packed run on each
# layout follows the padded single process's trajectory
PACKING_FLAGS = dict(sequence_packing=True, max_packing_token_size=46)


@pytest.mark.slow       # ~4 min: five packed runs (single process, 2 msrun workers x 3, 4 workers)
@pytest.mark.parametrize("name", ["single", "train_tp2_infer_dp2", "train_dp2_infer_tp2", "train_pp2_infer_dp2",
                                  "train_pp2_tp2_sp_infer_dp4"])
def test_packed_trajectory_equals_the_padded_single_process(assets, all_runs, name):
    ref, ref_weights = _check_reference(assets, all_runs, REFERENCE[ALL_LAYOUTS[name][4]])
    _check_layout(assets, _run(assets, name, "_packed", **PACKING_FLAGS), name, ref, ref_weights)


@pytest.mark.slow       # ~3 min: a single process and two 2-worker msrun jobs
@pytest.mark.parametrize("name, extra", [
    ("single", {}), ("train_tp2_infer_dp2", {}), ("train_dp2_infer_tp2", {}), ("single", PACKING_FLAGS)],
    ids=["single", "train_tp2_infer_dp2", "train_dp2_infer_tp2", "single_packed"])
def test_layerwise_update_follows_the_one_graph_trajectory(assets, runs, name, extra):
    """engine.layerwise_update (one graph per decoder layer for the update and the old-policy and reference
    log-probs; TP collectives inside the layer graphs) on each layout follows the one-graph single process:
    the same metrics, weights and checkpoints over 3 steps of off-policy updates with a moving reference."""
    ref, ref_weights = _check_reference(assets, runs, REFERENCE[ALL_LAYOUTS[name][4]])
    suffix = "_layerwise" + ("_packed" if extra else "")
    _check_layout(assets, _run(assets, name, suffix, layerwise_update=True, **extra), name, ref, ref_weights)
