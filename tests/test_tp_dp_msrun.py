"""Under msrun with 2 CPU workers: TP=2 and DP=2 reproduce TP=1, and each TP region's backward rule."""
import os

import numpy as np
import pytest

from hf_reference import make_hf_model, tiny_model_kwargs
from msrun_util import run_msrun
from mindrlhf.configs import ModelConfig
from mindrlhf.models.specs import param_specs
from mindrlhf.parallel.layouts import role_layouts
from mindrlhf.parallel.mesh import Mesh

pytestmark = pytest.mark.msrun


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpdp")
    make_hf_model(str(root / "hf"), qkv_bias=True, tie=False, n_kv_heads=2)
    out = root / "out"
    out.mkdir()
    script = os.path.join(os.path.dirname(__file__), "workers", "tp_dp_worker.py")
    run_msrun(script, [root / "hf", out], workers=2, log_dir=str(root / "log"))
    return [dict(np.load(out / f"rank_{r}.npz")) for r in range(2)]


def test_tp2_logits_equal_tp1(worker_results):
    for res in worker_results:
        assert np.abs(res["tp_logits"] - res["ref_logits"]).max() <= 1e-5
        assert abs(float(res["tp_loss"]) - float(res["ref_loss"])) <= 1e-5
    # vocab-parallel logprob is replicated and identical on both TP ranks
    assert np.array_equal(worker_results[0]["tp_logprob"], worker_results[1]["tp_logprob"])


@pytest.mark.parametrize("what", ["grad", "ent_grad"])
def test_tp2_gradients_equal_tp1(worker_results, what):
    """The next-token loss's gradients, and with an entropy bonus (ent_grad: the vocabulary-parallel entropy's
    autodiff against the whole-vocabulary head's written-out backward, itself checked against torch in
    test_loss_reference.py)."""
    layouts = role_layouts(param_specs(ModelConfig(**tiny_model_kwargs(True, False, 2))), Mesh(dp=1, tp=2))
    for rank, res in enumerate(worker_results):
        if what == "ent_grad":
            assert abs(float(res["tp_ent_loss"]) - float(res["ref_ent_loss"])) <= 1e-5
            diff = max(np.abs(res["ref_ent_grad/" + n] - res["ref_grad/" + n]).max() for n in
                       (k[len("ref_grad/"):] for k in res if k.startswith("ref_grad/")))
            assert diff > 1e-3                     # the bonus moves the gradients
        for key in res:
            if not key.startswith(f"tp_{what}/"):
                continue
            name = key[len(f"tp_{what}/"):]
            expected = layouts[name].shard(res[f"ref_{what}/" + name], rank)
            assert res[key].shape == expected.shape, name
            assert np.abs(res[key] - expected).max() <= 1e-5 * max(1.0, np.abs(expected).max()), name


def test_dp2_gradients_equal_full_batch(worker_results):
    for res in worker_results:
        for key in res:
            if key.startswith("dp_grad/"):
                ref = res["ref_grad/" + key[len("dp_grad/"):]]
                assert np.abs(res[key] - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max()), key


def test_region_backward_rules(worker_results):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    xs = np.arange(16, dtype=np.float32).reshape(2, 8)
    wg = np.arange(16, dtype=np.float32).reshape(2, 8)
    for r, res in enumerate(worker_results):
        # copy: identity forward, all-reduce backward (sum of both ranks' downstream weights 1 + 2)
        assert np.array_equal(res["region/copy_fwd"], x)
        assert np.array_equal(res["region/copy_bwd"], np.full((2, 4), 3.0))
        # reduce: sum forward (1x + 2x), identity backward (own weight only)
        assert np.array_equal(res["region/reduce_fwd"], 3 * x)
        assert np.array_equal(res["region/reduce_bwd"], np.full((2, 4), r + 1.0))
        # gather: concat of [x, x+10] forward; backward keeps own slice of the gradient
        assert np.array_equal(res["region/gather_fwd"], np.concatenate([x, x + 10], -1))
        assert np.array_equal(res["region/gather_bwd"], wg[:, 4 * r: 4 * r + 4])
        # scatter: own slice forward; backward gathers every rank's slice gradient
        assert np.array_equal(res["region/scatter_fwd"], xs[:, 4 * r: 4 * r + 4])
        assert np.array_equal(res["region/scatter_bwd"], np.concatenate([np.full((2, 4), 1.0),
                                                                         np.full((2, 4), 2.0)], -1))


def test_tp2_rollout_samples_same_tokens_as_tp1(worker_results):
    for res in worker_results:
        assert np.array_equal(res["rollout_tp"], res["rollout_ref"])
    assert np.array_equal(worker_results[0]["rollout_tp"], worker_results[1]["rollout_tp"])
