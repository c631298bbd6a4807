"""A model's chat template, rendered the way engines render it before tokenizing.

vLLM, TGI and SGLang turn chat messages into one prompt with the Jinja template that ships
with the model (``chat_template.jinja``, or ``chat_template`` in ``tokenizer_config.json``)
and then tokenize that text without adding special tokens again. Rendering it here the same
way (a sandboxed Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, the
``raise_exception`` and ``strftime_now`` helpers, a ``tojson`` that keeps non-ASCII text,
the tokenizer's special tokens as variables) gives the engine's ``prompt_tokens`` count.

Message content given as a list of parts is joined as text (text parts, one per line), as
vLLM does for templates that take string content; image and audio parts are not counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from shuniu.core.tokenization.counter import TokenizerError

__all__ = ["ChatTemplate", "text_content"]


def text_content(content: Any) -> Any:
    """A message's content as a template expects it: a list of parts becomes the text of its
    text parts, one per line; anything else is passed as it is."""
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return content


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(
    value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False
) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """One compiled chat template and the special tokens it may refer to."""

    __slots__ = ("_template", "source", "special")

    def __init__(self, source: str, special: Mapping[str, str] | None = None) -> None:
        try:
            from jinja2.exceptions import TemplateSyntaxError
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:  # pragma: no cover - jinja2 comes with the tokenizers extra
            raise TokenizerError("chat templates need jinja2: pip install 'shuniu[tokenizers]'") from exc
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except TemplateSyntaxError as exc:
            raise TokenizerError(f"the chat template does not compile: {exc} (line {exc.lineno})") from None
        self.source = source
        self.special = dict(special or {})

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Any = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of ``messages``. Raises ``jinja2.TemplateError`` when the template
        refuses them (its ``raise_exception``)."""
        msgs = [
            {**m, "content": text_content(m.get("content"))} if isinstance(m.get("content"), list) else m
            for m in messages
        ]
        context = {**self.special, **(extra or {})}
        context.update(messages=msgs, tools=tools, add_generation_prompt=add_generation_prompt)
        return self._template.render(context)
