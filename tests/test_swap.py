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
        assert res["separate_rollout_model"] and all(res["swaps_enabled"].values())
        assert res["learned"]
        assert res["policy_equal"] and res["rollout_equal"] and res["optimizer_equal"], res
        assert min(res["swap_seconds"]) > 0
