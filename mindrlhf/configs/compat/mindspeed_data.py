"""MindSpeed-RL's dataset preprocessing YAML (configs/datasets/*.yaml, read by its cli/preprocess_data.py) as
rlhf_data.py's `--config`: every key it accepts, and what each does here.

Read from github.com/Ascend/MindSpeed-RL (commit 05a90d7, April 2026), for facts only: the shipped
configs/datasets/deepscaler.yaml, math_17k.yaml and orca_rlhf.yaml; the accepted keys and their defaults in
mindspeed_rl/config_cls/data_handler_config.py (DataHandlerConfig, filled by BaseConfig.update: '-' read as '_',
any other key refused); their meaning in cli/preprocess_data.py, mindspeed_rl/config_cls/validate_config.py
(validate_data_handler_config), mindspeed_rl/datasets/data_handler.py (the handlers; rows whose ids reach
seq_length dropped), handler_utils.py (map_keys and the default columns instruction / input / output) and
utils/tokenizer.py (get_tokenizer). The template rendering is data/prompt_types.py.

Statuses as in configs/compat/keys.py. A key in no table is an error naming the file and the key.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Tuple

from mindrlhf.configs.compat.keys import CHECKED, INERT, MAPPED, Key, inert, run_checks
from mindrlhf.configs.compat.mindspeed import tokenizer_flags
from mindrlhf.configs.errors import ConfigError

# handler_name -> our --dataset_type; the handlers that write no GRPO prompts, and why
HANDLERS = {"R1AlpacaStyleInstructionHandler": "alpaca", "Math17kAlpacaStyleInstructionHandler": "math17k"}
REFUSED_HANDLERS = {
    "AlpacaStyleInstructionHandler": "SFT data (prompt + response ids, the prompt masked in labels)",
    "AlpacaStylePairwiseHandler": "chosen / rejected pairs for DPO and reward-model training",
    "AlpacaStyleProcessRewardHandler": "process-reward-model training data",
}
# map_keys entries we read, and the ones that must be "" (or absent)
MAP_KEYS_READ = ("prompt", "query", "response")
MAP_KEYS_EMPTY = {
    "system": "a system column per row is not read; every prompt gets the template's default_system, or "
              "--system_prompt",
    "history": "earlier turns are not read; a GRPO prompt here is one user turn",
    "chosen": "pairwise columns (AlpacaStylePairwiseHandler)",
    "rejected": "pairwise columns (AlpacaStylePairwiseHandler)",
}

KEYS: Dict[str, Key] = {k.name: k for k in [
    Key("input", MAPPED, "--file_path (a relative path is taken from the current directory; MindSpeed-RL takes it "
                         "from its checkout's root, the same when run from there)"),
    Key("tokenizer_name_or_path", MAPPED, "--vocab_path: the Hugging Face folder (tokenizer.json, else its "
                                          "vocab.json + merges.txt)"),
    Key("output_prefix", MAPPED, "--output_path: the MindRecord is written at output_prefix itself (+ .db), the "
                                 "path a MindSpeed-RL GRPO YAML names as data_path (MindSpeed-RL writes "
                                 "output_prefix_packed_*.bin/.idx there)"),
    Key("handler_name", MAPPED, "--dataset_type: " + ", ".join(f"{h} -> {t}" for h, t in HANDLERS.items()) +
        "; " + ", ".join(REFUSED_HANDLERS) + " are refused (they write no GRPO prompts); required"),
    Key("map_keys", MAPPED, "--map_keys: prompt, query, response name the file's columns (absent: MindSpeed-RL's "
                            "instruction, input, output); " + ", ".join(MAP_KEYS_EMPTY) + " must be \"\" or absent"),
    Key("prompt_type", MAPPED, "--prompt_type: the template of that name in prompt_type_path (absent: empty, "
                               "MindSpeed-RL's default)"),
    Key("prompt_type_path", MAPPED, "--prompt_type_path (absent: ../model/templates.json from the YAML's folder, "
                                    "where a MindSpeed-RL checkout keeps configs/model/templates.json)"),
    Key("enable_thinking", MAPPED, "--enable_thinking (qwen3, a ReasoningTemplate, only): false, MindSpeed-RL's "
                                   "default, ends each prompt with an empty <think></think>"),
    Key("seq_length", MAPPED, "--max_prompt_length seq_length - 1 with --on_long_prompt skip (MindSpeed-RL drops a "
                              "row whose prompt ids reach seq_length) and --seq_length 2 x seq_length - 1 (a kept "
                              "row's prompt + answer + eos fits whole); MindSpeed-RL also drops a row whose "
                              "reference reaches seq_length tokens: kept here, its answer cut"),
]}
CHECKS = {
    "tokenizer_type": (lambda v, c: v == "HuggingFaceTokenizer", "HuggingFaceTokenizer", "HuggingFaceTokenizer"),
    "dataset_additional_keys": (lambda v, c: isinstance(v, list) and set(v) <= {"labels"},
                                "[] or [labels]: the reference answer is always written (the solution column); "
                                "other columns are not carried", []),
    "pack": (lambda v, c: v is False, "false (prompts are not packed into shared sequences)", False),
    "neat_pack": (lambda v, c: v is False, "false (goes with pack)", False),
    "merge_group_keys": (lambda v, c: v is None, "unset (merging Megatron .bin/.idx files is not done here)", None),
    "script_data_dir": (lambda v, c: v is None, "unset (a dataset loading script is not run)", None),
}
KEYS.update({k: Key(k, CHECKED, expected) for k, (_, expected, _) in CHECKS.items()})
for _key in [
        *inert("workers n_subs", "how many processes MindSpeed-RL uses; the rows written are the same; --workers "
                                 "sets our tokenizer threads"),
        *inert("log_interval", "progress logging; a progress bar here"),
        *inert("streaming cache_dir overwrite_cache", "Hugging Face datasets' loading and cache; the file is "
                                                      "streamed here, uncached"),
        *inert("tokenizer_not_use_fast", "never read by MindSpeed-RL's get_tokenizer, which loads the fast "
                                         "tokenizer as here"),
        *inert("vocab_file merge_file", "read by tokenizer types other than HuggingFaceTokenizer, which is checked"),
        *inert("make_vocab_size_divisible_by pad_vocab_size_to", "the embedding's padding; the ids are the same"),
        *inert("dataset_impl", "Megatron's .bin/.idx layout; a MindRecord is written here"),
        *inert("json_keys", "each handler sets its own"),
        *inert("split_sentences keep_newlines", "pretraining's sentence splitting; the GRPO handlers do not split"),
        *inert("append_eod", "read by AlpacaStyleInstructionHandler (SFT) only"),
        *inert("placeholder_token reward_tokens", "read by AlpacaStyleProcessRewardHandler only, which is refused"),
        *inert("seed interleave_probs", "not read by preprocess_data.py")]:
    KEYS[_key.name] = _key


def translate(raw: Dict[str, Any], path: str) -> Tuple[Dict[str, Any], List[Tuple[str, str]], List[str]]:
    """A dataset YAML -> ({rlhf_data.py flag dest: value}, [(key, reason) inert], [start-up lines])."""
    values: Dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in KEYS:
            raise ConfigError(f"{path}: {key}: not a key of MindSpeed-RL's dataset YAML (DataHandlerConfig) that "
                              f"is known here; the keys are listed in docs/UPSTREAM.md")
        values[name] = value
    run_checks(values, CHECKS, {}, "MindSpeed-RL", lambda key: f"{path}: {key}")
    flags: Dict[str, Any] = {}
    notes: List[str] = []
    for name, dest in (("input", "file_path"), ("output_prefix", "output_path")):
        if name in values:
            flags[dest] = str(values[name])
    if "tokenizer_name_or_path" in values:
        flags.update(tokenizer_flags(str(values["tokenizer_name_or_path"])))
    if "output_prefix" in values:
        notes.append(f"output_prefix {values['output_prefix']}: the MindRecord is written at that path (+ .db), "
                     f"the data_path of MindSpeed-RL's GRPO YAML")
    flags["dataset_type"] = _dataset_type(values.get("handler_name"), path)
    if values.get("map_keys") is not None:
        flags["map_keys"] = json.dumps(_map_keys(values["map_keys"], path))
    flags["prompt_type"] = str(values.get("prompt_type", "empty")).strip()
    given_path = values.get("prompt_type_path")
    flags["prompt_type_path"] = str(given_path).strip() if given_path else \
        os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), "..", "model", "templates.json"))
    if "enable_thinking" in values:
        if not isinstance(values["enable_thinking"], bool):
            raise ConfigError(f"{path}: enable_thinking: expected true or false, got {values['enable_thinking']!r}")
        flags["enable_thinking"] = values["enable_thinking"]
    if values.get("seq_length") is not None:
        seq = values["seq_length"]
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 2:
            raise ConfigError(f"{path}: seq_length: expected a whole number > 1, got {seq!r}")
        flags.update(max_prompt_length=seq - 1, on_long_prompt="skip", seq_length=2 * seq - 1)
        notes.append(f"seq_length {seq}: prompts of {seq} tokens or more are skipped, as MindSpeed-RL drops them "
                     f"(--max_prompt_length {seq - 1} --on_long_prompt skip --seq_length {2 * seq - 1})")
    else:
        notes.append("seq_length not given: MindSpeed-RL writes every prompt whole; here prompt_ids are "
                     "--max_prompt_length wide (its GRPO YAML's rl_config.max_prompt_length is the width to give)")
    ignored = [(k, KEYS[k].ours) for k in values if KEYS[k].status == INERT]
    return flags, ignored, notes


def _dataset_type(handler: Any, path: str) -> str:
    if handler in HANDLERS:
        return HANDLERS[handler]
    if handler is None:
        raise ConfigError(f"{path}: handler_name: required (MindSpeed-RL has no default); "
                          f"R1AlpacaStyleInstructionHandler writes GRPO prompts")
    why = REFUSED_HANDLERS.get(handler, "not one of MindSpeed-RL's handlers known here")
    raise ConfigError(f"{path}: handler_name: {handler!r} is not supported ({why}); a GRPO prompt file comes from "
                      f"{' or '.join(HANDLERS)}")


def _map_keys(value: Any, path: str) -> Dict[str, str]:
    """MindSpeed-RL's map_keys -> ours: the columns we read; the others must be empty."""
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: map_keys: expected a mapping {{prompt: column, ...}}, got {value!r}")
    out = {}
    for key, column in value.items():
        if column is not None and not isinstance(column, str):
            raise ConfigError(f"{path}: map_keys.{key}: expected a column name, got {column!r}")
        if key in MAP_KEYS_READ:
            out[key] = column or ""
        elif key in MAP_KEYS_EMPTY:
            if column:
                raise ConfigError(f"{path}: map_keys.{key}: {column!r} is not supported ({MAP_KEYS_EMPTY[key]}); "
                                  f"give \"\" or leave it out")
        else:
            raise ConfigError(f"{path}: map_keys.{key}: not one of MindSpeed-RL's columns "
                              f"({', '.join(MAP_KEYS_READ + tuple(MAP_KEYS_EMPTY))})")
    return out


def table_markdown() -> str:
    """docs/UPSTREAM.md's dataset YAML table (generated: scripts/gen_config_reference.py)."""
    n = {s: sum(k.status == s for k in KEYS.values()) for s in (MAPPED, CHECKED, INERT)}
    out = [f"{n[MAPPED]} mapped, {n[CHECKED]} checked, {n[INERT]} inert.", "", "| key | status | here |",
           "| --- | --- | --- |"]
    for k in sorted(KEYS.values(), key=lambda k: ({MAPPED: 0, CHECKED: 1, INERT: 2}[k.status], k.name)):
        default = CHECKS[k.name][2] if k.name in CHECKS else None
        extra = f"; MindSpeed-RL's default {default!r} is checked when absent" if default not in (None, []) else ""
        out.append(f"| `{k.name}` | {k.status} | {k.ours}{extra} |")
    return "\n".join(out)
