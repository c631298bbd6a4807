"""The backend contract: one engine replica behind one endpoint.

A ``register_backends`` hook registers a factory ``factory(spec: EndpointSpec) -> Backend``
per ``kind:``. The gateway builds one backend per endpoint at start-up (and at reload or
when the admin API adds an endpoint), calls :meth:`Backend.start` before traffic and
:meth:`Backend.stop` at shutdown, and in between calls :meth:`Backend.stream` or
:meth:`Backend.complete` per request, :meth:`Backend.health` from the health loop and
:meth:`Backend.load` from the load loop. Subclass :class:`BackendBase` (or
:class:`Backend`) to inherit the defaults of the optional members.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from shuniu.core.contracts.conformance import optional
from shuniu.core.contracts.hardware import DeviceReading
from shuniu.core.errors import GatewayError
from shuniu.core.types import (
    Chunk,
    Completion,
    Embeddings,
    EndpointLoad,
    Health,
    InferenceRequest,
    Scores,
    Usage,
)

__all__ = ["Backend", "BackendBase", "EndpointSpec"]


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """Everything a backend factory receives about the endpoint it serves."""

    name: str
    """Unique endpoint name, e.g. ``chat-sim-0``."""
    model: str
    """The public model name of the pool."""
    options: Any
    """The validated options object (the registration's ``options`` type), or ``None``."""
    replica: int = 0
    """Which replica of its ``endpoints[]`` entry (``replicas: N``) this is."""
    max_model_len: int | None = None
    """The model's configured context window, when the deployment sets one."""
    extra: dict[str, Any] = field(default_factory=dict)
    """What the gateway knows beyond the options: ``launch`` (``host``, ``port``, ``env``)
    for an engine the gateway launches."""


class Backend(Protocol):
    """One engine replica. Required: :meth:`stream`. The other members are optional: their
    defaults (nothing to start or stop, ``complete`` gathers ``stream``, no load view,
    always healthy, no device readings) are inherited by subclassing :class:`Backend` or
    :class:`BackendBase`."""

    kind: ClassVar[str]
    """The ``kind:`` this backend is registered under."""
    max_model_len: int | None
    """The context window, once known (from the deployment or the engine); the gateway
    refuses prompts that do not fit."""
    tokenizes: bool
    """Whether :meth:`count_tokens` asks the engine (``tokenizer: engine`` needs an endpoint
    that does). Default ``False``."""
    serves: frozenset[str]
    """The APIs this kind of engine can answer (``chat``, ``completions``, ``embeddings``,
    ``rerank``); a model whose ``serves:`` asks for more is refused at start-up. Default
    chat and completions."""

    def stream(self, req: InferenceRequest) -> AsyncIterator[Chunk]:
        """Yield :class:`shuniu.core.types.Chunk` objects. Raise
        :class:`shuniu.core.errors.GatewayError` for the engine's own refusals (a 4xx is
        passed to the client as it is; a 5xx counts against the endpoint and may be
        retried elsewhere before the first chunk). Closing the iterator must stop the
        generation upstream (the client went away).

        The iterator may have a ``ready() -> bool`` method: true when its next chunk (or its
        end, or its error) is at hand without waiting for the engine. Delivery then holds the
        encoded chunks and sends them in one write once ``ready()`` turns false."""
        ...

    @optional
    async def start(self) -> None:
        """Open connections, read what the engine says about itself. Called once before
        traffic; an engine that is not up yet is not an error (health checks keep the
        endpoint out of balancing)."""
        return None

    @optional
    async def stop(self) -> None:
        """Release everything. Called once at shutdown, after in-flight requests ended."""
        return None

    @optional
    async def complete(self, req: InferenceRequest) -> Completion:
        """The whole result at once (non-streaming requests). Same errors as :meth:`stream`.
        The default gathers :meth:`stream`."""
        parts: list[str] = []
        finish: str | None = None
        usage: Usage | None = None
        tokens = 0
        gen = self.stream(req)
        try:
            async for chunk in gen:
                if chunk.text:
                    parts.append(chunk.text)
                tokens += chunk.tokens
                if chunk.finish_reason is not None:
                    finish = chunk.finish_reason
                if chunk.usage is not None:
                    usage = chunk.usage
        finally:
            await gen.aclose()  # type: ignore[attr-defined]  # stream() is an async generator
        if usage is None:
            usage = Usage(req.prompt_tokens, tokens, req.prompt_tokens + tokens)
        return Completion("".join(parts), finish, usage)

    @optional
    async def embed(self, req: InferenceRequest) -> Embeddings:
        """The vectors of ``req.pooling``'s inputs (texts or token ids), one per input in
        order, at ``req.pooling.dimensions`` when set, as floats or, for
        ``encoding_format: base64``, base64 strings (the gateway converts floats when the
        engine cannot). Errors as :meth:`stream`. For endpoints whose ``serves`` has
        ``embeddings``; the default refuses."""
        raise _not_served(self, "embeddings")

    @optional
    async def score(self, req: InferenceRequest) -> Scores:
        """The relevance of each document of ``req.pooling`` (``texts``) to its query
        (``queries``: one for all, or one per document), in document order; ``/v1/rerank``
        sorts them and ``/v1/score`` returns them as they are. For endpoints whose ``serves``
        has ``rerank``; the default refuses."""
        raise _not_served(self, "rerank")

    @optional
    async def load(self) -> EndpointLoad | None:
        """The engine's own load snapshot (polled every ``load.interval_s``), or ``None``
        when this backend cannot see it (balancers then use the gateway's own counts).
        Raising means "no fresh reading": the last snapshot ages."""
        return None

    @optional
    async def health(self) -> Health:
        """A cheap liveness probe (every ``health.interval_s``)."""
        return Health(True)

    @optional
    async def count_tokens(self, req: InferenceRequest) -> int | None:
        """The prompt's length in the engine's own tokens, chat template applied (vLLM's and
        SGLang's ``/tokenize``, TGI's), for models with ``tokenizer: engine``; ``None`` when
        the engine cannot tell. Raise on transport errors (the gateway then keeps its
        estimate). Called at most once per distinct prompt (counts are cached)."""
        return None

    @optional
    async def devices(self) -> Sequence[DeviceReading] | None:
        """The accelerators this endpoint's engine runs on, for ``/ready`` (called at most
        once per ``/ready`` request; cache expensive probes), or ``None`` when this backend
        cannot tell."""
        return None


GENERATION: frozenset[str] = frozenset({"chat", "completions"})
"""What an engine serves unless it says more: chat and completions."""


def _not_served(backend: object, api: str) -> GatewayError:
    kind = getattr(backend, "kind", "") or type(backend).__name__
    return GatewayError(
        501, f"Endpoints of kind {kind!r} do not serve {api}.", type="server_error", code="not_supported"
    )


class BackendBase(Backend):
    """A convenient base class: :class:`Backend`'s defaults, with an empty ``kind``, no
    known context window, and chat and completions served."""

    kind: ClassVar[str] = ""
    max_model_len: int | None = None
    tokenizes: bool = False
    serves: frozenset[str] = GENERATION

    def stream(self, req: InferenceRequest) -> AsyncIterator[Chunk]:  # pragma: no cover
        raise NotImplementedError
