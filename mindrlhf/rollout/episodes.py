"""What a multi-turn episode needs from the tools layer, for the rollout engine (engine.GenerationEngine, which
owns the episode loop and the KV cache): when a turn ends in a tool call, the calls in it, running them in the
pool, and the tokens appended after them.

The appended tokens are the chat template's delta (data/chat_template.ChatTemplate.tool_delta): the assistant
turn's closing, the `role: tool` messages and the next assistant opener, rendered once per tool turn and
tokenized alone; the history is never re-rendered or re-encoded (token-in / token-out). They enter the
sequence present (attended to) with loss mask 0.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from mindrlhf.configs.errors import ConfigError
from mindrlhf.tools.parser import ToolCall, ToolCallParser
from mindrlhf.tools.runner import ToolResult, ToolRunner


@dataclass
class EpisodeTools:
    """runner: runs calls in its pool; parser: finds calls in a turn's text (and where a turn pauses);
    encode/decode: the tokenizer's (text -> ids without special-token additions, ids -> text with special tokens
    kept); render: tool messages -> the template text appended after the assistant turn (ChatTemplate.tool_delta).
    max_tool_calls: calls per episode; max_parallel_calls: most calls run from one turn;
    max_total_response_length: most tokens of an episode (0: the response width)."""
    runner: ToolRunner
    parser: ToolCallParser
    encode: Callable[[str], List[int]]
    decode: Callable[[Sequence[int]], str]
    render: Callable[[List[Dict[str, str]]], str]
    max_tool_calls: int
    max_parallel_calls: int = 4
    max_total_response_length: int = 0

    def __post_init__(self):
        if self.max_tool_calls < 1:
            raise ConfigError(f"tools.max_tool_calls: an episode needs >= 1, got {self.max_tool_calls}")
        if not self.parser.stop_strings:
            raise ConfigError(f"tools.tool_parser_format: parser {self.parser.name!r} names no stop string")
        self._last_chars = {s[-1] for s in self.parser.stop_strings}
        self._may_end: Dict[int, bool] = {}

    def may_end_turn(self, token: int) -> bool:
        """Cheap filter: can this token end a stop string (its text holds a stop string's last character)?"""
        hit = self._may_end.get(token)
        if hit is None:
            piece = self.decode([int(token)])
            hit = self._may_end[token] = any(c in piece for c in self._last_chars)
        return hit

    def turn_stops(self, turn_ids: Sequence[int]) -> bool:
        """True when the turn decoded so far ends with (contains, at its last token) a stop string."""
        text = self.decode([int(t) for t in turn_ids])
        return any(text.rstrip().endswith(s) for s in self.parser.stop_strings)

    def calls(self, turn_ids: Sequence[int], remaining: int) -> List[ToolCall]:
        """The calls of a turn that paused at a stop string, at most `remaining` and max_parallel_calls; a stop
        string with no call before it is one malformed call (the model reads why)."""
        text = self.decode([int(t) for t in turn_ids])
        found = self.parser.parse(text)
        if not found:
            found = [ToolCall(None, error=f"{self.parser.stop_strings[0]} without a tool call before it",
                              raw=text[-200:])]
        return found[:max(0, min(remaining, self.max_parallel_calls))]

    def submit(self, calls: Sequence[ToolCall]) -> List["Future[ToolResult]"]:
        return [self.runner.submit(c) for c in calls]

    def tokens(self, results: Sequence[ToolResult]) -> List[int]:
        """The tokens appended after the turn: the template's delta for these results."""
        return list(self.encode(self.render([r.message() for r in results])))


def episode_tools(tools_cfg, tools: Sequence, tokenizer, template, count_tokens: bool = True,
                  log: Optional[Callable[[str], None]] = None) -> EpisodeTools:
    """The trainer's EpisodeTools from the config's tools section, loaded tools, the run's tokenizer and the
    model folder's chat template (data/chat_template.ChatTemplate)."""
    from mindrlhf.tools.parser import get_parser

    def encode(text):
        return tokenizer.encode(text)

    runner = ToolRunner(tools, max_parallel_calls=tools_cfg.max_parallel_calls, timeout=tools_cfg.tool_timeout,
                        max_tool_response_length=tools_cfg.max_tool_response_length,
                        tool_response_truncate_side=tools_cfg.tool_response_truncate_side,
                        count_tokens=(lambda s: len(encode(s))) if count_tokens else None)
    return EpisodeTools(runner, get_parser(tools_cfg.tool_parser_format), encode,
                        lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False), template.tool_delta,
                        tools_cfg.max_tool_calls, tools_cfg.max_parallel_calls, tools_cfg.max_total_response_length)
