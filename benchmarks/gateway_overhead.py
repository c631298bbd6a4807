"""How much does the shuniu gateway add in front of an instant upstream?

Usage::

    python benchmarks/gateway_overhead.py [--duration S] [--tenancy none|memory|redis] [--json OUT]

It starts ``benchmarks/instant_upstream.py`` and ``shuniu serve`` (a generated deployment
with one ``openai`` endpoint pointing at the upstream, ``--port 0``) as child processes,
then, twice against the same gateway process (to show whether memory grows run to run):

1. latency at c=1, non-streamed, direct to the upstream and through the gateway
   (``--requests`` requests each, after 200 unmeasured ones, in alternating blocks of 100
   so that load from elsewhere on the machine hits both alike);
2. requests/s at c=64, non-streamed, through the gateway, for ``--duration`` seconds,
   with the gateway's CPU time (``/proc/PID/stat``) over exactly the measured window;
3. streamed chunks/s at c=64 (``"stream": true``, ``--max-tokens`` tokens per response);
4. cache hits at c=1: as 1., with ``"temperature": 0`` in every body, so that with a cache
   every gateway answer after the first is a hit (checked with one request first: the
   response header ``x-shuniu-cache`` must say ``hit``); without one, a baseline.

``--tenancy memory`` or ``redis`` adds the tenancy features to the deployment: an
``api_keys`` authenticator with one fresh key (sent as ``Authorization: Bearer ...`` on every
request, to the upstream too, which ignores it), a tier whose key and tenant limits (RPM, TPM
and concurrency) are far too high to bind but are all checked, ``rate_limits`` and ``cache``
with that store. ``redis`` starts its own ``redis-server`` on a free port of 127.0.0.1 (and
reports its CPU time too). Phases 1-3 send non-deterministic requests: the cache lookup is
skipped (``x-shuniu-cache: skip``) and every other step runs.

The gateway's RSS (``/proc/PID/status`` VmRSS) is read after every phase. Every load phase
runs ``benchmarks/loadgen.py`` in its own process. Every process started here is stopped by
its PID on exit, Ctrl-C or error. Only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from shuniu.plugins.auth.api_keys import hash_key, new_key

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
UPSTREAM = HERE / "instant_upstream.py"
LOADGEN = HERE / "loadgen.py"
MODEL = "bench"

# Targets (docs: DESIGN.md, "Performance facts measured on these machines").
TARGET_ADDED_P50_MS = 1.0
TARGET_RPS = 2000.0
TARGET_RSS_MIB = 100.0
RSS_GROWTH_TOLERANCE_MIB = 2.0  # "no growth": run 2 ends within this of run 1
OTHER_LOAD_WARN_CORES = 0.2  # CPU used by processes not ours during a phase (max over phases)
REFERENCE_CPU_MS = 0.34  # bare aiohttp reverse proxy on uvloop, same machines
TENANCIES = ("none", "memory", "redis")
CACHE_BODY = {"temperature": 0}  # deterministic: cacheable
# Limits far above anything a run reaches, so that every store call happens and none binds.
NEVER_BINDING = "{rpm: 10000000, tpm: 10000000000, concurrency: 100000}"

_UPSTREAM_READY = re.compile(r"serving on http://(\S+):(\d+)")
_GATEWAY_READY = re.compile(r"serving .* on http://(\S+):(\d+)")

console = Console()


# -- child processes ---------------------------------------------------------------------


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    host: str = ""
    port: int = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Children:
    """Every process this run started, stopped by PID (never by name) in reverse order."""

    def __init__(self) -> None:
        self.items: list[Child] = []

    def start(self, name: str, cmd: list[str], log: Path, ready: re.Pattern[str], timeout: float) -> Child:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        child = Child(name, proc, log)
        self.items.append(child)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = ready.search(log.read_text(errors="replace"))
            if m:
                child.host, child.port = m.group(1).strip("[]"), int(m.group(2))
                return child
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{child.log_tail()}")
            time.sleep(0.05)
        raise RuntimeError(f"{name} did not say it was serving within {timeout:g} s:\n{child.log_tail()}")

    def stop_all(self) -> None:
        for child in reversed(self.items):
            _stop(child.proc)
        self.items.clear()


def _stop(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
    except ProcessLookupError:
        pass


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def machine_busy(seconds: float = 1.0) -> float:
    """Fraction of all CPUs busy over ``seconds`` (other people's load skews every number)."""

    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        idle = values[3] + values[4]
        total = sum(values[:8])
        return total - idle, total

    b0, t0 = read()
    time.sleep(seconds)
    b1, t1 = read()
    return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


def _shuniu_command() -> list[str]:
    script = Path(sys.executable).with_name("shuniu")
    if script.exists():
        return [str(script)]
    found = shutil.which("shuniu")
    return [found] if found else [sys.executable, "-m", "shuniu.core"]


DEPLOYMENT = """\
# generated by benchmarks/gateway_overhead.py
gateway: {{host: 127.0.0.1, port: 0{gateway_extra}}}
models:
  {model}:
    balancer: {{policy: {balancer}}}
    scheduler: {{policy: {scheduler}}}
    endpoints:
      - kind: openai
        options: {{base_url: "http://127.0.0.1:{port}/v1", model: "{model}"}}
"""

TENANCY = """\
tiers:
  bench:
    key_limits: {limits}
    tenant_limits: {limits}
auth:
  authenticators:
    - kind: api_keys
      options:
        keys:
          - {{id: bench-1, hash: "{hash}", tenant: bench, tier: bench}}
rate_limits:
  store: {store}
  options: {options}
cache:
  store: {store}
  options: {options}
  ttl_s: 3600
"""


OBSERVABILITY = ("metrics", "off", "tracing")


def deployment_yaml(
    *,
    port: int,
    balancer: str,
    scheduler: str,
    tenancy: str,
    key_hash: str,
    redis_url: str,
    observability: str = "metrics",
    collector: str = "",
) -> str:
    extra = {
        "metrics": "",  # the default: /metrics on, no tracing
        "off": ", metrics: false",
        "tracing": f', tracing: {{exporter: otlp, endpoint: "{collector}"}}',
    }[observability]
    text = DEPLOYMENT.format(
        model=MODEL, port=port, balancer=balancer, scheduler=scheduler, gateway_extra=extra
    )
    if tenancy == "none":
        return text
    options = "{}" if tenancy == "memory" else f'{{url: "{redis_url}"}}'
    return text + TENANCY.format(limits=NEVER_BINDING, hash=key_hash, store=tenancy, options=options)


def start_collector() -> Any:
    """A stub OTLP/HTTP collector in a thread of this process (``tests/otlp_collector.py``)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # for tests/
    from tests.otlp_collector import CollectorStub

    return CollectorStub().start()


def start_redis() -> Any:
    """A ``redis-server`` of this run on a free port (``tests/redis_server.py``)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # for tests/
    from tests.redis_server import RedisServer, redis_server_binary

    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("--tenancy redis needs redis-server (apt-get install -y redis-server)")
    for attempt in range(3):  # another process may take the free port before the server does
        server = RedisServer(binary)
        try:
            server.start()
            return server
        except RuntimeError:
            server.close()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _post(host: str, port: int, body: bytes, headers: dict[str, str]) -> tuple[int, str | None]:
    """One request to the gateway (stdlib, no proxy): (status, ``x-shuniu-cache``)."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader("x-shuniu-cache")
    finally:
        conn.close()


def check_tenancy(host: str, port: int, key: str, max_tokens: int) -> str:
    """Before the cache-hit phase: without a key → 401; a plain request → cache ``skip``; the
    phase's deterministic request twice → the second is a ``hit``. Returns that state."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from loadgen import make_body

    auth = {"Authorization": f"Bearer {key}"}
    status, _ = _post(host, port, make_body("chat", MODEL, max_tokens, False), {})
    if status != 401:
        raise RuntimeError(f"a request without an API key got {status}, not 401")
    status, state = _post(host, port, make_body("chat", MODEL, max_tokens, False), auth)
    if status != 200 or state != "skip":
        raise RuntimeError(f"a non-deterministic request got {status}, x-shuniu-cache {state!r} (not skip)")
    body = make_body("chat", MODEL, max_tokens, False, CACHE_BODY)
    states = []
    for _ in range(2):
        status, state = _post(host, port, body, auth)
        if status != 200:
            raise RuntimeError(f"a deterministic request got {status}")
        states.append(state)
    if states[1] != "hit":
        raise RuntimeError(f"the cache did not hit: x-shuniu-cache {states} for the same request twice")
    return "hit"


# -- phases ------------------------------------------------------------------------------


@dataclass
class Settings:
    duration: float
    requests: int
    concurrency: int
    max_tokens: int
    engine: str
    runs: int
    tenancy: str = "none"


@dataclass
class RunResult:
    direct: dict[str, Any] = field(default_factory=dict)
    gateway: dict[str, Any] = field(default_factory=dict)
    rps: dict[str, Any] = field(default_factory=dict)
    stream: dict[str, Any] = field(default_factory=dict)
    cache_direct: dict[str, Any] = field(default_factory=dict)
    cache_gateway: dict[str, Any] = field(default_factory=dict)
    cache_state: str | None = None
    """``x-shuniu-cache`` of the checked request before the cache-hit phase (None: no cache)."""
    rss_mib: dict[str, float] = field(default_factory=dict)


class Runner:
    def __init__(self, settings: Settings, children: Children, progress: Progress, key: str | None) -> None:
        self.s = settings
        self.children = children
        self.progress = progress
        self.key = key
        self.headers = [f"--header=Authorization:Bearer {key}"] if key else []
        self.overall = progress.add_task("overall", total=settings.runs * 4)
        self.phase = progress.add_task("", total=1, visible=False)
        self.watch: dict[str, int] = {}

    def loadgen(self, label: str, expected_s: float, args: list[str]) -> dict[str, Any]:
        """Run loadgen.py in its own process; show its progress by time."""
        cmd = [sys.executable, str(LOADGEN), *args, "--json"]
        self.progress.update(self.phase, description=label, total=expected_s, completed=0, visible=True)
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.children.items.append(Child(f"loadgen {label}", proc, Path(os.devnull)))
        t0 = time.monotonic()
        deadline = t0 + expected_s + 60
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"loadgen ({label}) ran past {expected_s + 60:.0f} s")
                self.progress.update(self.phase, completed=min(expected_s, time.monotonic() - t0))
                time.sleep(0.2)
            out, err = proc.communicate()
        finally:
            _stop(proc)
            self.children.items = [c for c in self.children.items if c.proc is not proc]
        if proc.returncode != 0:
            raise RuntimeError(f"loadgen ({label}) failed with {proc.returncode}:\n{err.decode()[-2000:]}")
        self.progress.update(self.phase, completed=expected_s)
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        if result.get("errors"):
            self.progress.console.print(f"[yellow]{label}: {result['errors']} errors[/]")
        return result

    def latency(
        self, label: str, direct: str, through: str, watch: dict[str, int], body: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """c=1 against both, in alternating blocks of 100 (one loadgen process)."""
        extra = ["--body-json", json.dumps(body)] if body else []
        result = self.loadgen(
            label,
            max(2.0, self.s.requests * 0.002),
            ["latency", direct, "--compare", through, "--requests", str(self.s.requests),
             "--max-seconds", "60", "--max-tokens", str(self.s.max_tokens), "--model", MODEL,
             *[f"--watch={name}={pid}" for name, pid in watch.items()], *self.headers, *extra],
        )  # fmt: skip
        other = result.pop("compare")
        if other.get("errors"):
            self.progress.console.print(f"[yellow]{label}: {other['errors']} errors through the gateway[/]")
        return result, other

    def saturate(self, label: str, mode: str, base: str, watch: dict[str, int]) -> dict[str, Any]:
        args = [mode, base, "-c", str(self.s.concurrency), "--duration", f"{self.s.duration:g}",
                "--warmup", "1", "--engine", self.s.engine, "--max-tokens", str(self.s.max_tokens),
                "--model", MODEL, *self.headers]  # fmt: skip
        for name, pid in watch.items():
            args += ["--watch", f"{name}={pid}"]
        return self.loadgen(label, self.s.duration + 1.5, args)

    def run(self, n: int, upstream: Child, gateway: Child) -> RunResult:
        direct = f"http://{upstream.host}:{upstream.port}/v1"
        through = f"http://{gateway.host}:{gateway.port}/v1"
        watch = {"gateway": gateway.pid, "upstream": upstream.pid, **self.watch}
        r = RunResult()
        r.rss_mib["start"] = rss_mib(gateway.pid)
        r.direct, r.gateway = self.latency(
            f"run {n}: c=1 latency, direct and through gateway", direct, through, watch
        )
        r.rss_mib["after c=1"] = rss_mib(gateway.pid)
        self.progress.advance(self.overall)
        r.rps = self.saturate(f"run {n}: c={self.s.concurrency} req/s", "rps", through, watch)
        r.rss_mib["after req/s"] = rss_mib(gateway.pid)
        self.progress.advance(self.overall)
        r.stream = self.saturate(
            f"run {n}: c={self.s.concurrency} streamed chunks/s", "stream", through, watch
        )
        r.rss_mib["after stream"] = rss_mib(gateway.pid)
        self.progress.advance(self.overall)
        if self.key is not None:
            r.cache_state = check_tenancy(gateway.host, gateway.port, self.key, self.s.max_tokens)
        what = "cache hits" if self.key is not None else "temperature 0 (no cache)"
        r.cache_direct, r.cache_gateway = self.latency(
            f"run {n}: c=1 {what}, direct and through gateway", direct, through, watch, CACHE_BODY
        )
        r.rss_mib["after cache hits"] = rss_mib(gateway.pid)
        self.progress.advance(self.overall)
        return r


# -- the report --------------------------------------------------------------------------


def summarize(runs: list[RunResult]) -> list[dict[str, Any]]:
    """One dict per run with the headline numbers."""
    out = []
    prev_end: float | None = None
    for r in runs:
        d, g = r.direct["latency_ms"], r.gateway["latency_ms"]
        rps_cpu = r.rps["cpu_s"].get("gateway", float("nan"))
        st_cpu = r.stream["cpu_s"].get("gateway", float("nan"))
        end = list(r.rss_mib.values())[-1]
        cd, cg = r.cache_direct["latency_ms"], r.cache_gateway["latency_ms"]
        redis_cpu = r.rps["cpu_ms_per_request"].get("redis")
        out.append(
            {
                "direct_p50_ms": d["p50"],
                "direct_p99_ms": d["p99"],
                "gateway_p50_ms": g["p50"],
                "gateway_p99_ms": g["p99"],
                "added_p50_ms": round(g["p50"] - d["p50"], 4),
                "added_p99_ms": round(g["p99"] - d["p99"], 4),
                "rps": r.rps["rps"],
                "rps_p50_ms": r.rps["latency_ms"].get("p50"),
                "rps_p99_ms": r.rps["latency_ms"].get("p99"),
                "cpu_ms_per_request": r.rps["cpu_ms_per_request"].get("gateway"),
                "gateway_core_use": round(rps_cpu / r.rps["duration_s"], 3) if r.rps["duration_s"] else None,
                "upstream_cpu_ms_per_request": r.rps["cpu_ms_per_request"].get("upstream"),
                "machine_busy_rps": r.rps["machine_cpu_busy"],
                "stream_rps": r.stream["rps"],
                "chunks_per_s": r.stream["chunks_per_s"],
                "cpu_ms_per_stream": r.stream["cpu_ms_per_request"].get("gateway"),
                "cpu_us_per_chunk": round(1e6 * st_cpu / r.stream["chunks"], 2)
                if r.stream["chunks"]
                else None,
                "gateway_core_use_stream": (
                    round(st_cpu / r.stream["duration_s"], 3) if r.stream["duration_s"] else None
                ),
                "redis_cpu_ms_per_request": redis_cpu,
                "redis_cpu_ms_per_stream": r.stream["cpu_ms_per_request"].get("redis"),
                "cache_state": r.cache_state,
                "cache_direct_p50_ms": cd["p50"],
                "cache_direct_p99_ms": cd["p99"],
                "cache_gateway_p50_ms": cg["p50"],
                "cache_gateway_p99_ms": cg["p99"],
                "cache_added_p50_ms": round(cg["p50"] - cd["p50"], 4),
                "cache_added_p99_ms": round(cg["p99"] - cd["p99"], 4),
                "errors": sum(
                    x["errors"]
                    for x in (r.direct, r.gateway, r.rps, r.stream, r.cache_direct, r.cache_gateway)
                ),
                "other_cores_max": max(
                    x.get("other_cores", 0.0) for x in (r.direct, r.rps, r.stream, r.cache_direct)
                ),
                "rss_start_mib": round(r.rss_mib["start"], 1),
                "rss_end_mib": round(end, 1),
                "rss_max_mib": round(max(r.rss_mib.values()), 1),
                "rss_growth_mib": round(end - prev_end, 1) if prev_end is not None else None,
            }
        )
        prev_end = end
    return out


def verdicts(summary: list[dict[str, Any]]) -> dict[str, bool | None]:
    """Pass/fail per target over all runs (``None``: not measured, e.g. growth with one run)."""
    growth = [s["rss_growth_mib"] for s in summary if s["rss_growth_mib"] is not None]
    return {
        "added_p50": all(s["added_p50_ms"] <= TARGET_ADDED_P50_MS for s in summary),
        "rps": all(s["rps"] >= TARGET_RPS for s in summary),
        "rss": all(s["rss_max_mib"] < TARGET_RSS_MIB for s in summary),
        "rss_growth": all(g <= RSS_GROWTH_TOLERANCE_MIB for g in growth) if growth else None,
        "errors": all(s["errors"] == 0 for s in summary),
    }


def render(summary: list[dict[str, Any]], ok: dict[str, bool | None], meta: dict[str, Any]) -> Table:
    tenancy = meta["tenancy"]
    features = (
        f" (API key; key and tenant RPM, TPM and concurrency; rate limits and cache in {tenancy})"
        if tenancy != "none"
        else ""
    )
    table = Table(
        title=(
            "shuniu gateway overhead (instant upstream, one gateway process, "
            f"tenancy {tenancy}, observability {meta.get('observability', 'metrics')})"
        ),
        caption=(
            f"c={meta['concurrency']}, {meta['duration_s']:g} s per saturation phase, "
            f"{meta['requests']} c=1 requests, max_tokens {meta['max_tokens']}, "
            f"load generator: {meta['engines']}, {meta['cpus']} CPUs, "
            f"machine {100 * meta['busy_before']:.0f}% busy before start; "
            f"balancer {meta['balancer']}, scheduler {meta['scheduler']}, tenancy {tenancy}{features}. "
            "*ref: a bare aiohttp reverse proxy on uvloop, same machines (DESIGN.md). "
            "RSS growth: run end minus the previous run's end."
        ),
    )
    table.add_column("measure")
    for i in range(len(summary)):
        table.add_column(f"run {i + 1}", justify="right")
    table.add_column("target", justify="right")
    table.add_column("", justify="center")

    def mark(key: str | None) -> str:
        if key is None:
            return ""
        if ok[key] is None:
            return "[dim]n/a[/]"
        return "[green]pass[/]" if ok[key] else "[red]FAIL[/]"

    def row(label: str, key: str, fmt: str, target: str = "", verdict: str | None = None) -> None:
        cells = []
        for s in summary:
            v = s.get(key)
            cells.append("-" if v is None else format(v, fmt))
        table.add_row(label, *cells, target, mark(verdict))

    c = f"c={meta['concurrency']}"
    row("direct p50, c=1 (ms)", "direct_p50_ms", ".3f")
    row("direct p99, c=1 (ms)", "direct_p99_ms", ".3f")
    row("gateway p50, c=1 (ms)", "gateway_p50_ms", ".3f")
    row("gateway p99, c=1 (ms)", "gateway_p99_ms", ".3f")
    row("[bold]added p50 (ms)[/]", "added_p50_ms", "+.3f", f"≤ {TARGET_ADDED_P50_MS:g}", "added_p50")
    row("[bold]added p99 (ms)[/]", "added_p99_ms", "+.3f")
    table.add_section()
    row(f"[bold]req/s, {c}[/]", "rps", ",.0f", f"≥ {TARGET_RPS:,.0f}", "rps")
    row(f"  p50 latency, {c} (ms)", "rps_p50_ms", ".2f")
    row(f"  p99 latency, {c} (ms)", "rps_p99_ms", ".2f")
    row("[bold]gateway CPU ms/request[/]", "cpu_ms_per_request", ".3f", f"ref {REFERENCE_CPU_MS}*")
    row("  gateway cores used", "gateway_core_use", ".2f", "max 1.00")
    row("  upstream CPU ms/request", "upstream_cpu_ms_per_request", ".3f")
    if meta["tenancy"] == "redis":
        row("  redis-server CPU ms/request", "redis_cpu_ms_per_request", ".3f")
    row("  machine CPU busy", "machine_busy_rps", ".0%")
    table.add_section()
    row(f"[bold]streamed chunks/s, {c}[/]", "chunks_per_s", ",.0f")
    row("  streamed requests/s", "stream_rps", ",.0f")
    row("  gateway CPU ms/stream", "cpu_ms_per_stream", ".3f")
    row("  gateway CPU µs/chunk", "cpu_us_per_chunk", ".1f")
    row("  gateway cores used", "gateway_core_use_stream", ".2f", "max 1.00")
    table.add_section()
    what = "cache hit" if meta["tenancy"] != "none" else "temperature 0, no cache"
    row("direct p50, c=1, temperature 0 (ms)", "cache_direct_p50_ms", ".3f")
    row("direct p99, c=1, temperature 0 (ms)", "cache_direct_p99_ms", ".3f")
    row(f"[bold]gateway p50, c=1, {what} (ms)[/]", "cache_gateway_p50_ms", ".3f")
    row(f"[bold]gateway p99, c=1, {what} (ms)[/]", "cache_gateway_p99_ms", ".3f")
    row("  gateway minus direct p50 (ms)", "cache_added_p50_ms", "+.3f")
    row("  gateway minus direct p99 (ms)", "cache_added_p99_ms", "+.3f")
    table.add_section()
    row("RSS at run start (MiB)", "rss_start_mib", ".1f")
    row("[bold]RSS max in run (MiB)[/]", "rss_max_mib", ".1f", f"< {TARGET_RSS_MIB:g}", "rss")
    row("RSS at run end (MiB)", "rss_end_mib", ".1f")
    row(
        "[bold]RSS growth (MiB)[/]", "rss_growth_mib", "+.1f", f"≤ {RSS_GROWTH_TOLERANCE_MIB:g}", "rss_growth"
    )
    row("errors, all phases", "errors", "d", "0", "errors")
    row("other processes (cores)", "other_cores_max", ".2f", f"≤ {OTHER_LOAD_WARN_CORES:g}")
    return table


# -- main --------------------------------------------------------------------------------


def _on_signal(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per c=64 phase (default 10)")
    parser.add_argument("--requests", type=int, default=3000, help="c=1 requests per latency phase")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens (= streamed chunks) per response")
    parser.add_argument("--runs", type=int, default=2, help="runs against the same gateway (default 2)")
    parser.add_argument("--engine", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--balancer", default="round_robin", help="balancer policy of the gateway's pool")
    parser.add_argument("--scheduler", default="priority", help="scheduler policy of the gateway's pool")
    parser.add_argument(
        "--tenancy",
        choices=TENANCIES,
        default="none",
        help="add API-key auth, rate limits and the response cache with this store (default none)",
    )
    parser.add_argument(
        "--observability",
        choices=OBSERVABILITY,
        default="metrics",
        help="metrics (default: /metrics on), off (metrics: false), tracing (metrics plus OTLP "
        "spans exported to a stub collector this script runs)",
    )
    parser.add_argument("--json", type=Path, metavar="OUT", help="write every number to OUT")
    args = parser.parse_args(argv)
    settings = Settings(
        duration=max(1.0, min(300.0, args.duration)),
        requests=max(100, min(100_000, args.requests)),
        concurrency=max(1, min(1024, args.concurrency)),
        max_tokens=max(1, min(4096, args.max_tokens)),
        engine=args.engine,
        runs=max(1, min(10, args.runs)),
        tenancy=args.tenancy,
    )
    # Ctrl-C, SIGTERM and SIGHUP all unwind through the clean-up below (SIGINT explicitly,
    # as a shell may start a background job with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)

    children = Children()
    redis: Any = None
    collector: Any = None
    key = None if args.tenancy == "none" else new_key()
    runs: list[RunResult] = []
    busy = machine_busy(1.0)
    if busy > 0.2:
        console.print(
            f"[yellow]warning: the machine is already {100 * busy:.0f}% busy; "
            "other load makes these numbers worse and noisier[/]"
        )
    with tempfile.TemporaryDirectory(prefix="shuniu-bench-") as tmp:
        tmpdir = Path(tmp)
        try:
            with Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                refresh_per_second=4,
                transient=True,
            ) as progress:
                runner = Runner(settings, children, progress, key)
                progress.update(runner.overall, description="[bold]starting upstream and gateway[/]")
                if args.tenancy == "redis":
                    redis = start_redis()
                    runner.watch["redis"] = redis.pid
                if args.observability == "tracing":
                    collector = start_collector()
                upstream = children.start(
                    "upstream",
                    [sys.executable, str(UPSTREAM), "--port", "0"],
                    tmpdir / "upstream.log",
                    _UPSTREAM_READY,
                    30,
                )
                deployment = tmpdir / "deployment.yaml"
                deployment.write_text(
                    deployment_yaml(
                        port=upstream.port,
                        balancer=args.balancer,
                        scheduler=args.scheduler,
                        tenancy=args.tenancy,
                        key_hash=hash_key(key) if key else "",
                        redis_url=redis.url if redis is not None else "",
                        observability=args.observability,
                        collector=collector.endpoint if collector is not None else "",
                    )
                )
                gateway = children.start(
                    "gateway",
                    [*_shuniu_command(), "serve", str(deployment), "--port", "0"],
                    tmpdir / "gateway.log",
                    _GATEWAY_READY,
                    60,
                )
                progress.update(runner.overall, description="[bold]all runs[/]")
                for n in range(1, settings.runs + 1):
                    runs.append(runner.run(n, upstream, gateway))
                    if gateway.proc.poll() is not None:
                        raise RuntimeError(f"the gateway exited:\n{gateway.log_tail()}")
                gateway_log = gateway.log_tail(200)
        except KeyboardInterrupt:
            console.print("[red]interrupted; stopping the processes this run started[/]")
            return 130
        except RuntimeError as exc:
            console.print(f"[red]benchmark failed:[/] {exc}")
            return 1
        finally:
            children.stop_all()
            if redis is not None:
                redis.close()  # stops it by its PID
            if collector is not None:
                collector.stop()

    summary = summarize(runs)
    ok = verdicts(summary)
    engines = sorted({r.rps["engine"] for r in runs} | {r.stream["engine"] for r in runs})
    meta = {
        "duration_s": settings.duration,
        "requests": settings.requests,
        "concurrency": settings.concurrency,
        "max_tokens": settings.max_tokens,
        "engines": "+".join(engines) + " (c=64), python (c=1)",
        "cpus": os.cpu_count(),
        "busy_before": round(busy, 3),
        "balancer": args.balancer,
        "scheduler": args.scheduler,
        "tenancy": args.tenancy,
        "observability": args.observability,
        "spans_exported": len(collector.spans) if collector is not None else None,
    }
    console.print(render(summary, ok, meta))
    for i, s in enumerate(summary, 1):
        if s["other_cores_max"] > OTHER_LOAD_WARN_CORES:
            console.print(
                f"[yellow]run {i}: other processes used up to {s['other_cores_max']:.2f} cores during a "
                "phase; its numbers are skewed. Rerun on a quiet machine.[/]"
            )
    problems = [ln for ln in gateway_log.splitlines() if re.search(r"ERROR|WARNING|Traceback", ln)]
    if problems:
        console.print("[yellow]the gateway logged problems (last 10):[/]\n" + "\n".join(problems[-10:]))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "meta": meta,
                    "targets": {
                        "added_p50_ms": TARGET_ADDED_P50_MS,
                        "rps": TARGET_RPS,
                        "rss_mib": TARGET_RSS_MIB,
                        "rss_growth_tolerance_mib": RSS_GROWTH_TOLERANCE_MIB,
                    },
                    "verdicts": ok,
                    "summary": summary,
                    "runs": [r.__dict__ for r in runs],
                },
                indent=2,
            )
        )
        console.print(f"numbers written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
