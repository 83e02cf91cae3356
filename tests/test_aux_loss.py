"""The MoE load-balancing loss in the GRPO update (trainer/aux_loss.py): its gradient, added to the router
probabilities' in the backward (models/moe.AuxLossGradient), is router_aux_loss_coef x the gradient of
transformers' aux_loss (output_router_logits, padding masked) as torch computes it on the same rows; the same
whole rows or shared prompts, one call or micro-batches; its value is transformers'; a GRPO run applies it and
says so."""
import numpy as np
import pytest

from hf_reference import make_qwen3_moe_model, qwen3_moe_model_kwargs
from model_helpers import load_ours
from mindrlhf.configs import ModelConfig
from mindrlhf.models.padding import left_pad
from mindrlhf.trainer.aux_loss import router_grad
from mindrlhf.trainer.router_replay import recorded_positions
from mindrlhf.trainer.samples import SampleBatch, training_tensors
from mindrlhf.trainer.update.loss import GRPOLossCell
from mindrlhf.trainer.update.loss_inputs import LossInputs
from mindrlhf.trainer.update.one_graph import ModelRouting

G, P, R = 3, 7, 6           # samples per prompt, prompt width, response width
COEF = 0.5                  # large, so the aux term's share of each gradient is far above the tolerance
TOL = 1e-5


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """(transformers' model, ours): layer 0 dense, layers 1 and 2 sparse; top-2 of 4."""
    d = str(tmp_path_factory.mktemp("moe_aux"))
    kw = dict(layers=3, mlp_only=(0,), aux_coef=COEF)
    hf = make_qwen3_moe_model(d, **kw)
    return hf, load_ours(d, ModelConfig(**qwen3_moe_model_kwargs(**kw)))


@pytest.fixture(scope="module")
def samples():
    """Two prompts (left-padded) x G responses of 2..6 tokens (right-padded)."""
    rng = np.random.RandomState(5)
    ids, mask = left_pad([rng.randint(3, 160, n).tolist() for n in (4, 7)], P, 0)
    ids, mask = np.repeat(ids, G, 0), np.repeat(mask, G, 0)
    rows = len(ids)
    lengths = np.array([6, 2, 4, 5, 3, 6])
    response_mask = (np.arange(R)[None] < lengths[:, None]).astype(np.int64)
    response = rng.randint(3, 160, (rows, R)) * response_mask
    return SampleBatch(ids, mask, response, response_mask, rng.randn(rows, R).astype(np.float32) * 0.1 - 2,
                       np.zeros(rows, np.int64), np.ones(rows, np.int64))


def _rl(**kw):
    from mindrlhf.configs.grpo_config import GRPOConfig
    rl = GRPOConfig().rl
    for key, value in dict(beta=0.0, loss_agg="token-mean", **kw).items():
        setattr(rl, key, value)
    return rl


def _inputs(samples, advantages, grad):
    """The loss cell's arguments: routing -1 everywhere (each token routes itself) and `grad` as router_grad."""
    t = training_tensors(samples)
    keep = recorded_positions(samples)
    own = np.full(keep.shape + (2, 2), -1, np.int32)
    mask = samples.response_mask.astype(np.float32)
    lin = LossInputs(mask, samples.rollout_logp, samples.rollout_logp, np.zeros_like(mask), advantages,
                     np.float32(mask.sum()), own, grad)
    return (t["input_ids"], t["position_ids"], t["bias"], t["labels"]), lin


def _grads(model, samples, advantages, grad, shared=(0, 0), cut=None):
    """Every parameter's gradient of the GRPO loss cell (with routing inputs), summed over the row slices `cut`."""
    import mindspore as ms
    params = list(model.trainable_params())
    cell = GRPOLossCell(model, _rl(), R, 1.0, on_policy=True, shared_prompt=shared, routed=True)
    fn = ms.value_and_grad(cell, None, params, has_aux=True)
    total = {}
    for rows in cut or [slice(0, len(samples))]:
        part = samples.rows(rows.start, rows.stop)
        inputs, lin = _inputs(part, advantages[rows], grad[rows])
        _, grads = fn(*inputs, *lin.tensors().args())
        for p, g in zip(params, grads):
            total[p.name] = total.get(p.name, 0) + g.asnumpy()
    return total


def _aux_gradient(model, samples):
    """router_grad and the aux value for the whole batch as one train replica's one mini-batch."""
    t = training_tensors(samples)
    ids, prob_sums = (x.asnumpy() for x in ModelRouting(model)(t["input_ids"], t["position_ids"], t["bias"],
                                                                 t["labels"]))
    return router_grad(ids, prob_sums, recorded_positions(samples), len(samples), 4, COEF, model.mesh)


def test_the_update_gets_coef_times_transformers_aux_loss_gradient(moe, samples):
    """Our gradient with router_grad minus without = COEF x d aux_loss / d parameter, aux_loss transformers' own
    (output_router_logits, attention_mask = the tokens the rollout fed); the reported value = that aux_loss. Fails
    with the gradient left out of the backward, or scaled by anything but 1."""
    import torch
    from hf_reference import hf_grad
    hf, ours = moe
    grad, aux = _aux_gradient(ours, samples)
    advantages = np.linspace(-1, 1, len(samples)).astype(np.float32)
    with_aux = _grads(ours, samples, advantages, grad)
    without = _grads(ours, samples, advantages, np.zeros_like(grad))
    t = training_tensors(samples)
    hf.zero_grad()
    out = hf(torch.tensor(t["input_ids"].asnumpy().astype(np.int64)),
             attention_mask=torch.tensor(recorded_positions(samples).astype(np.int64)),
             position_ids=torch.tensor(t["position_ids"].asnumpy().astype(np.int64)), output_router_logits=True)
    (COEF * out.aux_loss).backward()
    assert abs(aux - out.aux_loss.item()) <= TOL
    hf_params = dict(hf.named_parameters())
    for name in with_aux:
        try:
            ref = hf_grad(hf_params, name, ours.config)
        except AttributeError:          # torch's .grad None: no path from the parameter to the router logits
            ref = np.zeros_like(with_aux[name])
        diff = with_aux[name] - without[name]
        assert np.abs(diff - ref).max() <= TOL * max(1.0, np.abs(ref).max()), name
    router = "model.layers.1.feed_forward.routed_experts.router.dense.weight"
    assert np.abs(with_aux[router] - without[router]).max() > 100 * TOL     # the aux term is really there


def test_shared_prompts_and_micro_batches_get_the_same_aux_gradient(moe, samples):
    """The shared-prompt pass sums a prompt token's aux gradient over its group's rows (it stands for all of them);
    two micro-batches (one prompt group each) add up to the whole batch's gradient."""
    _, ours = moe
    grad, _ = _aux_gradient(ours, samples)
    advantages = np.zeros(len(samples), np.float32)          # the aux term alone
    whole = _grads(ours, samples, advantages, grad)
    shared = _grads(ours, samples, advantages, grad, shared=(G, P))
    micro = _grads(ours, samples, advantages, grad, cut=[slice(0, G), slice(G, 2 * G)])
    for name, ref in whole.items():
        scale = max(1e-3, np.abs(ref).max())
        assert np.abs(shared[name] - ref).max() <= TOL * scale, name
        assert np.abs(micro[name] - ref).max() <= TOL * scale, name


def test_router_grad_counts_the_global_mini_batch():
    """Per mini-batch: the aux gradient is coef x row shares x E x C_e / (L N)^2 on every real token, with C and N over
    the whole mini-batch; the value E sum_e f_e P_e (hand-computed here for two mini-batches of one row)."""
    class OneReplica:
        row_ways, is_row_leader, is_first_stage = 1, True, True
    ids = np.array([[[[0, 1]], [[0, 2]], [[3, 1]]], [[[2, 3]], [[2, 3]], [[0, 1]]]])       # (2 rows, 3 tokens, 1, 2)
    keep = np.array([[1, 1, 0], [1, 1, 1]], bool)
    probs = np.full((2, 3, 4), 0.25)
    grad, aux = router_grad(ids, probs, keep, 1, 4, 0.1, OneReplica())
    c0 = np.array([2, 1, 1, 0]) / 2.0               # row 0: 2 real tokens, 1 layer: f = C / 2
    c1 = np.array([1, 1, 2, 2]) / 3.0
    assert np.allclose(grad[0, 0], 0.1 * 4 * c0 / 2) and np.allclose(grad[0, 2], 0)
    assert np.allclose(grad[1, 2], 0.1 * 4 * c1 / 3)
    assert np.isclose(aux, np.mean([4 * (c0 * 0.25).sum(), 4 * (c1 * 0.25).sum()]))
