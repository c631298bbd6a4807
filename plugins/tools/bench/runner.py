"""The run: issue the plan's requests open loop (each at its arrival time, whatever the
server is doing) or closed loop (N users, each sending its next request when the last one
ends), and record every outcome.

Open loop is what the world does to a service, and the only way to see latency under a given
offered load: a closed-loop client slows down with the server, so the requests that would
have waited never exist (coordinated omission). The scheduler issues every request whose
time has come, then sleeps until the next; the *schedule lag* (time sent minus time intended)
of every request is recorded, and if it grows the client, not the server, is what limits the
run. ``max_in_flight`` caps open connections: a request due while that many are in flight is
not sent and counted as ``client_saturated``.

Requests issued during ``warmup_s`` are sent but left out of every statistic. The measured
window runs from the end of warm-up to the end of the last measured request.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import resource
import signal
import time
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from shuniu.core.tokens import count_tokens
from shuniu.plugins.tools.bench.client import ROUTES, Call, Endpoint, Pool, request_head
from shuniu.plugins.tools.bench.traffic import Planned

__all__ = ["Progress", "RequestRecord", "RunResult", "RunSpec", "run", "run_sync"]

_TICK_S = 0.1
_EARLY_S = 0.0005
"""A request due within this is sent now (the event loop's timers tick in milliseconds)."""
_TICK_MIN_S = 0.001
_BATCH = 32  # requests issued back to back before the scheduler lets responses in


@dataclass
class RunSpec:
    """How to run a plan."""

    endpoint: Endpoint
    headers: list[tuple[str, str]] = field(default_factory=list)
    concurrency: int | None = None
    """Closed loop with this many users; None: open loop (the plan's arrival times)."""
    duration_s: float | None = None
    """Measured seconds of issuing (after warm-up); None: no time limit."""
    requests: int | None = None
    """Measured requests to issue; None: no count limit. With both, whichever ends first;
    with neither, until the plan ends."""
    warmup_s: float = 0.0
    timeout_s: float = 600.0
    max_in_flight: int = 4096
    stream: bool = True
    verify_tls: bool = True
    user_agent: str = "shuniu-bench"
    goodput: Callable[[float | None, float | None, float], bool] | None = None
    """``(ttft, tpot, e2e) -> meets the SLO`` (seconds; ttft None when not streamed)."""
    keep_requests: bool = False
    """Keep one :class:`RequestRecord` per measured request (``RunResult.records``)."""


@dataclass(slots=True)
class RequestRecord:
    """One measured request, as ``shuniu bench --requests-out`` writes it (seconds)."""

    index: int
    """Its place in the plan (the order requests were due)."""
    sent_s: float
    """When it was sent, from the start of the run."""
    ttft_s: float | None
    """Time to its first content chunk (streamed answers only)."""
    e2e_s: float
    prompt_tokens: int
    """As the server's ``usage`` counted them (else as planned)."""
    output_tokens: int | None
    """As ``usage`` counted them (else None)."""
    cached_tokens: int | None
    """Prompt tokens the server's prefix cache served, when its ``usage`` says."""
    error: str | None


@dataclass
class Progress:
    """A snapshot for the progress display, every tick."""

    elapsed: float
    phase: str
    """``warmup``, ``running`` or ``draining``."""
    issued: int
    """Requests sent so far, warm-up included."""
    measured: int
    """Measured requests sent (or counted as client saturated)."""
    done: int
    errors: int
    in_flight: int
    rate: float
    """Successful completions per second over the last second."""
    saturated: int


@dataclass
class RunResult:
    """Everything measured (seconds; per-second series indexed from the start of the run)."""

    mode: str
    window_s: float = 0.0
    issue_s: float = 0.0
    """Measured seconds spent issuing (open loop: first to last measured send)."""
    issued: int = 0
    """Measured requests sent."""
    warmup_issued: int = 0
    succeeded: int = 0
    failed: int = 0
    aborted: int = 0
    saturated: int = 0
    """Measured requests not sent because ``max_in_flight`` were in flight."""
    errors: Counter[str] = field(default_factory=Counter)
    ttft: list[float] = field(default_factory=list)
    itl: array = field(default_factory=lambda: array("d"))
    tpot: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    lag: array = field(default_factory=lambda: array("d"))
    output_tokens: list[int] = field(default_factory=list)
    input_tokens: int = 0
    inputs: int = 0
    """Embedding inputs or documents scored by the successful measured requests."""
    usage_reported: int = 0
    """Successful requests whose output count came from ``usage`` (not from chunk counts)."""
    chunks: int = 0
    good: int = 0
    """Successful measured requests meeting the SLO (when one is given)."""
    client_cpu_s: float = 0.0
    wall_s: float = 0.0
    connections: int = 0
    interrupted: bool = False
    warmup_s: float = 0.0
    series_sent: list[int] = field(default_factory=list)
    series_ok: list[int] = field(default_factory=list)
    series_errors: list[int] = field(default_factory=list)
    series_saturated: list[int] = field(default_factory=list)
    series_tokens: list[float] = field(default_factory=list)
    series_inflight_sum: list[float] = field(default_factory=list)
    series_inflight_n: list[int] = field(default_factory=list)
    series_inflight_max: list[int] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)
    """Every measured request, when ``RunSpec.keep_requests`` (in the order they ended)."""

    def _grow(self, second: int) -> None:
        n = second + 1 - len(self.series_sent)
        if n > 0:
            for s in (
                self.series_sent,
                self.series_ok,
                self.series_errors,
                self.series_saturated,
                self.series_inflight_n,
                self.series_inflight_max,
            ):
                s.extend([0] * n)
            self.series_tokens.extend([0.0] * n)
            self.series_inflight_sum.extend([0.0] * n)


class _Run:
    def __init__(
        self,
        spec: RunSpec,
        plan: Iterator[Planned],
        progress: Callable[[Progress], None] | None,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.progress = progress
        self.result = RunResult(mode="closed" if spec.concurrency else "open", warmup_s=spec.warmup_s)
        self.loop = asyncio.get_running_loop()
        self.pool = Pool(spec.endpoint, self._done, timeout=spec.timeout_s, verify_tls=spec.verify_tls)
        self.heads: dict[str, bytes] = {
            api: request_head(spec.endpoint, spec.endpoint.path(api), spec.headers, spec.user_agent)
            for api in ROUTES
        }
        self.t0 = 0.0
        self.warm_end = 0.0
        self.issue_end = math.inf
        self.first_measured = math.inf
        self.last_measured = 0.0
        self.last_end = 0.0
        self.stopping = False
        self.index = 0
        self.measured_issued = 0
        self.done_count = 0
        self.error_count = 0
        self.ok_count = 0
        self.recent: deque[tuple[float, int]] = deque()
        """(time, successes so far) at the ticks of the last second, for the live rate."""
        self.finished = asyncio.Event()

    # -- issuing
    def _issue(self, p: Planned, intended: float) -> None:
        r = self.result
        measured = intended >= self.warm_end
        if self.pool.busy >= self.spec.max_in_flight:
            if measured:
                r.saturated += 1
                self.measured_issued += 1
            r._grow(int(intended - self.t0))
            r.series_saturated[int(intended - self.t0)] += 1
            return
        body = p.body
        request = self.heads[p.api] + str(len(body)).encode() + b"\r\n\r\n" + body
        call = Call(
            self.index, request, self.spec.stream, intended, measured, p.prompt_tokens, p.output_tokens
        )
        self.index += 1
        self.pool.submit(call)
        second = int(call.issued - self.t0)
        r._grow(second)
        r.series_sent[second] += 1
        if measured:
            self.measured_issued += 1
            r.issued += 1
            r.lag.append(call.issued - intended)
            if call.issued < self.first_measured:
                self.first_measured = call.issued
            self.last_measured = call.issued
        else:
            r.warmup_issued += 1

    def _want_more(self, now: float) -> bool:
        if self.stopping:
            return False
        if self.spec.requests is not None and self.measured_issued >= self.spec.requests:
            return False
        return now < self.issue_end

    async def _open_loop(self) -> None:
        sleep, clock = asyncio.sleep, time.perf_counter
        t0, spec = self.t0, self.spec
        batch = 0
        for p in self.plan:
            target = t0 + p.at
            if target >= self.issue_end:
                break
            now = clock()
            while target > now + _EARLY_S:
                # Never shorter than the loop's timer tick: shorter sleeps return at once
                # and would spin the CPU the server under test may need.
                await sleep(max(target - now, _TICK_MIN_S))
                batch = 0
                now = clock()
            if self.stopping:
                break
            if batch >= _BATCH:  # behind schedule: still let responses in now and then
                await sleep(0)
                batch = 0
            self._issue(p, target)
            batch += 1
            if spec.requests is not None and self.measured_issued >= spec.requests:
                break

    def _next_closed(self) -> None:
        now = time.perf_counter()
        if not self._want_more(now):
            return
        p = next(self.plan, None)
        if p is None:
            self.stopping = True
            return
        self._issue(p, now)

    # -- outcomes
    def _done(self, call: Call) -> None:
        r = self.result
        self.done_count += 1
        end_s = call.end - self.t0
        second = max(0, int(end_s))
        r._grow(second)
        if call.error == "aborted":
            r.aborted += 1
        elif call.error is not None:
            self.error_count += 1
            r.series_errors[second] += 1
            if call.measured:
                r.failed += 1
                r.errors[call.error] += 1
        else:
            self.ok_count += 1
            r.series_ok[second] += 1
            out = call.completion_tokens
            if out is not None:
                if call.measured:
                    r.usage_reported += 1
            elif call.stream:
                out = call.chunks
            else:
                out = count_tokens(call.text) if call.text else 0
            self._spread_tokens(call, out)
            if call.measured:
                r.succeeded += 1
                r.output_tokens.append(out)
                r.input_tokens += (
                    call.prompt_tokens if call.prompt_tokens is not None else call.planned_prompt
                )
                r.chunks += call.chunks
                if call.items:
                    r.inputs += call.items
                e2e = call.e2e
                r.e2e.append(e2e)
                ttft = call.ttft
                tpot = None
                if ttft is not None:
                    r.ttft.append(ttft)
                    if call.gaps:
                        r.itl.extend(call.gaps)
                    if out > 1:
                        tpot = (call.end - call.first) / (out - 1)
                        r.tpot.append(tpot)
                if self.spec.goodput is not None and self.spec.goodput(ttft, tpot, e2e):
                    r.good += 1
        if call.measured and self.spec.keep_requests and call.error != "aborted":
            r.records.append(
                RequestRecord(
                    call.index,
                    (call.issued or call.intended) - self.t0,
                    call.ttft,
                    call.e2e,
                    call.prompt_tokens if call.prompt_tokens is not None else call.planned_prompt,
                    call.completion_tokens,
                    call.cached_tokens,
                    call.error,
                )
            )
        if call.measured and call.end > self.last_end:
            self.last_end = call.end
        if self.spec.concurrency:
            self._next_closed()
        if self.pool.busy == 0 and self.stopping_or_done():
            self.finished.set()

    def _spread_tokens(self, call: Call, tokens: int) -> None:
        """Add a request's output tokens to the per-second series, spread evenly from its
        first content chunk to its end (all at the end when not streamed)."""
        r = self.result
        start = (call.first if call.first >= 0 else call.end) - self.t0
        end = call.end - self.t0
        if tokens <= 0:
            return
        if end - start < 1e-9 or int(start) == int(end):
            r.series_tokens[max(0, int(end))] += tokens
            return
        rate = tokens / (end - start)
        s = start
        while s < end:
            edge = min(end, math.floor(s) + 1.0)
            r.series_tokens[max(0, int(s))] += rate * (edge - s)
            s = edge

    def stopping_or_done(self) -> bool:
        return self.stopping or not self._want_more(time.perf_counter())

    # -- the run
    def _tick(self, now: float) -> None:
        r = self.result
        second = int(now - self.t0)
        r._grow(second)
        busy = self.pool.busy
        r.series_inflight_sum[second] += busy
        r.series_inflight_n[second] += 1
        if busy > r.series_inflight_max[second]:
            r.series_inflight_max[second] = busy
        if self.progress is not None:
            recent = self.recent
            recent.append((now, self.ok_count))
            while len(recent) > 2 and recent[1][0] <= now - 1.0:
                recent.popleft()
            then, ok_then = recent[0]
            rate = (self.ok_count - ok_then) / (now - then) if now - then > 0.05 else 0.0
            if now < self.warm_end:
                phase = "warmup"
            elif self.stopping_or_done():
                phase = "draining"
            else:
                phase = "running"
            self.progress(
                Progress(
                    elapsed=now - self.t0,
                    phase=phase,
                    issued=self.index,
                    measured=self.measured_issued,
                    done=self.done_count,
                    errors=self.error_count,
                    in_flight=busy,
                    rate=rate,
                    saturated=r.saturated,
                )
            )

    async def _ticker(self) -> None:
        while True:
            self._tick(time.perf_counter())
            await asyncio.sleep(_TICK_S)

    def interrupt(self) -> None:
        """Stop issuing and end every request in flight (Ctrl-C)."""
        if self.stopping and self.result.interrupted:
            return
        self.result.interrupted = True
        self.stopping = True
        self.pool.abort()
        if self.pool.busy == 0:
            self.finished.set()

    async def main(self) -> RunResult:
        spec, r = self.spec, self.result
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        self.t0 = time.perf_counter()
        self.warm_end = self.t0 + spec.warmup_s
        if spec.duration_s is not None:
            self.issue_end = self.warm_end + spec.duration_s
        ticker = self.loop.create_task(self._ticker())
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            self.loop.add_signal_handler(signal.SIGINT, self.interrupt)
        try:
            if spec.concurrency:
                for _ in range(spec.concurrency):
                    self._next_closed()
                    if self.stopping:
                        break
                # Closed loop re-issues from completions; wake up at the end of the window.
                while not self.finished.is_set():
                    if self.pool.busy == 0 and self.stopping_or_done():
                        break
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(_TICK_S):
                            await self.finished.wait()
            else:
                await self._open_loop()
            self.stopping = True
            while self.pool.busy > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_TICK_S):
                        await self.finished.wait()
                self.finished.clear()
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                self.loop.remove_signal_handler(signal.SIGINT)
            ticker.cancel()
            self._tick(time.perf_counter())
            self.pool.close()
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        end = time.perf_counter()
        r.client_cpu_s = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
        r.wall_s = end - self.t0
        r.connections = self.pool.opened
        start = max(self.warm_end, self.t0) if r.warmup_s > 0 else self.t0
        if self.first_measured < math.inf:
            start = min(start, self.first_measured)
        r.window_s = max(self.last_end, self.last_measured, start) - start
        if self.first_measured < math.inf:
            r.issue_s = self.last_measured - self.first_measured
        return r


async def run(
    spec: RunSpec, plan: Iterator[Planned], progress: Callable[[Progress], None] | None = None
) -> RunResult:
    """Run ``plan`` as ``spec`` says (inside a running event loop)."""
    return await _Run(spec, plan, progress).main()


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file limit toward ``wanted`` (one descriptor per
    connection) and return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft


def run_sync(
    spec: RunSpec, plan: Iterator[Planned], progress: Callable[[Progress], None] | None = None
) -> Any:
    """:func:`run` on a fresh event loop (uvloop when installed)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.run(run(spec, plan, progress))
    return uvloop.run(run(spec, plan, progress))
