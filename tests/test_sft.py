"""python -m mindrlhf.sft: chat conversations (tool calls and results included) rendered by the folder's chat
template, the loss on the assistant's tokens only; its loss and every gradient against transformers on the same
batch; the command end to end (checkpoint GRPO loads, HF export transformers loads, eval loss); bad rows named."""
import json
import os

import numpy as np
import pytest

from data_helpers import make_tokenizer_files, write_jsonl
from hf_reference import make_hf_model, tiny_model_kwargs

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")
VOCAB = 416


def conversation(i):
    a, b = 3 + i % 7, 4 + i % 5
    return {"messages": [
        {"role": "user", "content": f"{a} times {b}?"},
        {"role": "assistant", "content": f"<tool_call>{{\"name\": \"calc\", \"arguments\": {{\"x\": "
                                         f"\"{a}*{b}\"}}}}</tool_call>"},
        {"role": "tool", "content": str(a * b)},
        {"role": "assistant", "content": f"It is {a * b}.\n#### {a * b}"}]}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An HF folder: a random Qwen2 of the tokenizer's vocabulary, tokenizer.json and a ChatML template."""
    from mindrlhf.data.tokenizer import load_tokenizer
    root = str(tmp_path_factory.mktemp("sft"))
    texts = [json.dumps(conversation(i)) for i in range(50)]
    vocab, merges = make_tokenizer_files(os.path.join(root, "tok"), vocab_size=400, extra_texts=texts)
    out = os.path.join(root, "model")
    hf = make_hf_model(out, qkv_bias=True, tie=False, n_kv_heads=2, vocab=VOCAB)
    load_tokenizer(vocab, merges)._tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as fh:
        json.dump({"chat_template": CHATML, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, fh)
    data = write_jsonl(os.path.join(root, "train.jsonl"), [conversation(i) for i in range(12)])
    held = write_jsonl(os.path.join(root, "eval.jsonl"), [conversation(i) for i in range(20, 24)])
    return {"root": root, "model": out, "hf": hf, "train": data, "eval": held}


def _table(folder, width=64):
    from mindrlhf.data.chat_template import ChatTemplate
    from mindrlhf.data.conversations import tokenize_conversations
    from mindrlhf.data.tokenizer import load_tokenizer
    tok = load_tokenizer(folder["model"])
    return tok, tokenize_conversations(folder["train"], ChatTemplate(folder["model"]), tok, width, tok.pad_token_id)


def test_the_mask_is_the_assistant_turns_and_their_end_of_turn_token(folder):
    tok, table = _table(folder)
    row = conversation(0)
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in row["messages"])
    n = table.lengths[0]
    assert table.truncated == 0
    assert table.ids[0, :n].tolist() == tok.encode(text)                 # one encoding of the whole text
    trained = table.ids[0, :n][table.loss_mask[0, :n] == 1]
    want = "".join(m["content"] + "<|im_end|>" for m in row["messages"] if m["role"] == "assistant")
    assert tok.decode(trained.tolist(), skip_special_tokens=False) == want
    untrained = tok.decode(table.ids[0, :n][table.loss_mask[0, :n] == 0].tolist(), skip_special_tokens=False)
    assert "3 times 4?" in untrained
    assert str(3 * 4) + "<|im_end|>" in untrained                        # the tool's result is not trained


def test_loss_and_gradients_equal_transformers(folder):
    """The SFT loss (mean over the batch's assistant tokens) and every parameter's gradient against
    transformers on the same rows: loss to 1e-5, gradients to 1e-4 of the largest (float32 model noise)."""
    import mindspore as ms
    import torch
    from mindspore import Tensor
    from model_helpers import load_ours
    from mindrlhf.checkpoint.hf_interop import ms_to_hf_name
    from mindrlhf.configs import ModelConfig
    from mindrlhf.trainer.sft import SFTLoss, sft_inputs
    _, table = _table(folder)
    ids, mask, lengths = table.ids[:4], table.loss_mask[:4], table.lengths[:4]
    ours = load_ours(folder["model"], ModelConfig(**tiny_model_kwargs(True, False, 2, vocab=VOCAB)))
    inputs = sft_inputs(ids, mask, lengths)
    tokens = float(inputs[-1].asnumpy().sum())
    params = list(ours.trainable_params())
    loss, grads = ms.value_and_grad(SFTLoss(ours), None, params)(*inputs, Tensor(np.float32(tokens)))
    hf = folder["hf"]
    hf.zero_grad()
    present = (np.arange(ids.shape[1])[None] < lengths[:, None]).astype(np.int64)
    logits = hf(torch.tensor(ids[:, :-1]), attention_mask=torch.tensor(present[:, :-1])).logits
    logp = torch.log_softmax(logits.double(), -1).gather(-1, torch.tensor(ids[:, 1:])[..., None])[..., 0]
    m = torch.tensor(mask[:, 1:] * present[:, 1:], dtype=torch.float64)
    ref = -(logp * m).sum() / m.sum()
    ref.backward()
    assert abs(float(loss.asnumpy()) - float(ref)) <= 1e-5 * float(ref)
    named = dict(hf.named_parameters())
    for p, g in zip(params, grads):
        want = named[ms_to_hf_name(p.name)].grad.numpy()
        assert np.abs(g.asnumpy() - want).max() <= 1e-4 * np.abs(want).max(), p.name


def test_the_command_trains_saves_a_step_grpo_loads_and_exports_hf(folder, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM
    from mindrlhf import sft
    from mindrlhf.checkpoint.model_io import model_state
    from mindrlhf.configs import ModelConfig
    from mindrlhf.models.qwen2 import CausalLM
    from mindrlhf.trainer.build import load_model_weights
    out = str(tmp_path / "out")
    rows = sft.train(sft.config_from_argv([
        "--model", folder["model"], "--dataset", folder["train"], "--eval_dataset", folder["eval"], "--output_dir",
        out, "--max_length", "64", "--batch_size", "4", "--epochs", "3", "--lr", "3e-3", "--eval_steps", "3",
        "--save_steps", "3", "--progress", "False"]), log=lambda *a: None)
    assert [r["step"] for r in rows] == list(range(1, 10))              # 12 conversations / 4 x 3 epochs
    assert rows[-1]["loss"] < 0.7 * rows[0]["loss"]                       # it learns the conversations
    assert rows[-1]["eval_loss"] < rows[2]["eval_loss"]
    with open(os.path.join(out, "metrics.jsonl")) as fh:
        assert [json.loads(line)["step"] for line in fh] == list(range(1, 10))
    step = os.path.join(out, "step_000009")
    assert os.path.isfile(os.path.join(step, "COMPLETE"))
    loaded = CausalLM(ModelConfig(**tiny_model_kwargs(True, False, 2, vocab=VOCAB)))
    load_model_weights(loaded, step, lambda *a: None)                      # what --load_sft_checkpoint_train reads
    exported = AutoModelForCausalLM.from_pretrained(os.path.join(out, "hf_policy"), torch_dtype=torch.float32)
    from mindrlhf.checkpoint.hf_interop import ms_to_hf_name
    hf_state = {k: v.detach().numpy() for k, v in exported.state_dict().items()}
    for name, value in model_state(loaded).items():
        assert np.array_equal(value, hf_state[ms_to_hf_name(name)]), name
    before = {k: v.detach().numpy() for k, v in folder["hf"].state_dict().items()}
    assert any(not np.array_equal(before[k], hf_state[k]) for k in before)     # the weights moved


@pytest.mark.parametrize("row,pattern", [
    ({"text": "hi"}, r"train.jsonl:2: expected an object with a non-empty `messages` list"),
    ({"messages": [{"role": "robot", "content": "x"}]}, r"train.jsonl:2: messages\[0\].role: expected one of"),
    ({"messages": [{"role": "user", "content": "x"}]}, r"train.jsonl:2: no assistant message"),
])
def test_bad_rows_are_named(folder, tmp_path, row, pattern):
    from mindrlhf.configs import ConfigError
    from mindrlhf.data.chat_template import ChatTemplate
    from mindrlhf.data.conversations import tokenize_conversations
    from mindrlhf.data.tokenizer import load_tokenizer
    path = write_jsonl(str(tmp_path / "train.jsonl"), [conversation(0), row])
    tok = load_tokenizer(folder["model"])
    with pytest.raises(ConfigError, match=pattern):
        tokenize_conversations(path, ChatTemplate(folder["model"]), tok, 64, tok.pad_token_id)


def test_a_moe_models_loss_and_gradients_with_the_aux_loss_equal_transformers(folder, tmp_path):
    """A Qwen3-MoE's SFT loss with router_aux_loss_coef (0.5 here, so that it shows): every gradient against
    transformers' loss + coef x aux_loss (output_router_logits on; the aux over the attention-masked tokens, our
    real input tokens) to 1e-4 of the largest; without the routing pass's gradient the routers' are off by more."""
    import mindspore as ms
    import torch
    from mindspore import Tensor
    from hf_reference import hf_grad, make_qwen3_moe_model, qwen3_moe_model_kwargs
    from model_helpers import load_ours
    from mindrlhf.configs import ModelConfig
    from mindrlhf.parallel.mesh import Mesh
    from mindrlhf.trainer.sft import SFTLoss, aux_loss_gradient, sft_inputs
    from mindrlhf.trainer.update.one_graph import ModelRouting
    _, table = _table(folder)
    ids, mask, lengths = table.ids[:4], table.loss_mask[:4], table.lengths[:4]
    assert lengths.max() < ids.shape[1]            # every row's real tokens are all model inputs
    hf = make_qwen3_moe_model(str(tmp_path), vocab=VOCAB, aux_coef=0.5)
    cfg = ModelConfig(**qwen3_moe_model_kwargs(vocab=VOCAB, aux_coef=0.5))
    ours = load_ours(str(tmp_path), cfg)
    inputs = sft_inputs(ids, mask, lengths)
    tokens = Tensor(np.float32(inputs[-1].asnumpy().sum()))
    grad, aux = aux_loss_gradient(ModelRouting(ours), inputs, lengths, 0.5, Mesh(dp=1, tp=1))
    params = list(ours.trainable_params())
    loss, grads = ms.value_and_grad(SFTLoss(ours), None, params)(*inputs, tokens, grad)
    _, plain = ms.value_and_grad(SFTLoss(ours), None, params)(*inputs, tokens)
    present = (np.arange(ids.shape[1])[None] < lengths[:, None]).astype(np.int64)
    out = hf(torch.tensor(ids[:, :-1]), attention_mask=torch.tensor(present[:, :-1]), output_router_logits=True)
    logp = torch.log_softmax(out.logits.double(), -1).gather(-1, torch.tensor(ids[:, 1:])[..., None])[..., 0]
    m = torch.tensor(mask[:, 1:] * present[:, 1:], dtype=torch.float64)
    ce = -(logp * m).sum() / m.sum()
    (ce + 0.5 * out.aux_loss).backward()
    assert abs(float(loss.asnumpy()) - float(ce)) <= 1e-5 * float(ce)       # the value: the token loss alone
    assert abs(aux - float(out.aux_loss)) <= 1e-5 * float(out.aux_loss)
    named = dict(hf.named_parameters())
    router_off = 0.0
    for p, g, g0 in zip(params, grads, plain):
        want = hf_grad(named, p.name, cfg)
        scale = np.abs(want).max()
        assert np.abs(g.asnumpy() - want).max() <= 1e-4 * scale, p.name
        if "router" in p.name:
            router_off = max(router_off, np.abs(g0.asnumpy() - want).max() / scale)
    assert router_off > 1e-2


# ~12 s; the MoE loss and gradients with the aux loss against transformers stay in the default run
@pytest.mark.slow
def test_the_command_on_a_moe_folder_trains_with_the_aux_loss_and_says_what_is_inert(folder, tmp_path):
    """--model a Qwen3-MoE folder: start-up says the aux loss joins the loss and which config.json keys are inert
    (only GRPO's start-up reported them); each step reports moe/aux_loss."""
    import shutil
    from hf_reference import make_qwen3_moe_model
    from mindrlhf import sft
    moe = str(tmp_path / "moe")
    make_qwen3_moe_model(moe, vocab=VOCAB)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(folder["model"], name), moe)
    lines = []
    rows = sft.train(sft.config_from_argv([
        "--model", moe, "--dataset", folder["train"], "--output_dir", str(tmp_path / "out"), "--max_length", "64",
        "--batch_size", "4", "--total_steps", "2", "--progress", "False"]), log=lambda *a: lines.append(" ".join(a)))
    assert [r["step"] for r in rows] == [1, 2] and all(1.0 <= r["moe/aux_loss"] <= 4.0 for r in rows)
    said = "\n".join(lines)
    assert f"aux loss: {moe}: router_aux_loss_coef 0.01 x the load-balancing loss" in said
    assert f"ignored in {moe}: " in said and "output_router_logits" in said


def test_expert_parallel_that_cannot_be_laid_out_is_refused_by_its_flag(folder, tmp_path):
    """--expert_parallel on a dense model, one that does not divide the experts, or more EP ranks than the
    data-parallel ones, and --moe_tp_extend_ep on a dense model: a ConfigError naming the flag, before any model
    is built."""
    import shutil
    from hf_reference import make_qwen3_moe_model
    from mindrlhf import sft
    from mindrlhf.configs import ConfigError
    moe = str(tmp_path / "moe")
    make_qwen3_moe_model(moe, vocab=VOCAB, experts=4)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(folder["model"], name), moe)
    for model, ep, pattern in ((folder["model"], 2, r"--expert_parallel=2: the model has no experts \(.*a dense "
                                                    r"model\)"),
                               (moe, 3, r"--expert_parallel=3 does not divide model.model_config.num_experts=4"),
                               (moe, 2, r"--expert_parallel=2 does not divide the data-parallel ranks \(world / "
                                        r"--model_parallel\)=1"),
                               (folder["model"], "whole", r"--moe_tp_extend_ep: the model has no experts")):
        flags = ["--moe_tp_extend_ep", "true"] if ep == "whole" else ["--expert_parallel", str(ep)]
        cfg = sft.config_from_argv(["--model", model, "--dataset", folder["train"], "--output_dir",
                                    str(tmp_path / "out"), *flags])
        with pytest.raises(ConfigError, match=pattern):
            sft.train(cfg, log=lambda *a: None)
    assert not os.path.exists(tmp_path / "out" / "step_1")


@pytest.mark.slow       # ~120 s: a single process and three 2-worker msrun jobs
def test_the_command_under_msrun_dp2_tp2_and_ep2_follows_one_process(folder, tmp_path):
    """python -m mindrlhf.sft on a Qwen3-MoE folder (aux loss on: its counts are summed over the DP replicas):
    dp2, tp2 and ep2 under msrun give the single process's per-step loss, gradient norm and aux loss (1e-5
    relative) and its exported weights (1e-5 of the largest; lr 1e-4 as the GRPO layout tests: AdamW turns the last
    bits in which tp2's forward sums differ into ~3% of lr per step where a gradient is small). The ep2 run's last
    step, assembled from its shards by the layout it records (as eval and GRPO's --load_sft_checkpoint_train
    read it), is its export."""
    import shutil
    from hf_reference import make_qwen3_moe_model
    from msrun_util import REPO, run_msrun
    from mindrlhf import sft
    from mindrlhf.checkpoint.hf_interop import iter_hf_as_ms
    from mindrlhf.trainer.metrics import read_metrics
    moe = str(tmp_path / "moe")
    make_qwen3_moe_model(moe, vocab=VOCAB, aux_coef=0.1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(folder["model"], name), moe)
    flags = ["--model", moe, "--dataset", folder["train"], "--max_length", "64", "--batch_size", "4", "--epochs", "2",
             "--lr", "1e-4", "--progress", "False"]
    sft.train(sft.config_from_argv(flags + ["--output_dir", str(tmp_path / "single")]), log=lambda *a: None)
    runs = (("dp2", []), ("tp2", ["--model_parallel", "2"]), ("ep2", ["--expert_parallel", "2"]))
    for name, extra in runs:
        run_msrun(os.path.join(REPO, "mindrlhf", "sft.py"),
                  flags + extra + ["--output_dir", str(tmp_path / name), "--use_parallel", "True"], workers=2,
                  log_dir=str(tmp_path / f"log_{name}"))
    want = read_metrics(str(tmp_path / "single" / "metrics.jsonl"))
    weights = dict(iter_hf_as_ms(str(tmp_path / "single" / "hf_policy")))
    before = dict(iter_hf_as_ms(moe))
    assert len(want) == 6 and max(np.abs(weights[k] - before[k]).max() for k in weights) > 1e-4    # they moved
    for name, _ in runs:
        got = read_metrics(str(tmp_path / name / "metrics.jsonl"))
        for a, b in zip(got, want):
            for key in ("loss", "grad_norm", "moe/aux_loss"):
                assert abs(a[key] - b[key]) <= 1e-5 * abs(b[key]), (name, a["step"], key)
        for key, value in iter_hf_as_ms(str(tmp_path / name / "hf_policy")):
            assert np.abs(value - weights[key]).max() <= 1e-5 * max(1.0, np.abs(weights[key]).max()), (name, key)
    from mindrlhf.configs.compat.sources import load_model_yaml
    from mindrlhf.trainer.checkpointing import policy_tensors, step_dir
    exported = dict(iter_hf_as_ms(str(tmp_path / "ep2" / "hf_policy")))
    steps = dict(policy_tensors(step_dir(str(tmp_path / "ep2"), 6), load_model_yaml(moe).model))
    assert steps.keys() == exported.keys() and all(np.array_equal(steps[k], exported[k]) for k in steps)
