"""The ``sim`` backend: an endpoint served by an in-process simulated engine.

The engine decides *when* tokens appear (batching, KV cache, cost model); this adapter turns
them into deterministic text, applies stop strings and ``max_tokens``, and reports exact usage.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from typing import ClassVar

from shuniu.backends.sim.build import build_engine
from shuniu.backends.sim.engine import FINISHED, Seq
from shuniu.backends.sim.faults import FaultState
from shuniu.backends.sim.options import SimOptions
from shuniu.backends.sim.pooling import embed_text, relevance, truncate
from shuniu.backends.sim.text import VOCABULARY, rng_for
from shuniu.core.contracts import BackendBase, EndpointSpec
from shuniu.core.errors import bad_request, upstream_error
from shuniu.core.kv_events.local import LocalKvEvents
from shuniu.core.tokens import split_tokens
from shuniu.core.types import Chunk, Embeddings, EndpointLoad, Health, InferenceRequest, Scores, Usage

__all__ = ["SimBackend", "plan_output"]


def plan_output(
    req: InferenceRequest, options: SimOptions, max_model_len: int
) -> tuple[int, str, random.Random]:
    """How many tokens the request gets, why it stops (before stop strings), and the
    generator that then draws its words."""
    rng = rng_for(req.prompt, req.seed)
    natural = rng.randint(options.output_tokens_min, options.output_tokens_max)
    room = max(max_model_len - req.prompt_tokens, 0)
    limit = min(req.max_tokens, room) if req.max_tokens is not None else room
    if req.ignore_eos or natural > limit:
        return limit, "length", rng
    return natural, "stop", rng


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of ``text`` that could still grow into a stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


def _seed(prompt: str, seed: int | None) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}\x01{prompt}".encode(), digest_size=8).digest(), "big")


class SimBackend(BackendBase):
    kind: ClassVar[str] = "sim"
    serves: frozenset[str] = frozenset({"chat", "completions", "embeddings", "rerank"})
    takes_prompt_ids: ClassVar[bool] = True
    """With a model ``tokenizer:``, the pool keeps the prompt's token ids on the request
    (``prompt_ids``) and the engine caches and publishes blocks of those, as vLLM would of
    the same tokenizer's ids."""

    def __init__(self, spec: EndpointSpec) -> None:
        self.options = spec.options if isinstance(spec.options, SimOptions) else SimOptions()
        self.name = spec.name
        # A stable seed per endpoint name: replicas jitter independently, runs reproducibly.
        setup = build_engine(self.options, spec.max_model_len, seed=_seed(spec.name, 0))
        self.engine = setup.engine
        self.max_model_len = setup.max_model_len
        self.description = setup.description
        self.faults = (
            FaultState(self.options.faults, spec.name, self.engine.abort_all) if self.options.faults else None
        )
        self._kv_events: LocalKvEvents | None = None

    def kv_event_source(self) -> LocalKvEvents:
        """The engine's KV-cache events, in process and encoded as vLLM publishes them (the
        engine starts collecting them at the first call: nothing is spent before)."""
        if self._kv_events is None:
            self._kv_events = LocalKvEvents()
            self.engine.publish_kv_events(self._kv_events.publish)
        return self._kv_events

    async def start(self) -> None:
        if self.faults is not None:
            self.faults.start()

    async def stop(self) -> None:
        await self.engine.stop()

    async def run_seq(self, seq: Seq) -> None:
        """Run an engine-level sequence to its end (``shuniu simulate``), faults included."""
        if self.faults is not None:
            await self.faults.before_request()
        await self.submit_seq(seq)
        if seq.output_count < seq.max_output and self.faults is not None and self.faults.crashed:
            raise self.faults.down()

    def submit_seq(self, seq: Seq) -> asyncio.Future[None]:
        """Hand an engine-level sequence to the engine now; the future is done when it ends
        (cancelled: the caller gave up). :meth:`run_seq` without its coroutine, for a
        backend that injects no faults (``faults is None``): the simulator's driver runs
        its requests on callbacks. ``ValueError``: the sequence can never fit."""
        seq.done = done = asyncio.get_running_loop().create_future()
        seq.per_token = False  # only its end is awaited: the engine may advance it in aggregate
        self.engine.submit(seq)
        return done

    async def load(self) -> EndpointLoad:
        return self.engine.load()

    async def health(self) -> Health:
        faults = self.faults
        if faults is not None:
            if faults.hung:
                await asyncio.get_running_loop().create_future()  # a hung engine never answers
            if faults.crashed:
                return Health(False, "simulated crash")
        return Health(True, f"simulated ({self.description})")

    async def _prefill(self, req: InferenceRequest, texts: list[str]) -> None:
        """Run each input through the engine as a prompt that stops after its prefill (what
        a pooling model computes), so pooling requests take the time, batch slots and load
        they would on the engine, and share its prefix cache."""
        if self.faults is not None:
            await self.faults.before_request()
        job = req.pooling
        assert job is not None
        loop = asyncio.get_running_loop()
        seqs = []
        for i, (text, count) in enumerate(zip(texts, job.tokens, strict=True)):
            ids = [hash(t) & 0x7FFFFFFF for t in split_tokens(text)][:count]
            ids.extend(hash(("shuniu-marker", k)) & 0x7FFFFFFF for k in range(len(ids), max(count, 1)))
            seq = Seq(f"{req.id}-{i}", ids, 1, priority=req.priority, arrival=loop.time())
            seq.done = loop.create_future()
            try:
                self.engine.submit(seq)
            except ValueError as exc:
                for started in seqs:
                    self.engine.abort(started)
                raise bad_request(str(exc), "input", "context_length_exceeded") from None
            seqs.append(seq)
        try:
            await asyncio.gather(*(s.done for s in seqs))
        finally:
            for seq in seqs:
                if seq.status != FINISHED:
                    self.engine.abort(seq)  # the client went away
        if self.faults is not None and self.faults.crashed:
            raise self.faults.down()

    async def embed(self, req: InferenceRequest) -> Embeddings:
        job = req.pooling
        assert job is not None
        texts = (
            job.texts if job.texts is not None else [" ".join(f"t{t}" for t in ids) for ids in job.ids or ()]
        )
        dim = self.options.embedding_dim
        if job.dimensions is not None and job.dimensions > dim:
            raise bad_request(
                f"dimensions is {job.dimensions}, but this model's vectors have {dim}.",
                "dimensions",
                "invalid_value",
            )
        await self._prefill(req, texts)
        vectors = [embed_text(t, dim) for t in texts]
        if job.dimensions is not None and job.dimensions < dim:
            vectors = [truncate(v, job.dimensions) for v in vectors]
        return Embeddings(vectors, sum(job.tokens))

    async def score(self, req: InferenceRequest) -> Scores:
        job = req.pooling
        assert job is not None and job.texts is not None
        queries = job.queries if len(job.queries) > 1 else job.queries * len(job.texts)
        await self._prefill(req, [q + " " + d for q, d in zip(queries, job.texts, strict=True)])
        dim = self.options.embedding_dim
        memo: dict[str, list[float]] = {}
        scores = []
        for q, d in zip(queries, job.texts, strict=True):
            qv = memo.get(q)
            if qv is None:
                qv = memo[q] = embed_text(q, dim)
            scores.append(relevance(qv, embed_text(d, dim)))
        return Scores(scores, sum(job.tokens))

    async def stream(self, req: InferenceRequest) -> AsyncIterator[Chunk]:  # type: ignore[override]
        if self.faults is not None:
            await self.faults.before_request()
        count, finish, rng = plan_output(req, self.options, self.max_model_len)
        if count == 0:
            yield Chunk("", 0, finish, Usage(req.prompt_tokens, 0, req.prompt_tokens))
            return
        loop = asyncio.get_running_loop()
        # Token ids stand for the prompt's tokens so equal prompts share KV blocks; as many
        # as the request counts (the chat template's markers at the end, or fewer when a
        # model's own tokenizer counted), so the engine's counters agree with its usage.
        ids = req.token_ids if req.token_ids is not None else req.prompt_ids
        if ids is not None:
            prompt_ids = [t & 0x7FFFFFFF for t in ids]
        else:
            prompt_ids = [hash(t) & 0x7FFFFFFF for t in split_tokens(req.prompt)]
        wanted = req.prompt_tokens
        if len(prompt_ids) < wanted:
            prompt_ids.extend(hash(("shuniu-marker", i)) & 0x7FFFFFFF for i in range(len(prompt_ids), wanted))
        elif len(prompt_ids) > wanted:
            del prompt_ids[wanted:]
        seq = Seq(
            req.id,
            prompt_ids,
            count,
            output_seed=_seed(req.prompt, req.seed),
            priority=req.priority,
            arrival=loop.time(),
        )
        try:
            self.engine.submit(seq)
        except ValueError as exc:
            raise bad_request(str(exc), "messages", "context_length_exceeded") from None
        stops = req.stop
        text = ""
        emitted_chars = 0
        tokens = 0
        ended = False
        try:
            while True:
                if seq.output_count == tokens:
                    if seq.status == FINISHED:
                        # Dropped by the engine before its end: only a (simulated) crash does that.
                        ended = True
                        raise (
                            self.faults.down()
                            if self.faults is not None
                            else upstream_error(f"The engine endpoint {self.name} dropped the request.")
                        )
                    seq.waiter = loop.create_future()
                    await seq.waiter
                    continue
                while tokens < seq.output_count:
                    word = VOCABULARY[rng.randrange(len(VOCABULARY))]
                    text += word if tokens == 0 else " " + word
                    tokens += 1
                    last = tokens == count
                    reason: str | None = finish if last else None
                    cut = len(text)
                    if stops:
                        start = max(emitted_chars - max(len(s) for s in stops) + 1, 0)
                        hits = [p for p in (text.find(s, start) for s in stops) if p >= 0]
                        if hits:
                            cut, reason, last = min(hits), "stop", True
                        elif not last:
                            cut = len(text) - _held_back(text, stops)
                    piece = text[emitted_chars:cut]
                    emitted_chars = max(emitted_chars, cut)
                    if last:
                        ended = True
                        if tokens < count:
                            self.engine.abort(seq, aborted=False)  # a stop string ended it early
                        p = req.prompt_tokens
                        yield Chunk(piece, 1, reason, Usage(p, tokens, p + tokens, seq.cached_tokens))
                        return
                    yield Chunk(piece, 1)
        finally:
            if not ended:
                self.engine.abort(seq)  # the client went away: free the engine's work at once
