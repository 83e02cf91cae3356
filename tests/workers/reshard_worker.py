"""msrun worker: online re-layout against offline slicing, both transports, and the rollout-logprob check.

argv: out_dir. Writes out_dir/rank_{r}.json with per-case results.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from hf_reference import tiny_model_kwargs  # noqa: E402
from mindrlhf.checkpoint.model_io import load_full_weights, model_state  # noqa: E402
from mindrlhf.configs import ModelConfig  # noqa: E402
from mindrlhf.models.qwen2 import CausalLM  # noqa: E402
from mindrlhf.models.specs import param_specs  # noqa: E402
from mindrlhf.parallel.layouts import role_layouts  # noqa: E402
from mindrlhf.parallel.mesh import Mesh, init_distributed  # noqa: E402
from mindrlhf.parallel.reshard import WeightSync  # noqa: E402
from mindrlhf.rollout.engine import GenerationEngine  # noqa: E402
from mindrlhf.rollout.sampling import SamplingParams  # noqa: E402
from mindrlhf.trainer.exchange import gather_samples  # noqa: E402
from mindrlhf.trainer.samples import SampleBatch, training_tensors  # noqa: E402
from mindrlhf.models.padding import left_pad  # noqa: E402
from mindrlhf.trainer.update.one_graph import ResponseLogProb  # noqa: E402

CFG = ModelConfig(**tiny_model_kwargs(True, False, 4))   # 4 kv heads: TP up to 4


def full_weights(seed):
    rng = np.random.RandomState(seed)
    return {n: (0.1 * rng.randn(*shape)).astype(np.float32) for n, (shape, _) in param_specs(CFG).items()}


def layouts_for(world):
    cases = [((1, world), (world, 1)), ((world, 1), (1, world)), ((1, world), (1, world))]
    if world == 4:
        cases += [((2, 2), (1, 4)), ((2, 2), (4, 1))]
    return cases


class RolloutGap:
    """Generate on the rollout model, recompute with the policy: max |logprob difference|. Built once per case
    (its graphs compile once; every sync writes the weights they were compiled with in place).
    TP peers of one rollout replica must feed identical prompts, so prompts depend on the DP index."""

    def __init__(self, policy, rollout_model, mesh_infer):
        self.engine = GenerationEngine(rollout_model, 0, 8)
        self.logprob = ResponseLogProb(policy, 6)
        self.mesh = mesh_infer

    def __call__(self):
        d = self.mesh.dp_index
        prompts = [[5 + d, 9, 3, 17], [11, 2, 40 + 37 * d]]
        out = self.engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=6, n=2, seed=1))
        ids, mask = left_pad(out.prompt_ids, 8, 0)
        local = SampleBatch(ids, mask, out.response_ids, out.response_mask, out.logprobs, out.prompt_index,
                            np.zeros(len(ids), np.int64))
        allb = gather_samples(local, self.mesh)
        t = training_tensors(allb)
        logp = self.logprob(t["input_ids"], t["position_ids"], t["bias"], t["labels"])
        m = allb.response_mask.astype(bool)
        return float(np.abs(logp.asnumpy()[m] - allb.rollout_logp[m]).max())


def main():
    out_dir = sys.argv[1]
    rank, world = init_distributed()
    results = []
    for (sdp, stp), (ddp, dtp) in layouts_for(world):
        src_mesh, dst_mesh = Mesh(sdp, stp, rank), Mesh(ddp, dtp, rank)
        policy, rollout_model = CausalLM(CFG, src_mesh), CausalLM(CFG, dst_mesh)
        gap = RolloutGap(policy, rollout_model, dst_mesh)
        dst_layouts = role_layouts(param_specs(CFG), Mesh(dp=ddp, tp=dtp))
        for transport in ("shm", "collective"):
            w0 = full_weights(0)
            load_full_weights(policy, w0.items(), "w0")
            load_full_weights(rollout_model, full_weights(99).items(), "stale")
            sync = WeightSync(policy.weights(), rollout_model.weights(), transport)
            sync.sync()
            state = model_state(rollout_model)
            exact = all(np.array_equal(state[n], dst_layouts[n].shard(w0[n], rank)) for n in w0)
            # an "optimizer step": new policy weights; a skipped sync must show as a logprob gap
            w1 = {n: a + 0.05 * np.sign(a) for n, a in w0.items()}
            load_full_weights(policy, w1.items(), "w1")
            stale_gap = gap()
            sync.sync()
            synced_gap = gap()
            sync.close()
            results.append({"case": f"dp{sdp}tp{stp}->dp{ddp}tp{dtp}", "transport": transport, "exact": exact,
                            "synced_gap": synced_gap, "stale_gap": stale_gap, "seconds": sync.last_seconds})
    with open(os.path.join(out_dir, f"rank_{rank}.json"), "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":
    main()
