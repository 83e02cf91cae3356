"""MindSpeed-RL's `prompt_type`: a named template of its configs/model/templates.json, rendered around a question
as its R1AlpacaStyleInstructionHandler renders a GRPO prompt.

Facts read from github.com/Ascend/MindSpeed-RL (commit 05a90d7, April 2026): mindspeed_rl/datasets/templates.py
(register_custom_template, Template._encode, Llama2Template, ReasoningTemplate.encode_multiturn) and
formatter.py (StringFormatter.apply). The prompt is turn 0's source: format_prefix, then format_system around
the system text (the row's, else the template's default_system) when there is one, then format_user around
the question. Slots are strings ('{{content}}' and '{{idx}}' filled in, the first of each), ["bos_token"] /
["eos_token"] (the tokenizer's token, nothing when it has none) or {"token": text}. A template whose name
starts with llama2 puts the system text inside the user slot; template_class ReasoningTemplate (qwen3) with
enable_thinking false ends the prompt with an empty '<think>\\n\\n</think>\\n\\n' unless the row's answer holds
a thought tag.

MindSpeed-RL encodes each piece on its own and joins the ids; we render the text and encode it once. The ids
agree wherever the pieces meet at a special token or a pre-tokenizer split (every Qwen, Llama-3 and DeepSeek
template: tests/test_mindspeed_datasets.py compares them piece by piece).
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

from mindrlhf.configs.errors import ConfigError

REASONING = "ReasoningTemplate"
THOUGHT = ("<think>", "</think>")


def _slots(entry: dict, key: str, path: str, name: str) -> Optional[list]:
    value = entry.get(key)
    if value is None:
        return None
    slots = value.get("slots") if isinstance(value, dict) else None
    if not isinstance(slots, list):
        raise ConfigError(f"{path}: template {name!r}: {key} must be {{\"slots\": [...]}}, got {value!r}")
    return slots or None


class PromptType:
    """question -> prompt text with one template of a templates.json. `special`: the tokenizer's special token
    texts (bos_token, eos_token) for ["bos_token"] slots; `system`: a system text for every row (MindSpeed-RL's
    per-row map_keys.system), else the template's default_system."""

    def __init__(self, path: str, name: str, special: Dict[str, str], system: str = "",
                 enable_thinking: Optional[bool] = None):
        if not os.path.isfile(path):
            raise ConfigError(f"prompt_type {name!r}: the templates file {path} does not exist (MindSpeed-RL's "
                              f"configs/model/templates.json; give it as prompt_type_path / --prompt_type_path)")
        try:
            with open(path, encoding="utf-8") as fh:
                entries = json.load(fh)
        except ValueError as err:
            raise ConfigError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ConfigError(f"{path}: expected a JSON list of templates [{{\"name\": ..., ...}}]")
        named = {e.get("name"): e for e in entries}
        if name not in named:
            raise ConfigError(f"prompt_type {name!r} is not in {path} (it has {', '.join(map(str, named))})")
        entry = named[name]
        self.name, self.special = name, special
        self.prefix = _slots(entry, "format_prefix", path, name) or []
        self.user = _slots(entry, "format_user", path, name) or ["{{content}}"]
        self.system_slots = _slots(entry, "format_system", path, name) or ["{{content}}"]
        default = entry.get("default_system", "")
        default = "".join(default) if isinstance(default, list) else default
        self.system = system or default or ""
        self.reasoning = entry.get("template_class") == REASONING
        if enable_thinking is not None and not self.reasoning:
            raise ConfigError(f"enable_thinking: template {name!r} has no thinking switch (MindSpeed-RL allows it "
                              f"with qwen3, template_class {REASONING})")
        self.enable_thinking = bool(enable_thinking)
        self.llama2 = name.startswith("llama2")

    def _text(self, slots: List, content: Optional[str] = None) -> str:
        out = []
        for slot in slots:
            if isinstance(slot, str):
                if content is not None:
                    slot = slot.replace("{{content}}", content, 1).replace("{{idx}}", "0", 1)
                out.append(slot)
            elif isinstance(slot, list):            # a set of token names: the first the tokenizer has
                names = [n for n in ("bos_token", "eos_token") if n in slot and self.special.get(n)]
                out.append(self.special[names[0]] if names else "")
            elif isinstance(slot, dict) and isinstance(slot.get("token"), str):
                out.append(slot["token"])
            else:
                raise ConfigError(f"template {self.name!r}: a slot must be a string, [token name] or "
                                  f"{{\"token\": ...}}, got {slot!r}")
        return "".join(out)

    def __call__(self, question: str, answer: str = "") -> str:
        if self.llama2:                 # its format_system's first slot, inside the user slot
            system = self._text(self.system_slots[:1], self.system) if self.system else ""
            text = self._text(self.prefix) + self._text(self.user, system + question)
        else:
            system = self._text(self.system_slots, self.system) if self.system else ""
            text = self._text(self.prefix) + system + self._text(self.user, question)
        if self.reasoning and not self.enable_thinking and not any(t in answer for t in THOUGHT):
            text += f"{THOUGHT[0]}\n\n{THOUGHT[1]}\n\n"
        return text

    def render_example(self, example) -> str:
        """A row's prompt: the answer decides the empty thought (ReasoningTemplate)."""
        return self(example.question, example.answer_text)
