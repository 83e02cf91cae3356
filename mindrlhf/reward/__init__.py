"""Rewards. Importing the package registers every verifier name, MindSpeed-RL's and MindRLHF's included."""
from mindrlhf.reward import compat  # noqa: F401
