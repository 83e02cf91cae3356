"""A verl-style reward function as a verifier (reward.custom_reward_function; verl's custom_reward_function).

verl's reward manager calls `compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)`
for each completion and takes a float, or a dict whose "score" is the reward (verl/workers/reward_manager/
naive.py). Registered here under the function's name, it is called the same way: `solution_str` the decoded
completion, `ground_truth` the row's reference answer, `data_source` and `extra_info` the row's, which a prompt
file converted from verl's parquet keeps (data/mindrecord_io.py's verl columns; "" and None for a file without
them). A call that raises, or returns something without a number, scores 0 and counts in `reward/errors`, as any
verifier's (verifiers.RewardFn).

The row reaches the verifier on its reference answer: `Reference` is the answer string carrying the row's
data_source and extra_info, so every place a solution goes (logs, other verifiers) is unchanged.
"""
from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
from typing import Dict, List, Optional

from mindrlhf.configs.errors import ConfigError
from mindrlhf.reward.verifiers import VERIFIERS, register_verifier

DEFAULT_NAME = "compute_score"      # verl's custom_reward_function.name default


class Reference(str):
    """A row's reference answer, with the verl row fields a verl-style reward function reads."""
    data_source: str = ""
    extra_info: Optional[dict] = None

    @classmethod
    def of(cls, solution: str, data_source: str = "", extra_info: Optional[dict] = None) -> "Reference":
        ref = cls(solution)
        ref.data_source, ref.extra_info = data_source, extra_info
        return ref


def references(batch: Dict, rows=None) -> List[Reference]:
    """A prompt batch's solutions (PromptDataset columns; `rows` of them, default all) as References: with its
    data_source and extra_info (JSON) columns when the file has them."""
    rows = range(len(batch["solution"])) if rows is None else rows
    sources, extras = batch.get("data_source"), batch.get("extra_info")
    return [Reference.of(str(batch["solution"][i]), "" if sources is None else str(sources[i]),
                         json.loads(extras[i]) if extras is not None and extras[i] else None) for i in rows]


class VerlScorer:
    """verl's compute_score behind our verifier call: (completion, solution) -> float."""

    def __init__(self, fn, kwargs: Dict):
        self.fn, self.kwargs = fn, dict(kwargs)

    def __call__(self, completion: str, solution: str) -> float:
        out = self.fn(data_source=getattr(solution, "data_source", ""), solution_str=completion,
                      ground_truth=str(solution), extra_info=getattr(solution, "extra_info", None), **self.kwargs)
        if inspect.iscoroutine(out):            # verl awaits an async compute_score
            out = asyncio.run(out)
        return float(out["score"] if isinstance(out, dict) else out)


def load_custom_reward_function(spec: str, kwargs_json: str = "",
                                verifier_function: Optional[List[str]] = None) -> Optional[str]:
    """Register `spec` ("file.py" or "file.py:function", the function compute_score by default) as a verifier
    under the function's name, called with `kwargs_json` (a JSON object) as verl's reward_kwargs; returns the
    name (None for an empty spec). `verifier_function`, when given, must name it (else it would never run)."""
    if not spec:
        if kwargs_json:
            raise ConfigError("reward.custom_reward_kwargs: given without reward.custom_reward_function")
        return None
    path, _, name = spec.partition(":")
    name = name or DEFAULT_NAME
    where = f"reward.custom_reward_function {spec}"
    if not os.path.isfile(path):
        raise ConfigError(f"{where}: no such file: {path}")
    try:
        kwargs = json.loads(kwargs_json) if kwargs_json else {}
    except json.JSONDecodeError as err:
        raise ConfigError(f"reward.custom_reward_kwargs: not JSON ({err})") from None
    if not isinstance(kwargs, dict):
        raise ConfigError(f"reward.custom_reward_kwargs: expected a JSON object (the function's keyword "
                          f"arguments), got {kwargs_json!r}")
    module_spec = importlib.util.spec_from_file_location("mindrlhf_custom_reward_" +
                                                         os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - the user's file: any failure is a set-up error naming it
        raise ConfigError(f"{where}: importing it failed: {type(err).__name__}: {err}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ConfigError(f"{where}: the file has no function {name!r} (its functions: {', '.join(found) or 'none'})")
    if name in VERIFIERS and not isinstance(VERIFIERS[name], VerlScorer):
        raise ConfigError(f"{where}: {name!r} is a verifier of ours already; rename the function and give "
                          f"file.py:new_name")
    register_verifier(name)(VerlScorer(fn, kwargs))
    if verifier_function is not None and name not in verifier_function:
        raise ConfigError(f"{where}: registers the verifier {name!r}, which verifier_function "
                          f"({', '.join(verifier_function)}) does not name: add it there")
    return name
