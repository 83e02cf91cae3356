"""Choose the rollout engine by config. `mindspore` (ours, any device) is the default and the only one
implemented; `vllm_mindspore` is refused at start-up on every host: off Ascend it cannot run, and on Ascend its
adapter is not written yet (it needs an Ascend host to be written and tested).
"""
from __future__ import annotations

import importlib.util
import platform

from mindrlhf.configs import choices
from mindrlhf.configs.errors import ConfigError
from mindrlhf.rollout.engine import GenerationEngine

BACKENDS = choices.ROLLOUT_BACKENDS


def check_backend(backend: str):
    """Refuse an unusable backend before anything expensive happens (called at config time)."""
    if backend == "mindspore":
        return
    if backend == "vllm_mindspore":
        import mindspore as ms
        device = ms.get_context("device_target")
        if device != "Ascend" or platform.machine() != "aarch64":
            raise ConfigError(f"rollout_backend: vllm_mindspore runs only on Ascend (aarch64 + CANN); this host is "
                              f"{platform.machine()} with MindSpore device '{device}'. Use rollout_backend: mindspore "
                              f"(the built-in KV-cache engine), which runs on every MindSpore device")
        if importlib.util.find_spec("vllm_mindspore") is None:
            raise ConfigError("rollout_backend: vllm_mindspore is not installed (pip install vllm-mindspore on the "
                              "Ascend host), or use rollout_backend: mindspore")
        raise ConfigError("rollout_backend: the vllm_mindspore adapter is not implemented in this release (it needs "
                          "an Ascend host to be written and tested); use rollout_backend: mindspore")
    raise ConfigError(f"rollout_backend: expected one of {BACKENDS}, got {backend!r}")


def make_engine(backend: str, model, pad_token_id: int, prompt_bucket: int, max_num_seqs: int = 0, tools=None):
    """`tools`: rollout/episodes.EpisodeTools for multi-turn episodes (None: one turn per sample)."""
    check_backend(backend)
    return GenerationEngine(model, pad_token_id, prompt_bucket, max_num_seqs, tools=tools)
