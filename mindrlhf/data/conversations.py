"""Chat-format SFT data: conversations rendered by the model's chat template, with a loss mask on the
assistant's tokens only.

A row is a JSON object with `messages` (a list of {"role", "content"} and, for tool use, assistant messages
with `tool_calls` and `role: tool` results: the conversational form TRL's and verl's SFT data take) and an
optional `tools` list of function schemas. The whole conversation is rendered once and tokenized once (the ids
training sees are those of the text, as a single encoding gives them); an assistant turn's characters are
where rendering the conversation up to that turn (generation prompt included) ends and rendering it through
that turn ends, and a token is trained when it starts inside such a span. The turn's end-of-turn token is
trained (the model learns to stop); the template's line break after it is not. A template that does not render
a conversation's prefixes as prefixes of it (Qwen3 drops earlier turns' reasoning) is refused naming the row.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import numpy as np

from mindrlhf.configs.errors import ConfigError
from mindrlhf.data.chat_template import ChatTemplate

ROLES = ("system", "user", "assistant", "tool")


def read_conversations(path: str) -> Iterator[Tuple[str, dict]]:
    """(where, row) for each row of a .jsonl file (one object a line) or a .json array; `where` names the file
    and line (or item) for error messages."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: file not found")
    with open(path, encoding="utf-8") as fh:
        if path.endswith(".json"):
            try:
                rows = json.load(fh)
            except ValueError as err:
                raise ConfigError(f"{path}: not valid JSON ({err})") from None
            if not isinstance(rows, list):
                raise ConfigError(f"{path}: expected a JSON array of conversations")
            for i, row in enumerate(rows):
                yield f"{path} item {i}", row
            return
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{n}", json.loads(line)
            except ValueError as err:
                raise ConfigError(f"{path}:{n}: not valid JSON ({err})") from None


def check_messages(row, where: str) -> List[dict]:
    if not isinstance(row, dict) or not isinstance(row.get("messages"), list) or not row["messages"]:
        raise ConfigError(f"{where}: expected an object with a non-empty `messages` list")
    for i, m in enumerate(row["messages"]):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ConfigError(f"{where}: messages[{i}].role: expected one of {list(ROLES)}, got "
                              f"{m.get('role') if isinstance(m, dict) else m!r}")
        if not isinstance(m.get("content", ""), (str, type(None))):
            raise ConfigError(f"{where}: messages[{i}].content: expected text")
    if not any(m["role"] == "assistant" for m in row["messages"]):
        raise ConfigError(f"{where}: no assistant message: nothing to train")
    tools = row.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ConfigError(f"{where}: tools: expected a list of function schemas")
    return row["messages"]


def assistant_spans(template: ChatTemplate, messages: List[dict], where: str,
                    tools: Optional[list] = None) -> Tuple[str, List[Tuple[int, int]]]:
    """(the conversation's text, [(start, end) characters of each assistant turn])."""
    kw = {"tools": tools} if tools else {}
    try:
        text = template.render(messages, add_generation_prompt=False, **kw)
    except TypeError:
        raise ConfigError(f"{where}: tools: this chat template renderer takes no tool schemas") from None
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = template.render(messages[:i], add_generation_prompt=True, **kw) if i else ""
        through = template.render(messages[:i + 1], add_generation_prompt=False, **kw)
        if not (through.startswith(before) and text.startswith(through)):
            raise ConfigError(f"{where}: messages[{i}]: the chat template does not render this conversation's "
                              f"first turns as the start of it (e.g. it drops earlier turns' reasoning), so the "
                              f"assistant's tokens cannot be told apart; train such rows one assistant turn each")
        end = len(through.rstrip("\n"))
        spans.append((len(before), end))
    return text, spans


@dataclass
class ConversationTable:
    """Rows of token ids right-padded to `width` and their loss masks (1 on assistant tokens)."""
    ids: np.ndarray         # (N, width) int64
    loss_mask: np.ndarray   # (N, width) int64
    lengths: np.ndarray     # (N,) real tokens
    truncated: int          # rows cut at width (their end lost)


def tokenize_conversations(path: str, template: ChatTemplate, tokenizer, width: int, pad_id: int,
                           limit: int = 0) -> ConversationTable:
    """Every conversation of `path` as token ids and assistant-token masks; longer ones cut to `width`."""
    if not hasattr(tokenizer, "encode_with_offsets"):
        raise ConfigError(f"{path}: this tokenizer gives no character offsets (a tokenizer.json / vocab.json + "
                          f"merges.txt tokenizer does); the assistant's tokens cannot be located")
    ids_rows, mask_rows, truncated = [], [], 0
    for where, row in read_conversations(path):
        messages = check_messages(row, where)
        text, spans = assistant_spans(template, messages, where, row.get("tools"))
        ids, offsets = tokenizer.encode_with_offsets(text)
        mask = [int(any(a <= start < b for a, b in spans)) for start, _ in offsets]
        if not any(mask):
            raise ConfigError(f"{where}: the assistant turns hold no token after rendering")
        if len(ids) > width:
            truncated += 1
            ids, mask = ids[:width], mask[:width]
        ids_rows.append(ids)
        mask_rows.append(mask)
        if limit and len(ids_rows) == limit:
            break
    if not ids_rows:
        raise ConfigError(f"{path}: no conversation")
    n = len(ids_rows)
    table = ConversationTable(np.full((n, width), pad_id, np.int64), np.zeros((n, width), np.int64),
                              np.array([len(r) for r in ids_rows], np.int64), truncated)
    for i, (ids, mask) in enumerate(zip(ids_rows, mask_rows)):
        table.ids[i, :len(ids)] = ids
        table.loss_mask[i, :len(mask)] = mask
    return table

