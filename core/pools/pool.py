"""Pools of endpoints: the state the scheduler and balancer work on.

A pool serves one logical model. Each endpoint has a gateway-side concurrency limit
(``limit``: the configured ``max_concurrency``, tightened adaptively from the engine's own
load reports, see :mod:`shuniu.core.pools.load`); the scheduler only dispatches while some
healthy endpoint is under its limit, so the queue stays in the gateway, where priorities
and tenant shares can still be applied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shuniu.core.config.endpoints import KvEventsConfig
from shuniu.core.contracts import Backend, Balancer, Classifier, Scheduler, Ticket
from shuniu.core.pools.demand import Demand, Signals
from shuniu.core.tokenization.counter import PromptCounter
from shuniu.core.types import EndpointLoad, InferenceRequest, Outcome

__all__ = ["DEFAULT_OUTPUT_TOKENS", "EndpointState", "Pool"]

DEFAULT_OUTPUT_TOKENS = 256
"""Output tokens assumed for a request that sets no ``max_tokens`` (for token accounting)."""


class EndpointState:
    """One endpoint as the gateway sees it. Mutated only on the event loop.

    The load view a balancer reads: ``in_flight`` and ``in_flight_tokens`` (the gateway's
    own, always current), ``load`` (the engine's last snapshot, ``None`` when it reports
    none or it went stale) weighted by ``load_weight`` (1 for a fresh snapshot, fading to 0
    as it ages), ``healthy``, and ``labels`` (e.g. ``zone``).
    """

    __slots__ = (
        "backend",
        "backlog",
        "completed",
        "draining",
        "ejected",
        "ejected_until",
        "ejections",
        "errors",
        "expected_hits",
        "failures_in_row",
        "healthy",
        "in_flight",
        "in_flight_tokens",
        "index",
        "kv_events",
        "labels",
        "last_health_detail",
        "limit",
        "load",
        "load_at",
        "load_weight",
        "max_concurrency",
        "name",
        "prefill_tokens",
        "remote_in_flight",
        "remote_prefill_tokens",
        "remote_tokens",
        "version",
        "weight",
        "window_failures",
        "window_requests",
        "window_start",
    )

    def __init__(
        self,
        name: str,
        backend: Backend,
        *,
        weight: float = 1.0,
        version: str = "v1",
        max_concurrency: int = 0,
        labels: dict[str, str] | None = None,
        index: int = 0,
    ) -> None:
        self.name = name
        self.backend = backend
        self.weight = weight
        self.version = version
        self.max_concurrency = max_concurrency
        self.limit = max_concurrency
        """Current concurrency limit (0 = none): ``max_concurrency``, or less while the
        engine reports a backlog."""
        self.backlog = 0
        """Waiting requests beyond ``load.max_engine_waiting`` in the engine's last snapshot
        (0: none): a backlog counts only when the next snapshot still shows it."""
        self.labels = labels or {}
        self.index = index
        """Position in the pool (stable; balancers may use it as a small integer key)."""
        self.in_flight = 0
        self.in_flight_tokens = 0
        """Prompt + expected output tokens of the requests dispatched and not yet finished."""
        self.prefill_tokens = 0
        """Uncached prompt tokens of those requests not yet answering (see EndpointView)."""
        self.expected_hits = 0
        """Prompt tokens of the requests dispatched here that the balancer expected the
        engine's prefix cache to hold (``InferenceRequest.expected_cached``), in all."""
        self.kv_events: KvEventsConfig | None = None
        """Where the engine publishes its KV-cache events (``kv_events:``), if it does."""
        self.remote_in_flight = 0
        """The fleet's other gateways' requests in flight on it, as they last published
        (``fleet:``; 0 without one)."""
        self.remote_tokens = 0
        self.remote_prefill_tokens = 0
        """The other gateways' ``prefill_tokens`` on it, as they last published."""
        self.healthy = True
        self.draining = False
        self.last_health_detail = ""
        self.completed = 0
        self.errors = 0
        self.load: EndpointLoad | None = None
        self.load_at = 0.0
        self.load_weight = 0.0
        # Passive outlier detection (shuniu.core.pools.resilience).
        self.ejected = False
        self.ejected_until = 0.0
        self.ejections = 0
        self.failures_in_row = 0
        self.window_start = 0.0
        self.window_requests = 0
        self.window_failures = 0

    def __repr__(self) -> str:
        return f"<EndpointState {self.name} in_flight={self.in_flight} healthy={self.healthy}>"


class Pool:
    """The endpoints of one model, with its balancer and scheduler."""

    __slots__ = (
        "_next_index",
        "_on_change",
        "accepts",
        "balancer",
        "classifier",
        "counter",
        "demand",
        "dispatched",
        "endpoints",
        "max_model_len",
        "name",
        "scaling",
        "scheduler",
        "serves",
        "split_inputs",
        "takes_full",
        "versions",
        "versions_key",
    )

    def __init__(
        self,
        name: str,
        endpoints: list[EndpointState],
        balancer: Balancer,
        scheduler: Scheduler,
        *,
        max_model_len: int | None = None,
        counter: PromptCounter | None = None,
    ) -> None:
        self.name = name
        self.endpoints = endpoints
        for i, endpoint in enumerate(endpoints):
            endpoint.index = i
        self.balancer = balancer
        self.takes_full = bool(getattr(balancer, "takes_full_endpoints", False))
        """Whether the balancer is also offered endpoints at their adaptive limit."""
        self.scheduler = scheduler
        self.max_model_len = max_model_len
        self.counter = counter
        """Counts prompts in the model's tokens (``tokenizer:``); ``None``: the estimate."""
        self.accepts: frozenset[str] = frozenset()
        """The input modalities beyond text the model takes (``modalities:``)."""
        self.serves: frozenset[str] = frozenset({"chat", "completions"})
        """The APIs the model answers (``serves:``; ``rerank`` brings ``score``)."""
        self.split_inputs = 32
        """Inputs per engine call of a pooling request (``pooling.split_inputs``)."""
        self.classifier: Classifier | None = None
        """Labels the model's requests before its routing rules (``classifier:``)."""
        self.demand: Demand | None = None
        """Counts arrivals and answers for the autoscaling signals (``autoscaling:``)."""
        self.scaling: Signals | None = None
        """The autoscaling signals' last evaluation (:mod:`shuniu.core.pools.autoscale`)."""
        self.dispatched = 0
        """Requests given a slot since start (schedulers estimate queue drain rates from it)."""
        self._next_index = len(endpoints)
        self.versions: frozenset[str] = frozenset()
        self.versions_key = ""
        """The versions as one string (a cache key part: answers of any of them)."""
        self._versions_changed()
        self._on_change: list[Callable[[Pool], Any]] = []

    def _versions_changed(self) -> None:
        self.versions = frozenset(e.version for e in self.endpoints)
        self.versions_key = ",".join(sorted(self.versions))

    def add(self, endpoint: EndpointState) -> None:
        """A new endpoint joins (at run time). Its ``index`` is new, never reused: balancers
        key state on it."""
        endpoint.index = self._next_index
        self._next_index += 1
        # A new list, not an append: code iterating the old one is not disturbed.
        self.endpoints = [*self.endpoints, endpoint]
        self._versions_changed()
        self.scheduler.wake(self)

    def remove(self, endpoint: EndpointState) -> None:
        """An endpoint leaves (drained first: nothing in flight)."""
        self.endpoints = [e for e in self.endpoints if e is not endpoint]
        self._versions_changed()

    def has_healthy(self, version: str | None = None) -> bool:
        return any(
            e.healthy and not e.ejected and not e.draining and (version is None or e.version == version)
            for e in self.endpoints
        )

    def try_dispatch(self, req: InferenceRequest, now: float) -> Ticket | None:
        """Give ``req`` a slot on an endpoint the balancer picks, if one has a free slot
        (and runs ``req.version``, when the request is pinned to one); a balancer with
        ``takes_full_endpoints`` may also take one at its adaptive limit."""
        version = req.version
        tried = req.tried
        # The candidates: endpoints in balancing (healthy, not ejected, not draining) that
        # run the version and were not tried, with a free slot (under `limit`, counted
        # across the fleet's gateways); then, for a balancer that takes full endpoints,
        # those at their adaptive limit but under `max_concurrency` (the hard one). One
        # pass, no call per endpoint: this runs for every request.
        candidates: list[EndpointState] = []
        full: list[EndpointState] = []
        takes_full = self.takes_full
        for e in self.endpoints:
            if not e.healthy or e.ejected or e.draining:
                continue
            if (version is not None and e.version != version) or (tried is not None and e.name in tried):
                continue
            limit = e.limit
            if limit == 0:
                candidates.append(e)
                continue
            busy = e.in_flight + e.remote_in_flight
            if busy < limit:
                candidates.append(e)
            elif takes_full and (e.max_concurrency == 0 or busy < e.max_concurrency):
                # A prefix balancer weighs waiting on the engine that holds the prompt
                # against a cold prefill on a free one (the adaptive limit would send it to
                # the latter).
                full.append(e)
        if full:
            candidates += full
        if not candidates:
            return None
        picked = self.balancer.pick(req, candidates)
        if picked is None:
            return None
        # A balancer returns one of the candidates it was given: this pool's own endpoints.
        endpoint: EndpointState = picked  # type: ignore[assignment]  # one of this pool's
        cost = req.prompt_tokens + (req.max_tokens or DEFAULT_OUTPUT_TOKENS)
        endpoint.in_flight += 1
        endpoint.in_flight_tokens += cost
        self.dispatched += 1
        ticket = Ticket(req, self, endpoint, now, cost)
        expected = req.expected_cached
        if expected:
            endpoint.expected_hits += expected
        prefill = req.prompt_tokens - expected
        if prefill > 0:
            ticket.prefill = prefill
            endpoint.prefill_tokens += prefill
        return ticket

    @staticmethod
    def first_output(ticket: Ticket) -> None:
        """The ticket's request produced its first output (or failed): its prefill is done."""
        if ticket.prefill:
            ticket.endpoint.prefill_tokens -= ticket.prefill  # type: ignore[attr-defined]
            ticket.prefill = 0

    def free(self, ticket: Ticket, outcome: Outcome) -> bool:
        """Return the ticket's slot (idempotent). True if it was still held."""
        if ticket.released:
            return False
        ticket.released = True
        endpoint: EndpointState = ticket.endpoint  # type: ignore[assignment]
        endpoint.in_flight -= 1
        endpoint.in_flight_tokens -= ticket.cost
        if ticket.prefill:
            endpoint.prefill_tokens -= ticket.prefill
            ticket.prefill = 0
        if outcome is Outcome.ERROR:
            endpoint.errors += 1
        else:
            endpoint.completed += 1
        return True

    def learn_max_model_len(self) -> None:
        """Without a configured context window, take the smallest its backends report (an
        engine's ``/v1/models``, ``/info``): a prompt must fit every endpoint."""
        if self.max_model_len is None:
            lens = [e.backend.max_model_len for e in self.endpoints if e.backend.max_model_len]
            self.max_model_len = min(lens) if lens else None

    def engine_down(self, endpoint: EndpointState) -> None:
        """The endpoint's engine stopped serving (a launched engine exited, hung or failed
        to start): out of balancing, and whatever its KV cache held is gone, so a balancer
        that remembers it forgets it (``Balancer.engine_lost``)."""
        self.set_healthy(endpoint, False)
        lost = getattr(self.balancer, "engine_lost", None)
        if lost is not None:
            lost(endpoint)

    def set_healthy(self, endpoint: EndpointState, healthy: bool) -> None:
        endpoint.healthy = healthy
        if healthy:
            self.scheduler.wake(self)
