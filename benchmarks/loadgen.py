"""A cheap load generator for OpenAI-style endpoints on this machine (127.0.0.1 only).

Three measurements, each bounded in time and in count:

* ``latency``: one connection, one request at a time (c=1), non-streamed unless ``--stream``;
  reports p50/p90/p99/max over ``--requests`` requests after ``--warmup`` unmeasured ones.
  ``--compare URL2`` measures a second API root the same way in alternating blocks of 100
  (e.g. upstream direct vs through the gateway), so that load from elsewhere on the machine
  hits both alike, and prints the difference.
* ``rps``: ``-c`` keep-alive connections (default 64) sending non-streamed requests back to
  back for ``--duration`` seconds after ``--warmup`` seconds; reports requests/s.
* ``stream``: the same with ``"stream": true``; reports requests/s and streamed chunks/s
  (SSE ``data:`` events other than ``data: [DONE]``).

Engines: ``wrk`` (C, epoll; used for ``rps`` and ``stream`` when it is on PATH) or ``python``
(a raw :class:`asyncio.Protocol` client on uvloop with ``httptools`` response parsing:
pre-encoded request bytes, no per-request tasks, no JSON decoding, SSE events counted with
``bytes.count``). ``latency`` always uses the Python client, so direct and through-gateway
numbers come from the same client. Which engine ran is printed (and in ``--json``).

``--header NAME:VALUE`` (repeatable) is sent on every request, by both engines and to both
targets of ``--compare`` (e.g. ``Authorization: Bearer ...`` for a gateway with API keys; an
upstream ignores it). ``--body-json JSON`` merges fields into every request body (e.g.
``'{"temperature": 0}'``, which makes the request cacheable by the gateway).

``--watch NAME=PID`` (repeatable) reads the process's CPU time (``/proc/PID/stat`` utime +
stime), ``--watch NAME=tree:PID`` that of the process and its descendants, at the start and end
of the measured window only, and the machine's CPU use
(``/proc/stat``) over the same window.

Latency percentiles of the Python engine interpolate linearly between the two nearest ranks
(``shuniu.core.stats.percentile``, through ``harness.py``; before, they were nearest-rank);
``wrk``'s come from its own histogram.

Examples::

    python benchmarks/loadgen.py latency http://127.0.0.1:9000/v1 --compare http://127.0.0.1:8000/v1
    python benchmarks/loadgen.py rps http://127.0.0.1:8000/v1 -c 64 --duration 10 --watch gw=1234
    python benchmarks/loadgen.py stream http://127.0.0.1:8000/v1 --max-tokens 16 --json
    python benchmarks/loadgen.py latency http://127.0.0.1:8000/v1 --header "Authorization:Bearer sk-..." \
        --body-json '{"temperature": 0}'
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httptools
from harness import CLK_TCK, CpuWindow, handle_signals, latency_summary_ms, set_nodelay, tree_pids

__all__ = [
    "Result",
    "check_header",
    "make_body",
    "run_latency",
    "run_saturation",
]

MAX_DURATION_S = 600.0
MAX_REQUESTS = 1_000_000
MAX_CONCURRENCY = 1024
_ALLOWED_HOSTS = {"127.0.0.1": "127.0.0.1", "localhost": "127.0.0.1"}
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)
_OWN_HEADERS = {"host", "content-type", "content-length", "transfer-encoding", "connection"}

Headers = list[tuple[str, str]]


# -- targets and bodies ------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str  # the API path, e.g. /v1/chat/completions

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"


def parse_target(base_url: str, api: str) -> Target:
    """``http://127.0.0.1:PORT/v1`` (the API root) to the endpoint to hit; loopback only."""
    parts = urlsplit(base_url)
    if parts.scheme != "http":
        raise SystemExit(f"loadgen: only plain http:// is supported, got {base_url!r}")
    host = _ALLOWED_HOSTS.get(parts.hostname or "")
    if host is None:
        raise SystemExit(f"loadgen: refusing to send to {parts.hostname!r}; only 127.0.0.1 is allowed")
    if parts.port is None:
        raise SystemExit(f"loadgen: {base_url!r} has no port")
    root = parts.path.rstrip("/") or "/v1"
    return Target(host, parts.port, root + ("/chat/completions" if api == "chat" else "/completions"))


def make_body(
    api: str, model: str, max_tokens: int, stream: bool, extra: dict[str, Any] | None = None
) -> bytes:
    """The request body; ``extra`` fields are merged in last (they win)."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "Hello, how are you?"}]
    else:
        body["prompt"] = "Hello, how are you?"
    if stream:
        body["stream"] = True
    if extra:
        body.update(extra)
    return json.dumps(body, separators=(",", ":")).encode()


def check_header(name: str, value: str) -> tuple[str, str]:
    """A header to send on every request; raises ``ValueError`` if it is malformed or one
    loadgen sets itself."""
    if not _HEADER_NAME.match(name):
        raise ValueError(f"not a valid header name: {name!r}")
    if name.lower() in _OWN_HEADERS:
        raise ValueError(f"{name} is set by loadgen itself")
    if any(c in value for c in "\r\n\0"):
        raise ValueError(f"header {name} has a control character in its value")
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"header {name} has a character outside Latin-1 in its value") from None
    return name, value.strip()


def _request_bytes(target: Target, body: bytes, headers: Headers | None = None) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers or ())
    return (
        f"POST {target.path} HTTP/1.1\r\nHost: {target.host}:{target.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode("latin-1") + body


# -- results -----------------------------------------------------------------------------


@dataclass
class Result:
    mode: str
    engine: str
    url: str
    concurrency: int
    duration_s: float = 0.0
    requests: int = 0
    errors: int = 0
    chunks: int = 0
    rps: float = 0.0
    chunks_per_s: float = 0.0
    latency_ms: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    cpu_ms_per_request: dict[str, float] = field(default_factory=dict)
    machine_cpu_busy: float = 0.0
    loadgen_cpu_s: float = 0.0
    other_cores: float = 0.0  # CPU cores used by processes neither watched nor this one
    note: str = ""
    compare: dict[str, Any] | None = None  # latency --compare: the second URL's result

    def finish(self, watch: CpuWindow | None) -> Result:
        if self.duration_s > 0:
            self.rps = round(self.requests / self.duration_s, 1)
            self.chunks_per_s = round(self.chunks / self.duration_s, 1)
        if watch is not None:
            self.cpu_s = {k: round(v, 3) for k, v in watch.cpu_s.items()}
            self.machine_cpu_busy = round(watch.machine_busy, 3)
            self.loadgen_cpu_s = round(watch.own_cpu_s, 3)
            # What the rest of the machine used meanwhile (other people's jobs skew every number).
            watched = sum(v for v in self.cpu_s.values() if v == v) + self.loadgen_cpu_s
            if watch.wall_s > 0:
                self.other_cores = round(max(0.0, (watch.ticks.busy / CLK_TCK - watched) / watch.wall_s), 3)
            if self.requests:
                self.cpu_ms_per_request = {
                    k: round(1000 * v / self.requests, 4) for k, v in self.cpu_s.items()
                }
        return self


def _watch(pids: dict[str, int]) -> CpuWindow:
    """CPU of the watched processes (a negative number: that process and its descendants at
    each end of the window), of this one with the ``wrk`` it ran, of the machine."""
    what: dict[str, int | Callable[[], Iterable[int]]] = {
        name: pid if pid > 0 else functools.partial(tree_pids, -pid) for name, pid in pids.items()
    }
    return CpuWindow(what, own_children=True)


# -- the Python engine -------------------------------------------------------------------


class _Response:
    """Per-connection response parsing shared by both Python clients: httptools callbacks,
    SSE ``data:`` events counted across read boundaries, ``[DONE]`` checked at the end."""

    def __init__(self, stream: bool, on_complete: Any) -> None:
        self.stream = stream
        self.on_message_complete = on_complete  # httptools looks callbacks up once, here
        self.parser = httptools.HttpResponseParser(self)
        self.events = 0
        self.tail = b""

    def reset(self) -> None:
        self.events = 0
        self.tail = b""

    def on_body(self, body: bytes) -> None:
        if self.stream:
            buf = self.tail + body
            self.events += buf.count(b"data:")
            self.tail = buf[-16:]  # shorter than twice b"data:", so nothing is counted twice

    def outcome(self) -> tuple[bool, int]:
        """(ok, JSON chunks) of the response just completed."""
        if self.parser.get_status_code() != 200:
            return False, 0
        if not self.stream:
            return True, 0
        if b"[DONE]" not in self.tail:
            return False, 0
        return True, self.events - 1


class _Shared:
    """State of one saturation run, shared by its connections."""

    def __init__(self, request: bytes, stream: bool) -> None:
        self.request = request
        self.stream = stream
        self.running = True
        self.measuring = False
        self.completed = 0
        self.errors = 0
        self.events = 0
        self.latencies: list[float] = []


class _Conn(asyncio.Protocol):
    """One keep-alive connection sending the same request back to back, from callbacks
    (no task or future per request)."""

    def __init__(self, shared: _Shared) -> None:
        self.s = shared
        self.r = _Response(shared.stream, self.on_message_complete)
        self.transport: Any = None
        self.t0 = 0.0
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        set_nodelay(transport)
        self.send()

    def send(self) -> None:
        self.r.reset()
        self.t0 = time.perf_counter()
        self.transport.write(self.s.request)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.s.running:
            self.s.errors += 1
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            self.r.parser.feed_data(data)
        except httptools.HttpParserError:
            self.s.errors += 1
            if self.transport is not None:
                self.transport.close()

    def on_message_complete(self) -> None:
        now = time.perf_counter()
        s = self.s
        ok, events = self.r.outcome()
        if s.measuring:
            if ok:
                s.completed += 1
                s.events += events
                s.latencies.append(now - self.t0)
            else:
                s.errors += 1
        if not s.running or self.transport is None:
            return
        if self.r.parser.should_keep_alive():
            self.send()
        else:
            self.transport.close()  # keep_open() replaces it


async def _saturate(
    target: Target,
    body: bytes,
    *,
    stream: bool,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    watch: CpuWindow | None,
    headers: Headers | None = None,
) -> tuple[_Shared, float]:
    loop = asyncio.get_running_loop()
    shared = _Shared(_request_bytes(target, body, headers), stream)
    conns: list[_Conn] = []

    async def connect() -> None:
        _, proto = await loop.create_connection(lambda: _Conn(shared), target.host, target.port)
        conns.append(proto)

    async def keep_open() -> None:
        """Replace connections the server closed, while the run lasts."""
        while shared.running:
            await asyncio.sleep(0.05)
            for c in [c for c in conns if c.lost.done()]:
                conns.remove(c)
                if shared.running:
                    await connect()

    await asyncio.gather(*(connect() for _ in range(concurrency)))
    keeper = loop.create_task(keep_open())
    try:
        if warmup_s > 0:
            await asyncio.sleep(warmup_s)
        shared.completed = shared.errors = shared.events = 0
        shared.latencies.clear()
        if watch is not None:
            watch.start()
        t0 = time.perf_counter()
        shared.measuring = True
        await asyncio.sleep(duration_s)
        shared.measuring = False
        elapsed = time.perf_counter() - t0
        if watch is not None:
            watch.stop()
    finally:
        shared.running = False
        keeper.cancel()
        for c in conns:
            if c.transport is not None:
                c.transport.close()
    return shared, elapsed


class _SeqConn(asyncio.Protocol):
    """One keep-alive connection for c=1: ``fetch()`` sends the request and resolves to
    (ok, seconds from write to the last byte, chunks)."""

    def __init__(self, request: bytes, stream: bool) -> None:
        self.request = request
        self.stream = stream
        self.r = _Response(stream, self.on_message_complete)
        self.transport: Any = None
        self.t0 = 0.0
        self.waiter: asyncio.Future[tuple[bool, float, int]] | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        set_nodelay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("the server closed the connection"))

    def data_received(self, data: bytes) -> None:
        try:
            self.r.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_exception(exc)
            self.transport.close()

    def on_message_complete(self) -> None:
        dt = time.perf_counter() - self.t0
        ok, events = self.r.outcome()
        if not self.r.parser.should_keep_alive():
            self.transport.close()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((ok, dt, events))

    def fetch(self) -> asyncio.Future[tuple[bool, float, int]]:
        self.r.reset()
        self.waiter = asyncio.get_running_loop().create_future()
        self.t0 = time.perf_counter()
        self.transport.write(self.request)
        return self.waiter


@dataclass
class _Series:
    target: Target
    request: bytes
    conn: _SeqConn | None = None
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    events: int = 0
    elapsed: float = 0.0


async def _sequential(
    series: list[_Series],
    *,
    stream: bool,
    requests: int,
    warmup: int,
    max_seconds: float,
    block: int,
    watch: CpuWindow | None,
) -> None:
    """c=1 against each target in turn, ``block`` requests at a time, so that load from
    elsewhere on the machine hits every target alike."""
    loop = asyncio.get_running_loop()

    async def one(s: _Series, measured: bool) -> None:
        if s.conn is None or s.conn.transport is None:
            conn = _SeqConn(s.request, stream)
            await loop.create_connection(lambda: conn, s.target.host, s.target.port)
            s.conn = conn
        t0 = time.perf_counter()
        try:
            ok, dt, events = await asyncio.wait_for(s.conn.fetch(), 30)
        except (ConnectionError, TimeoutError, httptools.HttpParserError):
            ok, dt, events = False, 0.0, 0
            if s.conn.transport is not None:
                s.conn.transport.close()
            s.conn = None
        if measured:
            s.elapsed += time.perf_counter() - t0
            if ok:
                s.latencies.append(dt)
                s.events += events
            else:
                s.errors += 1

    deadline = loop.time() + max_seconds
    for i in range(warmup):
        for s in series:
            await one(s, False)
        if i % 50 == 0 and loop.time() > deadline:
            break
    done = 0
    if watch is not None:
        watch.start()
    while done < requests and loop.time() < deadline:
        n = min(block, requests - done)
        for s in series:
            for _ in range(n):
                await one(s, True)
        done += n
    if watch is not None:
        watch.stop()
    for s in series:
        if s.conn is not None and s.conn.transport is not None:
            s.conn.transport.close()


def _run_loop(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_latency(
    base_url: str,
    *,
    compare: str | None = None,
    api: str = "chat",
    model: str = "bench",
    max_tokens: int = 16,
    stream: bool = False,
    requests: int = 2000,
    warmup: int = 200,
    max_seconds: float = 30.0,
    block: int = 100,
    watch_pids: dict[str, int] | None = None,
    headers: Headers | None = None,
    body_extra: dict[str, Any] | None = None,
) -> Result:
    """c=1: ``requests`` measured requests (or as many as fit in ``max_seconds``). With
    ``compare``, the same against a second base URL, in alternating blocks; its result is
    ``Result.compare``. ``headers`` and ``body_extra`` go to both."""
    requests = max(1, min(MAX_REQUESTS, requests))
    body = make_body(api, model, max_tokens, stream, body_extra)
    series = []
    for url in [base_url] if compare is None else [base_url, compare]:
        target = parse_target(url, api)
        series.append(_Series(target, _request_bytes(target, body, headers)))
    watch = _watch(watch_pids) if watch_pids else None
    _run_loop(
        _sequential(
            series,
            stream=stream,
            requests=requests,
            warmup=max(0, warmup),
            max_seconds=min(MAX_DURATION_S, max_seconds),
            block=max(1, block),
            watch=watch,
        )
    )
    results: list[Result] = []
    for s in series:
        res = Result("latency", "python", s.target.url, 1, round(s.elapsed, 3), len(s.latencies), s.errors)
        res.chunks = s.events
        res.latency_ms = latency_summary_ms(s.latencies)
        if len(s.latencies) + s.errors < requests:
            res.note = f"stopped after {max_seconds:g} s with {len(s.latencies)} of {requests} requests"
        results.append(res.finish(watch if not results else None))
    if len(results) == 2:
        results[0].compare = asdict(results[1])
    return results[0]


# -- the wrk engine ----------------------------------------------------------------------

_WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
{headers}local threads = {{}}
function setup(thread)
  table.insert(threads, thread)
end
function init(args)
  events = 0
  dones = 0
  bad = 0
end
{response}
function done(summary, latency, requests)
  local ev, dn, bd = 0, 0, 0
  for _, t in ipairs(threads) do
    ev = ev + t:get("events")
    dn = dn + t:get("dones")
    bd = bd + t:get("bad")
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {{"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,'
    .. '"status":%d,"timeout":%d,"events":%d,"dones":%d,"bad":%d,'
    .. '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%f}}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    ev, dn, bd, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
"""

_WRK_STREAM_RESPONSE = """
function response(status, headers, body)
  if status ~= 200 or not string.find(body, "[DONE]", 1, true) then
    bad = bad + 1
    return
  end
  local _, n = string.gsub(body, "data:", "")
  events = events + n - 1
  dones = dones + 1
end
"""


def _lua_string(data: bytes) -> str:
    return '"' + "".join(f"\\{b:03d}" if b < 32 or b > 126 or b in (34, 92) else chr(b) for b in data) + '"'


def _wrk_run(
    target: Target,
    body: bytes,
    *,
    stream: bool,
    concurrency: int,
    duration_s: float,
    watch: CpuWindow | None,
    headers: Headers | None = None,
) -> tuple[dict[str, Any], float]:
    wrk = shutil.which("wrk")
    assert wrk is not None
    lua_headers = "".join(
        f"wrk.headers[{_lua_string(n.encode())}] = {_lua_string(v.encode('latin-1'))}\n"
        for n, v in headers or ()
    )
    script = _WRK_SCRIPT.format(
        body=_lua_string(body), headers=lua_headers, response=_WRK_STREAM_RESPONSE if stream else ""
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="shuniu-loadgen-", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        secs = max(1, round(duration_s))
        cmd = [wrk, "-t1", f"-c{concurrency}", f"-d{secs}s", "--timeout", "10s", "-s", path, target.url]
        if watch is not None:
            watch.start()
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 30, check=False)
        elapsed = time.perf_counter() - t0
        if watch is not None:
            watch.stop()
    finally:
        os.unlink(path)
    m = re.search(r"^WRKJSON (\{.*\})$", proc.stdout, re.M)
    if proc.returncode != 0 or m is None:
        raise RuntimeError(f"wrk failed (exit {proc.returncode}): {proc.stdout[-500:]} {proc.stderr[-500:]}")
    return json.loads(m.group(1)), elapsed


# -- saturation --------------------------------------------------------------------------


def run_saturation(
    base_url: str,
    *,
    stream: bool,
    api: str = "chat",
    model: str = "bench",
    max_tokens: int = 16,
    concurrency: int = 64,
    duration_s: float = 10.0,
    warmup_s: float = 1.0,
    engine: str = "auto",
    watch_pids: dict[str, int] | None = None,
    headers: Headers | None = None,
    body_extra: dict[str, Any] | None = None,
) -> Result:
    """``concurrency`` connections for ``duration_s`` seconds, after ``warmup_s`` unmeasured;
    ``headers`` on every request, ``body_extra`` merged into its body."""
    target = parse_target(base_url, api)
    concurrency = max(1, min(MAX_CONCURRENCY, concurrency))
    duration_s = max(0.5, min(MAX_DURATION_S, duration_s))
    warmup_s = max(0.0, min(MAX_DURATION_S, warmup_s))
    body = make_body(api, model, max_tokens, stream, body_extra)
    if engine == "auto":
        engine = "wrk" if shutil.which("wrk") else "python"
    if engine == "wrk" and not shutil.which("wrk"):
        raise SystemExit("loadgen: --engine wrk but wrk is not on PATH (apt-get install -y wrk)")
    watch = _watch(watch_pids or {})
    mode = "stream" if stream else "rps"
    if engine == "wrk":
        if warmup_s > 0:
            _wrk_run(
                target,
                body,
                stream=stream,
                concurrency=concurrency,
                duration_s=warmup_s,
                watch=None,
                headers=headers,
            )
        out, elapsed = _wrk_run(
            target,
            body,
            stream=stream,
            concurrency=concurrency,
            duration_s=duration_s,
            watch=watch,
            headers=headers,
        )
        errors = out["connect"] + out["read"] + out["write"] + out["status"] + out["timeout"] + out["bad"]
        res = Result(mode, "wrk", target.url, concurrency, round(out["duration_us"] / 1e6, 3))
        res.requests = out["requests"] - (out["bad"] if stream else out["status"])
        res.errors = errors
        res.chunks = out["events"]
        res.latency_ms = {
            "p50": out["p50_us"] / 1000,
            "p90": out["p90_us"] / 1000,
            "p99": out["p99_us"] / 1000,
            "max": out["max_us"] / 1000,
            "mean": round(out["mean_us"] / 1000, 4),
        }
        res.note = f"wall {elapsed:.2f} s including wrk start-up"
        return res.finish(watch)
    shared, elapsed = _run_loop(
        _saturate(
            target,
            body,
            stream=stream,
            concurrency=concurrency,
            warmup_s=warmup_s,
            duration_s=duration_s,
            watch=watch,
            headers=headers,
        )
    )
    res = Result(mode, "python", target.url, concurrency, round(elapsed, 3), shared.completed, shared.errors)
    res.chunks = shared.events
    res.latency_ms = latency_summary_ms(shared.latencies)
    return res.finish(watch)


# -- command line ------------------------------------------------------------------------


def _watch_arg(value: str) -> tuple[str, int]:
    """``NAME=PID``, or ``NAME=tree:PID`` for the process and its descendants (a negative
    number inside)."""
    name, _, pid = value.partition("=")
    tree = pid.startswith("tree:")
    pid = pid.removeprefix("tree:")
    if not name or not pid.isdigit():
        raise argparse.ArgumentTypeError("expected NAME=PID or NAME=tree:PID")
    return name, -int(pid) if tree else int(pid)


def _header_arg(value: str) -> tuple[str, str]:
    name, sep, rest = value.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError("expected NAME:VALUE")
    try:
        return check_header(name.strip(), rest)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _body_json_arg(value: str) -> dict[str, Any]:
    try:
        extra = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(extra, dict):
        raise argparse.ArgumentTypeError("expected a JSON object, e.g. '{\"temperature\": 0}'")
    return extra


def _print_human(res: Result) -> None:
    lat = res.latency_ms
    print(f"{res.mode} via {res.engine}: {res.url} c={res.concurrency}")
    print(f"  {res.requests} requests, {res.errors} errors in {res.duration_s:.2f} s = {res.rps:,.0f} req/s")
    if res.chunks:
        print(f"  {res.chunks} streamed chunks = {res.chunks_per_s:,.0f} chunks/s")
    if lat:
        print("  latency ms: " + ", ".join(f"{k} {v:.3f}" for k, v in lat.items() if k != "n"))
    for name, ms in res.cpu_ms_per_request.items():
        print(f"  {name}: {res.cpu_s[name]:.2f} CPU s = {ms:.3f} CPU ms per request")
    if res.cpu_s:
        print(
            f"  machine CPU busy {100 * res.machine_cpu_busy:.0f}%, loadgen CPU {res.loadgen_cpu_s:.2f} s, "
            f"other processes {res.other_cores:.2f} cores"
        )
    if res.note:
        print(f"  note: {res.note}")
    if res.compare is not None:
        other = Result(**res.compare)
        _print_human(other)
        a, b = res.latency_ms, other.latency_ms
        if a and b:
            print(f"second minus first: p50 {b['p50'] - a['p50']:+.3f} ms, p99 {b['p99'] - a['p99']:+.3f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Load generator for OpenAI-style endpoints on 127.0.0.1.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Examples::", 1)[1],
    )
    parser.add_argument("mode", choices=["latency", "rps", "stream"])
    parser.add_argument("base_url", help="API root, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument(
        "--compare", metavar="BASE_URL", help="latency: also this API root, in alternating blocks"
    )
    parser.add_argument("--api", choices=["chat", "completions"], default="chat")
    parser.add_argument("--model", default="bench")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per response (default 16)")
    parser.add_argument("-c", "--concurrency", type=int, default=64, help="rps/stream (default 64)")
    parser.add_argument("--duration", type=float, default=10.0, help="rps/stream seconds (default 10)")
    parser.add_argument("--warmup", type=float, default=None, help="rps/stream: seconds; latency: requests")
    parser.add_argument("--requests", type=int, default=2000, help="latency: measured requests")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="latency: time bound")
    parser.add_argument("--stream", action="store_true", help="latency: streamed requests")
    parser.add_argument("--engine", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument(
        "--watch", type=_watch_arg, action="append", default=[], metavar="NAME=PID|NAME=tree:PID"
    )
    parser.add_argument(
        "--header",
        type=_header_arg,
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="sent on every request (repeatable)",
    )
    parser.add_argument(
        "--body-json", type=_body_json_arg, metavar="JSON", help="fields merged into every request body"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    # SIGTERM (and SIGINT, SIGHUP) unwind as SystemExit, so a wrk child is killed
    # (subprocess.run does that on an exception); the exit status tells the runner.
    handle_signals(as_exit=True)

    if args.mode == "latency":
        res = run_latency(
            args.base_url,
            compare=args.compare,
            api=args.api,
            model=args.model,
            max_tokens=args.max_tokens,
            stream=args.stream,
            requests=args.requests,
            warmup=200 if args.warmup is None else int(args.warmup),
            max_seconds=args.max_seconds,
            watch_pids=dict(args.watch),
            headers=args.header,
            body_extra=args.body_json,
        )
    else:
        res = run_saturation(
            args.base_url,
            stream=args.mode == "stream",
            api=args.api,
            model=args.model,
            max_tokens=args.max_tokens,
            concurrency=args.concurrency,
            duration_s=args.duration,
            warmup_s=1.0 if args.warmup is None else args.warmup,
            engine=args.engine,
            watch_pids=dict(args.watch),
            headers=args.header,
            body_extra=args.body_json,
        )
    if args.json:
        print(json.dumps(asdict(res)))
    else:
        _print_human(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
