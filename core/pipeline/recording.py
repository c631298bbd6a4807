"""The last stage: what happened to a request, told to the ``request_finished`` observers
(metrics, the access log, the status window, degradation, plugins) and to the trace.

:class:`Progress` is filled in by the stages as the request goes; :class:`Recorder` turns
it into one :class:`~shuniu.core.types.RequestRecord` when the request ends (also for
requests refused before a model was known) and calls every observer directly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from shuniu.core.errors import GatewayError
from shuniu.core.observability.tracing import RequestTrace
from shuniu.core.types import ANONYMOUS, Api, InferenceRequest, Outcome, RequestRecord

__all__ = ["Progress", "Recorder"]

log = logging.getLogger("shuniu.gateway")


class Progress:
    """What the pipeline learned about one request, for the observers."""

    __slots__ = (
        "admitted",
        "attempts",
        "cached",
        "cached_tokens",
        "completion_tokens",
        "endpoint",
        "error_code",
        "fell_back",
        "finish_reason",
        "first_token",
        "outcome",
        "pool",
        "prompt_tokens",
        "retrying",
        "status",
        "trace",
        "upstream",
    )

    def __init__(self, pool: str, trace: RequestTrace | None) -> None:
        self.status = 200
        self.outcome: Outcome | None = None
        self.endpoint: str | None = None
        self.error_code: str | None = None
        self.admitted: float | None = None
        self.first_token: float | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        """Of the prompt tokens, those the engine's prefix cache served."""
        self.cached = False
        self.pool: str | None = pool
        self.finish_reason: str | None = None
        self.attempts = 0
        """Retries so far (0: the first attempt)."""
        self.retrying = False
        """The current attempt is a retry (counted in the pool's retry budget)."""
        self.fell_back = False
        self.trace = trace
        self.upstream: Any = None
        """The upstream span, while the engine call runs (tracing on)."""

    def end_upstream(self) -> None:
        span, self.upstream = self.upstream, None
        if span is not None:
            if self.outcome is Outcome.ERROR and self.trace is not None:
                self.trace.fail(span, self.error_code)
            span.end()

    def fail(self, err: GatewayError) -> None:
        self.status = err.status
        self.outcome = Outcome.ERROR
        self.error_code = err.code


class Recorder:
    """Builds each request's record and hands it to the observers and the trace."""

    __slots__ = ("_observers", "_prompts", "active")

    def __init__(self, observers: list[Callable[..., Any]], *, record_prompts: bool) -> None:
        self._observers = observers
        self._prompts = record_prompts
        self.active = bool(observers)
        """Whether anyone listens (otherwise no record is built)."""

    def add(self, observer: Callable[..., Any]) -> None:
        self._observers.append(observer)
        self.active = True

    def refused(
        self,
        request_id: str,
        api: Api,
        req: InferenceRequest | None,
        err: GatewayError,
        arrival: float,
        now: float,
        trace: RequestTrace | None,
    ) -> None:
        """A request refused before admission (bad body, unknown model, a tier rule)."""
        if not self.active and trace is None:
            return
        rec = RequestRecord(
            id=request_id,
            model=req.model if req is not None else "",
            api=api,
            stream=req.stream if req is not None else False,
            status=err.status,
            outcome=Outcome.ERROR,
            error_code=err.code,
            prompt_tokens=req.prompt_tokens if req is not None else 0,
            arrival=arrival,
            finished=now,
            principal=req.principal if req is not None else ANONYMOUS,
            prompt=req.prompt if req is not None and self._prompts else None,
        )
        self._call(rec)
        if trace is not None:
            trace.finish(rec)

    def finished(self, req: InferenceRequest, progress: Progress, now: float) -> None:
        """A request that was routed to a pool ended (answered, failed or abandoned)."""
        trace = progress.trace
        if not self.active and trace is None:
            return
        rec = RequestRecord(
            id=req.id,
            model=req.model,
            api=req.api,
            stream=req.stream,
            status=progress.status,
            outcome=progress.outcome if progress.outcome is not None else Outcome.OK,
            endpoint=progress.endpoint,
            error_code=progress.error_code,
            prompt_tokens=progress.prompt_tokens,
            completion_tokens=progress.completion_tokens,
            cached_tokens=progress.cached_tokens,
            arrival=req.arrival,
            admitted=progress.admitted,
            first_token=progress.first_token,
            finished=now,
            principal=req.principal,
            pool=progress.pool,
            cached=progress.cached,
            retries=progress.attempts,
            prompt=req.prompt if self._prompts else None,
        )
        self._call(rec)
        if trace is not None:
            trace.finish(rec, progress.finish_reason)

    def _call(self, rec: RequestRecord) -> None:
        for fn in self._observers:
            try:
                fn(record=rec)
            except Exception:
                log.exception("a request_finished observer failed")
