"""Configs: the dataclasses of a run (grpo_config, model_config) below, the readers of other tools' files
(compat/) on top of them, and the loaders that pick a reader (grpo_load, compat/sources)."""
from mindrlhf.configs.compat.sources import load_model_yaml
from mindrlhf.configs.errors import CheckpointError, ConfigError
from mindrlhf.configs.model_config import ModelConfig, ModelYaml, ParallelConfig

__all__ = ["ConfigError", "CheckpointError", "ModelConfig", "ParallelConfig", "ModelYaml", "load_model_yaml"]
