"""Forwarding embeddings and rerank to Hugging Face text-embeddings-inference (TEI).

TEI's native API: ``POST /embed`` (``inputs`` as strings or token ids, ``normalize``,
``truncate``, ``prompt_name``, ``dimensions``; the answer is an array of float arrays, and
``x-compute-tokens`` says how many tokens they took), ``POST /rerank`` (``query`` and
``texts``; the answer is ``[{index, score}]`` by descending score), ``GET /info`` (the model's
kind, ``max_input_length``, ``max_client_batch_size``), ``GET /health`` and ``GET /metrics``.
Errors are ``{"error", "error_type"}`` (``Validation`` 413, ``Tokenizer`` 422, ``Empty``
400: the request's fault, passed to the client; ``Backend`` 424 and ``Overloaded`` 429, TEI's
concurrency limit: counted against the endpoint, so the request is retried on another
replica). Read at TEI v1.8.3 (``router/src/http/server.rs``, ``router/src/lib.rs``);
``dimensions`` needs TEI 1.8.

A call with more inputs than the server takes at once (``max_client_batch_size``) is sent as
several calls at once, put back together in order; pairs with several queries (``/v1/score``
pairwise) become one ``/rerank`` per query.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import aiohttp
import msgspec

from shuniu.backends.http import (
    PROBE_ERRORS,
    ProbeError,
    Prober,
    describe_error,
    open_session,
    post_or_raise,
    probe_headers,
    read_whole,
)
from shuniu.backends.tei.metrics import parse_tei_metrics
from shuniu.backends.tei.options import TeiOptions
from shuniu.core.contracts import BackendBase, EndpointSpec
from shuniu.core.errors import GatewayError, protocol_error, upstream_error
from shuniu.core.types import Embeddings, EndpointLoad, Health, InferenceRequest, Scores

__all__ = ["TeiBackend"]

_encode = msgspec.json.Encoder().encode
_decode_vectors = msgspec.json.Decoder(list[msgspec.Raw]).decode


class _Ranked(msgspec.Struct):
    index: int
    score: float


_decode_ranking = msgspec.json.Decoder(list[_Ranked]).decode


class _TeiError(msgspec.Struct):
    error: str = ""
    error_type: str | None = None


_decode_error = msgspec.json.Decoder(_TeiError).decode

_CLIENT_FAULTS = frozenset({400, 413, 422})
"""TEI's statuses for a request it will never serve (empty, too large, too long, invalid)."""


class TeiBackend(BackendBase):
    kind: ClassVar[str] = "tei"
    serves: frozenset[str] = frozenset({"embeddings", "rerank"})

    def __init__(self, spec: EndpointSpec) -> None:
        opts = spec.options
        assert isinstance(opts, TeiOptions)
        self.name = spec.name
        self.options = opts
        self.max_model_len = spec.max_model_len
        root = opts.base_url
        self._embed_url = f"{root}/embed"
        self._rerank_url = f"{root}/rerank"
        self._info_url = f"{root}/info"
        self._health_url = root + opts.health_path
        self._metrics_url = root + opts.metrics_path
        self._headers = {"content-type": "application/json", **opts.headers}
        if opts.api_key:
            self._headers["authorization"] = f"Bearer {opts.api_key}"
        self._session: aiohttp.ClientSession | None = None
        self.prober = Prober(
            lambda: self._session, probe_headers(opts.headers, opts.api_key), opts.probe_timeout_s
        )
        self.info: dict[str, Any] | None = None
        """TEI's ``/info`` answer once read."""
        self.info_problem: str | None = None
        self.batch_size = 32
        """Inputs per call the server takes (``max_client_batch_size``; TEI's default until
        ``/info`` says)."""
        self.model_kind: str | None = None
        """``embedding``, ``reranker`` or ``classifier``, from ``/info``."""

    # -- lifecycle and probes ---------------------------------------------------------------

    async def start(self) -> None:
        opts = self.options
        self._session = open_session(
            max_connections=opts.max_connections,
            timeout_s=opts.timeout_s,
            connect_timeout_s=opts.connect_timeout_s,
        )
        try:
            await self.discover()
        except ProbeError as exc:
            self.info_problem = str(exc)
        except PROBE_ERRORS as exc:
            self.info_problem = f"GET /info: {describe_error(exc)}"

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def discover(self) -> None:
        """Read ``/info``: the model's kind, ``max_input_length`` (the context window unless
        configured) and ``max_client_batch_size``."""
        data = await self.prober.fetch_json(self._info_url, "GET /info")
        if not isinstance(data, dict):
            raise ProbeError("GET /info: not a JSON object")
        length = data.get("max_input_length")
        if self.max_model_len is None and type(length) is int and length > 0:
            self.max_model_len = length
        batch = data.get("max_client_batch_size")
        if type(batch) is int and batch > 0:
            self.batch_size = batch
        model_type = data.get("model_type")
        if isinstance(model_type, dict) and model_type:
            self.model_kind = next(iter(model_type))
        self.info = data
        self.info_problem = None

    async def health(self) -> Health:
        pending = self._read_info if self.info is None else None
        health = await self.prober.health(
            self._health_url, started=self._session is not None, pending=pending
        )
        return Health(True, f"HTTP 200 ({self.model_kind or 'model'})") if health.ok else health

    async def _read_info(self) -> None:
        await self.discover()

    async def load(self) -> EndpointLoad:
        raw = await self.prober.fetch(self._metrics_url, f"GET {self.options.metrics_path}")
        return parse_tei_metrics(raw)

    # -- requests ---------------------------------------------------------------------------

    def _error(self, status: int, raw: bytes) -> GatewayError:
        message = raw[:500].decode("utf-8", "replace").strip() or f"HTTP {status}"
        error_type = None
        try:
            body = _decode_error(raw)
            message, error_type = body.error or message, body.error_type
        except msgspec.DecodeError:
            pass
        if status in _CLIENT_FAULTS:
            return GatewayError(status, message, param=None, code=error_type or "invalid_request")
        return upstream_error(f"The engine endpoint {self.name} answered HTTP {status}: {message}")

    async def _post(self, url: str, payload: dict[str, Any]) -> tuple[bytes, int | None]:
        """The answer's body and the tokens TEI says it computed (``x-compute-tokens``)."""
        resp = await post_or_raise(
            self._session, url, _encode(payload), self._headers, self.name, self._error
        )
        header = resp.headers.get("x-compute-tokens")
        raw = await read_whole(resp, self.name)
        tokens = int(header) if header is not None and header.isdigit() else None
        return raw, tokens

    def _common(self, body: dict[str, Any]) -> dict[str, Any]:
        opts = self.options
        out: dict[str, Any] = {}
        truncate = body.get("truncate", opts.truncate)
        if truncate is not None:
            out["truncate"] = truncate
        if "truncation_direction" in body:
            out["truncation_direction"] = body["truncation_direction"]
        return out

    async def embed(self, req: InferenceRequest) -> Embeddings:
        job = req.pooling
        assert job is not None
        inputs: list[Any] = job.texts if job.texts is not None else list(job.ids or ())
        payload = self._common(req.body)
        payload["normalize"] = req.body.get("normalize", self.options.normalize)
        prompt_name = req.body.get("prompt_name", self.options.prompt_name)
        if prompt_name is not None:
            payload["prompt_name"] = prompt_name
        if job.dimensions is not None:
            payload["dimensions"] = job.dimensions
        size = self.batch_size
        batches = [inputs[i : i + size] for i in range(0, len(inputs), size)]
        answers = await asyncio.gather(
            *(self._post(self._embed_url, {**payload, "inputs": b}) for b in batches)
        )
        vectors: list[Any] = []
        counted = 0
        for (raw, tokens), batch in zip(answers, batches, strict=True):
            try:
                part = _decode_vectors(raw)
            except msgspec.DecodeError:
                raise protocol_error(
                    f"The engine endpoint {self.name} sent a malformed /embed answer."
                ) from None
            if len(part) != len(batch):
                raise upstream_error(
                    f"The engine endpoint {self.name} sent {len(part)} vectors for {len(batch)} inputs."
                )
            vectors.extend(part)
            counted += tokens if tokens is not None else 0
        known = all(tokens is not None for _, tokens in answers)
        return Embeddings(vectors, counted if known else sum(job.tokens))

    async def score(self, req: InferenceRequest) -> Scores:
        job = req.pooling
        assert job is not None and job.texts is not None
        docs = job.texts
        queries = job.queries if len(job.queries) > 1 else job.queries * len(docs)
        groups: dict[str, list[int]] = {}
        for i, query in enumerate(queries):
            groups.setdefault(query, []).append(i)
        common = self._common(req.body)
        calls = []
        plan: list[tuple[list[int], int]] = []  # (document indexes, offset within them) per call
        for query, indexes in groups.items():
            for start in range(0, len(indexes), self.batch_size):
                chunk = indexes[start : start + self.batch_size]
                payload = {**common, "query": query, "texts": [docs[i] for i in chunk], "raw_scores": False}
                calls.append(self._post(self._rerank_url, payload))
                plan.append((chunk, 0))
        answers = await asyncio.gather(*calls)
        scores: list[float | None] = [None] * len(docs)
        counted = 0
        for (raw, tokens), (chunk, _) in zip(answers, plan, strict=True):
            try:
                ranked = _decode_ranking(raw)
            except msgspec.DecodeError:
                raise protocol_error(
                    f"The engine endpoint {self.name} sent a malformed /rerank answer."
                ) from None
            for item in ranked:
                if 0 <= item.index < len(chunk):
                    scores[chunk[item.index]] = item.score
            counted += tokens or 0
        if any(s is None for s in scores):
            raise upstream_error(f"The engine endpoint {self.name} did not score every document.")
        known = all(tokens is not None for _, tokens in answers)
        return Scores([s for s in scores if s is not None], counted if known else sum(job.tokens))
