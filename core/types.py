"""Hot-path value types shared by the gateway, schedulers, balancers and backends.

They are ``msgspec.Struct`` classes: cheap to create, typed, and encodable without copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Literal

import msgspec

__all__ = [
    "POOLING_APIS",
    "Api",
    "Budget",
    "Chunk",
    "Completion",
    "Embeddings",
    "EndpointLoad",
    "Health",
    "InferenceRequest",
    "Limits",
    "Outcome",
    "PoolingJob",
    "Principal",
    "RequestRecord",
    "Scores",
    "Usage",
]

Api = Literal["chat", "completions", "embeddings", "rerank", "score"]

POOLING_APIS: frozenset[str] = frozenset({"embeddings", "rerank", "score"})
"""The APIs answered by a pooling model in one piece (vectors, scores), never streamed."""


class Usage(msgspec.Struct):
    """Token counts as OpenAI reports them."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int | None = None
    """Of the prompt tokens, those the engine's prefix cache served (``None``: the engine
    does not say); OpenAI's ``prompt_tokens_details.cached_tokens``."""


class Limits(msgspec.Struct, frozen=True, omit_defaults=True):
    """Rate limits of one scope (an API key, a tenant). ``None``: no limit of that kind."""

    rpm: int | None = None
    """Requests per minute."""
    rpd: int | None = None
    """Requests per day."""
    tpm: int | None = None
    """Tokens (prompt + completion) per minute."""
    tpd: int | None = None
    """Tokens per day."""
    concurrency: int | None = None
    """Requests in flight at once."""

    def any(self) -> bool:
        return (
            self.rpm is not None
            or self.rpd is not None
            or self.tpm is not None
            or self.tpd is not None
            or self.concurrency is not None
        )


class Budget(msgspec.Struct, frozen=True, omit_defaults=True):
    """A budget of one credential: tokens or money (exactly one set) per ``period``."""

    period: Literal["day", "month", "total"] = "day"
    tokens: int | None = None
    cost: float | None = None
    soft: float = 0.8
    """Share of the budget at which the caller is warned."""


class Principal(msgspec.Struct, frozen=True, omit_defaults=True):
    """Who sent a request. Filled by an authenticator; anonymous on an open gateway."""

    tenant: str = "anonymous"
    key_id: str | None = None
    """A name for the credential (an API key's id, a token's subject), never the secret."""
    tier: str = "default"
    models: frozenset[str] | None = None
    """Models (names or aliases) this credential may use. It narrows the tier: a model must
    be allowed by both. ``None``: any the tier allows."""
    limits: Limits | None = None
    """Limits of this credential, overriding its tier's per-key limits field by field."""
    project: str | None = None
    """A grouping of keys (a team, an application) that budgets and reports can name."""
    budgets: tuple[Budget, ...] = ()
    """This credential's own budgets (its tenant's and project's come from
    ``governance``)."""


ANONYMOUS = Principal()


class PoolingJob(msgspec.Struct, kw_only=True):
    """What an embeddings, rerank or score request asks of an engine, checked and counted.

    A long list is split into parts (each a request of its own, with a slice of this job and
    of ``body``) that run on several endpoints and are put back together in order.
    """

    texts: list[str] | None = None
    """Embeddings: the inputs as text (``None`` when they came as token ids). Rerank and
    score: the documents."""
    ids: list[list[int]] | None = None
    """Embeddings: the inputs as token ids."""
    tokens: list[int] = msgspec.field(default_factory=list)
    """Each input's length in tokens (exact for token ids, else the estimate); for rerank
    and score, each document's with its query's."""
    queries: list[str] = msgspec.field(default_factory=list)
    """Rerank and score: the query of every document, one for all or one each (score's
    ``text_1`` paired with ``text_2``)."""
    encoding_format: str = "float"
    """Embeddings: ``float`` or ``base64`` (little-endian float32), as the client asked."""
    dimensions: int | None = None
    """Embeddings: the vector size asked for (``None``: the model's)."""
    offset: int = 0
    """The index of this job's first input in the client's request (a part of a split
    request)."""

    @property
    def size(self) -> int:
        """How many inputs (documents) the job holds."""
        return len(self.tokens)


class Embeddings(msgspec.Struct):
    """A pooling engine's vectors, one per input, in input order."""

    vectors: list[Any]
    """Each an array of floats (``list[float]``, or the engine's JSON kept as
    ``msgspec.Raw``) or, for ``encoding_format: base64``, a base64 string."""
    prompt_tokens: int


class Scores(msgspec.Struct):
    """Relevance scores of a rerank or score job, one per document, in document order."""

    scores: list[float]
    prompt_tokens: int


class InferenceRequest(msgspec.Struct, kw_only=True):
    """One validated client request, as it travels through the pipeline.

    ``body`` is the decoded JSON the client sent; backends that forward to an
    OpenAI-compatible server send it on (with ``model`` rewritten), so fields shuniu does
    not know about reach engines that do.
    """

    id: str
    """The request id (``x-request-id``), also the base of the response id."""
    api: Api
    """``chat`` for /v1/chat/completions (and the Messages and Responses APIs),
    ``completions`` for /v1/completions, ``embeddings``, ``rerank`` and ``score`` for the
    pooling APIs (:data:`POOLING_APIS`)."""
    model: str
    """The model name as the client asked for it (a name or an alias)."""
    body: dict[str, Any]
    """The decoded request body."""
    prompt: str
    """The prompt as plain text (chat messages flattened), for backends that need text."""
    prompt_tokens: int
    """Prompt length from shuniu's estimate; exact for the simulator."""
    stream: bool = False
    include_usage: bool = False
    """``stream_options.include_usage``: send a final usage chunk."""
    continuous_usage: bool = False
    """``stream_options.continuous_usage_stats`` (vLLM's, with ``include_usage``): the
    usage so far on every chunk."""
    max_tokens: int | None = None
    """``max_completion_tokens`` or ``max_tokens``; ``None`` when the client sent neither."""
    stop: list[str] = msgspec.field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    arrival: float = 0.0
    """Event-loop time when the request was accepted."""
    priority: int = 0
    """Smaller runs first (vLLM's convention). The client's wish until the scheduler sets
    the priority it will apply (from the tier)."""
    principal: Principal = ANONYMOUS
    deadline: float | None = None
    """Event-loop time after which the answer is useless (from ``x-shuniu-deadline-ms``);
    a request still queued then leaves the queue with 504."""
    headers: Any = ()
    """The raw ASGI header pairs ``(name, value)`` (lower-case bytes), for policies that key
    on a header. Not copied."""
    header_map: dict[bytes, bytes] | None = None
    """The same headers by name (each name's first value), when the request path has made
    it: :meth:`header` reads it instead of walking the pairs."""
    version: str | None = None
    """The endpoint version this request must run on (a canary split or a pinning header);
    ``None`` = any."""
    modalities: frozenset[str] = frozenset()
    """The input modalities beyond text the prompt carries (``image``, ``audio``, ``video``,
    ``file``): only a model that declares them (``modalities:``) is given the request."""
    label: str | None = None
    """What the model's classifier (``classifier:``) made of the request, for routing rules'
    ``labels``; ``None`` without one."""
    token_ids: Sequence[int] | None = None
    """The prompt's token ids when known exactly (the simulator, whose workloads hand a
    compact ``array('H')``; a completion sent as ids, a list)."""
    prompt_ids: Sequence[int] | None = None
    """The token ids the engine will compute for the prompt, when the model's ``tokenizer:``
    produced them for exact prefix routing (``precise_prefix``); the request is still sent
    as text."""
    prefix_hashes: list[int] | None = None
    """Hash chain of the prompt's blocks, filled lazily by the first policy that needs it
    (:func:`shuniu.core.pools.prefix.prefix_hashes`), for blocks of ``prefix_block`` units."""
    prefix_block: int = 0
    expected_cached: int = 0
    """Prompt tokens the balancer expects the chosen engine to have cached (its prefix
    match), so the endpoint's ``prefill_tokens`` counts only what it must compute."""
    tried: frozenset[str] | None = None
    """Endpoints this request already failed on (a retry avoids them)."""
    wire: str = "openai"
    """The wire format the request arrived in and is answered in (``openai``,
    ``anthropic``, ``responses``: :mod:`shuniu.core.api.wire`); engines always receive
    ``body`` as OpenAI's."""
    wire_state: Any = None
    """What the wire format keeps from the request for its answer (the Responses API echoes
    parameters the chat body does not carry)."""
    pooling: PoolingJob | None = None
    """The inputs of an embeddings, rerank or score request (``None`` for generation)."""
    raw_events: bool = False
    """The client's stream may forward the engine's own events (:attr:`Chunk.raw`): an
    OpenAI chat or completions stream with one choice, without ``continuous_usage_stats``,
    whose text nothing in the gateway reads (no response-cache fill). Set by the request
    path before the engine call; ``False`` for every other caller of a backend."""
    trace_headers: dict[str, str] | None = None
    """W3C trace-context headers (``traceparent``, ``tracestate``) for the engine call: the
    gateway's upstream span when tracing is on, else the client's own, passed through."""

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower-case bytes), or ``None``."""
        by_name = self.header_map
        if by_name is not None:
            return by_name.get(name)
        for key, value in self.headers:
            if key == name:
                return value
        return None


class Chunk(msgspec.Struct):
    """One increment of generated output from a backend."""

    text: str = ""
    tokens: int = 0
    """Completion tokens this chunk carries (1 per chunk for token-by-token engines)."""
    finish_reason: str | None = None
    usage: Usage | None = None
    """Final usage when the backend knows it (usually on the last chunk)."""
    extra: dict[str, Any] | None = None
    """Other delta fields passed through from the engine (``tool_calls``, ``reasoning_content``)."""
    raw: bytes | None = None
    """The engine's own OpenAI event from its ``"choices"`` key up to its closing brace,
    without a ``usage`` member: forwarded to the client with the fields before ``"choices"``
    (id, object, created, model) written anew and ``usage`` as the client asked. Set by an
    OpenAI-protocol backend when the request allows it (:attr:`InferenceRequest.raw_events`)
    and the event is an ordinary content delta; such a chunk's ``text`` is left empty (the
    event is not decoded) and its ``tokens`` counted."""


class Completion(msgspec.Struct):
    """A whole, non-streamed result."""

    text: str
    finish_reason: str | None
    usage: Usage
    extra: dict[str, Any] | None = None
    """Other message fields passed through from the engine."""


class EndpointLoad(msgspec.Struct):
    """An engine's own view of its load, as reported by the backend (``None`` from a backend
    that cannot see its engine's load)."""

    running: int = 0
    waiting: int = 0
    kv_usage: float | None = None
    """Fraction of KV-cache blocks in use, 0..1, when the engine reports it."""
    prefix_queries: int | None = None
    prefix_hits: int | None = None
    generated_tokens: int | None = None
    aborted: int | None = None
    """Requests the engine dropped because their client went away."""


class Health(msgspec.Struct):
    ok: bool
    detail: str = ""


class Outcome(StrEnum):
    """How a request ended, as told to the scheduler and the observers."""

    OK = "ok"
    ERROR = "error"
    CANCELLED = "cancelled"


class RequestRecord(msgspec.Struct, kw_only=True):
    """What the ``request_finished`` observers receive once per request."""

    id: str
    model: str
    api: Api
    stream: bool
    status: int
    """HTTP status sent (200 for streams that failed after the first byte; see ``outcome``)."""
    outcome: Outcome
    endpoint: str | None = None
    error_code: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Of the prompt tokens, those the engine's prefix cache served (0 when it does not
    say)."""
    arrival: float = 0.0
    """Event-loop time the request arrived."""
    admitted: float | None = None
    """When the scheduler gave it an endpoint."""
    first_token: float | None = None
    finished: float = 0.0
    principal: Principal = ANONYMOUS
    pool: str | None = None
    """The model (pool) that served it, after aliases and routing rules; ``None`` when the
    request was refused before a model was known."""
    cached: bool = False
    """Answered from the response cache."""
    retries: int = 0
    """Attempts after the first (on other endpoints or the fallback model)."""
    prompt: str | None = None
    """The prompt text, only when the deployment asks for it (``gateway.access_log.include_prompt``)."""
