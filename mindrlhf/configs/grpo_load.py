"""A GRPO run's config from its sources, later wins: dataclass defaults < `--config` file (our sections,
MindRLHF's flat grpo_config.yaml or MindSpeed-RL's GRPO YAML, told apart by compat/sources.py) < the command-line
flags actually given (a flag's absence never overrides the file) < defaults other settings imply (each said at
start-up). Also what start-up prints of it and the run directory's config_resolved.yaml."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any, Dict, List, Optional

import yaml

from mindrlhf.configs.coerce import coerce
from mindrlhf.configs.compat import mindrlhf_grpo
from mindrlhf.configs.compat.hf import is_hf_folder
from mindrlhf.configs.compat.sources import grpo_file_sections
from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.fields import default_of
from mindrlhf.configs.grpo_config import MOVED_FIELDS, SECTIONS, GRPOConfig, _field_of, _section_fields


def _read_yaml(path: str) -> Dict[str, Any]:
    if not os.path.isfile(path):
        raise ConfigError(f"--config: file not found: {path}")
    with open(path, encoding="utf-8") as fh:
        try:
            raw = yaml.safe_load(fh) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping (sections {SECTIONS}, MindRLHF's flat fields or "
                          f"MindSpeed-RL's sections)")
    return raw


def _file_sections(path: str, cfg: GRPOConfig) -> Dict[str, Dict[str, Any]]:
    """The file's {section: {field: value}}, its inert keys and derived values noted on `cfg`."""
    sections, ignored, derived = grpo_file_sections(_read_yaml(path), path, SECTIONS, _field_of)
    cfg.ignored += [(path, key, why) for key, why in ignored]
    cfg.derived += derived
    return sections


def load_grpo_config(path: Optional[str] = None, overrides: Optional[Dict[str, Any]] = None) -> GRPOConfig:
    """Defaults < YAML file (our sections, or MindRLHF's flat form) < overrides {field_name: value} from the CLI."""
    cfg = GRPOConfig()
    if path:
        for sec_name, values in _moved_fields(_file_sections(path, cfg), path, cfg).items():
            section = getattr(cfg, sec_name)
            known = {f.name: f for f in dataclasses.fields(section)}
            for key, value in values.items():
                if key not in known:
                    raise ConfigError(f"{path}: {sec_name}.{key}: unknown field (known: {', '.join(known)})")
                cfg.set_from(f"{sec_name}.{key}", coerce(value, known[key], f"{path}: {sec_name}.{key}"), path,
                             explicit=True)
    where = {f.name: (sec, f) for sec, f in _section_fields()}
    for key, value in (overrides or {}).items():
        sec, f = where[key]
        cfg.set_from(f"{sec}.{key}", coerce(value, f, f"--{key}"), f"--{key}", explicit=True)
    _hf_folder_defaults(cfg)
    _loss_mode_defaults(cfg)
    _implied_defaults(cfg)
    return cfg.validate()


def _moved_fields(sections: Dict[str, Dict[str, Any]], path: str, cfg: GRPOConfig) -> Dict[str, Dict[str, Any]]:
    """A field written in the section it had before (grpo_config.MOVED_FIELDS) goes to its section now, with a
    one-line note at start-up; written in both places it is an error."""
    out = {sec: dict(values) for sec, values in sections.items()}
    for old, new in MOVED_FIELDS.items():
        old_sec, name = old.split(".")
        new_sec = new.split(".")[0]
        if name not in out.get(old_sec, {}):
            continue
        if name in out.get(new_sec, {}):
            raise ConfigError(f"{path}: {old} and {new} are both given; {old} is the earlier spelling of {new}: "
                              f"keep {new}")
        out.setdefault(new_sec, {})[name] = out[old_sec].pop(name)
        cfg.derived.append(f"{new}: {out[new_sec][name]!r} (written {old} in {path}; that spelling is deprecated, "
                           f"write {new})")
    return out


# GSPO's ratio is a geometric mean over a whole response, so it moves far less than a token's: the paper clips
# it at 3e-4 / 4e-4 (Zheng et al. 2025, section 5.1; verl's and TRL's GSPO recipes use the same) and averages
# per sequence (its objective is a mean over the group's sequences; verl's gspo forces seq-mean-token-mean).
LOSS_MODE_DEFAULTS = {"gspo": {"clip_low": 3e-4, "clip_high": 4e-4, "loss_agg": "seq-mean-token-mean"}}


def _loss_mode_defaults(cfg: GRPOConfig):
    """A loss_mode's own defaults for the rl fields the config and flags did not set."""
    for name, value in LOSS_MODE_DEFAULTS.get(cfg.rl.loss_mode, {}).items():
        if f"rl.{name}" not in cfg.explicit:
            cfg.set_from(f"rl.{name}", value, f"loss_mode {cfg.rl.loss_mode}'s default")
            cfg.derived.append(f"rl.{name}: {value} (loss_mode {cfg.rl.loss_mode}'s default)")


def _implied_defaults(cfg: GRPOConfig):
    """Defaults another setting rules out: under LoRA the reference is the frozen base (nothing to sync);
    packed rows need the token-mean loss; verifiers given without weights weigh 1 each. Only fields the
    config and flags did not set; said at start-up."""
    implied = []
    if cfg.lora.lora_rank:
        implied.append(("rl.ref_sync_steps", 0, "lora: the reference is the frozen base"))
    if cfg.engine.sequence_packing and cfg.rl.loss_mode != "gspo":
        implied.append(("rl.loss_agg", "token-mean", "engine.sequence_packing packs token-mean losses"))
    functions = cfg.reward.verifier_function
    implied.append(("reward.verifier_weight", [1.0] * len(functions), f"1 for each of the {len(functions)} "
                    f"verifier_function entries, as upstream's reward_weights"))
    for key, value, why in implied:
        sec, name = key.split(".")
        if key not in cfg.explicit and getattr(getattr(cfg, sec), name) != value:
            cfg.set_from(key, value, why)
            cfg.derived.append(f"{key}: {value} ({why})")


def _hf_folder_defaults(cfg: GRPOConfig):
    """A Hugging Face folder as sft_path_train also gives the policy's weights and the tokenizer, unless
    those are set."""
    run = cfg.run
    if not is_hf_folder(run.sft_path_train):
        return
    for name in ("load_sft_checkpoint_train", "vocab_path"):
        if not getattr(run, name):
            cfg.set_from(f"run.{name}", run.sft_path_train, "the Hugging Face folder given as sft_path_train")
            cfg.derived.append(f"run.{name}: {run.sft_path_train} (the Hugging Face folder given as sft_path_train)")


def build_arg_parser() -> argparse.ArgumentParser:
    """Every config field as --field_name; unset flags stay absent so they never override the YAML."""
    p = argparse.ArgumentParser(description="GRPO training with mindrlhf (run under msrun for several ranks)",
                                argument_default=argparse.SUPPRESS)
    p.add_argument("--config", help="grpo_config.yaml: sections " + ", ".join(SECTIONS) + ", MindRLHF's flat "
                                    "fields or MindSpeed-RL's GRPO YAML (docs/UPSTREAM.md)")
    for sec, f in _section_fields():
        default = default_of(f)
        p.add_argument(f"--{f.name}", metavar=str(f.type).upper().replace("LIST[", "").rstrip("]"),
                       help=f"[{sec}] {f.metadata['help']} (default: {default})")
    for flag, (ours, note) in mindrlhf_grpo.FLAG_ALIASES.items():
        p.add_argument(f"--{flag}", nargs=mindrlhf_grpo.FLAG_NARGS.get(flag),
                       help=f"[MindRLHF] {'= --' + ours + ': ' if ours else 'accepted, inert: '}{note}")
    for flag, (allowed, why) in mindrlhf_grpo.FLAG_CHECKS.items():
        p.add_argument(f"--{flag}", help=f"[MindRLHF] {allowed!r} only: {why}")
    return p


def config_from_argv(argv=None) -> GRPOConfig:
    ns = vars(build_arg_parser().parse_args(argv))
    path = ns.pop("config", None)
    ns, ignored_flags = mindrlhf_grpo.translate_flags(ns)
    cfg = load_grpo_config(path, ns)
    cfg.ignored += [("command line", flag, why) for flag, why in ignored_flags]
    return cfg


def _field_origins(cfg: GRPOConfig):
    """(section, field, value, where it came from) for every field: a file, a flag, what derived it, or the
    default (with MindRLHF's value where it runs another)."""
    for sec in SECTIONS:
        for f in dataclasses.fields(getattr(cfg, sec)):
            key, value = f"{sec}.{f.name}", getattr(getattr(cfg, sec), f.name)
            yield sec, f.name, value, cfg.origin.get(key) or "default" + mindrlhf_grpo.upstream_default_note(key, value)


def describe_fields(cfg: GRPOConfig) -> List[str]:
    """The fields not at their plain default - set by a file or flag, derived, or a default MindRLHF runs
    otherwise - with their value and origin, printed once at start-up; every field is in the run directory's
    config_resolved.yaml (resolved_config_text)."""
    lines = ["config (fields not at their default: value  <- where it came from; all: config_resolved.yaml):"]
    for sec in SECTIONS:
        rows = [f"    {name} = {value!r}  <- {where}" for s, name, value, where in _field_origins(cfg)
                if s == sec and where != "default"]
        if rows:
            lines += [f"  [{sec}]"] + rows
    return lines


def resolved_config_text(cfg: GRPOConfig) -> str:
    """Every field of the run as our sectioned YAML (it loads back as --config), each with its origin."""
    lines = ["# the resolved GRPO config: every field, its value and (after #) where it came from"]
    for sec in SECTIONS:
        lines.append(f"{sec}:")
        lines += [f"  {name}: {json.dumps(value)}  # {where}" for s, name, value, where in _field_origins(cfg)
                  if s == sec]
    return "\n".join(lines) + "\n"
