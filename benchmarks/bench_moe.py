"""Qwen3-MoE against transformers' own Qwen3MoeForCausalLM (issue #57): train step and rollout tokens/s, and the
per-rank memory of the experts under expert parallelism.

    python benchmarks/bench_moe.py [--rounds 3]
    python benchmarks/bench_moe.py --quick      # tiny shapes, one round: checks that the script runs, no figures

The model: the benchmark model's attention and vocabulary (common.BENCH_MODEL: 4 layers, hidden 512, 8 heads of
64, 2 kv heads, vocab 32000, untied head) as Qwen3 (q/k RMSNorm, no q/k/v bias) with every layer sparse: 8
experts, top-2, moe_intermediate_size 256, norm_topk_prob true, no load-balancing loss on either side
(router_aux_loss_coef 0; transformers' output_router_logits off). Random weights, written once by transformers
(its own initialisation, std 0.02) as an HF folder and loaded by both sides, so both route alike.

1. Train: forward + backward + AdamW of 8 x 256 tokens, tokens/s over 6 steps after 2. Ours:
   common.train_tokens_per_s (trainer/sft.SFTStep, our AdamW); transformers: the model in torch eager, mean
   next-token cross-entropy, backward, torch.optim.AdamW, no clipping on either side. At these shapes the LM
   head is ~74% of the FLOPs (the same float32 GEMMs on both sides), so the train ratio mostly measures the head:
   "train_body" runs the same model with a vocabulary of 512 (BODY_VOCAB: the head next to nothing), the
   decoder layers' own ratio, and each side's head is its step time minus its body's (train_step_s).
2. Rollout: 16 prompts of 64 tokens -> 64 new tokens, sampling at temperature 1 (no top-k / top-p), EOS off;
   tokens/s of the second of two identical calls on each side (GenerationEngine.generate; transformers
   `generate` with the KV cache).
3. Memory at expert parallelism: the bytes this rank holds of the stacked expert weights
   (`routed_experts.ffn.w1/w2/w3`) and of their two AdamW moments (trainer/optim.AdamW), counted from the
   Parameters a model + optimizer actually hold: at ep2 on a Mesh with an `ep` axis of 2, built by 2 msrun
   workers (the larger rank's figure), against ep1 in one process. Also the whole model's weights + moments per
   rank, and the ratio the layouts predict (models/specs.layouts_for(cfg, 2, 1, ep=2) shard shapes) as a check.
4. Ceilings: the highest train and rollout ratios any float32 implementation could reach on this CPU.
   transformers' measured seconds over a floor that runs every matmul FLOP (step_flops, rollout_work: the routed
   (token, expert) pairs only, attention over whole rows) at this CPU's best float32 matmul rate and reads every
   byte a decode step must (its weights, the experts its tokens reach, the KV cache) at its best bandwidth. Both
   figures are measured in the same run, in a child with our kernel threads (machine_rates: numpy, torch and
   MindSpore at the step's shapes; STREAM-style copy and triad). Nothing else is charged: no softmax, norms,
   optimizer, sampling or kernel launches. A bar above its ceiling cannot be met here; one below it can, in
   principle. Beside them, not part of them: the sorted form's batched products at the train step's blocks,
   MindSpore's BatchMatMul against torch.bmm (sorted_block_rates), where our experts' kernels stand; one sparse
   layer's experts forward + backward, our ExpertsFFN against transformers' own experts module on the same
   weights and routing (expert_layer_ms), the experts' share of the train_body gap; and a decode step's expert
   and head products at the rollout's rows, each weight read once (decode_product_ms).

Same thread count: our side sets MindSpore's kernel threads as the trainer does (common.ours_kernel_threads:
this process's cores, 1 rank); transformers' side sets torch.set_num_threads to the same count. Each
measurement in a fresh process (common.run_child), ours and transformers alternating, train then rollout, for
--rounds rounds (2 cores: the machine drifts); medians reported.

Our experts' form: `--experts` (model_config.moe_expert_compute; auto picks per call between dense, every expert
on every token, and sorted, the (token, expert) pairs sorted by expert into blocks: models/moe.py). transformers
5.24 dispatches (its default `experts_implementation` "grouped_mm" on CPU sorts the (token, expert) pairs and runs
a grouped matmul; "eager" loops over the experts that received tokens). Both are in the last line (`--hf_experts`
picks another).

Last line: {"bench": "moe_vs_transformers", "cpu", "train_ratio", "train_body_ratio", "rollout_ratio",
"train_step_s": {side: {step, body, head}}, "train_ratio_ceiling", "rollout_ratio_ceiling", "floors", "machine"
(with "sorted_block_gflops", "expert_layer_ms", "decode_product_ms"), "ep2_expert_memory_ratio", ...} with ratio =
ours / transformers tokens/s (the issue's bars: >= 1.5, >= 1.5) and the memory ratio = ep2 / ep1 per rank (bar:
<= 0.55).
"""
import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (BENCH_MODEL, msrun_self, ours_kernel_threads, run_child, torch_train_tokens_per_s,  # noqa: E402
                    train_tokens_per_s)

MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, norm_topk_prob=True)
FULL = dict(model=dict(BENCH_MODEL, qkv_has_bias=False, qk_layernorm=True,
                       head_dim=BENCH_MODEL["hidden_size"] // BENCH_MODEL["num_heads"], router_aux_loss_coef=0.0,
                       **MOE),
            batch=8, seq=256, warmup=2, steps=6, prompts=16, prompt=64, new=64)
# --quick: the script's every path on a model that builds and runs in seconds; its figures mean nothing
QUICK = dict(model=dict(FULL["model"], hidden_size=64, num_layers=2, num_heads=4, n_kv_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=512, seq_length=64, max_position_embedding=64,
                        num_experts=4, moe_intermediate_size=32),
             batch=2, seq=16, warmup=1, steps=1, prompts=2, prompt=8, new=8)
EXPERT_WEIGHTS = ".routed_experts.ffn."      # the stacked experts, split over ep (models/specs.py)
BODY_VOCAB = 512                              # train_body: the head's FLOPs ~1% of the step's
PHASES = ("train", "train_body", "rollout")


def shapes(quick: bool, phase: str = "train") -> dict:
    s = QUICK if quick else FULL
    if phase == "train_body":
        return dict(s, model=dict(s["model"], vocab_size=min(BODY_VOCAB, s["model"]["vocab_size"] // 8)))
    return s


def config(quick: bool, experts: str = "auto", phase: str = "train"):
    from mindrlhf.configs import ModelConfig
    return ModelConfig(**shapes(quick, phase)["model"], moe_expert_compute=experts)


def hf_moe_dir(quick: bool, phase: str = "train") -> str:
    """The model as an HF Qwen3-MoE folder, transformers' own random initialisation (written once)."""
    m = shapes(quick, phase)["model"]
    path = os.path.join(tempfile.gettempdir(), "mindrlhf_bench_moe_model" + ("_quick" if quick else "")
                        + (f"_vocab{m['vocab_size']}" if phase == "train_body" else ""))
    if os.path.isfile(os.path.join(path, "config.json")) and glob.glob(os.path.join(path, "*.safetensors")):
        return path
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    cfg = Qwen3MoeConfig(hidden_size=m["hidden_size"], num_hidden_layers=m["num_layers"],
                         num_attention_heads=m["num_heads"], num_key_value_heads=m["n_kv_heads"],
                         head_dim=m["head_dim"], intermediate_size=m["intermediate_size"], vocab_size=m["vocab_size"],
                         max_position_embeddings=m["max_position_embedding"], rope_theta=m["theta"],
                         rms_norm_eps=m["rms_norm_eps"], tie_word_embeddings=False, attention_bias=False,
                         use_sliding_window=False, num_experts=m["num_experts"],
                         num_experts_per_tok=m["num_experts_per_tok"], moe_intermediate_size=m["moe_intermediate_size"],
                         norm_topk_prob=m["norm_topk_prob"], decoder_sparse_step=1, mlp_only_layers=[],
                         output_router_logits=False, router_aux_loss_coef=0.0)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    return path


def same_threads() -> int:
    """The kernel threads of both sides: what utils/cpu_threads.auto_threads(1) gives (this process's cores over
    one rank), computed here so that transformers' process never imports MindSpore."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def train_ids(s: dict) -> np.ndarray:
    return np.random.RandomState(0).randint(0, s["model"]["vocab_size"], (s["batch"], s["seq"] + 1))


def rollout_prompts(s: dict) -> np.ndarray:
    return np.random.RandomState(1).randint(1, s["model"]["vocab_size"], (s["prompts"], s["prompt"]))


def ours_model(hf_dir: str, quick: bool, experts: str, phase: str):
    import mindspore as ms
    from mindrlhf.checkpoint.model_io import load_weights
    from mindrlhf.models.qwen2 import CausalLM
    ms.set_seed(0)
    model = CausalLM(config(quick, experts, phase))
    load_weights(model, hf_dir)
    return model


def ours(phase: str, hf_dir: str, quick: bool, experts: str) -> dict:
    s = shapes(quick, phase)
    threads = ours_kernel_threads()
    assert threads == same_threads(), (threads, same_threads())
    model = ours_model(hf_dir, quick, experts, phase)
    if phase != "rollout":
        return {"tokens_per_s": train_tokens_per_s(model, train_ids(s), s["warmup"], s["steps"]), "threads": threads}
    from mindrlhf.rollout.engine import GenerationEngine
    from mindrlhf.rollout.sampling import SamplingParams
    engine = GenerationEngine(model, pad_token_id=0, prompt_bucket=s["prompt"])
    prompts = rollout_prompts(s).tolist()
    params = SamplingParams(temperature=1.0, max_tokens=s["new"], eos_token_ids=[], seed=0)
    engine.generate(prompts, params)                     # compile
    t0 = time.perf_counter()
    out = engine.generate(prompts, params)
    return {"tokens_per_s": float(out.response_mask.sum()) / (time.perf_counter() - t0), "threads": threads}


def hf_model(hf_dir: str, experts: str):
    """transformers' model from the benchmark's HF folder in float32, with experts_implementation `experts`
    ("default": what from_pretrained picks)."""
    import torch
    from transformers import AutoModelForCausalLM
    kw = {} if experts == "default" else {"experts_implementation": experts}
    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, **kw)


def reference(phase: str, hf_dir: str, quick: bool, experts: str) -> dict:
    import torch
    s = shapes(quick, phase)
    threads = same_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = hf_model(hf_dir, experts)
    implementation = model.config._experts_implementation
    if phase != "rollout":
        tps = torch_train_tokens_per_s(model, train_ids(s), s["warmup"], s["steps"])
    else:
        model.eval()
        ids = torch.tensor(rollout_prompts(s))
        gen = dict(attention_mask=torch.ones_like(ids), max_new_tokens=s["new"], min_new_tokens=s["new"],
                   do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0, use_cache=True)
        with torch.no_grad():
            model.generate(ids, **gen)                   # warm-up: the same call, as ours compiles on its first
            t0 = time.perf_counter()
            res = model.generate(ids, **gen)
        tps = float((res.shape[1] - ids.shape[1]) * ids.shape[0]) / (time.perf_counter() - t0)
    return {"tokens_per_s": tps, "threads": threads, "experts_implementation": implementation}


def step_flops(s: dict) -> dict:
    """Matmul FLOPs of one train step at shapes `s`, forward + backward (3 x the forward's 2 per weight per token):
    the LM head, and the body: q/k/v/o, the router, each token's top-k experts (exactly the routed pairs, no
    padding), attention's scores and values over the whole row (neither side skips the causal half)."""
    m, t = s["model"], s["batch"] * s["seq"]
    h, hd, heads, kv = m["hidden_size"], m["head_dim"], m["num_heads"], m["n_kv_heads"]
    weights = 2 * h * heads * hd + 2 * h * kv * hd + h * m["num_experts"] \
        + m["num_experts_per_tok"] * 3 * h * m["moe_intermediate_size"]
    scores = 2 * 2 * s["seq"] * heads * hd                  # per token: q.k and p.v against the row's keys
    return {"head": 6 * t * h * m["vocab_size"], "body": 3 * t * m["num_layers"] * (2 * weights + scores)}


def rollout_work(s: dict) -> dict:
    """The rollout's least work: the prefill's FLOPs (every prompt token through the body, the head at each
    prompt's last position only) and, per decode step, the FLOPs and the bytes it must read, every weight it
    uses once (attention's, the router's, the experts the step's tokens reach: E (1 - (1 - k / E)^rows) of them
    in expectation, and the head) and the KV cache so far."""
    m, rows = s["model"], s["prompts"]
    h, hd, heads, kv, e, k = (m["hidden_size"], m["head_dim"], m["num_heads"], m["n_kv_heads"], m["num_experts"],
                              m["num_experts_per_tok"])
    expert = 3 * h * m["moe_intermediate_size"]
    attention = 2 * h * heads * hd + 2 * h * kv * hd
    layers, head = m["num_layers"], h * m["vocab_size"]
    prefill = 2 * rows * s["prompt"] * layers * (attention + h * e + k * expert + 2 * s["prompt"] * heads * hd) \
        + 2 * rows * head
    reached = e * (1 - (1 - k / e) ** rows)
    steps = []
    for cached in range(s["prompt"], s["prompt"] + s["new"] - 1):       # the first new token is the prefill's
        flops = 2 * rows * (layers * (attention + h * e + k * expert + 2 * cached * heads * hd) + head)
        read = 4 * (layers * (attention + h * e + reached * expert) + head) + 4 * 2 * layers * kv * hd * rows * cached
        steps.append((flops, read))
    return {"prefill_flops": prefill, "decode_steps": steps}


def machine_rates(quick: bool, hf_dir: str, hf_experts: str, experts: str) -> dict:
    """This CPU's best float32 matmul rate (GFLOP/s) over numpy, torch and MindSpore (a graph, read back) at the
    train step's shapes, and its best streaming bandwidth (GB/s, copy and triad over 512 MB, torch on every
    core): what ceilings() divides by, measured in its own process with our kernel threads."""
    from bench_floors import bandwidth, matmul_rates
    s = shapes(quick)
    threads = ours_kernel_threads()
    m, t = s["model"], s["batch"] * s["seq"]
    h = m["hidden_size"]
    rates = matmul_rates({"head": (t, h, m["vocab_size"]), "q": (t, h, m["num_heads"] * m["head_dim"]),
                          "expert": (t, h, m["moe_intermediate_size"]),
                          "expert_down": (t, m["moe_intermediate_size"], h)})
    bw = bandwidth()
    return {"matmul_gflops": rates, "best_gflops": max(max(r.values()) for r in rates.values()),
            "sorted_block_gflops": sorted_block_rates(s), "decode_product_ms": decode_product_ms(s),
            "expert_layer_ms": expert_layer_ms(quick, hf_dir, hf_experts, experts),
            "bandwidth_gbs": bw, "best_gbs": max(bw["torch_copy"], bw["torch_triad"]), "threads": threads}


def sorted_block_rates(s: dict) -> dict:
    """GFLOP/s of the sorted form's batched products at the train step's blocks (models/moe.expert_block: 2048
    tokens -> 24 blocks of 256 rows at the full shapes), MindSpore's BatchMatMul (a graph, read back) against
    torch.bmm on the same operands: the gate / up product x @ W, its input gradient g @ W^T and weight
    gradient x^T @ g. Where the body's expert time stands against the kernels transformers' side runs (a
    diagnosis, not part of the ceilings)."""
    import torch
    from bench_floors import _best, product_graph
    from mindspore import Tensor, ops
    from mindrlhf.models.moe import expert_block, sorted_capacity
    m, t = s["model"], s["batch"] * s["seq"]
    h, i, k, e = m["hidden_size"], m["moe_intermediate_size"], m["num_experts_per_tok"], m["num_experts"]
    block = expert_block(t, k, e, "sorted")          # the block auto would use where it sorts
    blocks = sorted_capacity(t, k, e, block) // block
    rng = np.random.default_rng(0)
    x, w, g = (rng.standard_normal(shape, dtype=np.float32) for shape in
               ((blocks, block, h), (blocks, h, i), (blocks, block, i)))
    flop = 2 * blocks * block * h * i / 1e9
    tx, tw, tg = (torch.from_numpy(a) for a in (x, w, g))
    mx, mw, mg = (Tensor(a) for a in (x, w, g))
    products = {"x_w": (ops.BatchMatMul(), (mx, mw), lambda: torch.bmm(tx, tw)),
                "g_wT": (ops.BatchMatMul(transpose_b=True), (mg, mw), lambda: torch.bmm(tg, tw.transpose(1, 2))),
                "xT_g": (ops.BatchMatMul(transpose_a=True), (mx, mg), lambda: torch.bmm(tx.transpose(1, 2), tg))}
    out = {"blocks": blocks, "block": block}
    for name, (op, args, ref) in products.items():
        graph = product_graph(op)
        out[name] = {"mindspore": round(flop / _best(lambda: graph(*args).asnumpy()), 1),
                     "torch": round(flop / _best(ref), 1)}
    return out


def expert_layer_ms(quick: bool, hf_dir: str, hf_experts: str, experts: str) -> dict:
    """Milliseconds of one sparse layer's experts, forward + backward, at the train step's tokens: our ExpertsFFN
    (a graph: the output, the gradients of the tokens, the routing weights and the three weight stacks) against
    transformers' own experts module of the benchmark model's first layer (its experts_implementation, autograd),
    both loaded from the benchmark's HF folder, on the same routing (random router logits, top-k, renormalised),
    alternating, medians. Isolates the experts' share of the train_body gap (a diagnosis, not part of the
    ceilings); "max_rel_diff" checks that both compute the same output."""
    import mindspore as ms
    import torch
    from mindspore import Tensor, nn
    s = shapes(quick)
    m, n = s["model"], s["batch"] * s["seq"]
    e, k = m["num_experts"], m["num_experts_per_tok"]
    hf = hf_model(hf_dir, hf_experts).model.layers[0].mlp.experts
    ffn = ours_model(hf_dir, quick, experts, "train").model.layers[0].feed_forward.routed_experts.ffn
    rng = np.random.default_rng(0)
    x, dy = (rng.standard_normal((n, m["hidden_size"]), dtype=np.float32) for _ in range(2))
    logits = rng.standard_normal((n, e), dtype=np.float32)
    top = np.argsort(-logits, 1, kind="stable")[:, :k]
    top_w = np.exp(np.take_along_axis(logits, top, 1))
    top_w = (top_w / top_w.sum(1, keepdims=True)).astype(np.float32)
    dense_w = np.zeros((n, e), np.float32)
    np.put_along_axis(dense_w, top, top_w, 1)

    class Step(nn.Cell):
        """One forward: (loss, output) and the loss's gradients (tokens, routing weights, the three stacks)."""

        def __init__(self):
            super().__init__()
            self.ffn = ffn
            self.value_and_grad = ms.value_and_grad(self.loss, (0, 1), ms.ParameterTuple(ffn.trainable_params()),
                                                    has_aux=True)

        def loss(self, x, w, dy):
            out = self.ffn(x, w, ms.float32)
            return (out * dy).sum(), out

        @ms.jit
        def construct(self, x, w, dy):
            (_, out), grads = self.value_and_grad(x, w, dy)
            return out, grads

    step, args = Step(), (Tensor(x), Tensor(dense_w), Tensor(dy))
    tx, tidx, tw, tdy = (torch.from_numpy(a) for a in (x, top.astype(np.int64), top_w, dy))

    def reference():
        xr, wr = tx.clone().requires_grad_(), tw.clone().requires_grad_()
        hf.zero_grad(set_to_none=True)
        out = hf(xr, tidx, wr)
        (out * tdy).sum().backward()
        return out.detach().numpy()

    ours_out, ref_out = step(*args)[0].asnumpy(), reference()
    times = {"ours": [], "transformers": []}
    for _ in range(7):
        t = time.perf_counter()
        step(*args)[0].asnumpy()
        times["ours"].append(time.perf_counter() - t)
        t = time.perf_counter()
        reference()
        times["transformers"].append(time.perf_counter() - t)
    med = {side: float(np.median(v)) * 1e3 for side, v in times.items()}
    return {"tokens": n, "ours": round(med["ours"], 1), "transformers": round(med["transformers"], 1),
            "ratio": round(med["transformers"] / med["ours"], 3),
            "max_rel_diff": float(np.abs(ours_out - ref_out).max() / np.abs(ref_out).max())}


def decode_product_ms(s: dict) -> dict:
    """Milliseconds of one decode step's expert and head products alone, MindSpore (one graph of them all, in the
    forms the model picks at the rollout's rows: ExpertsFFN's batched few-token form, tp_layers.linear for the
    head) against torch (the same products in a loop: torch.bmm, F.linear). Every layer's gate, up and down
    weights and the head are distinct arrays, as many bytes as the model's, so they stream from memory as in the
    rollout. Where the rollout's kernels stand against those transformers' side runs (a diagnosis, not part of
    the ceilings)."""
    import mindspore as ms
    import torch
    from bench_floors import _best
    from mindspore import Parameter, Tensor, nn, ops
    from mindrlhf.models.tp_layers import linear
    m, rows = s["model"], s["prompts"]
    e, h, i = m["num_experts"], m["hidden_size"], m["moe_intermediate_size"]
    rng = np.random.default_rng(0)
    shapes = [(e, h, i), (e, h, i), (e, i, h)] * m["num_layers"]
    experts = [rng.standard_normal(shape, dtype=np.float32) * 0.02 for shape in shapes]
    head = rng.standard_normal((m["vocab_size"], h), dtype=np.float32) * 0.02
    xh, xi = (rng.standard_normal((e, rows, k), dtype=np.float32) for k in (h, i))

    class Products(nn.Cell):
        """Each weight's product in the form the model runs at the rollout's rows (an expert's batched one, the
        head's through `linear`), every one an output of the graph (none is left out as unused)."""

        def __init__(self, weights):
            super().__init__()
            self.w = ms.ParameterTuple([Parameter(Tensor(w), name=f"w{j}") for j, w in enumerate(weights)])
            self.bmm = ops.BatchMatMul()

        @ms.jit
        def construct(self, xh, xi):
            out = []
            for w in self.w:
                if len(w.shape) == 2:                  # the head (vocab, H)
                    out.append(linear(xh[0], w, ms.float32))
                else:
                    out.append(self.bmm(xh if w.shape[1] == xh.shape[2] else xi, w))
            return tuple(out)

    mx = (Tensor(xh), Tensor(xi))
    tw, th, tx = [torch.from_numpy(w) for w in experts], torch.from_numpy(head), {h: torch.from_numpy(xh),
                                                                                    i: torch.from_numpy(xi)}
    graphs = {"experts": Products(experts), "head": Products([head])}
    torch_runs = {"experts": lambda: [torch.bmm(tx[w.shape[1]], w) for w in tw],
                  "head": lambda: torch.nn.functional.linear(tx[h][0], th)}
    out = {"rows": rows, "mbytes": {"experts": round(sum(w.nbytes for w in experts) / 1e6, 1),
                                    "head": round(head.nbytes / 1e6, 1)}}
    for part, graph in graphs.items():
        out[part] = {"mindspore": round(_best(lambda: graph(*mx)[-1].asnumpy(), 20) * 1e3, 2),
                     "torch": round(_best(torch_runs[part], 20) * 1e3, 2)}
    return out


def ceilings(s: dict, machine: dict, reference_s: dict) -> dict:
    """The highest ratio against transformers any float32 implementation could reach on this CPU: transformers'
    measured seconds over a floor that runs every FLOP at the best matmul rate measured here (any shape, any
    library) and reads every byte a decode step must at the best bandwidth, nothing else costing time (no
    softmax, norms, optimizer, sampling or launches). A bar above its ceiling cannot be met on this machine."""
    rate, bw = machine["best_gflops"] * 1e9, machine["best_gbs"] * 1e9
    train = step_flops(s)
    train_floor = (train["head"] + train["body"]) / rate
    work = rollout_work(s)
    rollout_floor = work["prefill_flops"] / rate + sum(max(f / rate, b / bw) for f, b in work["decode_steps"])
    return {"train_floor_s": round(train_floor, 3), "train_gflop": {k: round(v / 1e9, 1) for k, v in train.items()},
            "train_ratio_ceiling": round(reference_s["train"] / train_floor, 3),
            "rollout_floor_s": round(rollout_floor, 3),
            "rollout_ratio_ceiling": round(reference_s["rollout"] / rollout_floor, 3)}


def held_bytes(model, opt) -> dict:
    """Bytes of this rank's Parameters and AdamW moments, read back from the tensors themselves: the stacked
    experts', and the whole model's."""
    moments = {}
    for m in list(opt.exp_avg) + list(opt.exp_avg_sq):
        name = m.name.split(".", 1)[1]             # adam_m.<parameter> / adam_v.<parameter>
        moments[name] = moments.get(name, 0) + m.asnumpy().nbytes
    out = {"expert_param_bytes": 0, "expert_moment_bytes": 0, "param_bytes": 0, "moment_bytes": 0, "expert_shapes": []}
    for p in model.trainable_params():
        n = p.asnumpy().nbytes
        out["param_bytes"] += n
        out["moment_bytes"] += moments[p.name]
        if EXPERT_WEIGHTS in p.name:
            out["expert_param_bytes"] += n
            out["expert_moment_bytes"] += moments[p.name]
            out["expert_shapes"].append(list(p.shape))
    assert out["expert_shapes"], "no expert weights found"
    return out


def memory(quick: bool, mesh=None) -> dict:
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.trainer.optim import AdamW
    model = CausalLM(config(quick), mesh)
    opt = AdamW(list(model.trainable_params()), weight_decay=0.0)
    return held_bytes(model, opt)


def ep_worker(work: str, quick: bool):
    """msrun worker: this rank's bytes on an ep2 mesh, written to work/rank_<r>.json."""
    from mindrlhf.parallel.mesh import Mesh, init_distributed
    rank, world = init_distributed()
    assert world == 2, world
    res = dict(memory(quick, Mesh(dp=1, tp=1, rank=rank, extra_axes=(("ep", 2),))), rank=rank)
    with open(os.path.join(work, f"rank_{rank}.json"), "w") as fh:
        json.dump(res, fh)


def ep2_memory(quick: bool) -> list:
    """Both ranks' bytes at ep2, each an msrun worker."""
    work = msrun_self(__file__, "--ep_worker", *(["--quick"] if quick else []))
    ranks = []
    for r in range(2):
        with open(os.path.join(work, f"rank_{r}.json")) as fh:
            ranks.append(json.load(fh))
    shutil.rmtree(work, ignore_errors=True)
    return ranks


def layouts_ratio(quick: bool) -> dict:
    """The per-rank bytes ratio (ep2 / ep1) the layouts predict, weights + two moments alike (all float32)."""
    from mindrlhf.models.specs import layouts_for
    cfg = config(quick)
    per = {}
    for ep in (1, 2):
        layouts = layouts_for(cfg, ep, 1, ep=ep)
        per[ep] = {"experts": sum(int(np.prod(lay.shard_shape)) for n, lay in layouts.items() if EXPERT_WEIGHTS in n),
                   "all": sum(int(np.prod(lay.shard_shape)) for lay in layouts.values())}
    return {k: per[2][k] / per[1][k] for k in ("experts", "all")}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="tiny shapes and one round: checks the script runs")
    p.add_argument("--hf_experts", default="default", choices=("default", "eager", "grouped_mm", "batched_mm"),
                   help="transformers' experts_implementation (default: what from_pretrained picks)")
    p.add_argument("--experts", default="auto", choices=("auto", "dense", "sorted"),
                   help="our experts' form (model_config.moe_expert_compute; auto: the cheaper per call)")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--hf_dir", help=argparse.SUPPRESS)
    p.add_argument("--ep_worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.ep_worker:
        ep_worker(args.ep_worker, args.quick)
        return
    if args.child:
        phase, side = args.child
        if phase == "memory":
            res = memory(args.quick)
        elif phase == "machine":
            res = machine_rates(args.quick, args.hf_dir, args.hf_experts, args.experts)
        elif side == "ours":
            res = ours(phase, args.hf_dir, args.quick, args.experts)
        else:
            res = reference(phase, args.hf_dir, args.quick, args.hf_experts)
        print(json.dumps(res), flush=True)
        return
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    rounds = 1 if args.quick else args.rounds
    script = os.path.abspath(__file__)
    flags = ["--hf_experts", args.hf_experts, "--experts", args.experts] + (["--quick"] if args.quick else [])
    hf_dirs = {phase: hf_moe_dir(args.quick, phase) for phase in PHASES}
    print(f"model: {json.dumps(shapes(args.quick)['model'])}; HF folder {hf_dirs['train']} (train_body: vocab "
          f"{shapes(args.quick, 'train_body')['model']['vocab_size']}, {hf_dirs['train_body']})", flush=True)
    runs = {(phase, side): [] for phase in PHASES for side in ("ours", "transformers")}
    implementation, threads = None, {}
    for r in range(rounds):
        for (phase, side), values in runs.items():
            res = run_child(script, phase, side, "--hf_dir", hf_dirs[phase], *flags)
            values.append(res["tokens_per_s"])
            threads[side] = res["threads"]
            implementation = res.get("experts_implementation", implementation)
            print(f"round {r + 1}/{rounds} {phase:10s} {side:12s} {res['tokens_per_s']:10.1f} tokens/s", flush=True)
    med = {k: float(np.median(v)) for k, v in runs.items()}
    s = shapes(args.quick)
    step_tokens = s["batch"] * s["seq"]
    step_s = {side: {"step": step_tokens / med[("train", side)], "body": step_tokens / med[("train_body", side)]}
              for side in ("ours", "transformers")}
    for side in step_s:
        step_s[side]["head"] = step_s[side]["step"] - step_s[side]["body"]
    s_roll = shapes(args.quick, "rollout")
    reference_s = {"train": step_tokens / med[("train", "transformers")],
                   "rollout": s_roll["prompts"] * s_roll["new"] / med[("rollout", "transformers")]}
    machine = run_child(script, "machine", "rates", "--hf_dir", hf_dirs["train"], *flags)
    ceiling = ceilings(s, machine, reference_s)
    print(f"this CPU's best float32 matmul {machine['best_gflops']} GFLOP/s, bandwidth {machine['best_gbs']} GB/s: "
          f"train floor {ceiling['train_floor_s']} s a step (transformers {reference_s['train']:.3f} s), rollout "
          f"floor {ceiling['rollout_floor_s']} s (transformers {reference_s['rollout']:.3f} s)", flush=True)
    ep1 = run_child(script, "memory", "ep1", *flags)
    ep2 = ep2_memory(args.quick)
    worst = max(ep2, key=lambda x: x["expert_param_bytes"] + x["expert_moment_bytes"])
    expert_ratio = (worst["expert_param_bytes"] + worst["expert_moment_bytes"]) / \
        (ep1["expert_param_bytes"] + ep1["expert_moment_bytes"])
    model_ratio = max(x["param_bytes"] + x["moment_bytes"] for x in ep2) / (ep1["param_bytes"] + ep1["moment_bytes"])
    predicted = layouts_ratio(args.quick)
    mb = 1 / 2 ** 20
    print(f"experts per rank (weights + AdamW moments, MiB): ep1 "
          f"{(ep1['expert_param_bytes'] + ep1['expert_moment_bytes']) * mb:.1f}, ep2 ranks "
          + ", ".join(f"{(x['expert_param_bytes'] + x['expert_moment_bytes']) * mb:.1f}" for x in ep2)
          + f" (shapes {ep1['expert_shapes'][0]} -> {worst['expert_shapes'][0]}); whole model per rank: ep1 "
          f"{(ep1['param_bytes'] + ep1['moment_bytes']) * mb:.1f}, ep2 "
          + ", ".join(f"{(x['param_bytes'] + x['moment_bytes']) * mb:.1f}" for x in ep2), flush=True)
    for (phase, side), values in runs.items():
        print(json.dumps({"bench": "moe_vs_transformers", "phase": phase, "side": side,
                          "tokens_per_s": [round(v, 1) for v in values]}), flush=True)
    from bench_floors import cpu_info
    cpu = cpu_info()
    print(json.dumps({
        "bench": "moe_vs_transformers", "cpu": f"{cpu['model_name']} ({cpu['family']}/{cpu['model']})",
        "quick": args.quick, "rounds": rounds,
        "train_ratio": round(med[("train", "ours")] / med[("train", "transformers")], 3),
        "train_body_ratio": round(med[("train_body", "ours")] / med[("train_body", "transformers")], 3),
        "rollout_ratio": round(med[("rollout", "ours")] / med[("rollout", "transformers")], 3),
        "train_step_s": {side: {k: round(v, 3) for k, v in parts.items()} for side, parts in step_s.items()},
        "train_ratio_ceiling": ceiling["train_ratio_ceiling"], "rollout_ratio_ceiling": ceiling["rollout_ratio_ceiling"],
        "floors": {k: v for k, v in ceiling.items() if not k.endswith("_ceiling")},
        "machine": {k: machine[k] for k in ("matmul_gflops", "sorted_block_gflops", "decode_product_ms",
                                             "expert_layer_ms", "bandwidth_gbs", "best_gflops", "best_gbs")},
        "ep2_expert_memory_ratio": round(expert_ratio, 4),
        "ep2_model_memory_ratio": round(model_ratio, 4),
        "ep2_memory_measured": "bytes of the Parameters and AdamW moments held: ep2 by 2 msrun workers, ep1 in one "
                               "process",
        "ep2_ratio_from_layouts": {k: round(v, 4) for k, v in predicted.items()},
        "medians_tokens_per_s": {f"{ph}_{side}": round(v, 1) for (ph, side), v in med.items()},
        "hf_experts_implementation": implementation, "our_experts": args.experts, "threads": threads}), flush=True)


if __name__ == "__main__":
    main()
