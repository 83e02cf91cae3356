"""AdamW (fused float32 path and composite path) against torch.optim.AdamW; clip scale; LR schedule; its state
through a training checkpoint."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn

from memory_helpers import heap_peak_growth
from mindrlhf.trainer.optim import AdamW, lr_at
from mindrlhf.trainer.update.grad_norm import clip_scale


class _Apply(nn.Cell):
    def __init__(self, opt):
        super().__init__(auto_prefix=False)
        self.opt = opt

    @ms.jit
    def construct(self, grads, lr, scale):
        return self.opt(grads, lr, scale)

    def __call__(self, grads, lr, scale):
        # gradients as the graph's input, not constants: see test_in_graph_update_takes_each_parameters_gradient
        return super().__call__(ms.mutable(tuple(grads)), lr, scale)


@pytest.mark.parametrize("fused", [True, False])
def test_adamw_matches_torch(fused):
    import torch
    rng = np.random.default_rng(0)
    init = {"layer.w.weight": rng.standard_normal((48, 16)).astype(np.float32),
            "layer.attention_norm.weight": rng.standard_normal(16).astype(np.float32)}
    params = [Parameter(Tensor(v.copy()), name=k) for k, v in init.items()]
    opt = AdamW(params, weight_decay=0.1)
    assert opt.fused_ids == (0, 1) and opt.composite_ids == ()
    if not fused:                                  # the float32 parameters through the composite update
        opt.fused_ids, opt.composite_ids = (), (0, 1)
    step = _Apply(opt)
    ref = {k: torch.nn.Parameter(torch.tensor(v.copy())) for k, v in init.items()}
    torch_opt = torch.optim.AdamW([{"params": [ref["layer.w.weight"]], "weight_decay": 0.1},
                                   {"params": [ref["layer.attention_norm.weight"]], "weight_decay": 0.0}],
                                  lr=1.0, eps=1e-8)
    for t in range(6):
        grads = [rng.standard_normal(v.shape).astype(np.float32) for v in init.values()]
        lr, scale = lr_at(t, 1e-2, 2, 6), (0.5 if t % 2 else 1.0)
        step(tuple(Tensor(g) for g in grads), Tensor(np.float32(lr)), Tensor(np.float32(scale)))
        for group in torch_opt.param_groups:
            group["lr"] = lr
        for p, g in zip(ref.values(), grads):
            p.grad = torch.tensor(g * scale)
        torch_opt.step()
    for p in params:
        np.testing.assert_allclose(p.asnumpy(), ref[p.name].detach().numpy(), atol=2e-6, rtol=0)
    assert int(opt.step.asnumpy()[0]) == 6


def test_adamw_on_float16_parameters_follows_the_float32_update():
    """float16 parameters take the composite path (moments in the parameter's dtype, as torch.optim.AdamW
    keeps them; the update in float32): six updates of lr 0.05 move the weights by 0.13 on average, and the
    fp16 run's moves equal the float32 (fused) run's within 2e-3. It once failed to compile (a float32 moment
    assigned to a float16 Parameter). bfloat16 cannot be written in place on CPU at all (no bf16 Assign
    kernel in 2.10): the trainer refuses a bf16 policy at set-up."""
    rng = np.random.default_rng(1)
    init = rng.uniform(0.1, 0.5, (24, 8)).astype(np.float32)
    init = init.astype(np.float16).astype(np.float32)        # representable in float16
    grads = [rng.standard_normal(init.shape).astype(np.float32) for _ in range(6)]
    moved = {}
    for dtype in (ms.float32, ms.float16):
        p = Parameter(Tensor(init, dtype), name="layer.w.weight")
        opt = AdamW([p], weight_decay=0.1)
        assert (opt.composite_ids == (0,)) == (dtype == ms.float16)
        step = _Apply(opt)
        for g in grads:
            step((Tensor(g),), Tensor(np.float32(0.05)), Tensor(np.float32(1.0)))
        moved[dtype] = p.astype(ms.float32).asnumpy() - init
    assert np.abs(moved[ms.float32]).mean() > 0.1
    np.testing.assert_allclose(moved[ms.float16], moved[ms.float32], atol=2e-3, rtol=0)


def test_clip_scale():
    grads = (Tensor(np.full((4,), 3.0, np.float32)), Tensor(np.full((2,), 4.0, np.float32)))
    norm = np.sqrt(4 * 9 + 2 * 16)
    scale, got = clip_scale(grads, 2.0)
    assert float(got.asnumpy()) == pytest.approx(norm, rel=1e-6)
    assert float(scale.asnumpy()) == pytest.approx(2.0 / (norm + 1e-6), rel=1e-6)
    assert float(clip_scale(grads, 100.0)[0].asnumpy()) == 1.0
    assert float(clip_scale(grads, 0.0)[0].asnumpy()) == 1.0


class _Clip(nn.Cell):
    @ms.jit
    def construct(self, *grads):
        return clip_scale(grads, 1.0)


def test_clip_norm_compiles_in_heap_proportional_to_the_parameters():
    """The global norm of 54 gradients compiles with a small heap peak. Its squares once were a list built in
    the graph, which MindSpore 2.10's front end handled in more than linear memory: +94 MB for 54 gradients,
    +233 MB and 5.5 s for 108 (a 7B model has ~340), against +14 / +25 MB now (measured in a fresh process)."""
    values = [0.1 * i for i in range(54)]
    grads = [Tensor(np.full((3, 5), v, np.float32)) for v in values]
    peak, (_, norm) = heap_peak_growth(lambda: _Clip()(*grads))
    assert float(norm.asnumpy()) == pytest.approx(np.sqrt(sum(15 * v * v for v in values)), rel=1e-5)
    assert peak < 40 * 2**20, f"compiling the clip of 54 gradients peaked at +{peak / 2**20:.1f} MB of heap"


def test_compiled_step_updates_every_parameter_and_moment():
    """The fused kernel updates in place and its outputs are unused: none of it may be pruned from the graph."""
    from mindrlhf.configs import ModelConfig
    from mindrlhf.models.padding import causal_bias
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.trainer.sft import SFTStep
    model = CausalLM(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, vocab_size=64,
                                 seq_length=16))
    params = list(model.trainable_params())
    opt = AdamW(params, weight_decay=0.1)
    step = SFTStep(model, opt, 1.0)
    before = {p.name: p.asnumpy().copy() for p in params}
    ids = np.random.RandomState(0).randint(0, 64, (2, 9))
    step(Tensor(ids[:, :-1].astype(np.int32)), Tensor(np.tile(np.arange(8, dtype=np.int32), (2, 1))),
         causal_bias(Tensor(np.ones((2, 8), np.int32))), Tensor(ids[:, 1:].astype(np.int32)),
         Tensor(np.ones((2, 8), np.float32)), Tensor(np.float32(16.0)), Tensor(np.float32(1e-2)))[0].asnumpy()
    assert [p.name for p in params if np.array_equal(p.asnumpy(), before[p.name])] == []
    assert all(m.asnumpy().any() and v.asnumpy().any() for m, v in zip(opt.exp_avg, opt.exp_avg_sq))
    assert int(opt.step.asnumpy()[0]) == 1


@pytest.mark.parametrize("fused", [True, False])
def test_zero_learning_rate_leaves_weights_unchanged(fused):
    """lr = 0 (a schedule's last step with min_lr 0) with weight decay must be a no-op, not 0/0."""
    init = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    param = Parameter(Tensor(init.copy()), name="layer.w.weight")
    opt = AdamW([param], weight_decay=0.1)
    if not fused:
        opt.fused_ids, opt.composite_ids = (), (0,)
    _Apply(opt)((Tensor(np.ones((4, 8), np.float32)),), Tensor(np.float32(0.0)), Tensor(np.float32(1.0)))
    np.testing.assert_array_equal(param.asnumpy(), init)


class _Weights(nn.Cell):
    """Stands in for the policy: a decayed float32 matrix, an undecayed norm weight (both on the fused kernel)
    and a float16 matrix (the composite path, its moments float16)."""

    def __init__(self, rng):
        super().__init__()
        self.w = Parameter(Tensor(rng.standard_normal((6, 4)).astype(np.float32)), name="layer.w.weight")
        self.norm = Parameter(Tensor(rng.uniform(0.5, 1.5, 4).astype(np.float32)), name="layer.attention_norm.weight")
        self.h = Parameter(Tensor(rng.uniform(-1, 1, (4, 3)).astype(np.float16)), name="layer.h.weight")


def test_checkpoint_restores_the_optimizer_exactly_and_the_next_update_matches(tmp_path):
    """Resume must continue the run, not restart Adam: after a save, overwriting every weight, moment and the
    step counter, and a load, each equals its saved value bit for bit, and the next update (whose bias
    correction reads the step counter) equals the one the original state would have made."""
    from mindrlhf.trainer.checkpointing import load_training_checkpoint, save_training_checkpoint
    from mindrlhf.utils.params import param_to_numpy, write_param
    rng = np.random.default_rng(3)
    model = _Weights(rng)
    params = list(model.trainable_params())
    opt = AdamW(params, weight_decay=0.1)
    assert opt.fused_ids == (0, 1) and opt.composite_ids == (2,)
    step = _Apply(opt)
    grads = [tuple(Tensor(rng.standard_normal(p.shape).astype(p.asnumpy().dtype)) for p in params) for _ in range(3)]

    def update(t):
        step(grads[t], Tensor(np.float32(1e-2)), Tensor(np.float32(0.7)))

    def state():
        return {p.name: param_to_numpy(p) for p in params + opt.state_parameters()}

    update(0)
    update(1)
    saved = state()
    assert int(saved["adam_step"][0]) == 2
    assert all(v.any() for k, v in saved.items() if k.startswith("adam_"))      # moments are not still zero
    save_training_checkpoint(str(tmp_path), 2, 0, model, opt, rank_state={"data": {"epoch": 0}},
                             trainer_state={"step": 2}, keep=1)
    update(2)
    expected = state()                                 # one more update from the unperturbed state
    for p in params + opt.state_parameters():          # a different run's state: every entry changes
        write_param(p, param_to_numpy(p) * 3 + 1)
    assert all(not np.array_equal(v, saved[k]) for k, v in state().items())
    loaded = load_training_checkpoint(str(tmp_path), 0, model, opt)
    assert loaded["step"] == 2 and loaded["rank_state"] == {"data": {"epoch": 0}}
    got = state()
    for name, value in saved.items():
        assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name
    update(2)
    got = state()
    for name, value in expected.items():
        assert np.array_equal(got[name], value), name


def test_an_update_over_many_parameters_compiles_past_the_default_call_depth(monkeypatch):
    """The update loop unrolls into about two nested calls per parameter at compile time: 420 LoRA adapter
    tensors of a 30-layer model exceeded MindSpore's default depth of 1000. Here the limit is first lowered
    to 100 and 60 parameters are updated in one graph; AdamW raises the limit to what they need."""
    from mindrlhf.trainer import optim
    n = 60
    ms.set_recursion_limit(100)
    monkeypatch.setattr(optim, "_CALL_DEPTH", [100], raising=False)
    try:
        params = [Parameter(Tensor(np.ones((3,), np.float32)), name=f"m.l{i}.weight") for i in range(n)]
        opt = AdamW(params, weight_decay=0.0)

        class Step(nn.Cell):
            def __init__(self):
                super().__init__()
                self.opt = opt

            @ms.jit
            def construct(self, grads, lr):
                return self.opt(grads, lr, 1.0)

        Step()(ms.mutable(tuple(Tensor(np.full((3,), 0.5, np.float32)) for _ in range(n))), Tensor(1e-2, ms.float32))
        assert all(np.allclose(p.asnumpy(), 1.0 - 1e-2, atol=1e-6) for p in params)   # Adam's first step: lr x sign
    finally:
        ms.set_recursion_limit(1000)


def _adamw_reference(p, m, v, g, t, lr, decay, beta1=0.9, beta2=0.95, eps=1e-8):
    """torch.optim.AdamW's step t (from 1) in float64."""
    p, g = p.astype(np.float64) * (1.0 - lr * decay), g.astype(np.float64)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    update = (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps)
    return p - lr * update, m, v


def test_update_driven_from_the_host_follows_adamw_and_compiles_once_for_all_layers():
    """AdamW.update_each (one call per decoder layer's run of parameters, the parameters passed to the graph as
    aliases of their memory) follows torch's AdamW (float64 reference) over three updates with clipping
    factors, a float16 parameter included; each gradient buffer is zeroed; the four layers share one compiled
    update graph (a graph per layer would make the first step's compile grow with depth)."""
    from mindrlhf.trainer.optim import block_runs
    rng = np.random.default_rng(3)
    shapes = {"attention.wq.weight": (12, 8), "attention_norm.weight": (8,), "feed_forward.w1.weight": (16, 8)}
    init = {"model.tok_embeddings.embedding_weight": rng.standard_normal((20, 8)).astype(np.float32)}
    for layer in range(4):
        init.update({f"model.layers.{layer}.{k}": rng.standard_normal(s).astype(np.float32)
                     for k, s in shapes.items()})
    init["model.lm_head.weight"] = rng.standard_normal((20, 8)).astype(np.float16).astype(np.float32)
    dtypes = {k: (ms.float16 if k == "model.lm_head.weight" else ms.float32) for k in init}
    params = [Parameter(Tensor(v, dtypes[k]), name=k) for k, v in init.items()]
    opt = AdamW(params, weight_decay=0.1, beta2=0.95)
    buffers = [Parameter(Tensor(np.zeros(v.shape, np.float32)), name=f"buf.{k}") for k, v in init.items()]
    ref = {k: (v.astype(np.float64), 0.0, 0.0) for k, v in init.items()}
    for t in range(1, 4):
        lr, scale = 1e-2 * t, (0.5 if t == 2 else 1.0)
        gs = [rng.standard_normal(v.shape).astype(np.float32) for v in init.values()]
        for b, g in zip(buffers, gs):
            b.set_data(Tensor(g))
        opt.update_each(buffers, Tensor(np.float32(lr)), Tensor(np.float32(scale)))
        assert all(not b.asnumpy().any() for b in buffers)
        for (k, (p, m, v)), g in zip(list(ref.items()), gs):
            ref[k] = _adamw_reference(p, m, v, g * scale, t, lr, 0.0 if "norm" in k else 0.1)
    assert int(opt.step.asnumpy()[0]) == 3
    for p in params:
        tol = 2e-3 if p.dtype == ms.float16 else 2e-6
        np.testing.assert_allclose(p.astype(ms.float32).asnumpy(), ref[p.name][0], atol=tol, rtol=0)
        assert np.abs(p.astype(ms.float32).asnumpy() - init[p.name]).max() > 1e-2          # moved
    names = list(init)
    assert block_runs(names, range(len(names)))[1:5] == [(1, 2, 3), (4, 5, 6), (7, 8, 9), (10, 11, 12)]
    assert len(opt._host.update) == 3          # the embedding, one for all four layers, the float16 head


def test_in_graph_update_takes_each_parameters_gradient():
    """Four same-shape parameters (one shared update cell) after another model's train step compiled in the
    process: each moves by its own gradient. Given as a plain tuple of Tensors, the gradients are folded into the
    graph as constants, and MindSpore 2.10 then gave later same-shape parameters the first one's values
    (layers 1-2 moved by layer 0's gradient); as a mutable input they are right. The trainer's gradients come
    from autodiff inside its graphs, never as constants."""
    test_compiled_step_updates_every_parameter_and_moment()
    rng = np.random.default_rng(3)
    init = {f"net.blocks.{i}.w": rng.standard_normal((12, 8)).astype(np.float32) for i in range(4)}
    grads = [rng.standard_normal(v.shape).astype(np.float32) for v in init.values()]
    params = [Parameter(Tensor(v), name=k) for k, v in init.items()]
    opt = AdamW(params, weight_decay=0.1, beta2=0.95)
    _Apply(opt)([Tensor(g) for g in grads], Tensor(np.float32(1e-2)), Tensor(np.float32(1.0)))
    for p, v, g in zip(params, init.values(), grads):
        np.testing.assert_allclose(p.asnumpy(), _adamw_reference(v, 0.0, 0.0, g, 1, 1e-2, 0.1)[0], atol=2e-6)


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20


def test_moments_and_gradient_buffers_are_filled_at_construction_not_at_the_first_update():
    """The AdamW moments (and the accumulated-gradient buffers, optim.zeros_like) hold their zeros from
    construction, named as ParameterTuple.clone names them (checkpoint keys). MindSpore's "zeros" initializer
    leaves the memory to the first graph call, which fills it at ~2.5x the cost, inside the first update:
    there the first update_each grew RSS by the moments' size (165 MB for 128 MB of moments)."""
    from mindrlhf.trainer.optim import zeros_like
    params = [Parameter(Tensor(np.ones((1024, 4096), np.float32)), name=f"model.layers.{i}.w") for i in range(4)]
    params.append(Parameter(Tensor(np.ones((5,), np.float16)), name="model.norm.weight", requires_grad=False))
    opt = AdamW(params)
    grads = zeros_like(opt.params, "grad_acc")
    for prefix, tup in (("adam_m", opt.exp_avg), ("adam_v", opt.exp_avg_sq), ("grad_acc", grads)):
        assert [p.name for p in tup] == [f"{prefix}.{p.name}" for p in params]
        assert [(p.shape, p.dtype, p.requires_grad) for p in tup] == \
            [(p.shape, p.dtype, p.requires_grad) for p in params]
    for g in grads[:4]:
        g.set_data(Tensor(np.ones(g.shape, np.float32)))
    before = _rss_mb()
    opt.update_each(grads, Tensor(np.float32(1e-3)), Tensor(np.float32(1.0)))
    grown = _rss_mb() - before
    assert grown < 64, f"the first update grew RSS by {grown:.0f} MB: the 128 MB of moments were filled there"
    np.testing.assert_allclose(opt.exp_avg[0].asnumpy(), 0.1, rtol=1e-6)        # (1 - beta1) * g
    assert not any(p.asnumpy().any() for p in opt.exp_avg[4:] + opt.exp_avg_sq[4:])


def test_the_constant_schedule_warms_up_as_transformers_constant_with_warmup():
    """optim.lr_schedule constant with warmup_steps 3 gives the updates transformers' (and TRL's)
    constant_with_warmup gives: lr x t / 3 for updates t = 0, 1, 2, then lr. Measured before: warmup_steps
    was ignored under constant (lr from the first update), while the real-model example set 3 of them."""
    import torch
    from transformers import get_constant_schedule_with_warmup
    from mindrlhf.configs.grpo_config import OptimConfig
    from mindrlhf.trainer.optim import scheduled_lr
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-5)
    ref = get_constant_schedule_with_warmup(opt, num_warmup_steps=3)
    want = []
    for _ in range(6):
        want.append(opt.param_groups[0]["lr"])
        opt.step()
        ref.step()
    cfg = OptimConfig(lr=1e-5, lr_schedule="constant", warmup_steps=3)
    assert [scheduled_lr(t, cfg, 40) for t in range(6)] == pytest.approx(want, rel=1e-12, abs=0)
    assert want[0] == 0 and want[3] == 1e-5
    assert [scheduled_lr(t, OptimConfig(lr=1e-5, lr_schedule="constant", warmup_steps=0), 40)
            for t in range(3)] == [1e-5] * 3
