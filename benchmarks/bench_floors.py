"""Where a GRPO step's time goes against this CPU's own limits, measured in one run on this machine.

    python benchmarks/bench_floors.py [--steps 6] [--model_dir DIR] [--machine_only]

1. The machine, in a child process with the trainer's MindSpore settings (calling-thread runs, kernel threads
   as run.cpu_threads picks them): lscpu's model name, family / model / stepping and the SIMD flags that choose
   kernels (avx2, fma, avx512f, avx512_bf16, avx512_vnni, amx_*); float32 matmul rates on the real model's
   hot shapes, (m, k, n) = tokens x hidden -> MLP, hidden -> hidden, MLP -> hidden and the LM head, for numpy,
   torch and MindSpore (MatMul(transpose_b) as our layers call it, in a graph, the output read back each call,
   best of 5); memory bandwidth STREAM-style (copy a = b: 2 x 4 bytes per element, triad a = b + s c: 3 x 4)
   over 512 MB arrays with torch on every core and numpy on one; one decode step's matmuls alone (every weight of
   the model, read once, at 1 / 8 / 16 / 32 rows) with torch and MindSpore.
2. mindrlhf on the real-model example (examples/grpo/smollm2_arithmetic: SmolLM2-135M-Instruct, 4 prompts x 8
   samples, <= 40 new tokens, one decoder layer per update graph) for --steps steps; medians over steps 2..N.
   The rollout's prefill and decode graph calls are timed apart (their output is read back inside the timer).
3. Per phase its work and its floors: FLOPs (2 per weight per token forward, 6 forward + backward; attention's
   scores and softmax left out) over the matmul rate, bytes (decode: every weight and the KV cache read once
   per token step; the update: the weights read forward and backward, the gradients written, AdamW's read of
   weights, gradients and both moments and write of weights and moments, 10 x the weights; the weight sync:
   read + write) over the triad bandwidth; the floor is the larger; "x_floor" is ours / floor, against the
   best rate of the three libraries and against MindSpore's own ("x_floor_ms"). Decode also against the best
   library's time for its matmuls at its own row counts ("x_library_floor"): at a few rows the libraries'
   kernels stream the weights well below the triad bandwidth, so that is the floor a graph of them can reach.

JSON lines: {"bench": "floors_machine", ...}, {"bench": "floors_phases", "cpu": ..., "phases": {...},
"decode_tokens_per_s", "decode_floor_tokens_per_s", ...}. Not a test: figures depend on the CPU; name it.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ours_kernel_threads, run_child  # noqa: E402

SMOLLM2_SHAPES = {"hidden->mlp": (3200, 576, 1536), "hidden->hidden": (3200, 576, 576),
                  "mlp->hidden": (3200, 1536, 576), "lm_head": (1024, 576, 49152)}
DECODE_ROWS = (1, 8, 16, 32)         # decode_matmul_s's row counts (the example decodes <= 32 rows)
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "avx_vnni")


def cpu_info() -> dict:
    """lscpu's model and family numbers, and which kernel-choosing SIMD flags /proc/cpuinfo lists."""
    out = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
    field = dict(re.findall(r"^([^:\n]+):\s*(.*)$", out, re.M))
    flags = set()
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return {"model_name": field.get("Model name", "?"), "vendor": field.get("Vendor ID", "?"),
            "family": field.get("CPU family", "?"), "model": field.get("Model", "?"),
            "stepping": field.get("Stepping", "?"), "cores": os.cpu_count(),
            "flags": [f for f in KERNEL_FLAGS if f in flags]}


def _best(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def product_graph(op):
    """A graph of the one product `op` (a Cell: MindSpore's jit parses a Cell's construct, not a closure)."""
    import mindspore as ms
    from mindspore import nn

    class Product(nn.Cell):
        def __init__(self):
            super().__init__()
            self.op = op

        @ms.jit
        def construct(self, a, b):
            return self.op(a, b)
    return Product()


def matmul_rates(shapes: dict = None) -> dict:
    """GFLOP/s of x (m, k) @ w (n, k)^T for each {name: (m, k, n)} of `shapes` (default: the real model's hot
    ones): numpy, torch, MindSpore (graph, read back)."""
    import numpy as np
    import torch
    from mindspore import Tensor, ops
    torch.set_num_threads(os.cpu_count())
    rates = {}
    rng = np.random.default_rng(0)
    for name, (m, k, n) in (shapes or SMOLLM2_SHAPES).items():
        x, w = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((n, k), dtype=np.float32)
        tx, tw = torch.from_numpy(x), torch.from_numpy(w)
        cell, mx, mw = product_graph(ops.MatMul(transpose_b=True)), Tensor(x), Tensor(w)
        flop = 2 * m * k * n / 1e9
        rates[name] = {"numpy": flop / _best(lambda: x @ w.T), "torch": flop / _best(lambda: tx @ tw.T),
                       "mindspore": flop / _best(lambda: cell(mx, mw).asnumpy())}
        rates[name] = {lib: round(r, 1) for lib, r in rates[name].items()}
    return rates


def decode_weights(model_dir: str, seed: int = 0) -> list:
    """Random float32 weights of every matmul a decode step runs, (out, in) each, in the order it runs them:
    per layer q, k, v, o, gate, up, down, then the head; as many bytes as the model's, so they stream from
    memory as the real step's do (a smaller set can sit in a large L3)."""
    import numpy as np
    c = model_config(model_dir)
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape, dtype=np.float32) * 0.02
            for shape in layer_matmuls(c) * c["num_hidden_layers"] + [(c["vocab_size"], c["hidden_size"])]]


def decode_matmul_s(model_dir: str, rows_list) -> dict:
    """Seconds for one decode step's matmuls alone (decode_weights, each read once) at each row count: torch
    (x @ w.T per weight, a Python loop) and MindSpore (one graph of them all, x @ w^T and our few-row form
    (w @ x^T)^T; each product from a fixed input, so nothing but the matmuls is timed). The
    libraries' own rate at the decode's shapes, where a kernel tuned for many rows streams the weights well
    below the triad bandwidth: the floor a graph of these kernels can reach."""
    import mindspore as ms
    import numpy as np
    import torch
    from mindspore import Parameter, Tensor, nn, ops
    torch.set_num_threads(os.cpu_count())
    weights = decode_weights(model_dir)

    class Matmuls(nn.Cell):
        def __init__(self, few_rows: bool):
            super().__init__()
            self.few_rows = few_rows
            self.w = ms.ParameterTuple([Parameter(Tensor(w), name=f"w{j}") for j, w in enumerate(weights)])
            self.mm = ops.MatMul(transpose_b=True)

        @ms.jit
        def construct(self, xs):
            out = []
            for j in range(len(self.w)):
                x = xs[0] if self.w[j].shape[1] == xs[0].shape[1] else xs[1]
                out.append(ops.transpose(self.mm(self.w[j], x), (1, 0)) if self.few_rows else self.mm(x, self.w[j]))
            return tuple(out)          # every product an output: none is left out of the graph as unused

    tw = [torch.from_numpy(w) for w in weights]
    ins = sorted({w.shape[1] for w in weights})
    cells = {form: Matmuls(form == "few_rows") for form in ("x_wT", "few_rows")}
    result = {}
    for rows in rows_list:
        xs = [np.random.default_rng(rows).standard_normal((rows, k), dtype=np.float32) for k in ins]
        tx = {k: torch.from_numpy(x) for k, x in zip(ins, xs)}
        mx = tuple(Tensor(x) for x in xs)
        times = {"torch": _best(lambda: [tx[w.shape[1]] @ w.T for w in tw], 3)}
        times.update({f"mindspore_{form}": _best(lambda: cell(mx)[-1].asnumpy(), 3) for form, cell in cells.items()})
        result[str(rows)] = {lib: round(t, 4) for lib, t in times.items()}
    result["gbytes"] = round(sum(w.nbytes for w in weights) / 1e9, 3)
    return result


def bandwidth() -> dict:
    """STREAM-style GB/s over 512 MB arrays: copy and triad with torch on every core, copy with numpy."""
    import numpy as np
    import torch
    torch.set_num_threads(os.cpu_count())
    n = 128 * 2 ** 20
    a, b, c = (torch.ones(n) for _ in range(3))
    na, nb = np.ones(n, np.float32), np.ones(n, np.float32)
    gb = n * 4 / 1e9
    return {"torch_copy": round(2 * gb / _best(lambda: a.copy_(b)), 2),
            "torch_triad": round(3 * gb / _best(lambda: torch.add(b, c, alpha=3.0, out=a)), 2),
            "numpy_copy_1thread": round(2 * gb / _best(lambda: np.copyto(na, nb)), 2)}


def child_machine(model_dir: str) -> dict:
    threads = ours_kernel_threads()
    return {"mindspore_kernel_threads": threads, "matmul_gflops": matmul_rates(), "bandwidth_gbs": bandwidth(),
            "decode_matmuls_s": decode_matmul_s(model_dir, DECODE_ROWS)}


class _Fetched:
    """A graph's output already read back (inside the timer); the engine reads it with .asnumpy()."""

    def __init__(self, array):
        self.array = array

    def asnumpy(self):
        return self.array


def child_run(work: str, steps: int) -> dict:
    """The example's run with the rollout's prefill and decode graph calls timed per step."""
    import bench_real_model as real
    from mindrlhf.rollout import engine
    calls = []                       # (kind, rows, tokens per row, cache length, seconds)

    def timed(cls, kind):
        original = cls.__call__

        def call(self, *args):
            t = time.perf_counter()
            out = original(self, *args).asnumpy()
            calls.append((kind, *map(int, args[0].shape), int(self.caches_k[0].shape[2]), time.perf_counter() - t))
            return _Fetched(out)
        cls.__call__ = call

    timed(engine._Decode, "decode")
    timed(engine._Prefill, "prefill")
    with open(os.path.join(work, "inputs.json")) as fh:
        inputs = json.load(fh)
    from mindrlhf.trainer.grpo_trainer import GRPOTrainer
    marks, original_rollout = [], GRPOTrainer.rollout        # where each step's rollout starts in `calls`

    def rollout(self, *a, **k):
        marks.append(len(calls))
        return original_rollout(self, *a, **k)
    GRPOTrainer.rollout = rollout
    result = real.child_ours(work, inputs, steps, 0, out_name="floors")
    per_step = [calls[start:end] for start, end in zip(marks, marks[1:] + [len(calls)])][1:]
    for kind in ("decode", "prefill"):
        result[f"{kind}_s"] = real.median([sum(c[4] for c in s if c[0] == kind) for s in per_step])
        result[f"{kind}_calls"] = [list(c[1:4]) for c in per_step[-1] if c[0] == kind]   # the last step's
    result["decoded_rows"] = sum(c[1] for c in per_step[-1] if c[0] == "decode")
    result["decode_s_last"] = sum(c[4] for c in per_step[-1] if c[0] == "decode")
    return result


def model_config(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "config.json")) as fh:
        return json.load(fh)


def layer_matmuls(c: dict) -> list:
    """A decoder layer's weights that enter matmuls, (out, in) in the order a step runs them: q, k, v, o, gate,
    up, down (config.json `c`)."""
    h, i = c["hidden_size"], c["intermediate_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    return [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]


def model_sizes(model_dir: str) -> dict:
    c = model_config(model_dir)
    h, layers, v = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    kv = layer_matmuls(c)[1][0]
    body = layers * (sum(o * i for o, i in layer_matmuls(c)) + 2 * h) + h      # + two norms per layer, one final
    head = v * h
    params = body + head if c.get("tie_word_embeddings", True) else body + 2 * head
    return {"body": body, "head": head, "params": params, "layers": layers, "kv_width": kv}


def decode_library_floor(measured: dict, calls, seconds: float) -> dict:
    """The decode phase against the best library's time for its steps' matmuls alone (decode_matmul_s), each
    call at the fewest measured rows that cover it."""
    measured_rows = sorted(int(r) for r in measured if r.isdigit())

    def step_s(rows):
        at = next((r for r in measured_rows if r >= rows), measured_rows[-1])
        return min(measured[str(at)].values())
    floor = sum(step_s(rows) for rows, _, _ in calls)
    return {"library_matmul_floor_s": round(floor, 3), "x_library_floor": round(seconds / floor, 2)}


def phase_floors(machine: dict, run: dict, sizes: dict, flops: dict) -> dict:
    rates = machine["matmul_gflops"]
    best = sorted(max(r.values()) for r in rates.values())[len(rates) // 2] * 1e9      # median shape, best lib
    ms_rate = sorted(r["mindspore"] for r in rates.values())[len(rates) // 2] * 1e9
    bw = machine["bandwidth_gbs"]["torch_triad"] * 1e9
    w_bytes = 4 * sizes["params"]
    body, head, kv = sizes["body"], sizes["head"], 2 * 4 * sizes["layers"] * sizes["kv_width"]   # kv: bytes/token
    decode_flops = sum(2 * (body + head) * rows for rows, _, _ in run["decode_calls"])
    decode_bytes = sum(4 * (body + head) + kv * rows * length for rows, _, length in run["decode_calls"])
    prefill_flops = sum(2 * body * rows * width + 2 * head * rows for rows, width, _ in run["prefill_calls"])
    work = {"decode": (decode_flops, decode_bytes, run["decode_s_last"]),
            "prefill": (prefill_flops, w_bytes, run["prefill_s"]),
            "policy fwd+bwd+AdamW": (flops["train"], 10 * w_bytes, run["phases"]["policy fwd+bwd+AdamW"]),
            "weight sync": (0.0, 2 * w_bytes, run["phases"]["weight sync"])}
    out = {}
    for name, (f, b, s) in work.items():
        floor, floor_ms = max(f / best, b / bw), max(f / ms_rate, b / bw)
        out[name] = {"s": round(s, 3), "gflop": round(f / 1e9, 2), "gbytes": round(b / 1e9, 2),
                     "matmul_floor_s": round(f / best, 3), "memory_floor_s": round(b / bw, 3),
                     "bound": "matmul" if f / best >= b / bw else "memory",
                     "x_floor": round(s / floor, 2) if floor else None,
                     "x_floor_ms": round(s / floor_ms, 2) if floor_ms else None}
    out["decode"].update(decode_library_floor(machine["decode_matmuls_s"], run["decode_calls"],
                                              run["decode_s_last"]))
    return {"phases": out, "matmul_gflops_used": round(best / 1e9, 1), "mindspore_gflops_used": round(ms_rate / 1e9, 1),
            "triad_gbs_used": round(bw / 1e9, 2)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--model_dir", default=os.path.join(os.path.expanduser("~"), ".cache", "mindrlhf", "smollm2"))
    p.add_argument("--work", default="")
    p.add_argument("--machine_only", action="store_true", help="only the machine's rates (no training run)")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        which, work = args.child
        result = child_machine(args.model_dir) if which == "machine" else child_run(work, args.steps)
        print(json.dumps(result), flush=True)
        return
    work = args.work or tempfile.mkdtemp(prefix="bench_floors_")
    os.makedirs(work, exist_ok=True)
    cpu = cpu_info()
    machine = run_child(os.path.abspath(__file__), "machine", work, "--model_dir", args.model_dir)
    print(json.dumps({"bench": "floors_machine", "cpu": cpu, **machine}), flush=True)
    if args.machine_only:
        return
    import bench_real_model as real
    inputs = real.prepare(work, args.model_dir)
    with open(os.path.join(work, "inputs.json"), "w") as fh:
        json.dump(inputs, fh)
    run = run_child(os.path.abspath(__file__), "run", work, "--steps", str(args.steps))
    sizes = model_sizes(args.model_dir)
    floors = phase_floors(machine, run, sizes, real.phase_flops(args.model_dir))
    decode_tokens = run["decoded_rows"]                     # the last step's (its calls are the ones counted)
    floor_decode = floors["phases"]["decode"]
    line = {"bench": "floors_phases", "cpu": cpu["model_name"], "cpu_family_model": f"{cpu['family']}/{cpu['model']}",
            "steps": args.steps, "step_s": round(run["step_s"], 3), "first_step_s": round(run["first_step_s"], 2),
            "rollout_s": round(run["phases"]["generation"], 3), **floors,
            "decode_tokens_per_s": round(decode_tokens / run["decode_s_last"], 1),
            "decode_floor_tokens_per_s": round(decode_tokens / max(floor_decode["matmul_floor_s"],
                                                                   floor_decode["memory_floor_s"]), 1),
            "rollout_host_s": round(run["phases"]["generation"] - run["decode_s"] - run["prefill_s"], 3)}
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
