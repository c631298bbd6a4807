"""The simulated engine.

For now each request decodes at a fixed per-request rate after a first-token delay, with at
most ``max_num_seqs`` running (the rest wait inside the engine). The full model (continuous
batching, paged KV cache, prefix caching, roofline timing) replaces the inside of
:meth:`SimEngine.generate` without changing its contract: an async iterator of chunks that
stops generating the moment it is closed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

from shuniu.backends.sim.options import SimOptions
from shuniu.backends.sim.text import VOCABULARY, rng_for
from shuniu.core.types import Chunk, EndpointLoad, InferenceRequest, Usage

__all__ = ["SimEngine"]


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of ``text`` that could still grow into a stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


class SimEngine:
    """One simulated engine replica."""

    def __init__(self, options: SimOptions) -> None:
        self.options = options
        self.running = 0
        self.waiting = 0
        self.requests = 0
        self.aborted = 0
        self.generated_tokens = 0
        self._slots = asyncio.Semaphore(options.max_num_seqs)

    def load(self) -> EndpointLoad:
        return EndpointLoad(
            running=self.running,
            waiting=self.waiting,
            generated_tokens=self.generated_tokens,
            aborted=self.aborted,
        )

    def plan(self, req: InferenceRequest) -> tuple[int, str, random.Random]:
        """How many tokens this request will get, why it stops (before stop strings), and the
        generator that then draws its words."""
        opts = self.options
        rng = rng_for(req.prompt, req.seed)
        natural = rng.randint(opts.output_tokens_min, opts.output_tokens_max)
        room = max(opts.max_model_len - req.prompt_tokens, 0)
        limit = min(req.max_tokens, room) if req.max_tokens is not None else room
        if req.ignore_eos or natural > limit:
            return limit, "length", rng
        return natural, "stop", rng

    async def generate(self, req: InferenceRequest) -> AsyncIterator[Chunk]:
        opts = self.options
        loop = asyncio.get_running_loop()
        self.requests += 1
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        done = False
        try:
            count, finish, rng = self.plan(req)
            delay = opts.ttft_ms / 1000
            if opts.prefill_tokens_per_s:
                delay += req.prompt_tokens / opts.prefill_tokens_per_s
            if delay > 0:
                await asyncio.sleep(delay)
            stops = req.stop
            text = ""
            emitted = 0
            start = loop.time()
            rate = opts.tokens_per_s
            for i in range(count):
                if rate and i:
                    wait = start + i / rate - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                word = VOCABULARY[rng.randrange(len(VOCABULARY))]
                text += word if i == 0 else " " + word
                self.generated_tokens += 1
                last = i == count - 1
                reason: str | None = finish if last else None
                cut = len(text)
                if stops:
                    hits = [p for p in (text.find(s, max(emitted - len(s) + 1, 0)) for s in stops) if p >= 0]
                    if hits:
                        cut, reason, last = min(hits), "stop", True
                    elif not last:
                        cut = len(text) - _held_back(text, stops)
                piece = text[emitted:cut]
                emitted = max(emitted, cut)
                if last:
                    done = True
                    tokens = i + 1
                    yield Chunk(
                        piece, 1, reason, Usage(req.prompt_tokens, tokens, req.prompt_tokens + tokens)
                    )
                    return
                yield Chunk(piece, 1)
            done = True
            if count == 0:
                yield Chunk("", 0, finish, Usage(req.prompt_tokens, 0, req.prompt_tokens))
        finally:
            if not done:
                self.aborted += 1
            self.running -= 1
            self._slots.release()
