"""Every loss mode, aggregation, KL estimator and their options at the trainer's loss cell
(`GRPOLossCell.terms`, what all three update engines call) against an independent reference written in torch
from the papers' definitions (PPO/GRPO clip with DAPO's clip-higher, GSPO in the paper's sequence form, CISPO,
KL-Cov; DAPO's token mean, GRPO's sequence mean, Dr.GRPO's fixed-length sum; Schulman's k1/k2/k3; TIS; the
80/20 entropy mask): loss, every statistic and d loss / d log-prob on the same batch, to 1e-5 (float32 against
float64: measured <= 2e-6 of the largest gradient; a wrong formula is off by far more). Two cases also
run end to end through the model, against transformers' model feeding the same torch loss: every parameter's
gradient. Clip-Cov draws its tokens at random inside the graph, so it is checked by its own statistical test
(tests/test_loss_variants.py), not here."""
import numpy as np
import pytest
import torch
import mindspore as ms
from mindspore import Tensor

from hf_reference import make_hf_model, tiny_model_kwargs
from model_helpers import load_ours
from mindrlhf.checkpoint.hf_interop import ms_to_hf_name
from mindrlhf.configs import ModelConfig
from mindrlhf.configs.grpo_config import GRPOConfig
from mindrlhf.trainer.update.loss import GRPOLossCell
from mindrlhf.trainer.update.loss_inputs import LossInputs

N, R = 6, 5
RS = np.random.RandomState(11)
LOGP = (-RS.rand(N, R) * 3 - 0.05).astype(np.float32)
OLD = (LOGP + RS.randn(N, R) * 0.3).astype(np.float32)
ROLLOUT = (OLD + RS.randn(N, R) * 0.2).astype(np.float32)
REF = (LOGP + RS.randn(N, R) * 0.3).astype(np.float32)
MASK = (np.arange(R)[None, :] < np.array([5, 3, 4, 1, 5, 2])[:, None]).astype(np.float32)
ADV = np.array([1.2, -0.7, 0.4, -1.5, 0.9, -0.2], np.float32)
ENT = (RS.rand(N, R) * 4).astype(np.float32)
TOKEN_NORM = float(MASK.sum() + 3)          # the global mini-batch's count (other ranks' tokens too)


def _reference(logp, c, ent=None):
    """The loss and statistics as the papers define them, in torch, from `logp` (a leaf tensor) and the token
    entropies `ent` (default ENT)."""
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in
         dict(old=OLD, rollout=ROLLOUT, ref=REF, mask=MASK, ent=ENT).items()}
    if ent is not None:
        t["ent"] = ent
    mask, adv = t["mask"], torch.tensor(ADV, dtype=torch.float64)[:, None]
    old = logp.detach() if c["on_policy"] else t["old"]
    lo, hi = c["clip_low"], c["clip_high"]

    def agg(x):
        if c["loss_agg"] == "token-mean":                   # DAPO: every token of the mini-batch weighs the same
            return (x * mask).sum() / TOKEN_NORM
        if c["loss_agg"] == "seq-mean-token-mean":          # GRPO: each response's mean, then the mean of those
            return ((x * mask).sum(1) / mask.sum(1)).mean()
        return ((x * mask).sum(1) / R).mean()               # Dr.GRPO: a fixed length instead of the response's

    ratio = torch.exp(logp - old)
    flags = torch.zeros_like(logp)
    mode = c["loss_mode"]
    if mode == "vanilla":                                   # PPO's clipped surrogate, per token
        clipped = torch.clamp(ratio, 1 - lo, 1 + hi)
        pg = -torch.minimum(ratio * adv, clipped * adv)
        flags = (clipped * adv < ratio * adv).double()
    elif mode == "gspo":                                    # one ratio per response: the geometric mean
        s = torch.exp(((logp - old) * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True))
        pg = -torch.minimum(s * adv, torch.clamp(s, 1 - lo, 1 + hi) * adv).expand(N, R)
        flags = (torch.clamp(s, 1 - lo, 1 + hi) * adv < s * adv).double().expand(N, R)
    elif mode == "cispo":                                   # the IS weight clipped (above), never the gradient
        pg = -torch.clamp(ratio, max=1 + hi).detach() * adv * logp
        flags = (ratio > 1 + hi).double()
    elif mode == "kl_cov":                                  # no clip; |log r| on the top-covariance tokens
        on = mask > 0
        a = adv.expand(N, R)
        cov = (a - a[on].mean()) * (logp.detach() - logp.detach()[on].mean())
        k = max(1, int(np.floor(c["kl_cov_ratio"] * float(mask.sum()))))
        top = torch.topk(torch.where(on, cov, torch.full_like(cov, -np.inf)).flatten(), k).indices
        flags = torch.zeros(N * R, dtype=torch.float64)
        flags[top] = 1.0
        flags = flags.reshape(N, R)
        pg = -adv * ratio + flags * c["ppo_kl_coef"] * torch.abs(logp - old)
    if c["tis"]:                                            # truncated importance sampling
        pg = pg * torch.clamp(torch.exp(old.detach() - t["rollout"]), max=c["tis_cap"])
    if c["top_entropy_quantile"] < 1:                       # 80/20: the policy term on high-entropy tokens only
        threshold = torch.quantile(t["ent"][mask > 0], 1 - c["top_entropy_quantile"])
        pg = pg * (t["ent"] >= threshold).double()
    pg_loss = agg(pg)
    log_r = t["ref"] - logp
    kl_token = {"k1": -log_r, "k2": 0.5 * log_r ** 2, "k3": torch.exp(log_r) - log_r - 1}[c["kl_estimator"]]
    kl = agg(kl_token) if c["beta"] > 0 else torch.zeros(())
    scale = 1.0 if c["loss_agg"] == "token-mean" else 1.0 / c["micro_batches"]   # micro-batches' share
    # verl's / MindSpeed-RL's entropy bonus: the entropy aggregated as the loss, with its gradient
    loss = (pg_loss + c["beta"] * kl - c["entropy_coeff"] * agg(t["ent"])) * scale
    stats = {"pg_loss": pg_loss * scale, "kl": kl * scale, "clip_frac": (flags * mask).sum() / TOKEN_NORM,
             "entropy": (t["ent"].detach() * mask).sum() / TOKEN_NORM}
    if c["on_policy"]:
        stats["on_policy_gap"] = (torch.abs(logp.detach() - t["rollout"]) * mask).sum() / TOKEN_NORM
    if c["tis"]:
        w = torch.exp(old.detach() - t["rollout"])
        stats.update(tis_ratio_mean=(w * mask).sum() / TOKEN_NORM, tis_ratio_max=(w * mask).max(),
                     tis_clipped_frac=((w > c["tis_cap"]).double() * mask).sum() / TOKEN_NORM)
    return loss, stats


BASE = dict(loss_mode="vanilla", loss_agg="token-mean", clip_low=0.2, clip_high=0.28, beta=0.0, kl_estimator="k3",
            tis=False, tis_cap=2.0, top_entropy_quantile=1.0, kl_cov_ratio=0.2, ppo_kl_coef=1.0, on_policy=False,
            micro_batches=1, entropy_coeff=0.0)
CASES = {
    "grpo_token_mean_k3": dict(beta=0.04),
    "grpo_seq_mean_k1": dict(loss_agg="seq-mean-token-mean", beta=0.1, kl_estimator="k1"),
    "dr_grpo_k2": dict(loss_agg="seq-mean-token-sum-norm", beta=0.1, kl_estimator="k2"),
    "dapo_clip_higher_tis": dict(clip_low=0.1, clip_high=0.4, tis=True, tis_cap=1.2),
    "on_policy_with_tis": dict(on_policy=True, tis=True, tis_cap=1.1, beta=0.04),
    "seq_mean_in_two_micro_batches": dict(loss_agg="seq-mean-token-mean", micro_batches=2, beta=0.04),
    "gspo": dict(loss_mode="gspo", loss_agg="seq-mean-token-mean", clip_low=0.05, clip_high=0.08),
    "cispo": dict(loss_mode="cispo", clip_high=0.3, beta=0.04),
    "kl_cov": dict(loss_mode="kl_cov", kl_cov_ratio=0.2, ppo_kl_coef=0.7),
    "top_entropy_quantile": dict(top_entropy_quantile=0.4, beta=0.04, loss_agg="seq-mean-token-mean"),
    "entropy_bonus": dict(entropy_coeff=0.3, beta=0.04),
    "entropy_bonus_seq_mean_80_20": dict(entropy_coeff=0.3, loss_agg="seq-mean-token-mean", top_entropy_quantile=0.4),
}
STATS = ("pg_loss", "kl", "clip_frac", "entropy", "on_policy_gap", "tis_ratio_mean", "tis_ratio_max",
         "tis_clipped_frac")


def _loss_cell(model, c, response_len=R):
    rl = GRPOConfig().rl
    for key in ("loss_mode", "loss_agg", "clip_low", "clip_high", "beta", "kl_estimator", "tis", "tis_cap",
                "top_entropy_quantile", "kl_cov_ratio", "ppo_kl_coef", "entropy_coeff"):
        setattr(rl, key, c[key])
    return GRPOLossCell(model, rl, response_len, 1.0, c["on_policy"], c["micro_batches"])


def _inputs():
    return LossInputs(MASK, OLD, ROLLOUT, REF, ADV, TOKEN_NORM).tensors()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("lossref"))
    hf = make_hf_model(root, qkv_bias=True, tie=False, n_kv_heads=2)
    return hf, load_ours(root, ModelConfig(**tiny_model_kwargs(True, False, 2)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_loss_cell_equals_the_reference(tiny, name):
    c = {**BASE, **CASES[name]}
    cell = _loss_cell(tiny[1], c)
    loss_inputs = _inputs().args()

    def f(logp, ent):
        return cell.terms(logp, ent, loss_inputs)
    (loss, aux), (grad, ent_grad) = ms.value_and_grad(f, (0, 1), has_aux=True)(Tensor(LOGP), Tensor(ENT))
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    ent = torch.tensor(ENT, dtype=torch.float64, requires_grad=True)
    ref_loss, ref_stats = _reference(logp, c, ent)
    ref_loss.backward()
    want_ent = ent.grad.numpy()                 # the bonus's share; zero without it (80/20 reads no gradient)
    assert (np.abs(want_ent).max() > 1e-3) == (c["entropy_coeff"] != 0), name
    np.testing.assert_allclose(ent_grad.asnumpy(), want_ent, rtol=0, atol=1e-6 + 1e-5 * np.abs(want_ent).max())
    assert abs(float(loss.asnumpy()) - float(ref_loss)) <= 1e-5 * max(1.0, abs(float(ref_loss))), name
    for key, value in zip(STATS, aux):
        want = float(ref_stats.get(key, 0.0))
        assert abs(float(value.asnumpy()) - want) <= 1e-5 * max(1.0, abs(want)), (name, key)
    want = logp.grad.numpy()
    assert np.abs(want).max() > 1e-3                                   # the case trains something
    np.testing.assert_allclose(grad.asnumpy(), want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", ["dapo_clip_higher_tis", "gspo", "entropy_bonus"])
def test_the_loss_cell_through_the_model_equals_transformers_and_the_reference(tiny, name):
    """The whole loss cell (forward, log-probs, entropies, loss) against transformers' model feeding the torch
    reference: loss and every parameter's gradient (the model's float32 noise bounds these at 1e-4 relative, as
    the model parity tests); with the entropy bonus, its gradient through every logit (the head's written-out
    backward) against torch autograd's."""
    hf, ours = tiny
    c = {**BASE, **CASES[name]}
    rs = np.random.RandomState(5)
    prompt, seq = 4, rs.randint(3, 160, (N, 4 + R))
    cell = _loss_cell(ours, c)
    params = list(ours.trainable_params())
    from model_helpers import model_inputs
    ids, pos, bias = model_inputs(seq[:, :-1])
    try:
        (loss, _), grads = ms.value_and_grad(cell, None, params, has_aux=True)(
            ids, pos, bias, Tensor(seq[:, 1:].astype(np.int32)), *_inputs().args())
    finally:
        ours.logprob_fn.entropy_grad = False            # the module's model serves the other cases as a metric
    hf.zero_grad()
    logits = hf(torch.tensor(seq[:, :-1])).logits.double()[:, prompt - 1:]
    log_probs = torch.log_softmax(logits, -1)
    logp = log_probs.gather(-1, torch.tensor(seq[:, prompt:])[..., None])[..., 0]
    ref_loss, _ = _reference(logp, c, -(log_probs.exp() * log_probs).sum(-1))
    ref_loss.backward()
    assert abs(float(loss.asnumpy()) - float(ref_loss)) <= 1e-5 * max(1.0, abs(float(ref_loss)))
    named = dict(hf.named_parameters())
    for p, g in zip(params, grads):
        want = named[ms_to_hf_name(p.name)].grad.numpy()
        assert np.abs(g.asnumpy() - want).max() <= 1e-4 * np.abs(want).max(), (name, p.name)
