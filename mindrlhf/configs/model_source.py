"""Which reader a model path needs: a Hugging Face folder (hf_config.py), a MindSpeed-RL GRPO YAML
(upstream_mindspeed.py: its model entry) or a MindFormers-style model YAML (model_config.py). The one place
that tells them apart; each reader builds on model_config's dataclasses and none knows the others."""
from __future__ import annotations

from typing import Optional

from mindrlhf.configs import upstream_mindspeed
from mindrlhf.configs.hf_config import is_hf_folder, model_yaml_from_hf
from mindrlhf.configs.model_config import ModelYaml, ParallelConfig, model_yaml_from_raw, read_yaml_mapping


def load_model_yaml(path: str, hf_parallel: Optional[ParallelConfig] = None, role: str = "train") -> ModelYaml:
    """The model and layout at `path`; errors name the file and the field. A Hugging Face folder (config.json)
    in the layout `hf_parallel` (default: one rank); a MindSpeed-RL GRPO YAML's model entry in the layout of
    `role` (train or infer), both of which that one file gives."""
    if is_hf_folder(path):
        return model_yaml_from_hf(path, hf_parallel)
    raw = read_yaml_mapping(path)
    if upstream_mindspeed.is_mindspeed(raw):
        return upstream_mindspeed.model_yaml(raw, path, role)
    return model_yaml_from_raw(raw, path)
