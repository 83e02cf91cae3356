"""`python -m mindrlhf.configs.hf_config DIR [-o finetune.yaml] [--model_parallel N ...]`: an HF folder's
MindFormers model YAML, to edit its layout (compat/hf.py reads the folder). A module of its own, which nothing
imports, so running it never meets an already-imported copy of itself."""
import sys

from mindrlhf.configs.compat.hf import main

if __name__ == "__main__":
    sys.exit(main())
