from mindrlhf.configs.errors import CheckpointError, ConfigError
from mindrlhf.configs.model_config import ModelConfig, ModelYaml, ParallelConfig, model_config_from_dict
from mindrlhf.configs.model_source import load_model_yaml

__all__ = ["ConfigError", "CheckpointError", "ModelConfig", "ParallelConfig", "ModelYaml", "load_model_yaml",
           "model_config_from_dict"]
