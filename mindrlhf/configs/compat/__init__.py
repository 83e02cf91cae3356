"""Other tools' files read into our dataclasses, one way: MindFormers model YAML, MindRLHF's grpo_config.yaml
and flags, MindSpeed-RL's GRPO YAML, Hugging Face config.json, verl's command line. configs/ below this folder
knows none of them; sources.py is the one place that tells the formats apart."""
