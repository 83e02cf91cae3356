"""Sequence packing (trainer/packing.py): several sequences per row, attention within each, positions restarting.
Log-probs, the loss and every gradient on packed rows equal the padded rows' (<= 1e-5), and a GRPO run with
engine.sequence_packing follows the padded run's trajectory."""
import numpy as np
import pytest
import mindspore as ms

from mindrlhf.configs import ModelConfig
from mindrlhf.configs.grpo_config import GRPOConfig
from mindrlhf.configs.errors import ConfigError
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.trainer.packing import PackingLayout, first_fit_decreasing, pack, packed_logprobs, packed_step_inputs
from mindrlhf.trainer.samples import SampleBatch, train_step_inputs
from mindrlhf.trainer.update.loss_inputs import LossInputs
from mindrlhf.trainer.update.loss import GRPOLossCell
from mindrlhf.trainer.update.one_graph import ResponseLogProb

PAD = 0


def ragged_batch(seed=0, n=6, p=5, r=7):
    """Left-padded prompts of 2..p tokens, right-padded responses of 0..r tokens (one empty), random values."""
    rng = np.random.RandomState(seed)
    plen = np.array([5, 2, 3, 4, 2, 5])[:n]
    rlen = np.array([7, 1, 3, 0, 6, 2])[:n]
    pmask = (np.arange(p)[None] >= p - plen[:, None]).astype(np.int64)
    rmask = (np.arange(r)[None] < rlen[:, None]).astype(np.int64)
    batch = SampleBatch(rng.randint(3, 64, (n, p)) * pmask, pmask, rng.randint(3, 64, (n, r)) * rmask, rmask,
                        (rng.normal(-2, 0.5, (n, r)) * rmask).astype(np.float32), np.arange(n), np.ones(n, np.int64))
    return batch, rng


@pytest.fixture(scope="module")
def model():
    ms.set_seed(3)
    return CausalLM(ModelConfig(hidden_size=32, num_layers=2, num_heads=4, n_kv_heads=2, intermediate_size=48,
                                vocab_size=64, seq_length=16))


def test_first_fit_decreasing_fills_rows_longest_first_and_skips_empty():
    assert first_fit_decreasing(np.array([3, 9, 0, 4, 6, 1]), 10) == [[1, 5], [4, 3], [0]]
    with pytest.raises(ValueError, match="sequence 0 has 11 tokens"):
        first_fit_decreasing(np.array([11]), 10)


def test_pack_layout_positions_labels_and_attention():
    batch, _ = ragged_batch()
    packed = pack(batch, PAD, row_multiple=4)
    width = 5 + 7 - 1
    assert packed.input_ids.shape == (4, width)          # 3 rows of 11 hold the 5 non-empty sequences, + 1 empty
    assert packed.tokens == (5 + 7 - 1) + (2 + 1 - 1) + (3 + 3 - 1) + (2 + 6 - 1) + (5 + 2 - 1)
    assert not (packed.segments == 3).any()              # sequence 3 has no response: not packed
    for i in (0, 1, 2, 4, 5):
        cols = np.nonzero(packed.segments == i)
        row = cols[0][0]
        tokens = np.concatenate([batch.prompt_ids[i][batch.prompt_mask[i] == 1],
                                 batch.response_ids[i][batch.response_mask[i] == 1]])
        np.testing.assert_array_equal(packed.input_ids[row, cols[1]], tokens[:-1])
        np.testing.assert_array_equal(packed.labels[row, cols[1]], tokens[1:])
        np.testing.assert_array_equal(packed.position_ids[row, cols[1]], np.arange(len(tokens) - 1))
    # a response value lands on the position whose label is that response token, and comes back
    np.testing.assert_array_equal(packed.gather(packed.scatter(batch.rollout_logp)), batch.rollout_logp)
    on = batch.response_mask == 1
    np.testing.assert_array_equal(packed.labels[packed.response_rows[on], packed.response_cols[on]],
                                  batch.response_ids[on])
    bias = packed.bias().asnumpy()[:, 0]
    seg = packed.segments
    for row in range(packed.rows):
        for t in range(width):
            for s in range(width):
                visible = seg[row, t] >= 0 and seg[row, s] == seg[row, t] and s <= t
                assert (bias[row, t, s] == 0) == visible


def padded_logprobs(model, batch, temperature=0.7):
    cell = ResponseLogProb(model, batch.response_ids.shape[1], temperature)
    from mindrlhf.trainer.samples import training_tensors
    t = training_tensors(batch)
    return cell(t["input_ids"], t["position_ids"], t["bias"], t["labels"]).asnumpy()


def test_packed_logprobs_equal_padded(model):
    batch, _ = ragged_batch()
    want = padded_logprobs(model, batch)
    width = 5 + 7 - 1
    got = packed_logprobs(ResponseLogProb(model, width, 0.7), batch, PAD, micro_rows=2, per_call=2)
    on = batch.response_mask == 1
    np.testing.assert_allclose(got[on], want[on], rtol=0, atol=1e-5)
    assert (got[~on] == 0).all()


@pytest.mark.parametrize("beta,tis,on_policy", [(0.04, True, False), (0.0, False, True)])
def test_packed_loss_and_gradients_equal_padded(model, beta, tis, on_policy):
    """One mini-batch padded (one call) and packed (micro-batches of 1 row, gradients summed): the loss, its
    statistics and every parameter gradient agree within 1e-5 of the largest gradient."""
    batch, rng = ragged_batch(seed=1)
    logp = padded_logprobs(model, batch)
    old = (logp + rng.normal(0, 0.2, logp.shape) * batch.response_mask).astype(np.float32)
    ref = (logp + rng.normal(0, 0.2, logp.shape) * batch.response_mask).astype(np.float32)
    adv = np.array([1.0, -0.5, 0.7, 0.3, -1.2, 0.4], np.float32)
    mask = batch.response_mask.astype(np.float32)
    mask[5] = 0                                          # a masked-out row (e.g. a filler group) trains nothing
    token_norm = mask.sum()
    rl = GRPOConfig().rl
    rl.beta, rl.tis, rl.clip_low, rl.clip_high, rl.loss_agg = beta, tis, 0.2, 0.28, "token-mean"
    params = model.trainable_params()

    def run(cell, calls):
        grad_fn = ms.value_and_grad(cell, None, params, has_aux=True)
        total, stats, grads = 0.0, np.zeros(8), [np.zeros(p.shape, np.float32) for p in params]
        for args in calls:
            (loss, aux), g = grad_fn(*args[:4], *args[5:])     # the update's arguments less lr
            total += float(loss.asnumpy())
            stats += [float(a.asnumpy()) for a in aux]
            grads = [a + b.asnumpy() for a, b in zip(grads, g)]
        return total, stats, grads

    loss_inputs = LossInputs(mask, old, batch.rollout_logp, ref, adv, token_norm)
    padded = run(GRPOLossCell(model, rl, 7, 0.7, on_policy),
                 [train_step_inputs(batch, loss_inputs, 0.0)])
    args = packed_step_inputs(batch, loss_inputs, 0.0, PAD, micro_rows=1)
    rows = args[0].shape[0]
    assert rows < len(batch)                             # several sequences share rows
    calls = [[a[i:i + 1] if a.ndim and a.shape[0] == rows else a for a in args] for i in range(rows)]
    packed = run(GRPOLossCell(model, rl, 11, 0.7, on_policy), calls)
    assert packed[0] == pytest.approx(padded[0], rel=1e-5, abs=1e-7)
    np.testing.assert_allclose(packed[1][:4], padded[1][:4], rtol=1e-5, atol=1e-7)   # pg, kl, clip, entropy
    scale = max(np.abs(g).max() for g in padded[2])
    assert scale > 1e-3
    for p, a, b in zip(params, packed[2], padded[2]):
        assert np.abs(a - b).max() <= 1e-5 * scale, p.name


def test_packing_config_checks(tmp_path):
    from grpo_helpers import grpo_overrides, make_grpo_assets
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    assets = make_grpo_assets(str(tmp_path))
    for k, (extra, pattern) in enumerate((({"loss_agg": "seq-mean-token-mean"}, "needs rl.loss_agg token-mean"),
                           ({"loss_mode": "gspo"}, "needs rl.loss_agg token-mean"),
                           ({"loss_mode": "gspo", "loss_agg": "token-mean"}, "gspo takes a ratio per sequence"),
                           ({"max_packing_token_size": 10}, "hold no packed row of 23"))):
        overrides = grpo_overrides(assets, str(tmp_path / str(k)), sequence_packing=True, **extra)
        if "loss_agg" not in extra:
            del overrides["loss_agg"]        # left to the loss_mode's own default (gspo: a sequence mean)
        cfg = load_grpo_config(None, overrides)
        with pytest.raises(ConfigError, match=pattern):
            GRPOTrainer(cfg, log=lambda *a: None)
    cfg = load_grpo_config(None, grpo_overrides(assets, str(tmp_path / "y"), max_packing_token_size=2 * 47))
    with pytest.raises(ConfigError, match="engine.sequence_packing is false"):
        GRPOTrainer(cfg, log=lambda *a: None)
    # by default one packed row of prompt width 16 + max_tokens 8 - 1 per micro-batch; share_prompt is off
    cfg = load_grpo_config(None, grpo_overrides(assets, str(tmp_path / "z"), sequence_packing=True,
                                                share_prompt=True))
    run = GRPOTrainer(cfg, log=lambda *a: None).run
    assert run.packing == PackingLayout(23, 1) and run.shared_prompt == (0, 0)
    assert "sequence packing: 1 row(s) of 23 tokens per micro-batch" in run.describe()


@pytest.mark.slow       # ~32 s; packed log-probs, loss and gradients equal the padded ones in the default run
def test_packed_run_follows_the_padded_trajectory(tmp_path, monkeypatch):
    """Two steps, two mini-batches each (old log-prob pass, two updates) with a reference model: losses,
    statistics and final weights of the packed run equal the padded run's."""
    from grpo_helpers import grpo_overrides, make_grpo_assets
    from mindrlhf.checkpoint.model_io import model_state, save_checkpoint
    from mindrlhf.configs import load_model_yaml
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    from mindrlhf.utils.params import param_as_f32
    assets = make_grpo_assets(str(tmp_path))
    init = str(tmp_path / "init.safetensors")
    save_checkpoint(model_state(CausalLM(load_model_yaml(assets["sft_path_train"]).model)), init)
    rollout = GRPOTrainer.rollout

    def ragged_rollout(self, batch, round_index=0):
        """A random tiny model rarely samples EOS: responses cut to 1..R tokens here stand in for it."""
        out = rollout(self, batch, round_index)
        cut = 1 + (np.arange(len(out)) * 7 + self.step) % out.response_ids.shape[1]
        keep = np.arange(out.response_ids.shape[1])[None] < cut[:, None]
        out.response_ids, out.response_mask = out.response_ids * keep, out.response_mask * keep
        out.rollout_logp = out.rollout_logp * keep
        out.finished[:] = 1
        return out
    monkeypatch.setattr(GRPOTrainer, "rollout", ragged_rollout)
    from mindrlhf.trainer import packing as packing_module
    calls = []

    def spy(samples, pad_id, row_multiple=1, keep=None):
        out = pack(samples, pad_id, row_multiple, keep)
        calls.append((len(samples), out.rows, out.tokens))
        return out
    monkeypatch.setattr(packing_module, "pack", spy)
    results = {}
    for packing in (False, True):
        cfg = load_grpo_config(None, grpo_overrides(assets, str(tmp_path / str(packing)), beta=0.04, max_tokens=32,
                                                    mini_batch_size=4, load_sft_checkpoint_train=init,
                                                    verifier_function="digit_fraction_test",
                                                    sequence_packing=packing, max_packing_token_size=2 * 47))
        if not packing:
            cfg.engine.max_packing_token_size = 0
        trainer = GRPOTrainer(cfg, log=lambda *a: None)
        assert (trainer.run.packing is not None) == packing
        history = [trainer.train_one_step() for _ in range(2)]
        results[packing] = (history, {p.name: param_as_f32(p).copy() for p in trainer.policy.get_parameters()})
    (h1, w1), (h2, w2) = results[False], results[True]
    # per step: old and reference log-probs (8 sequences each), 2 updates of 4
    assert [c[0] for c in calls] == [8, 8, 4, 4] * 2
    assert sum(rows for _, rows, _ in calls) < sum(n for n, _, _ in calls), calls    # rows hold several
    assert all(h["grad_norm"] > 1e-3 for h in h1)
    for a, b in zip(h1, h2):
        for key in ("loss", "pg_loss", "kl", "grad_norm", "entropy", "reward_mean", "clip_frac"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    diff = sum(np.linalg.norm(w2[n] - w) ** 2 for n, w in w1.items()) ** 0.5
    assert diff <= 1e-5 * sum(np.linalg.norm(w) ** 2 for w in w1.values()) ** 0.5


@pytest.mark.slow       # ~30 s; the routing inputs' packing itself is the fast test below
def test_packed_moe_run_with_router_replay_and_aux_loss_follows_the_padded_trajectory(tmp_path, monkeypatch):
    """A Qwen3-MoE folder with r3 and the load-balancing loss at 0.5: the packed run replays the rollout's experts
    and takes the aux gradient at the packed positions, and equals the padded run (one step, two updates: the
    old-policy pass replays the routing too)."""
    from grpo_helpers import grpo_overrides, make_grpo_assets
    from hf_reference import make_qwen3_moe_model
    from mindrlhf.configs.grpo_load import load_grpo_config
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    from mindrlhf.utils.params import param_as_f32
    assets = make_grpo_assets(str(tmp_path / "assets"), rows=16)
    folder = str(tmp_path / "moe")
    make_qwen3_moe_model(folder, vocab=416, aux_coef=0.5)
    results = {}
    for packing in (False, True):
        cfg = load_grpo_config(None, grpo_overrides(dict(assets, sft_path_train=folder), str(tmp_path / str(packing)),
                                                    beta=0.04, max_tokens=12, mini_batch_size=4, router_replay="r3",
                                                    verifier_function="digit_fraction_test",
                                                    sequence_packing=packing, max_packing_token_size=2 * 27))
        if not packing:
            cfg.engine.max_packing_token_size = 0
        trainer = GRPOTrainer(cfg, log=lambda *a: None)
        assert (trainer.run.packing is not None) == packing
        history = [trainer.train_one_step()]
        results[packing] = (history, {p.name: param_as_f32(p).copy() for p in trainer.policy.get_parameters()})
    (h1, w1), (h2, w2) = results[False], results[True]
    assert h1[0]["grad_norm"] > 1e-3 and h1[0]["moe/aux_loss"] > 0
    for a, b in zip(h1, h2):
        for key in ("loss", "pg_loss", "kl", "grad_norm", "entropy", "moe/aux_loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    diff = sum(np.linalg.norm(w2[n] - w) ** 2 for n, w in w1.items()) ** 0.5
    assert diff <= 1e-5 * sum(np.linalg.norm(w) ** 2 for w in w1.values()) ** 0.5


def test_routing_inputs_are_packed_with_their_tokens():
    """Per input token values (a MoE's routing inputs) land where pack put each sequence's input tokens: experts
    -1 and aux gradient 0 elsewhere; a sequence left out of the pack leaves nothing."""
    rng = np.random.RandomState(0)
    n, p, r = 4, 5, 4
    prompt_len, resp_len = np.array([2, 5, 3, 1]), np.array([3, 1, 4, 2])
    prompt_ids = np.where(np.arange(p)[None] >= p - prompt_len[:, None], rng.randint(3, 50, (n, p)), 0)
    resp_mask = (np.arange(r)[None] < resp_len[:, None]).astype(np.int64)
    batch = SampleBatch(prompt_ids, (prompt_ids > 0).astype(np.int64), rng.randint(3, 50, (n, r)) * resp_mask,
                        resp_mask, np.zeros((n, r), np.float32), np.zeros(n, np.int64), np.ones(n, np.int64))
    packed = pack(batch, 0, keep=np.array([True, True, True, False]))
    ids = np.arange(n * (p + r - 1))[:, None].repeat(2, 1).reshape(n, p + r - 1, 2).astype(np.int32) + 1
    out = packed.scatter_tokens(ids)
    inputs = np.concatenate([batch.prompt_ids, batch.response_ids], 1)[:, :-1]
    for i in range(3):
        where = packed.segments == i
        real = np.flatnonzero(np.concatenate([batch.prompt_mask[i], resp_mask[i, 1:]]))
        np.testing.assert_array_equal(out[where], ids[i, real])                   # the same tokens' values
        np.testing.assert_array_equal(packed.input_ids[where], inputs[i, real])
    assert (out[packed.segments < 0] == -1).all() and not np.isin(ids[3], out).any()
    assert (packed.scatter_tokens(ids.astype(np.float32))[packed.segments < 0] == 0).all()
