"""Command-line entry points; errors the user can fix print one line and exit 2 (no traceback)."""
from __future__ import annotations

import os
import sys
from typing import List

from mindrlhf.configs.errors import CheckpointError, ConfigError


def save_role_strategies(cfg) -> List[str]:
    """`grpo_one_stage.py --only_save_strategy True`: train and infer strategy files from the model YAMLs."""
    from mindrlhf.configs.compat.sources import load_model_yaml
    from mindrlhf.models.specs import layouts_for
    from mindrlhf.parallel.strategy import save_role_strategy
    run = cfg.run
    if not run.sft_path_train:
        raise ConfigError("sft_path_train: required to write strategy files")
    out_dir = run.save_strategy_dir or os.path.join(run.save_ckpt_dir, "strategy")
    written = []
    for role, path in (("train", run.sft_path_train), ("infer", run.sft_path_infer or run.sft_path_train)):
        yaml_cfg = load_model_yaml(path, role=role)
        par = yaml_cfg.parallel
        layouts = layouts_for(yaml_cfg.model, par.data_parallel, par.model_parallel, par.pipeline_stage,
                              ep=par.expert_parallel, experts_over_tp=par.moe_tp_extend_ep)
        written += save_role_strategy(out_dir, role, layouts, par.world_size)
    return written


def grpo_main(argv=None) -> int:
    from mindrlhf.configs.grpo_load import config_from_argv
    try:
        cfg = config_from_argv(argv)
        if cfg.run.only_save_strategy:
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
