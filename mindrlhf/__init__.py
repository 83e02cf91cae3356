"""mindrlhf: MindSpore-native GRPO post-training."""
__version__ = "0.1.0"
