"""A model folder's own chat template, rendered as transformers' `apply_chat_template` renders it.

The template is Jinja: from chat_template.jinja, chat_template.json or tokenizer_config.json's
`chat_template` (the default one when it names several). It runs in a sandboxed environment with
trim_blocks and lstrip_blocks, the loopcontrols extension, `raise_exception`, `strftime_now` and a
`tojson` filter, and sees the special tokens of tokenizer_config.json (bos_token, eos_token, ...), as in
transformers; tests/test_real_model.py checks the text against transformers on a real folder.
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Dict, List, Optional

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from mindrlhf.configs.errors import ConfigError
from mindrlhf.data.tokenizer import tokenizer_config


def _template_source(folder: str) -> Optional[str]:
    jinja_file = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(jinja_file):
        with open(jinja_file, encoding="utf-8") as fh:
            return fh.read()
    json_file = os.path.join(folder, "chat_template.json")
    if os.path.isfile(json_file):
        with open(json_file, encoding="utf-8") as fh:
            try:
                return json.load(fh)["chat_template"]
            except (ValueError, KeyError, TypeError) as err:
                raise ConfigError(f"{json_file}: expected {{\"chat_template\": ...}} ({err})") from None
    template = tokenizer_config(folder).get("chat_template")
    if isinstance(template, list):        # several named templates: the default one, as transformers picks
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


class ChatTemplate:
    """`render(messages)`: the prompt text for a list of {"role", "content"} messages, ending with the
    assistant's turn opener (add_generation_prompt). Keyword arguments reach the template as variables, as
    apply_chat_template's do (Qwen3's `enable_thinking`)."""

    def __init__(self, folder: str):
        source = _template_source(folder) if os.path.isdir(folder) else None
        if source is None:
            hint = ("" if os.path.isdir(folder) else
                    " (not a folder: the template is read from the model folder; pass the folder as --vocab_path)")
            raise ConfigError(f"{folder}: no chat template (expected chat_template.jinja, chat_template.json or "
                              f"tokenizer_config.json's chat_template){hint}")
        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols, _GenerationBlock])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateError as err:
            raise ConfigError(f"{folder}: the chat template does not parse ({err})") from None
        config = tokenizer_config(folder)
        self.special_tokens: Dict[str, str] = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"):
            value = config.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                self.special_tokens[key] = value
        self.folder = folder

    def render(self, messages: List[Dict[str, str]], add_generation_prompt: bool = True,
               tools: Optional[List[Dict]] = None, **variables) -> str:
        """`tools`: the tools' JSON schemas (transformers' `tools=`; tools.ToolRunner.schemas()). Messages may
        include `role: tool` results, rendered as the template renders them. `variables` (enable_thinking, ...)
        reach the template."""
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         tools=tools or None, documents=None, **self.special_tokens, **variables)
        except jinja2.exceptions.TemplateError as err:
            raise ConfigError(f"{self.folder}: the chat template failed to render ({err})") from None

    def prompt(self, question: str, system_prompt: str = "", tools: Optional[List[Dict]] = None,
               **variables) -> str:
        """The text for one user question (after an optional system message), offering `tools` if given."""
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
            [{"role": "user", "content": question}]
        return self.render(messages, tools=tools, **variables)

    def tool_delta(self, tool_messages: List[Dict[str, str]], sentinel: str = "\x00ASSISTANT-TURN\x00") -> str:
        """The text the template puts between the end of an assistant turn's content and the start of the next
        assistant turn's content when `tool_messages` (role tool) answer it: the assistant turn's closing, the
        rendered tool messages and the next assistant opener (add_generation_prompt). Rendered once around a
        sentinel assistant content, so the history before it is never re-rendered (token-in / token-out)."""
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": sentinel}]
        text = self.render(messages + list(tool_messages), add_generation_prompt=True)
        at = text.find(sentinel)
        if at < 0:
            raise ConfigError(f"{self.folder}: the chat template drops the assistant turn's content, so the tokens "
                              f"between an assistant turn and a tool result cannot be found")
        return text[at + len(sentinel):]


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask marker) renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)
