"""Host-memory swap: offload/reload is bit-exact, and a GRPO run with every swap equals one without."""
import json
import os

import pytest

from grpo_helpers import make_grpo_assets, model_yaml
from msrun_util import run_msrun
from mindrlhf.configs import ModelConfig
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.parallel.swap import SwapGroup
from mindrlhf.trainer.optim import AdamW


def test_offload_reload_is_bit_exact():
    model = CausalLM(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, vocab_size=64,
                                 seq_length=16))
    params = list(model.get_parameters())
    opt = AdamW(params)
    for m in opt.exp_avg:
        m.copy_(m + 0.5)
    before = {p.name: p.asnumpy().copy() for p in params + opt.state_parameters()}
    groups = [SwapGroup("w", params), SwapGroup("opt", opt.state_parameters())]
    for g in groups:
        g.offload()
    assert all(not p.asnumpy().any() for p in params)           # nothing usable left on the device side
    assert groups[0].host_bytes() == sum(a.nbytes for k, a in before.items() if not k.startswith("adam"))
    for g in groups:
        g.reload()
    for p in params + opt.state_parameters():
        assert p.asnumpy().tobytes() == before[p.name].tobytes(), p.name


def test_offload_returns_pages_and_compiled_graphs_see_the_reload():
    """Offload frees the buffers' physical pages (resident memory grows by far less than the host copy it
    makes), a graph compiled before the swap reads zeros while offloaded and the exact values after reload."""
    import numpy as np
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn, ops
    from mindrlhf.utils.memory import rss_mb

    class Weighted(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(Tensor(np.random.default_rng(0).random(16_000_000, np.float32)), name="w")

        @ms.jit
        def construct(self, x):
            return ops.sum(self.w * x)

    net = Weighted()
    x = Tensor(np.float32(2.0))
    expected = float(net(x).asnumpy())
    group = SwapGroup("w", [net.w])
    before = rss_mb()
    group.offload()
    grown = rss_mb() - before
    host_mb = group.host_bytes() / 2**20
    assert host_mb == 64_000_000 / 2**20 and group.released_bytes > 0.99 * 64_000_000
    assert grown < 0.25 * host_mb, (grown, host_mb)        # a copy that freed nothing would grow by ~host_mb
    assert float(net(x).asnumpy()) == 0.0
    group.reload()
    assert float(net(x).asnumpy()) == expected
    scratch = SwapGroup("scratch", [net.w], keep_contents=False)     # e.g. the KV cache: no host copy
    before = rss_mb()
    scratch.offload()
    assert scratch.host_bytes() == 0 and before - rss_mb() > 0.9 * host_mb
    scratch.reload()
    assert float(net(x).asnumpy()) == 0.0


@pytest.mark.msrun
def test_grpo_with_swaps_equals_without(tmp_path):
    assets = make_grpo_assets(str(tmp_path / "assets"))
    assets["sft_path_train"] = model_yaml(str(tmp_path / "train.yaml"), dp=1, tp=2)
    assets["sft_path_infer"] = model_yaml(str(tmp_path / "infer.yaml"), dp=2, tp=1)
    from mindrlhf.checkpoint.model_io import model_state, save_checkpoint
    from mindrlhf.configs import load_model_yaml
    init = str(tmp_path / "init.safetensors")    # both runs start from the same weights
    save_checkpoint(model_state(CausalLM(load_model_yaml(assets["sft_path_train"]).model)), init)
    assets["load_sft_checkpoint_train"] = init
    (tmp_path / "assets.json").write_text(json.dumps(assets))
    out = tmp_path / "out"
    out.mkdir()
    script = os.path.join(os.path.dirname(__file__), "workers", "swap_worker.py")
    run_msrun(script, [tmp_path / "assets.json", out], workers=2, log_dir=str(tmp_path / "log"))
    for r in range(2):
        res = json.loads((out / f"rank_{r}.json").read_text())
        enabled = dict(res["swaps_enabled"])
        assert enabled.pop("reward_model") is False           # no reward model in this run: nothing to swap
        assert res["separate_rollout_model"] and all(enabled.values())
        assert res["learned"]
        assert res["policy_equal"] and res["rollout_equal"] and res["optimizer_equal"], res
        assert min(res["swap_seconds"]) > 0
