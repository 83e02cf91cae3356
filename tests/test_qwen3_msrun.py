"""Qwen3 under msrun with 2 CPU workers: TP=2 (and TP=2 with sequence parallelism) reproduce TP=1, the
replicated q/k norm weights' gradients summed over the TP ranks' heads."""
import os

import numpy as np
import pytest

from hf_reference import make_qwen3_model, qwen3_model_kwargs
from msrun_util import run_msrun
from mindrlhf.configs import ModelConfig
from mindrlhf.models.specs import param_specs
from mindrlhf.parallel.layouts import role_layouts
from mindrlhf.parallel.mesh import Mesh

pytestmark = pytest.mark.msrun


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_tp")
    make_qwen3_model(str(root / "hf"))
    out = root / "out"
    out.mkdir()
    run_msrun(os.path.join(os.path.dirname(__file__), "workers", "qwen3_tp_worker.py"), [root / "hf", out],
              workers=2, log_dir=str(root / "log"))
    return [dict(np.load(out / f"rank_{r}.npz")) for r in range(2)]


@pytest.mark.parametrize("tag", ["tp", "sp"])
def test_qwen3_tp2_equals_one_process(results, tag):
    layouts = role_layouts(param_specs(ModelConfig(**qwen3_model_kwargs())), Mesh(dp=1, tp=2))
    for rank, res in enumerate(results):
        assert np.abs(res[tag + "_logits"] - res["ref_logits"]).max() <= 1e-5
        assert abs(float(res[tag + "_loss"]) - float(res["ref_loss"])) <= 1e-5
        grads = [k for k in res if k.startswith(tag + "_grad/")]
        assert any("q_layernorm" in k for k in grads) and len(grads) == len(layouts)
        for key in grads:
            name = key.split("/", 1)[1]
            want = layouts[name].shard(res["ref_grad/" + name], rank)
            assert res[key].shape == want.shape, name
            assert np.abs(res[key] - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), (tag, name)
