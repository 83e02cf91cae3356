"""Errors raised for bad user input; each message names the file/field and what was expected."""


class ConfigError(ValueError):
    """A config file or field is missing, unknown or invalid."""


class CheckpointError(ValueError):
    """A checkpoint does not match the model (missing/unexpected parameter, wrong shape, corrupt file)."""
