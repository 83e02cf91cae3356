"""A sequence classifier (Hugging Face's *ForSequenceClassification): our decoder (qwen2.py, the same
MindFormers parameter names `model.layers.N...`) plus a score head `score.weight` (num_labels, H), no bias,
read at each row's last real token, as transformers' forward reads it at `last_non_pad_token`. A reward model
has num_labels 1. Frozen: built for scoring, never trained here.

Rows may be padded on both sides (our samples: left-padded prompts, right-padded responses): positions and
the causal bias come from the attention mask (padding.py), and the last real token is the mask's last 1.
transformers takes the rightmost token that is not the pad id: the same token unless a real token equals
the pad id (then ours is the right one).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, Zero, initializer

from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.model_config import ModelConfig, ParallelConfig
from mindrlhf.models.padding import causal_bias, position_ids
from mindrlhf.models.qwen2 import DecoderModel
from mindrlhf.models.specs import param_specs
from mindrlhf.models.tp_layers import MS_DTYPES
from mindrlhf.parallel.layouts import REPLICATED, Layout, RoleWeights, role_layouts
from mindrlhf.parallel.mesh import Mesh

SCORE = "score.weight"


def classifier_specs(cfg: ModelConfig, num_labels: int):
    """param_specs of the decoder without the LM head, plus the score head (replicated on every TP rank)."""
    specs = {n: s for n, s in param_specs(cfg).items() if n != "lm_head.weight"}
    specs[SCORE] = ((num_labels, cfg.hidden_size), REPLICATED)
    return specs


class SequenceClassifier(nn.Cell):
    """`construct(input_ids, position_ids, bias, last)` -> scores (B, num_labels): the score head on the final
    hidden state at position `last` (B,) of each row. Under TP the final hidden states are replicated, so
    every TP rank computes the same scores. Pipeline stages are not supported (its own layout: a follow-up)."""

    def __init__(self, cfg: ModelConfig, num_labels: int, mesh: Optional[Mesh] = None, random_init: bool = True):
        super().__init__()
        mesh = mesh or Mesh(1, 1, 0)
        if mesh.pp > 1:
            raise ConfigError(f"reward model: pipeline stages ({mesh.pp}) are not supported; it runs in a "
                              f"TP x DP layout")
        # whole activations: sequence parallelism is a training layout's, and nothing trains here
        mesh = dataclasses.replace(mesh, seq_parallel=False)
        ParallelConfig(data_parallel=mesh.dp, model_parallel=mesh.tp).check_model(cfg)
        self.config, self.mesh, self.num_labels = cfg, mesh, num_labels
        self.model = DecoderModel(cfg, mesh, None, random_init)
        init = Normal(cfg.initializer_range) if random_init else Zero()
        self.score = Parameter(initializer(init, (num_labels, cfg.hidden_size), MS_DTYPES[cfg.param_init_type]),
                               name=SCORE, requires_grad=False)
        self.compute_dtype = MS_DTYPES[cfg.compute_dtype]
        for p in self.get_parameters():
            p.requires_grad = False

    @ms.jit
    def construct(self, input_ids, position_ids, bias, last):
        hidden = self.model(input_ids, position_ids, bias)                       # (B, T, H), normed
        pick = ops.cast(ops.one_hot(last, hidden.shape[1], Tensor(1.0, ms.float32), Tensor(0.0, ms.float32)),
                        hidden.dtype)                                            # (B, T)
        pooled = (hidden * ops.expand_dims(pick, 2)).sum(1)                     # (B, H): exact, one term each
        return ops.matmul(ops.cast(pooled, ms.float32),
                          ops.cast(self.score, ms.float32).T)                    # (B, num_labels)

    def layouts(self) -> Dict[str, Layout]:
        return role_layouts(classifier_specs(self.config, self.num_labels), self.mesh)

    def weights(self) -> RoleWeights:
        return RoleWeights({p.name: p for p in self.get_parameters()}, self.layouts(), self.mesh.rank)

    def score_rows(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """ids, mask (B, T), padded anywhere (mask 0) -> scores (B, num_labels) float32, read at each row's last
        real token. A row without real tokens scores as position 0 does (a filler row)."""
        mask = np.asarray(mask, np.int64)
        last = np.where(mask.any(1), mask.shape[1] - 1 - np.argmax(mask[:, ::-1], 1), 0)
        out = self(Tensor(np.asarray(ids, np.int32)), Tensor(position_ids(mask)), causal_bias(mask),
                   Tensor(last.astype(np.int32)))
        return out.asnumpy().astype(np.float32)
