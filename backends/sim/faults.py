"""Fault injection for simulated endpoints: errors, latency spikes, crashes, hangs.

The resilience features (health checks, retries, failover) are tested against these; the
faults are decided by a seeded random generator, so a run is reproducible.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from pydantic import Field, model_validator

from shuniu.core.config import Options
from shuniu.core.errors import GatewayError, upstream_error

__all__ = ["FaultOptions", "FaultState"]


class FaultOptions(Options):
    error_rate: float = Field(0.0, ge=0, le=1)
    """Share of requests that fail before their first token (the gateway answers 502)."""
    spike_rate: float = Field(0.0, ge=0, le=1)
    """Share of requests delayed by ``spike_s`` before they reach the engine."""
    spike_s: float = Field(1.0, ge=0)
    """Length of a latency spike, in seconds."""
    crash_at_s: float | None = Field(None, ge=0)
    """Seconds after start-up when the engine crashes: streams in flight end with an error,
    new requests fail, health checks fail."""
    crash_after_requests: int | None = Field(None, ge=0)
    """Crash when this many requests have arrived (the next one fails)."""
    restart_after_s: float | None = Field(None, ge=0)
    """A crashed engine comes back (empty) after this long; unset = it stays down."""
    hang_after_requests: int | None = Field(None, ge=0)
    """After this many requests the engine stops answering: new requests and health probes
    wait forever (timeouts must catch them)."""
    seed: int = 0
    """Seed of the fault generator."""

    @model_validator(mode="after")
    def _check(self) -> FaultOptions:
        if self.restart_after_s is not None and self.crash_at_s is None and self.crash_after_requests is None:
            raise ValueError("restart_after_s needs crash_at_s or crash_after_requests")
        return self


class FaultState:
    """The fault schedule of one endpoint."""

    def __init__(self, options: FaultOptions, name: str, on_crash: Callable[[], None]) -> None:
        self.options = options
        self.name = name
        self._on_crash = on_crash
        self._rng = random.Random(f"{options.seed}:{name}")
        self.requests = 0
        self.crashed = False
        self.crashes = 0
        self.hung = False
        self.injected_errors = 0

    def start(self) -> None:
        if self.options.crash_at_s is not None:
            asyncio.get_running_loop().call_later(self.options.crash_at_s, self.crash)

    def crash(self) -> None:
        if self.crashed:
            return
        self.crashed = True
        self.crashes += 1
        self._on_crash()
        if self.options.restart_after_s is not None:
            asyncio.get_running_loop().call_later(self.options.restart_after_s, self._restart)

    def _restart(self) -> None:
        self.crashed = False

    async def before_request(self) -> None:
        """Apply the faults that hit a request before the engine sees it."""
        opts = self.options
        self.requests += 1
        if (
            opts.crash_after_requests is not None
            and self.requests > opts.crash_after_requests
            and not self.crashes
        ):
            self.crash()
        if self.crashed:
            raise self.down()
        if opts.hang_after_requests is not None and self.requests > opts.hang_after_requests:
            self.hung = True
        if self.hung:
            await asyncio.get_running_loop().create_future()  # never answers
        if opts.error_rate and self._rng.random() < opts.error_rate:
            self.injected_errors += 1
            raise upstream_error(f"The engine endpoint {self.name} failed (simulated engine error).")
        if opts.spike_rate and self._rng.random() < opts.spike_rate:
            await asyncio.sleep(opts.spike_s)
            if self.crashed:
                raise self.down()

    def down(self) -> GatewayError:
        return upstream_error(f"The engine endpoint {self.name} is down (simulated crash).")
