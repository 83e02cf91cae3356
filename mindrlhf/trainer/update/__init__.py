"""The policy update and the no-grad log-prob passes, behind one call.

Every engine is called as `step(input_ids, position_ids, bias, labels, lr, *LossInputs.args())` and returns
loss.UPDATE_STATS without lr; every log-prob cell as `cell(input_ids, position_ids, bias,
labels)` -> (N, R) log-probs. Which engine runs is `ResolvedRun.update_graphs` / `logprob_graphs`, and
`engines.build_update` is the one place that turns that answer into objects:

| module | engine |
| --- | --- |
| engines.py | `build_update`: the engine and log-prob cells a resolved run names |
| loss_inputs.py | the loss's inputs besides the forward, one structure (a new input lands there) |
| loss.py | the GRPO loss cell (the same for every engine) and the update's statistics |
| grad_norm.py | global gradient norm over TP ranks and stages, the clip factor |
| one_graph.py | loss, backward, DP mean, clip, AdamW in one graph; the one-graph log-probs |
| accumulate.py | gradients summed into buffers by several calls, then DP mean, clip, AdamW from the host |
| pipelined.py | micro-batches and pipeline stages (1F1B) |
| layerwise.py | a graph per decoder layer (engine.layerwise_update) |
"""
