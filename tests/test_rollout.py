"""Generation engine: parity with transformers generate, logprobs vs the train model, sampling rules, errors."""
import numpy as np
import pytest

from hf_reference import make_hf_model, tiny_model_kwargs
from model_helpers import load_ours
from mindrlhf.configs import ConfigError, ModelConfig
from mindrlhf.rollout.engine import GenerationEngine
from mindrlhf.rollout.sampling import SamplingParams, apply_repetition_penalty, process_logits
from mindrlhf.trainer.samples import SampleBatch
from mindrlhf.models.padding import left_pad
from mindrlhf.trainer.update.one_graph import ResponseLogProb


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("hf"))
    hf = make_hf_model(d, qkv_bias=True, tie=False, n_kv_heads=2)
    ours = load_ours(d, ModelConfig(**tiny_model_kwargs(True, False, 2)))
    return hf, ours


def _prompts(seed=0, lengths=(5, 9, 3, 7)):
    rs = np.random.RandomState(seed)
    return [rs.randint(3, 160, size=n).tolist() for n in lengths]


def test_greedy_matches_transformers_generate(models):
    import torch
    hf, ours = models
    prompts = _prompts()
    eos = 7
    out = GenerationEngine(ours, pad_token_id=0, prompt_bucket=8).generate(
        prompts, SamplingParams(temperature=0, max_tokens=14, eos_token_ids=[eos]))
    for i, p in enumerate(prompts):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=14, do_sample=False, pad_token_id=0,
                          eos_token_id=eos)[0, len(p):].tolist()
        n = int(out.response_mask[i].sum())
        assert out.response_ids[i, :n].tolist() == ref
        assert out.finish_reason[i] == ("stop" if ref[-1] == eos else "length")


def test_sampled_logprobs_equal_train_model_logprobs(models):
    _, ours = models
    prompts = _prompts(1)
    params = SamplingParams(temperature=1.0, max_tokens=10, n=3, eos_token_ids=[7], seed=3)
    out = GenerationEngine(ours, pad_token_id=0, prompt_bucket=16).generate(prompts, params)
    assert out.response_ids.shape == (len(prompts) * 3, 10)
    ids, mask = left_pad(out.prompt_ids, 16, 0)
    batch = SampleBatch(ids, mask, out.response_ids, out.response_mask, out.logprobs,
                        out.prompt_index, np.zeros(len(ids), np.int64))
    from mindrlhf.trainer.samples import training_tensors
    t = training_tensors(batch)
    logp = ResponseLogProb(ours, 10)(t["input_ids"], t["position_ids"], t["bias"], t["labels"])
    m = out.response_mask.astype(bool)
    assert np.abs(logp.asnumpy()[m] - out.logprobs[m]).max() <= 1e-4
    # n samples of one prompt differ (sampling), but share the prompt
    assert out.prompt_ids[0] == out.prompt_ids[1] == out.prompt_ids[2]
    assert len({tuple(r) for r in out.response_ids[:3]}) > 1


def test_same_seed_same_samples(models):
    _, ours = models
    eng = GenerationEngine(ours, pad_token_id=0, prompt_bucket=8)
    params = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=8, n=2, seed=11)
    a = eng.generate(_prompts(2), params).response_ids
    b = eng.generate(_prompts(2), params).response_ids
    assert np.array_equal(a, b)


def test_top_k_one_equals_greedy(models):
    _, ours = models
    eng = GenerationEngine(ours, pad_token_id=0, prompt_bucket=8)
    greedy = eng.generate(_prompts(), SamplingParams(temperature=0, max_tokens=8)).response_ids
    topk = eng.generate(_prompts(), SamplingParams(temperature=0.7, top_k=1, max_tokens=8, seed=5)).response_ids
    assert np.array_equal(greedy, topk)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_suppresses_eos(temperature):
    # temperature 1 and no filters: process_logits hands back the caller's array untouched; the suppression
    # must write into a copy, never into the logits the engine reads again for the log-prob
    logits = np.zeros((2, 10), np.float32)
    logits[:, 3] = 50.0     # EOS would win
    p = SamplingParams(temperature=temperature, eos_token_ids=[3], max_tokens=4, min_tokens=2)
    scores = process_logits(logits, p, None, suppress_eos=True)
    assert np.all(np.isneginf(scores[:, 3])) and (np.argmax(scores, -1) != 3).all()
    assert logits[0, 3] == 50.0
    assert (np.argmax(process_logits(logits, p, None, suppress_eos=False), -1) == 3).all()


def test_min_tokens_in_generation(models):
    _, ours = models
    eng = GenerationEngine(ours, pad_token_id=0, prompt_bucket=8)
    free = eng.generate(_prompts(), SamplingParams(temperature=0, max_tokens=6))
    eos = int(free.response_ids[0, 0])  # the first greedy token of prompt 0 becomes "EOS"
    stopped = eng.generate(_prompts(), SamplingParams(temperature=0, max_tokens=6, eos_token_ids=[eos]))
    assert stopped.response_mask[0].sum() == 1
    held = eng.generate(_prompts(), SamplingParams(temperature=0, max_tokens=6, eos_token_ids=[eos], min_tokens=3))
    assert held.response_mask[0].sum() >= 3 and eos not in held.response_ids[0, :3].tolist()


def test_repetition_penalty_matches_hf_definition():
    import torch
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor
    rs = np.random.RandomState(0)
    logits = rs.randn(2, 12).astype(np.float32)
    seen_ids = [[1, 4, 4, 7], [0, 11, 2, 2]]
    seen = np.zeros((2, 12), bool)
    for i, ids in enumerate(seen_ids):
        seen[i, ids] = True
    ours = apply_repetition_penalty(logits.astype(np.float64), seen, 1.3)
    ref = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor(seen_ids), torch.tensor(logits)).numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-6)


def test_top_p_and_min_p_filtering():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    kept = np.isfinite(process_logits(logits, SamplingParams(top_p=0.8), None, False))
    assert kept.tolist() == [[True, True, False, False]]
    kept = np.isfinite(process_logits(logits, SamplingParams(min_p=0.2), None, False))
    assert kept.tolist() == [[True, True, True, False]]


def test_bad_inputs(models):
    _, ours = models
    eng = GenerationEngine(ours, pad_token_id=0, prompt_bucket=8)
    with pytest.raises(ConfigError, match="exceeds the model's max_position_embedding=64"):
        eng.generate([[5] * 60], SamplingParams(max_tokens=8))
    with pytest.raises(ConfigError, match="max_tokens: expected > 0"):
        eng.generate(_prompts(), SamplingParams(max_tokens=0))
    with pytest.raises(ConfigError, match="prompt batch is empty"):
        eng.generate([], SamplingParams(max_tokens=4))


def test_vllm_backend_refused_off_ascend(models):
    from mindrlhf.rollout.backends import make_engine
    _, ours = models
    with pytest.raises(ConfigError, match="vllm_mindspore runs only on Ascend .* Use rollout_backend: mindspore"):
        make_engine("vllm_mindspore", ours, 0, 8)
    assert isinstance(make_engine("mindspore", ours, 0, 8), GenerationEngine)


def test_inverse_cdf_sampling_follows_the_weights():
    """Blockwise inverse-CDF sampling: frequencies match the weights (vocabulary not a multiple of the block,
    zero-weight tokens never drawn) and equal a plain cumulative-sum search for the same uniforms."""
    from mindrlhf.rollout.sampling import inverse_cdf
    rng = np.random.default_rng(0)
    v = 300
    weights = rng.random(v).astype(np.float32) ** 4
    weights[::7] = 0.0
    u = rng.random(100_000)
    got = inverse_cdf(np.broadcast_to(weights, (len(u), v)), u, block=64)
    cdf = np.cumsum(weights.astype(np.float64))
    plain = np.searchsorted(cdf, u * cdf[-1], side="right")
    assert (got == plain).mean() > 0.9999                  # differ only where float32 rounding ties
    assert not np.isin(got, np.arange(0, v, 7)).any()
    freq = np.bincount(got, minlength=v) / len(u)
    p = weights / weights.sum()
    assert np.abs(freq - p).max() < 5 * np.sqrt(p.max() / len(u))


def _numpy_logprobs(ours, prompts_ids, response_ids, temperature):
    """Independent reference: log softmax(full logits / T) of each response token, from one forward pass."""
    from model_helpers import model_inputs
    seq = np.concatenate([prompts_ids, response_ids], 1)
    logits = ours.full_logits(*model_inputs(seq[:, :-1])).asnumpy().astype(np.float64) / temperature
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    r = response_ids.shape[1]
    return np.take_along_axis(logp[:, -r:], response_ids[:, :, None], -1)[..., 0]


def test_logprob_convention_at_temperature_with_filters(models):
    """Rollout, train and an independent numpy pass agree on log softmax(logits / T), whatever top-k, top-p,
    repetition penalty and min_tokens did to the sampled distribution."""
    from mindrlhf.trainer.samples import training_tensors
    _, ours = models
    prompts = [[5, 9, 3, 17, 4, 8, 22, 6]] * 2 + [[11, 2, 40, 3, 3, 7, 9, 15]]     # equal lengths: no padding
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.2, min_tokens=2,
                            max_tokens=10, n=2, eos_token_ids=[7], seed=4)
    out = GenerationEngine(ours, pad_token_id=0, prompt_bucket=8).generate(prompts, params)
    ids, mask = left_pad(out.prompt_ids, 8, 0)
    batch = SampleBatch(ids, mask, out.response_ids, out.response_mask, out.logprobs, out.prompt_index,
                        np.zeros(len(ids), np.int64))
    t = training_tensors(batch)
    train = ResponseLogProb(ours, 10, temperature=0.7)(t["input_ids"], t["position_ids"], t["bias"], t["labels"])
    m = out.response_mask.astype(bool)
    reference = _numpy_logprobs(ours, ids, out.response_ids, 0.7)
    assert np.abs(out.logprobs[m] - reference[m]).max() <= 1e-4
    assert np.abs(train.asnumpy()[m] - reference[m]).max() <= 1e-4
    untempered = _numpy_logprobs(ours, ids, out.response_ids, 1.0)
    assert np.abs(out.logprobs[m] - untempered[m]).max() > 1e-2       # the temperature does matter here


def test_top_k_and_top_p_keep_what_transformers_keeps():
    import torch
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    rs = np.random.RandomState(1)
    logits = (3 * rs.randn(6, 50)).astype(np.float32)
    for top_k, top_p in ((5, 1.0), (0, 0.8), (12, 0.7)):
        ours = np.isfinite(process_logits(logits, SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p),
                                          None, False))
        x = TemperatureLogitsWarper(0.8)(None, torch.tensor(logits))
        if top_k:
            x = TopKLogitsWarper(top_k)(None, x)
        if top_p < 1:
            x = TopPLogitsWarper(top_p)(None, x)
        assert np.array_equal(ours, np.isfinite(x.numpy())), (top_k, top_p)
        assert 1 <= ours.sum(1).min() and (ours.sum(1) < 50).all()


def test_samples_depend_on_their_key_not_on_the_batch(models):
    """Sample j of a prompt is drawn from (seed, key, j): alone or beside other prompts, on any rank."""
    _, ours = models
    eng = GenerationEngine(ours, pad_token_id=0, prompt_bucket=8)
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=8, n=3, seed=5)
    a, b = _prompts(3, lengths=(5, 7))
    both = eng.generate([a, b], params, keys=[(2, 0), (2, 1)])
    alone = eng.generate([b], params, keys=[(2, 1)])
    assert np.array_equal(both.response_ids[3:], alone.response_ids)
    np.testing.assert_allclose(both.logprobs[3:], alone.logprobs, atol=1e-5)
    other_step = eng.generate([b], params, keys=[(3, 1)])
    assert not np.array_equal(other_step.response_ids, alone.response_ids)


def test_finished_rows_leave_the_decode_batch(models):
    """Once at most half of the decoded rows still run, their caches move into a smaller batch: fewer rows
    are decoded, and every sample (tokens, log-probs, finish reason) is the one decoding all rows gives."""
    _, ours = models
    params = SamplingParams(temperature=1.0, max_tokens=12, n=8, eos_token_ids=list(range(3, 23)), seed=7,
                            repetition_penalty=1.1)
    prompts = _prompts(4, lengths=(5, 9))
    every_row = GenerationEngine(ours, pad_token_id=0, prompt_bucket=8, compact_below=0)
    compacting = GenerationEngine(ours, pad_token_id=0, prompt_bucket=8, compact_below=2)
    a, b = every_row.generate(prompts, params), compacting.generate(prompts, params)
    lengths = a.response_lengths
    assert lengths.min() <= 3 and lengths.max() >= 9, lengths      # ragged, or the test means nothing
    assert np.array_equal(a.response_ids, b.response_ids)
    assert np.array_equal(a.response_mask, b.response_mask)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert a.finish_reason == b.finish_reason
    assert every_row.decoded_rows == 16 * (lengths.max() - 1)
    assert compacting.decoded_rows < 0.7 * every_row.decoded_rows, (compacting.decoded_rows, every_row.decoded_rows)
