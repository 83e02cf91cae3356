"""Which reader a file needs: the one place that tells formats apart. A model path is a Hugging Face folder
(compat/hf.py), a MindSpeed-RL GRPO YAML (compat/mindspeed.py: its model entry) or a MindFormers model YAML
(compat/mindformers.py); a GRPO config file is ours (sections), MindRLHF's flat grpo_config.yaml
(compat/mindrlhf_grpo.py) or MindSpeed-RL's (compat/mindspeed.py). Each reader builds on the dataclasses of
configs/ and none knows the others."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

from mindrlhf.configs.compat import mindrlhf_grpo, mindspeed
from mindrlhf.configs.compat.hf import check_model_folder, is_hf_folder, model_yaml_from_hf
from mindrlhf.configs.compat.mindformers import model_yaml_from_raw
from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.model_config import ModelYaml, ParallelConfig, read_yaml_mapping


def load_model_yaml(path: str, hf_parallel: Optional[ParallelConfig] = None, role: str = "train") -> ModelYaml:
    """The model and layout at `path`; errors name the file and the field. A Hugging Face folder (config.json)
    in the layout `hf_parallel` (default: one rank); a MindSpeed-RL GRPO YAML's model entry in the layout of
    `role` (train or infer), both of which that one file gives."""
    if is_hf_folder(path):
        return model_yaml_from_hf(path, hf_parallel)
    check_model_folder(path, yaml_too=True)
    raw = read_yaml_mapping(path)
    if mindspeed.is_mindspeed(raw):
        return mindspeed.model_yaml(raw, path, role)
    return model_yaml_from_raw(raw, path)


def grpo_file_sections(raw: Dict[str, Any], path: str, sections: List[str],
                       field_of: Callable[[str, str], dataclasses.Field]
                       ) -> Tuple[Dict[str, Dict[str, Any]], List[Tuple[str, str]], List[str]]:
    """A GRPO config file's contents as ({section: {field: value}}, [(key, reason) inert], [derived lines]):
    our sectioned form as it is, MindRLHF's flat form or MindSpeed-RL's GRPO YAML translated."""
    if mindspeed.is_mindspeed(raw):
        return mindspeed.translate(raw, path, field_of)
    sectioned = [k for k in raw if k in sections and isinstance(raw[k], dict)]
    if sectioned and len(sectioned) != len(raw):
        flat = [k for k in raw if k not in sectioned]
        raise ConfigError(f"{path}: mixes sections ({', '.join(sectioned)}) with flat MindRLHF fields "
                          f"({', '.join(flat[:5])}); use one form")
    if sectioned:
        return raw, [], []
    flat_sections, ignored = mindrlhf_grpo.flat_grpo_sections(raw, path)
    return flat_sections, ignored, []
