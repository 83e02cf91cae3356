"""engine.layerwise_update (trainer/update/layerwise.py): the update and the log-prob passes run one decoder layer per
graph give what the model-deep graphs give - losses, KL to the reference (its log-probs), gradient norms and
weights after two GRPO steps - with the prompt shared by its group or not, with one micro-batch or several,
on-policy or with old log-probs of their own pass, for full fine-tuning (tied embeddings: the head's and the
embedding's gradients meet in one buffer) and for LoRA (the reference: the policy with its adapters off);
and layouts it cannot run are refused by name."""
from __future__ import annotations

import numpy as np
import pytest

from grpo_helpers import grpo_overrides, make_grpo_assets, model_yaml
from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.grpo_load import load_grpo_config
from mindrlhf.trainer.grpo_trainer import GRPOTrainer
from mindrlhf.trainer.update.layerwise import LayerwiseLogProb, LayerwiseTrainStep
from mindrlhf.utils.params import param_as_f32


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_grpo_assets(str(tmp_path_factory.mktemp("layerwise")), rows=16)


def _run(assets, out, steps=2, **extra):
    cfg = load_grpo_config(None, grpo_overrides(assets, out, beta=0.04, verifier_function="digit_fraction_test",
                                                **extra))
    trainer = GRPOTrainer(cfg, log=lambda *a: None)
    history = [trainer.train_one_step() for _ in range(steps)]
    weights = {p.name: param_as_f32(p).copy() for p in trainer.policy.get_parameters()}
    return trainer, history, weights


@pytest.mark.parametrize("case", [
    dict(share_prompt=True, micro_batch_size=4),                                  # two micro-batches, one group each
    pytest.param(dict(share_prompt=False), marks=pytest.mark.slow),             # whole rows, one micro-batch (~13 s)
    pytest.param(dict(share_prompt=False, micro_batch_size=4),                    # the head in two pieces of rows
                 marks=pytest.mark.slow),                                        # ~13 s
    # ~16 s: -m slow (LoRA under the one-graph update stays in the default run: test_lora)
    pytest.param(dict(share_prompt=True, micro_batch_size=4, lora_rank=4, lora_alpha=8, lr=1e-2),
                 marks=pytest.mark.slow),
    # two updates per step, old log-probs of their own pass (~18 s: -m slow; the MoE test below runs them)
    pytest.param(dict(share_prompt=True, mini_batch_size=4), marks=pytest.mark.slow),
], ids=["shared_prompt_micro_batches", "whole_rows", "whole_rows_micro_batches", "lora", "off_policy"])
def test_layerwise_update_equals_the_one_graph_update(assets, tmp_path, case):
    _, h1, w1 = _run(assets, str(tmp_path / "graph"), **case)
    trainer, h2, w2 = _run(assets, str(tmp_path / "layers"), layerwise_update=True, **case)
    assert isinstance(trainer.train_step, LayerwiseTrainStep)
    reference = trainer.ref_logprob.cell if "lora_rank" in case else trainer.ref_logprob    # adapters off
    assert isinstance(trainer.policy_logprob, LayerwiseLogProb) and isinstance(reference, LayerwiseLogProb)
    assert all(h["grad_norm"] > 1e-3 for h in h1)          # a real gradient in every step
    for a, b in zip(h1, h2):
        for key in ("loss", "pg_loss", "kl", "grad_norm", "entropy", "reward_mean", "clip_frac"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    moved = sum(np.linalg.norm(w1[n] - w2[n]) ** 2 for n in w1) ** 0.5
    assert moved <= 1e-5 * sum(np.linalg.norm(w) ** 2 for w in w1.values()) ** 0.5
    if "lora_rank" in case:                                # only adapters moved, in both runs
        trained = [n for n in w1 if "lora" in n]
        assert trained and all(np.abs(w2[n]).max() > 0 for n in trained if n.endswith("lora_b"))


def test_layerwise_update_refuses_pipeline_stages(assets, tmp_path):
    path = model_yaml(str(tmp_path / "pp2.yaml"), pp=2, micro_batch_num=2, tie_word_embeddings=False)
    cfg = load_grpo_config(None, grpo_overrides(dict(assets, sft_path_train=path), str(tmp_path / "out"),
                                                layerwise_update=True))
    with pytest.raises(ConfigError, match="engine.layerwise_update: .*pipeline_stage 2"):
        GRPOTrainer(cfg, log=lambda *a: None)


@pytest.mark.parametrize("group", [0, 2])
def test_head_pieces_are_the_micro_batches_own_streams(group):
    """HeadPieces cuts a layer call's stream into what each micro-batch's own stream would be (whole rows by
    rows; a shared-prompt token matrix: the pieces' groups' prompt tokens, then their responses') and joins
    the pieces back into the call's layout."""
    from mindspore import Tensor
    from mindrlhf.trainer.update.layerwise import HeadPieces
    rows, prompt_len, response_len, hidden = 6, 3, 2, 4
    rng = np.random.default_rng(0)
    prompts = rng.standard_normal((rows // max(group, 1), prompt_len, hidden)).astype(np.float32)
    responses = rng.standard_normal((rows, response_len, hidden)).astype(np.float32)

    def stream(lo, hi):                     # the stream of rows [lo, hi) laid out on its own
        if not group:
            return np.concatenate([np.concatenate([prompts[r], responses[r]]) for r in range(lo, hi)]).reshape(
                hi - lo, prompt_len + response_len, hidden)
        return np.concatenate([prompts[lo // group:hi // group].reshape(-1, hidden),
                               responses[lo:hi].reshape(-1, hidden)])

    if not group:
        prompts = rng.standard_normal((rows, prompt_len, hidden)).astype(np.float32)
    head = HeadPieces(2 if group else 4, group, prompt_len)
    whole = Tensor(stream(0, rows))
    cuts = head.cuts(slice(0, rows))
    pieces = head.cut(whole, rows)
    assert [(c.start, c.stop) for c in cuts] == ([(0, 2), (2, 4), (4, 6)] if group else [(0, 4), (4, 6)])
    for c, piece in zip(cuts, pieces):
        np.testing.assert_array_equal(piece.asnumpy(), stream(c.start, c.stop))
    np.testing.assert_array_equal(head.join(pieces, rows).asnumpy(), whole.asnumpy())


# ~25-29 s each, so both run with -m slow; the default run keeps the routing inputs of the one-graph update
# (test_aux_loss.py, test_router_replay.py) and the layerwise update's dense equalities above
@pytest.mark.slow
@pytest.mark.parametrize("replay, lora", [("r3", {}), ("none", {}),
                                          ("r3", dict(lora_rank=4, lora_alpha=8, lr=1e-2))],
                         ids=["r3", "none", "r3_lora"])
def test_layerwise_update_of_a_moe_model_takes_its_routing_inputs(tmp_path, replay, lora):
    """A Qwen3-MoE folder (every layer sparse) with router replay (r3) or not (none: the layers route themselves)
    and the load-balancing loss (coefficient 0.5: a large share of every gradient; the test fails with the
    routing inputs left out of the layer graphs): one step of two updates (the old-policy pass replays the
    routing too), shared prompts; the layerwise update gives the one-graph update's numbers and weights. With
    LoRA the layer template carries the experts' adapters too, and they move."""
    from hf_reference import make_qwen3_moe_model
    assets = make_grpo_assets(str(tmp_path / "assets"), rows=16)
    folder = str(tmp_path / "moe")
    make_qwen3_moe_model(folder, vocab=416, aux_coef=0.5)
    moe = dict(assets, sft_path_train=folder)
    case = dict(share_prompt=True, mini_batch_size=4, router_replay=replay, **lora)
    _, h1, w1 = _run(moe, str(tmp_path / "graph"), steps=1, **case)
    trainer, h2, w2 = _run(moe, str(tmp_path / "layers"), steps=1, layerwise_update=True, **case)
    assert isinstance(trainer.train_step, LayerwiseTrainStep)
    for a, b in zip(h1, h2):
        for key in ("loss", "pg_loss", "kl", "grad_norm", "entropy", "moe/aux_loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    moved = sum(np.linalg.norm(w1[n] - w2[n]) ** 2 for n in w1) ** 0.5
    assert moved <= 1e-5 * sum(np.linalg.norm(w) ** 2 for w in w1.values()) ** 0.5
    if lora:
        experts_b = [n for n in w2 if "routed_experts" in n and n.endswith("lora_b")]
        assert len(experts_b) == 6 and all(np.abs(w2[n]).max() > 0 for n in experts_b)
