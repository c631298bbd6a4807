"""Counting with the model's own tokenizer, loaded from a local file or model directory.

``tokenizer: PATH`` names either a ``tokenizer.json`` (the Hugging Face ``tokenizers``
format every recent model ships) or the model directory holding it, where the chat template
is read too (``chat_template.jinja``, else ``chat_template`` in ``tokenizer_config.json``)
with the special tokens it refers to (``bos_token``, ``eos_token``, ...).

Counting follows the engines (vLLM's defaults): a completion prompt is tokenized with the
tokenizer's special tokens (a BOS where the model adds one); a chat prompt is rendered with
the template and tokenized without adding them again. A prompt longer than
:attr:`LocalTokenizer.offload_chars` is tokenized on a worker thread, off the event loop
shorter ones inline, where a thread hop would cost more than the work. Counting goes through
the tokenizer's batch call (``encode_batch_fast``, or ``encode_batch`` on releases before
0.20.2): it releases the GIL while the Rust code runs, where a plain ``encode`` holds it and
would stall the event loop from the worker thread just the same (measured in
``benchmarks/tokenizer_cost.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from shuniu.core.tokenization.chat_template import ChatTemplate
from shuniu.core.tokenization.counter import TokenizerError
from shuniu.core.types import InferenceRequest

__all__ = ["OFFLOAD_CHARS", "IdsCounter", "LocalTokenizer"]

T = TypeVar("T")
log = logging.getLogger("shuniu.tokenization")

OFFLOAD_CHARS = 4096
"""Prompts longer than this many characters (about 1,000 tokens, 0.3 to 0.9 ms of
tokenizing) are counted on a worker thread: the hop costs about 0.05 ms, less than stalling
every other request for the count (``benchmarks/tokenizer_cost.py``)."""


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, or an
    ``AddedToken`` object with ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _read_template(directory: Path, config: Mapping[str, Any]) -> str | None:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    if template is None:
        chat_json = directory / "chat_template.json"
        if chat_json.is_file():
            template = json.loads(chat_json.read_text(encoding="utf-8")).get("chat_template")
    return template if isinstance(template, str) else None


class LocalTokenizer:
    """A model's tokenizer and chat template, loaded once."""

    __slots__ = ("_encode", "_executor", "name", "offload_chars", "template")

    def __init__(self, tokenizer: Any, template: ChatTemplate | None, name: str) -> None:
        """``tokenizer`` is a ``tokenizers.Tokenizer`` (anything with its batch encode)."""
        self._encode = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
        self.template = template
        self.name = name
        self.offload_chars = OFFLOAD_CHARS
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def load(cls, path: str | Path) -> LocalTokenizer:
        """Load ``path`` (a ``tokenizer.json`` or a directory holding one). Raises
        :class:`TokenizerError` with the reason."""
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerError(
                "counting with a model's tokenizer needs the tokenizers package: "
                "pip install 'shuniu[tokenizers]'"
            ) from None
        where = Path(path).expanduser()
        directory = where if where.is_dir() else where.parent
        file = where / "tokenizer.json" if where.is_dir() else where
        if not file.is_file():
            raise TokenizerError(f"no tokenizer.json at {file}")
        try:
            tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # the Rust loader raises plain Exception
            raise TokenizerError(
                f"{file} is not a tokenizer file the tokenizers package can read: {exc}"
            ) from None
        config: dict[str, Any] = {}
        config_file = directory / "tokenizer_config.json"
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise TokenizerError(f"{config_file} is not JSON: {exc}") from None
        source = _read_template(directory, config)
        special = {
            key: text
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
            if (text := _token_text(config.get(key))) is not None
        }
        template = ChatTemplate(source, special) if source is not None else None
        return cls(tok, template, str(where))

    def count_text(self, text: str, *, special_tokens: bool = True) -> int:
        """Tokens of ``text`` (with the tokenizer's own special tokens, e.g. a BOS, when
        ``special_tokens``)."""
        return len(self._encode([text], add_special_tokens=special_tokens)[0])

    def prompt_text(self, req: InferenceRequest) -> tuple[str, bool] | None:
        """The text an engine tokenizes for ``req`` and whether it adds special tokens, or
        ``None`` when the chat template refuses the messages."""
        if req.api != "chat":
            return req.prompt, True
        if self.template is None:
            return req.prompt, False  # no template: the flattened messages are the best guess
        body = req.body
        kwargs = body.get("chat_template_kwargs")
        try:
            text = self.template.render(
                body["messages"],
                add_generation_prompt=body.get("add_generation_prompt", True),
                tools=body.get("tools"),
                extra=kwargs if isinstance(kwargs, Mapping) else None,
            )
        except Exception as exc:  # the template's raise_exception, or one that breaks
            log.debug("chat template of %s refused request %s: %s", self.name, req.id, exc)
            return None
        return text, False

    async def count(self, req: InferenceRequest) -> int | None:
        prompt = self.prompt_text(req)
        if prompt is None:
            return None
        return await self._off_loop(self.count_text, *prompt)

    async def _off_loop(self, fn: Callable[..., T], text: str, special: bool) -> T:
        """``fn(text, special_tokens=special)``, on a worker thread for a long text."""
        if len(text) <= self.offload_chars:
            return fn(text, special_tokens=special)
        if self._executor is None:
            # Created on the first long prompt; two threads: tokenizing is CPU work, and more
            # threads than a gateway's cores would only queue behind each other.
            self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="shuniu-tokenize")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(fn, text, special_tokens=special))

    def ids_text(self, text: str, *, special_tokens: bool = True) -> list[int]:
        """The token ids of ``text``."""
        return list(self._encode([text], add_special_tokens=special_tokens)[0].ids)

    async def ids(self, req: InferenceRequest) -> list[int] | None:
        """The prompt's token ids as the engine computes them (chat template applied), or
        ``None`` when the template refuses the messages."""
        prompt = self.prompt_text(req)
        if prompt is None:
            return None
        return await self._off_loop(self.ids_text, *prompt)

    def close(self) -> None:
        """Stop the worker threads (the pool's shutdown)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


class IdsCounter:
    """Counts with a :class:`LocalTokenizer` and keeps the ids on the request
    (``InferenceRequest.prompt_ids``), for a balancer that matches them against the engines'
    blocks (``precise_prefix``). One encode does both."""

    __slots__ = ("tokenizer",)

    def __init__(self, tokenizer: LocalTokenizer) -> None:
        self.tokenizer = tokenizer

    async def count(self, req: InferenceRequest) -> int | None:
        ids = await self.tokenizer.ids(req)
        if ids is None:
            return None
        req.prompt_ids = ids
        return len(ids)

    def close(self) -> None:
        pass  # the tokenizer is shared: the pool builder closes it
