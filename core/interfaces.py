"""The interfaces plugins implement. Plugins are resolved into these objects at start-up;
the hot path calls their methods directly and never goes through ``pm.hook``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from shuniu.core.types import Completion, EndpointLoad, Health, InferenceRequest, Outcome

if TYPE_CHECKING:
    from shuniu.core.pool import EndpointState, Pool, Ticket

__all__ = [
    "Backend",
    "BackendBase",
    "Balancer",
    "Cache",
    "EndpointSpec",
    "Filter",
    "Registration",
    "Scheduler",
    "Scorer",
]


@dataclass(frozen=True, slots=True)
class Registration:
    """What a ``register_*`` callback records: a name, how to build it, and its options.

    ``options`` is a pydantic model (subclass :class:`shuniu.core.config.Options`) that
    validates the ``options:`` mapping of the YAML entry selecting this name; ``None`` means
    the thing takes no options.
    """

    name: str
    factory: Callable[..., Any]
    options: type | None = None
    description: str = ""
    plugin: str = ""
    """Name of the plugin that registered it (filled in by the plugin manager)."""


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
    max_model_len: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    """One engine replica. Built by the factory a ``register_backends`` hook registered."""

    kind: ClassVar[str]
    max_model_len: int | None

    async def start(self) -> None:
        """Open connections / start the engine. Called once before traffic."""

    async def stop(self) -> None:
        """Release everything. Called once at shutdown."""

    def stream(self, req: InferenceRequest) -> AsyncIterator[Any]:
        """Yield :class:`shuniu.core.types.Chunk` objects. Closing the iterator must stop
        the generation upstream (the client went away)."""
        ...

    async def complete(self, req: InferenceRequest) -> Completion:
        """The whole result at once (non-streaming requests)."""
        ...

    async def load(self) -> EndpointLoad | None:
        """The engine's own load snapshot, or ``None`` when this backend cannot see it
        (balancers then use the gateway's own in-flight counts)."""
        ...

    async def health(self) -> Health:
        """A cheap liveness probe."""
        ...


class BackendBase:
    """Defaults for the optional parts of :class:`Backend`: ``complete`` gathers ``stream``."""

    kind: ClassVar[str] = ""
    max_model_len: int | None = None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def stream(self, req: InferenceRequest) -> AsyncIterator[Any]:  # pragma: no cover
        raise NotImplementedError

    async def complete(self, req: InferenceRequest) -> Completion:
        from shuniu.core.types import Usage

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
            await gen.aclose()  # type: ignore[attr-defined]
        if usage is None:
            usage = Usage(req.prompt_tokens, tokens, req.prompt_tokens + tokens)
        return Completion("".join(parts), finish, usage)

    async def load(self) -> EndpointLoad | None:
        return None

    async def health(self) -> Health:
        return Health(True)


@runtime_checkable
class Balancer(Protocol):
    """Picks one endpoint for a request. Synchronous, O(endpoints), no I/O."""

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointState]) -> EndpointState | None:
        """Return one of ``endpoints`` (all healthy with a free slot), or ``None`` to wait."""
        ...


@runtime_checkable
class Filter(Protocol):
    """Narrows the candidates of a composed balancer. Synchronous, O(endpoints), no I/O."""

    def filter(self, req: InferenceRequest, endpoints: Sequence[EndpointState]) -> Sequence[EndpointState]:
        """A subset of ``endpoints`` (all healthy with a free slot). Returning none of them
        means "no preference": the balancer then keeps them all."""
        ...


@runtime_checkable
class Scorer(Protocol):
    """Rates candidates for a composed balancer. Synchronous, O(endpoints), no I/O."""

    def score(self, req: InferenceRequest, endpoints: Sequence[EndpointState]) -> Sequence[float]:
        """One score per endpoint, in order, each in 0..1 (higher is better)."""
        ...

    def picked(self, req: InferenceRequest, endpoint: EndpointState) -> None:
        """``endpoint`` was chosen for ``req`` (a scorer with memory, e.g. prefixes, records it)."""
        ...


@runtime_checkable
class Scheduler(Protocol):
    """Owns a pool's queue: decides which waiting request is dispatched next."""

    async def admit(self, req: InferenceRequest, pool: Pool) -> Ticket:
        """Wait until the request may start and return its ticket (holding an endpoint slot),
        or raise :class:`shuniu.core.errors.GatewayError` (429/503) to refuse it."""
        ...

    def release(self, ticket: Ticket, outcome: Outcome) -> None:
        """The request holding ``ticket`` ended; free its slot and dispatch waiters."""
        ...

    def wake(self, pool: Pool) -> None:
        """Capacity may have appeared (an endpoint turned healthy); dispatch what fits."""
        ...


class Cache(Protocol):
    """A response cache (built-ins arrive with the tenancy issue)."""

    async def get(self, key: str) -> Any | None: ...

    async def put(self, key: str, value: Any, ttl: float) -> None: ...
