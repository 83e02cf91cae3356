"""Tiny Hugging Face reference models (torch, CPU) with random weights, written as HF safetensors."""
from __future__ import annotations

import os

import numpy as np


def tiny_model_kwargs(qkv_bias=True, tie=False, n_kv_heads=2, vocab=160, layers=2):
    return dict(hidden_size=64, num_layers=layers, num_heads=4, n_kv_heads=n_kv_heads, intermediate_size=96,
                vocab_size=vocab, qkv_has_bias=qkv_bias, tie_word_embeddings=tie, seq_length=64,
                theta=10000.0, rms_norm_eps=1e-6)


def make_hf_model(out_dir, qkv_bias=True, tie=False, n_kv_heads=2, vocab=160, layers=2, seed=0):
    """Build a Qwen2ForCausalLM (qkv bias) or LlamaForCausalLM (no bias) with every weight random."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    common = dict(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=n_kv_heads,
                  intermediate_size=96, vocab_size=vocab, rms_norm_eps=1e-6, rope_theta=10000.0,
                  max_position_embeddings=64, tie_word_embeddings=tie, torch_dtype="float32")
    if qkv_bias:
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common, attention_bias=False, mlp_bias=False))
    return _randomised_and_saved(model, out_dir, seed)


# Qwen3 tiny: head_dim 24 is not hidden / heads (64 / 4 = 16), as Qwen3-0.6B's 128 is not 1024 / 16:
# every place that assumed hidden / heads shows here
QWEN3_HEAD_DIM = 24


def qwen3_model_kwargs(tie=False, n_kv_heads=2, vocab=160, layers=2):
    """Our ModelConfig fields for make_qwen3_model's model."""
    return dict(tiny_model_kwargs(False, tie, n_kv_heads, vocab, layers), head_dim=QWEN3_HEAD_DIM, qk_layernorm=True)


def make_qwen3_model(out_dir, tie=False, n_kv_heads=2, vocab=160, layers=2, seed=0):
    """A Qwen3ForCausalLM with every weight random (q/k norms too), saved as an HF folder."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=n_kv_heads,
                      head_dim=QWEN3_HEAD_DIM, intermediate_size=96, vocab_size=vocab, rms_norm_eps=1e-6,
                      rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=tie, attention_bias=False,
                      use_sliding_window=False, torch_dtype="float32")
    return _randomised_and_saved(Qwen3ForCausalLM(cfg), out_dir, seed)


def _randomised_and_saved(model, out_dir, seed, scales=None):
    """Every weight drawn from `seed`: norms 1 + 0.1 N(0, 1), the rest 0.08 N(0, 1) (or scales[name] N(0, 1))."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_((scales or {}).get(name, 0.08) * torch.randn(p.shape, generator=gen))
    model.eval()
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


def hf_logits(model, ids: np.ndarray, attention_mask: np.ndarray = None) -> np.ndarray:
    import torch
    with torch.no_grad():
        kw = {} if attention_mask is None else {"attention_mask": torch.tensor(attention_mask)}
        return model(torch.tensor(ids, dtype=torch.long), **kw).logits.float().numpy()


def make_hf_classifier(out_dir, qkv_bias=True, vocab=160, layers=2, pad_token_id=0, num_labels=1, seed=0,
                       tokenizer_dir=""):
    """A Qwen2ForSequenceClassification (qkv bias) or LlamaForSequenceClassification (no bias) with every
    weight random (a reward model with num_labels 1), saved with save_pretrained; with `tokenizer_dir`, its
    tokenizer files (vocab.json, merges.txt) copied in, as a reward-model folder ships them."""
    import shutil
    from transformers import LlamaConfig, LlamaForSequenceClassification, Qwen2Config, Qwen2ForSequenceClassification
    common = dict(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, vocab_size=vocab, rms_norm_eps=1e-6, rope_theta=10000.0,
                  max_position_embeddings=64, tie_word_embeddings=False, num_labels=num_labels,
                  pad_token_id=pad_token_id)
    if qkv_bias:
        model = Qwen2ForSequenceClassification(Qwen2Config(**common, use_sliding_window=False))
    else:
        model = LlamaForSequenceClassification(LlamaConfig(**common, attention_bias=False, mlp_bias=False))
    _randomised_and_saved(model, out_dir, seed, {"score.weight": 0.5})
    for name in ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json"):
        if tokenizer_dir and os.path.isfile(os.path.join(tokenizer_dir, name)):
            shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(out_dir, name))
    return model


def hf_scores(model, ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """transformers' sequence-classification scores (B, num_labels) of a padded batch."""
    import torch
    with torch.no_grad():
        return model(torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(attention_mask)).logits.numpy()


# Qwen3-MoE tiny: 4 experts of width 32, top-2; sparse layers by decoder_sparse_step / mlp_only_layers
def qwen3_moe_model_kwargs(layers=2, experts=4, top_k=2, norm_topk_prob=True, sparse_step=1, mlp_only=(),
                           aux_coef=0.01, vocab=160):
    """Our ModelConfig fields for make_qwen3_moe_model's model."""
    return dict(qwen3_model_kwargs(vocab=vocab, layers=layers), num_experts=experts, num_experts_per_tok=top_k,
                moe_intermediate_size=32, norm_topk_prob=norm_topk_prob, decoder_sparse_step=sparse_step,
                mlp_only_layers=list(mlp_only), router_aux_loss_coef=aux_coef)


def make_qwen3_moe_model(out_dir, layers=2, experts=4, top_k=2, norm_topk_prob=True, sparse_step=1, mlp_only=(),
                         aux_coef=0.01, vocab=160, seed=0):
    """A Qwen3MoeForCausalLM with every weight random (router and experts too), saved by save_pretrained."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    cfg = Qwen3MoeConfig(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=QWEN3_HEAD_DIM, intermediate_size=96, vocab_size=vocab, rms_norm_eps=1e-6,
                         rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=False,
                         attention_bias=False, use_sliding_window=False, num_experts=experts,
                         num_experts_per_tok=top_k, moe_intermediate_size=32, norm_topk_prob=norm_topk_prob,
                         decoder_sparse_step=sparse_step, mlp_only_layers=list(mlp_only),
                         router_aux_loss_coef=aux_coef, torch_dtype="float32")
    model = Qwen3MoeForCausalLM(cfg)
    model.config._experts_implementation = "eager"     # the per-expert loop (from_pretrained picks grouped_mm)
    return _randomised_and_saved(model, out_dir, seed)


def hf_grad(hf_params, name: str, cfg) -> np.ndarray:
    """transformers' gradient for our parameter `name` in our layout; a Qwen3-MoE's experts are fused in
    transformers' memory (gate_up_proj (E, 2I, H), down_proj (E, H, I)), ours stacked (E, H, I) / (E, I, H)."""
    from mindrlhf.checkpoint.hf_interop import ms_to_hf_name
    if ".routed_experts.ffn." not in name:
        return hf_params[ms_to_hf_name(name)].grad.numpy()
    layer = name.split(".")[2]
    i = cfg.moe_intermediate_size
    if name.endswith("w2.weight"):
        return hf_params[f"model.layers.{layer}.mlp.experts.down_proj"].grad.numpy().transpose(0, 2, 1)
    gate_up = hf_params[f"model.layers.{layer}.mlp.experts.gate_up_proj"].grad.numpy()
    part = gate_up[:, :i] if name.endswith("w1.weight") else gate_up[:, i:]
    return part.transpose(0, 2, 1)
