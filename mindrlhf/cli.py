"""Command-line entry points; errors the user can fix print one line and exit 2 (no traceback)."""
from __future__ import annotations

import sys

from mindrlhf.configs.errors import CheckpointError, ConfigError


def grpo_main(argv=None) -> int:
    from mindrlhf.configs.grpo_config import config_from_argv
    try:
        cfg = config_from_argv(argv)
        if cfg.run.only_save_strategy:
            from mindrlhf.parallel.strategy import save_role_strategies
            for path in save_role_strategies(cfg):
                print(f"wrote {path}")
            return 0
        from mindrlhf.trainer.grpo_trainer import GRPOTrainer
        trainer = GRPOTrainer(cfg)
        trainer.fit()
    except (ConfigError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    except Exception as err:  # noqa: BLE001 - TrainingError and friends: one line, non-zero exit
        if type(err).__name__ == "TrainingError":
            print(f"error: {err}", file=sys.stderr, flush=True)
            return 3
        raise
    return 0
