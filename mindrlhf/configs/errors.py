"""The input errors (mindrlhf/errors.py) under the name most of the package imports them by."""
from mindrlhf.errors import CheckpointError, ConfigError

__all__ = ["CheckpointError", "ConfigError"]
