"""MindSpore generation engine: jit-compiled prefill and decode over a KV cache kept in Parameters.

Static shapes so each graph compiles once per (batch, prompt bucket, cache length): prompts are
left-padded to a bucket length P, every prompt is prefilled once and its cache rows copied to its n
samples, and each decode step writes its new keys/values in place (`scatter_nd_update` on Parameters laid
out [row, kv head, slot, head dim], the layout attention reads; passing the cache in and out of a graph
instead costs a full copy per step). Sampling runs on host numpy over the
gathered logits. The loop ends when every sequence has finished; before that, once at most half of the
decoded rows are still running (`compact_below`), the running rows' caches are gathered into a smaller batch
(row counts halve: R, R/2, R/4, ..., each a graph compiled once), so finished rows stop costing compute.

Multi-turn episodes (`tools`, rollout/episodes.py; `_generate_episodes`): a row whose turn ends in a tool call
pauses while its calls run in the tool pool and the other rows keep decoding; the results' template tokens are
appended to its response (present, loss mask 0) and fed through the same decode graph as forced tokens, one per
step (each at its own cache slot and position: exact, the history is never re-encoded), then it samples again.
"""
from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindrlhf.configs.errors import ConfigError
from mindrlhf.models.layer_graphs import decode, prefill, write_decoded
from mindrlhf.models.padding import NEG_INF, causal_bias, left_pad, position_ids
from mindrlhf.models.qwen2 import CausalLM, last_positions
from mindrlhf.rollout.sampling import SamplingParams, process_logits, row_uniforms, sample, token_logprobs


@dataclass
class RolloutOutput:
    """n samples per prompt, sample j of prompt i at row i*n + j. Responses right-padded with pad id."""
    prompt_ids: List[List[int]]        # per row (repeated per sample)
    response_ids: np.ndarray           # (N, max_tokens) int64
    response_mask: np.ndarray          # (N, max_tokens) 1 on generated tokens (EOS included)
    logprobs: np.ndarray               # (N, max_tokens) float32 log softmax(logits / T) of each sampled token
    finish_reason: List[str]           # "stop" (EOS), "length", or "tool_calls" (max_tool_calls reached)
    prompt_index: np.ndarray           # (N,) which input prompt each row came from
    seconds: float = 0.0
    # episodes: 1 on the model's own tokens (the rest of response_mask is tool results and template tokens);
    # None = response_mask (single turn)
    loss_mask: Optional[np.ndarray] = None
    tool_calls: Optional[np.ndarray] = None     # (N,) calls made per episode
    turns: Optional[List[List[tuple]]] = None   # per row: (start, end, "model" | "tool") spans of the response
    # Qwen3-MoE: the experts each token went to in the rollout's own passes (router replay), ids sorted: per row
    # (prompt length, sparse layers, k), and (N, max_tokens, sparse layers, k) for the response (positions
    # never fed back, such as a row's last token, hold experts 0..k-1); None for a dense model
    prompt_routing: Optional[List[np.ndarray]] = None
    response_routing: Optional[np.ndarray] = None

    def __post_init__(self):
        rows = len(self.response_ids)
        if self.loss_mask is None:
            self.loss_mask = self.response_mask.copy()
        if self.tool_calls is None:
            self.tool_calls = np.zeros(rows, np.int64)
        if self.turns is None:
            self.turns = [[(0, int(n), "model")] for n in self.response_mask.sum(-1)]

    @property
    def response_lengths(self) -> np.ndarray:
        return self.response_mask.sum(-1)


def unrouted(shape: tuple, top_k: int) -> np.ndarray:
    """A routing record of `shape` + (top_k,) holding experts 0..k-1 everywhere: the filler of the positions no
    pass routed (padding, tokens never fed back)."""
    return np.broadcast_to(np.arange(top_k, dtype=np.int32), tuple(shape) + (top_k,)).copy()


class RoutingRecord:
    """The experts of every token a rollout feeds through a Qwen3-MoE model, filled from prefill's and each
    decode step's outputs (router replay: rl.router_replay)."""

    def __init__(self, rows: int, width: int, sparse_layers: int, top_k: int):
        self.response = unrouted((rows, width, sparse_layers), top_k)
        self.prompts: List[np.ndarray] = []

    def prefilled(self, experts: np.ndarray, lengths: np.ndarray, p_len: int, n: int):
        """experts (sparse layers, B x P, k) of the left-padded prompts -> each of the B x n rows' real tokens."""
        per_prompt = np.sort(experts, -1).reshape(experts.shape[0], len(lengths), p_len, -1).transpose(1, 2, 0, 3)
        self.prompts = [per_prompt[i, p_len - length:] for i, length in enumerate(lengths) for _ in range(n)]

    def fields(self) -> dict:
        return {"prompt_routing": self.prompts, "response_routing": self.response}

    def decoded(self, experts: np.ndarray, batch_rows: np.ndarray, seqs: np.ndarray, positions):
        """experts (sparse layers, batch, k) of one decode step: batch row batch_rows[j] fed sequence seqs[j]'s
        response token at positions[j]."""
        self.response[seqs, positions] = np.sort(experts[:, batch_rows], -1).transpose(1, 0, 2)


def _outputs(result):
    """A prefill or decode graph's outputs as numpy: (logits, experts or None)."""
    if isinstance(result, (tuple, list)):
        return result[0].asnumpy(), result[1].asnumpy()
    return result.asnumpy(), None


def _one_position(logits):
    """(B, 1, V) -> (B, V) as a reshape: the slice [:, 0, :] costs a tenth of a small model's decode step on
    MindSpore 2.10's CPU."""
    return ops.reshape(logits, (logits.shape[0], logits.shape[2]))


class _Prefill(nn.Cell):
    """The prompts' forward; caches of batch x n rows: each prompt's keys/values go to its n samples' rows."""

    def __init__(self, lm: CausalLM, caches_k, caches_v):
        super().__init__(auto_prefix=False)
        self.lm = lm
        self.caches_k, self.caches_v = caches_k, caches_v

    @ms.jit
    def construct(self, input_ids, position_ids, bias):
        h, experts = prefill(self.lm.model, input_ids, position_ids, bias, self.caches_k, self.caches_v)
        logits = _one_position(self.lm.gather_vocab(self.lm.head(last_positions(h, 1))))
        return logits if experts is None else (logits, experts)


class _Decode(nn.Cell):
    def __init__(self, lm: CausalLM, caches_k, caches_v):
        super().__init__(auto_prefix=False)
        self.lm = lm
        self.caches_k, self.caches_v = caches_k, caches_v

    @ms.jit
    def construct(self, input_ids, position_ids, bias, kv_index, kv_keep):
        h, experts, new_kv = decode(self.lm.model, input_ids, position_ids, bias, self.caches_k, self.caches_v)
        logits = _one_position(self.lm.gather_vocab(self.lm.head(h)))
        write_decoded(self.caches_k, self.caches_v, new_kv, kv_index, kv_keep)
        return logits if experts is None else (logits, experts)


class _Compact(nn.Cell):
    """Gather the given cache rows of one batch size into the caches of a smaller one."""

    def __init__(self, src_k, src_v, dst_k, dst_v):
        super().__init__(auto_prefix=False)
        self.src_k, self.src_v, self.dst_k, self.dst_v = src_k, src_v, dst_k, dst_v

    @ms.jit
    def construct(self, rows):
        for i in range(len(self.src_k)):
            ops.assign(self.dst_k[i], ops.gather(self.src_k[i], rows, 0))
            ops.assign(self.dst_v[i], ops.gather(self.src_v[i], rows, 0))
        return rows


class GenerationEngine:
    """Batched generation on one model replica (one DP rank of the infer layout, TP inside the model)."""

    def __init__(self, model: CausalLM, pad_token_id: int = 0, prompt_bucket: int = 16, max_num_seqs: int = 0,
                 compact_below: int = 8, tools=None):
        self.model = model
        self.tools = tools                    # rollout/episodes.EpisodeTools: multi-turn episodes; None: one turn
        self.pad_token_id = pad_token_id
        self.prompt_bucket = prompt_bucket
        self.max_num_seqs = max_num_seqs      # most rows decoded at once (vLLM's name); 0 = no bound
        # smallest batch finished rows are compacted into (0: never compact); below it a graph launch costs
        # more than the rows it would drop
        self.compact_below = compact_below
        # Compiled graphs (and their caches) are kept for the engine's lifetime: a jit graph holds its
        # Parameters' buffers even after the Python objects are dropped, so rebuilding would only leak.
        self._caches = {}       # (rows, L) -> (k caches, v caches)
        self._prefills = {}     # (prompts, P, L, n) -> _Prefill
        self._decodes = {}      # (rows, L) -> _Decode
        self._compacts = {}     # (rows, to rows, L) -> _Compact
        self.decoded_rows = 0   # rows x decode steps run so far (what compaction saves shows here)

    def cache_parameters(self) -> List[Parameter]:
        """Every KV-cache Parameter allocated so far (for host swap between rollouts)."""
        return [p for ck, cv in self._caches.values() for p in list(ck) + list(cv)]

    def _cache(self, rows: int, length: int):
        if (rows, length) not in self._caches:
            cfg, mesh = self.model.config, self.model.mesh
            shape = (rows, cfg.n_kv_heads // mesh.tp, length, cfg.head_dim)
            dtype = self.model.compute_dtype
            self._caches[(rows, length)] = tuple(
                ms.ParameterTuple([Parameter(Tensor(np.zeros(shape, np.float32)).astype(dtype),
                                             name=f"kv_cache.{kind}.{i}.rows{rows}", requires_grad=False)
                                   for i in range(cfg.num_layers)]) for kind in "kv")
        return self._caches[(rows, length)]

    def _prefill(self, batch: int, p: int, length: int, n: int) -> _Prefill:
        key = (batch, p, length, n)
        if key not in self._prefills:
            self._prefills[key] = _Prefill(self.model, *self._cache(batch * n, length))
        return self._prefills[key]

    def _decode(self, rows: int, length: int) -> _Decode:
        if (rows, length) not in self._decodes:
            self._decodes[(rows, length)] = _Decode(self.model, *self._cache(rows, length))
        return self._decodes[(rows, length)]

    def _compact(self, rows: int, to_rows: int, length: int) -> _Compact:
        key = (rows, to_rows, length)
        if key not in self._compacts:
            self._compacts[key] = _Compact(*self._cache(rows, length), *self._cache(to_rows, length))
        return self._compacts[key]

    def _kv_index(self, rows: int, slot: int) -> np.ndarray:
        """Where a decode step writes each new key/value vector: [row, kv head, slot], (rows * nkv, 3)."""
        nkv = self.model.config.n_kv_heads // self.model.mesh.tp
        index = np.empty((rows * nkv, 3), np.int32)
        index[:, 0] = np.repeat(np.arange(rows), nkv)
        index[:, 1] = np.tile(np.arange(nkv), rows)
        index[:, 2] = slot
        return index

    def _smaller_batch(self, rows: int, running: int) -> int:
        """The batch to decode `running` rows in when the current one has `rows`: halved while the running
        rows fit and it stays >= compact_below; `rows` itself when no halving applies."""
        if not self.compact_below:
            return rows
        to = rows
        while -(-to // 2) >= max(running, self.compact_below):
            to = -(-to // 2)
        return to

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 keys: Optional[Sequence[Sequence[int]]] = None) -> RolloutOutput:
        """n samples per prompt. `keys[i]` (ints) names prompt i for the random streams (default: its
        position): sample j of prompt i draws from (params.seed, *keys[i], j) on every rank and layout,
        so generating in chunks of max_num_seqs rows gives the same samples as all at once."""
        params.validate()
        if len(prompts) == 0:
            raise ConfigError("generate: the prompt batch is empty")
        keys = [(i,) for i in range(len(prompts))] if keys is None else keys
        if len(keys) != len(prompts):
            raise ConfigError(f"generate: {len(keys)} sampling keys for {len(prompts)} prompts")
        per_chunk = max(1, self.max_num_seqs // params.n) if self.max_num_seqs else len(prompts)
        if per_chunk >= len(prompts):
            return self._generate(prompts, params, keys)
        parts = [self._generate(prompts[i:i + per_chunk], params, keys[i:i + per_chunk])
                 for i in range(0, len(prompts), per_chunk)]
        return RolloutOutput(
            [row for p in parts for row in p.prompt_ids], np.concatenate([p.response_ids for p in parts]),
            np.concatenate([p.response_mask for p in parts]), np.concatenate([p.logprobs for p in parts]),
            [r for p in parts for r in p.finish_reason],
            np.concatenate([p.prompt_index + k * per_chunk for k, p in enumerate(parts)]),
            sum(p.seconds for p in parts), np.concatenate([p.loss_mask for p in parts]),
            np.concatenate([p.tool_calls for p in parts]), [t for p in parts for t in p.turns],
            None if parts[0].prompt_routing is None else [r for p in parts for r in p.prompt_routing],
            None if parts[0].response_routing is None else np.concatenate([p.response_routing for p in parts]))

    def _start(self, prompts, params: SamplingParams, keys):
        """What a single-turn generate and an episode both begin with: the prompts checked, left-padded to the
        bucket and prefilled once each, their logits repeated for the n samples, the repetition penalty's seen
        tokens, the rows' random draws and (MoE) the routing record. Returns (lengths, p_len, total, mask,
        logits (rows, V), seen, uniforms, RoutingRecord or None)."""
        cfg = self.model.config
        lengths = np.array([len(p) for p in prompts])
        if lengths.min() == 0:
            raise ConfigError(f"generate: prompt {int(np.argmin(lengths))} is empty")
        p_len = int(-(-lengths.max() // self.prompt_bucket) * self.prompt_bucket)
        total = p_len + params.max_tokens
        if total > cfg.max_position_embedding:
            raise ConfigError(f"generate: prompt bucket {p_len} + max_tokens {params.max_tokens} = {total} exceeds "
                              f"the model's max_position_embedding={cfg.max_position_embedding}; the longest "
                              f"prompt has {lengths.max()} tokens")
        uniforms = None if params.greedy else row_uniforms(params.seed, keys, params.n, params.max_tokens)
        b, n = len(prompts), params.n
        ids, mask = left_pad(prompts, p_len, self.pad_token_id)
        logits, experts = _outputs(self._prefill(b, p_len, total, n)(
            Tensor(ids.astype(np.int32)), Tensor(position_ids(mask)), causal_bias(mask)))
        logits = np.repeat(logits, n, axis=0)                                      # (rows, V)
        record = None
        if experts is not None:
            record = RoutingRecord(b * n, params.max_tokens, experts.shape[0], experts.shape[-1])
            record.prefilled(experts, lengths, p_len, n)
        seen = None
        if params.repetition_penalty != 1.0:
            seen = np.zeros((b * n, cfg.vocab_size), bool)
            for i, p in enumerate(prompts):
                seen[i * n:(i + 1) * n, p] = True
        return lengths, p_len, total, mask, logits, seen, uniforms, record

    def _generate(self, prompts, params: SamplingParams, keys) -> RolloutOutput:
        if self.tools is not None:
            return self._generate_episodes(prompts, params, keys, self.tools)
        t0 = time.time()
        lengths, p_len, total, mask, logits, seen, uniforms, record = self._start(prompts, params, keys)
        b, n = len(prompts), params.n
        rows = b * n
        out_ids = np.full((rows, params.max_tokens), self.pad_token_id, np.int64)
        out_mask = np.zeros((rows, params.max_tokens), np.int64)
        out_logp = np.zeros((rows, params.max_tokens), np.float32)
        done = np.zeros(rows, bool)
        eos = np.array(params.eos_token_ids, np.int64)
        # per decoded row ("slot"): which sequence it carries (`real` False: a filler after compaction), its
        # key validity over the cache (real prompt tokens, then generated positions as they fill) and the
        # position of its next token
        seq_of = np.arange(rows)
        real = np.ones(rows, bool)
        key_ok = np.zeros((rows, total), bool)
        key_ok[:, :p_len] = np.repeat(mask, n, axis=0).astype(bool)
        next_pos = np.repeat(lengths, n).astype(np.int32)
        batch = rows
        for t in range(params.max_tokens):
            running = real & ~done[seq_of]
            seqs = seq_of[running]
            suppress_eos = t < params.min_tokens
            live = logits if running.all() else logits[running]
            scores = process_logits(live, params, None if seen is None else seen[seqs], suppress_eos=suppress_eos)
            tokens, logp = sample(scores, params, None if uniforms is None else uniforms[seqs, t])
            if params.reshapes_distribution(suppress_eos):     # report the log-prob convention's value
                logp = token_logprobs(live, tokens, params.logprob_temperature)
            out_ids[seqs, t] = tokens
            out_mask[seqs, t] = 1
            out_logp[seqs, t] = logp
            if seen is not None:
                seen[seqs, tokens] = True
            done[seqs] |= np.isin(tokens, eos)
            if done.all() or t == params.max_tokens - 1:
                break
            feed = np.full(batch, self.pad_token_id, np.int32)
            feed[running] = np.where(done[seqs], self.pad_token_id, tokens)
            still = np.flatnonzero(real & ~done[seq_of])
            smaller = self._smaller_batch(batch, len(still))
            if smaller < batch:            # gather the running rows' caches into a smaller batch
                keep = np.concatenate([still, np.full(smaller - len(still), still[0])]).astype(np.int32)
                self._compact(batch, smaller, total)(Tensor(keep))
                seq_of, key_ok, next_pos, feed = seq_of[keep], key_ok[keep], next_pos[keep], feed[keep]
                real = np.arange(smaller) < len(still)
                batch = smaller
            slot = p_len + t
            bias = np.where(key_ok, 0.0, NEG_INF).astype(np.float32)[:, None, None, :]   # the cache before slot
            key_ok[:, slot] = True
            logits, experts = _outputs(self._decode(batch, total)(
                Tensor(feed[:, None]), Tensor(next_pos[:, None]), Tensor(bias), Tensor(self._kv_index(batch, slot)),
                Tensor(np.ones((batch, 1, 1, 1), np.float32))))
            if record is not None:              # the rows that fed response token t
                fed = np.flatnonzero(real & ~done[seq_of])
                record.decoded(experts, fed, seq_of[fed], t)
            self.decoded_rows += batch
            next_pos = next_pos + 1
        reasons = ["stop" if d else "length" for d in done]
        prompt_rows = [list(prompts[i]) for i in range(b) for _ in range(n)]
        return RolloutOutput(prompt_rows, out_ids, out_mask, out_logp, reasons,
                             np.repeat(np.arange(b), n), time.time() - t0,
                             **({} if record is None else record.fields()))

    def _draw(self, logits, params: SamplingParams, seen, suppress_eos: bool, u, seqs, positions):
        """The next tokens and their log-probs (the log-prob convention) for rows `seqs` at response `positions`
        (an episode's draw; tests script an episode by overriding it)."""
        scores = process_logits(logits, params, seen, suppress_eos=suppress_eos)
        tokens, logp = sample(scores, params, u)
        if params.reshapes_distribution(suppress_eos):
            logp = token_logprobs(logits, tokens, params.logprob_temperature)
        return tokens, logp

    def _generate_episodes(self, prompts, params: SamplingParams, keys, tools) -> RolloutOutput:
        """Multi-turn episodes in the response width params.max_tokens (tools.max_total_response_length, when
        set, ends them earlier). Per sequence: `n_out` response tokens written (the model's and the tools'),
        `n_fed` of them in the KV cache; response token k sits at cache slot p_len + k and position
        prompt length + k, whichever turn it belongs to. A decode step feeds each row's next unfed token; a row
        samples when all its tokens are fed. Random draws are keyed by (seed, key, sample) and the response
        position, so a trajectory does not depend on the batch it ran in or on when its tools answered."""
        width = params.max_tokens
        budget = min(tools.max_total_response_length or width, width)
        t0 = time.time()
        lengths, p_len, total, mask, logits, seen, uniforms, record = self._start(prompts, params, keys)
        b, n = len(prompts), params.n
        rows = b * n
        out_ids = np.full((rows, width), self.pad_token_id, np.int64)
        out_mask = np.zeros((rows, width), np.int64)
        out_loss = np.zeros((rows, width), np.int64)
        out_logp = np.zeros((rows, width), np.float32)
        n_out = np.zeros(rows, np.int64)
        n_fed = np.zeros(rows, np.int64)
        n_model = np.zeros(rows, np.int64)
        turn_start = np.zeros(rows, np.int64)
        calls_made = np.zeros(rows, np.int64)
        turns = [[] for _ in range(rows)]
        done = np.zeros(rows, bool)
        reasons = ["length"] * rows
        waiting = {}                                    # seq -> futures of its turn's calls
        paused = np.zeros(rows, bool)                   # waiting for its calls' results
        eos = set(int(e) for e in params.eos_token_ids)
        seq_of = np.arange(rows)
        real = np.ones(rows, bool)
        key_ok = np.zeros((rows, total), bool)
        key_ok[:, :p_len] = np.repeat(mask, n, axis=0).astype(bool)
        fresh = np.ones(rows, bool)                     # per batch row: its logits predict its next token
        batch = rows

        def end_turn(seq):
            if n_out[seq] > turn_start[seq]:
                turns[seq].append((int(turn_start[seq]), int(n_out[seq]), "model"))
            turn_start[seq] = n_out[seq]

        while True:
            # 1. rows whose tokens are all in the cache sample their next token
            pick = np.flatnonzero(real & fresh & ~done[seq_of] & ~paused[seq_of])
            if pick.size:
                seqs = seq_of[pick]
                pos = n_out[seqs]
                tokens = np.zeros(len(pick), np.int64)
                logp = np.zeros(len(pick), np.float32)
                suppress = n_model[seqs] < params.min_tokens
                for flag in (False, True):
                    sel = np.flatnonzero(suppress == flag)
                    if not sel.size:
                        continue
                    tokens[sel], logp[sel] = self._draw(
                        logits[pick[sel]], params, None if seen is None else seen[seqs[sel]], bool(flag),
                        None if uniforms is None else uniforms[seqs[sel], pos[sel]], seqs[sel], pos[sel])
                out_ids[seqs, pos] = tokens
                out_mask[seqs, pos] = 1
                out_loss[seqs, pos] = 1
                out_logp[seqs, pos] = logp
                n_out[seqs] += 1
                n_model[seqs] += 1
                if seen is not None:
                    seen[seqs, tokens] = True
                for seq, tok in zip(seqs.tolist(), tokens.tolist()):
                    if tok in eos:
                        done[seq], reasons[seq] = True, "stop"
                    elif n_out[seq] >= budget:
                        done[seq] = True
                    elif tools.may_end_turn(tok) and tools.turn_stops(out_ids[seq, turn_start[seq]:n_out[seq]]):
                        if calls_made[seq] >= tools.max_tool_calls:
                            done[seq], reasons[seq] = True, "tool_calls"
                        else:
                            calls = tools.calls(out_ids[seq, turn_start[seq]:n_out[seq]],
                                                tools.max_tool_calls - calls_made[seq])
                            calls_made[seq] += len(calls)
                            waiting[seq] = tools.submit(calls)
                            paused[seq] = True
                    if done[seq] or seq in waiting:
                        end_turn(seq)
            fresh[:] = False
            # 2. rows whose calls are answered get the tool tokens appended (present, not trained)
            for seq in [s for s, futs in waiting.items() if all(f.done() for f in futs)]:
                delta = tools.tokens([f.result() for f in waiting.pop(seq)])
                paused[seq] = False
                take = delta[:budget - n_out[seq]]
                start = n_out[seq]
                out_ids[seq, start:start + len(take)] = take
                out_mask[seq, start:start + len(take)] = 1
                n_out[seq] += len(take)
                if seen is not None:
                    seen[seq, take] = True
                turns[seq].append((int(start), int(n_out[seq]), "tool"))
                turn_start[seq] = n_out[seq]
                if len(take) < len(delta) or n_out[seq] >= budget:
                    done[seq] = True                    # cut: no room for the model's next turn
            # 3. who feeds a token this step
            feeding = real & ~done[seq_of] & (n_fed[seq_of] < n_out[seq_of])
            if not feeding.any():
                if waiting:
                    wait([f for futs in waiting.values() for f in futs if not f.done()], return_when=FIRST_COMPLETED)
                    continue
                break
            still = np.flatnonzero(real & ~done[seq_of])
            smaller = self._smaller_batch(batch, len(still))
            if smaller < batch:
                keep = np.concatenate([still, np.full(smaller - len(still), still[0])]).astype(np.int32)
                self._compact(batch, smaller, total)(Tensor(keep))
                seq_of, key_ok = seq_of[keep], key_ok[keep]
                real = np.arange(smaller) < len(still)
                feeding = real & ~done[seq_of] & (n_fed[seq_of] < n_out[seq_of])
                batch = smaller
                fresh = np.zeros(batch, bool)
            # 4. one decode step: each feeding row's next token at its own slot; idle rows (waiting for tools,
            # finished, fillers) write at their next free slot, which is not attended to and later overwritten
            fed_pos = np.minimum(n_fed[seq_of], width - 1)
            slots = (p_len + fed_pos).astype(np.int32)
            feed = np.full(batch, self.pad_token_id, np.int32)
            fb = np.flatnonzero(feeding)
            feed[fb] = out_ids[seq_of[fb], fed_pos[fb]]
            bias = np.where(key_ok, 0.0, NEG_INF).astype(np.float32)[:, None, None, :]   # the cache before slots
            key_ok[fb, slots[fb]] = True
            pos_ids = (lengths[seq_of // n] + fed_pos).astype(np.int32)
            index = self._kv_index(batch, 0)
            index[:, 2] = np.repeat(slots, index.shape[0] // batch)
            write = feeding.astype(np.float32)[:, None, None, None]      # an idle row's slot stays zero
            logits, experts = _outputs(self._decode(batch, total)(Tensor(feed[:, None]), Tensor(pos_ids[:, None]),
                                                                  Tensor(bias), Tensor(index), Tensor(write)))
            if record is not None:
                record.decoded(experts, fb, seq_of[fb], fed_pos[fb])
            self.decoded_rows += batch
            n_fed[seq_of[fb]] += 1
            fresh = np.zeros(batch, bool)
            fresh[fb] = n_fed[seq_of[fb]] == n_out[seq_of[fb]]
        for seq in range(rows):
            end_turn(seq)
        prompt_rows = [list(prompts[i]) for i in range(b) for _ in range(n)]
        return RolloutOutput(prompt_rows, out_ids, out_mask, out_logp, reasons, np.repeat(np.arange(b), n),
                             time.time() - t0, out_loss, calls_made, turns,
                             **({} if record is None else record.fields()))
