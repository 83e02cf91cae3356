"""MindRLHF's later entry-point name for the same GRPO run as grpo_one_stage.py (same flags)."""
import sys

from mindrlhf.cli import grpo_main

if __name__ == "__main__":
    sys.exit(grpo_main())
