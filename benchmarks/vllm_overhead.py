"""How much does the shuniu gateway add in front of a REAL vLLM server?

Usage::

    python benchmarks/vllm_overhead.py [--requests N] [--concurrency 1 16] [--quick]

It starts one vLLM server (vLLM's CPU build serving the tiny random Llama of
``tests/tiny_model.py``; DESIGN.md, "Testing with real parts") and one ``shuniu serve`` with a
generated deployment whose only endpoint is that server (``kind: vllm``, the ``round_robin``
balancer and the default scheduler unless ``--balancer``/``--scheduler`` say otherwise), both
on 127.0.0.1. Then, for each concurrency, it sends streamed chat completions of exactly
``--max-tokens`` tokens (``ignore_eos``, ``temperature: 0``, a short prompt unique to the
request, so every request is the same work and none hits the prefix cache) to vLLM directly
and through the gateway, in alternating blocks (direct, gateway, gateway, direct, ...), so
that drift and other load on the machine hit both paths alike. Each request records:

* TTFT: time from sending the request to the first SSE ``data:`` event (vLLM sends the first
  chat chunk once the first token exists);
* end-to-end: time to ``data: [DONE]``;
* the completion tokens the final usage chunk reports (anything but ``--max-tokens`` counts
  as an error).

The gateway's CPU time (``/proc/PID/stat`` utime + stime) is read around every block: over
the gateway blocks it is the gateway's CPU per proxied request (gross); over the direct
blocks it is what the gateway spends while idle (health and ``/metrics`` probes), which is
subtracted for the net figure. On a 2-core machine the engine, the gateway and this client
share the CPUs, so the added latency includes the gateway taking CPU away from the engine;
the CPU per request is the less noisy number.

Prints a table, writes every number to ``benchmarks/results/vllm_overhead.json`` (``--json``),
and stops every process it started by PID and process group, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SERVED = "tiny"
DEFAULT_JSON = HERE / "results" / "vllm_overhead.json"
DEFAULT_VENV = Path(os.environ.get("SHUNIU_VLLM_VENV") or ROOT / ".venv-vllm")
DEFAULT_MODEL = ROOT / ".cache" / "tiny-model"
_GATEWAY_READY = re.compile(r"serving .* on http://(\S+):(\d+)")
_CLK_TCK = os.sysconf("SC_CLK_TCK")
OTHER_LOAD_WARN_CORES = 0.3
"""Above this, other processes (or CPU this run cannot attribute) skewed a phase: warn."""
_WORDS = "hello world model server request response token stream gateway cache".split()

console = Console(width=None if sys.stdout.isatty() else 130)


# -- processes -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (NaN once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / _CLK_TCK
    except (OSError, IndexError, ValueError):
        return float("nan")


def group_pids(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            if int(parts[2]) == pgid and parts[0] != "Z":
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    return out


def machine_ticks() -> tuple[int, int, int]:
    """(busy, total, interrupts) jiffies of the whole machine; ``interrupts`` (irq + softirq,
    mostly loopback TCP here) is part of ``busy`` but charged to no process."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values[:8]) - idle, sum(values[:8]), values[5] + values[6]


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Children:
    """Every process this run started, each in its own process group (``process_group=0``)
    but in this session: a new session is a new CPU autogroup, and vLLM's ``sched_yield``
    spin loops then starve the other groups on 2 cores (``benchmarks/sim_fidelity.py``)."""

    def __init__(self) -> None:
        self.items: list[Child] = []

    def start(self, name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Child:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                process_group=0,
            )
        child = Child(name, proc, log)
        self.items.append(child)
        return child

    def stop_all(self) -> None:
        for child in reversed(self.items):
            stop(child.proc)
        self.items.clear()


def stop(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM the process, SIGKILL it after ``grace``, then clear its process group (the
    vLLM server's engine core and worker) by that group's id, which is its PID."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not group_pids(proc.pid):
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while group_pids(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)


def wait_for(what: str, child: Child, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        if child.proc.poll() is not None:
            raise RuntimeError(f"{child.name} exited with {child.proc.returncode}:\n{child.tail()}")
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout:g} s:\n{child.tail()}")
        time.sleep(0.5)


def http_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read()) if r.status == 200 else None
    except (OSError, ValueError):
        return None


def start_vllm(children: Children, python: Path, model_dir: Path, tmp: Path) -> tuple[Child, str]:
    port = free_port()
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", SERVED, "--dtype", "float32", "--max-model-len", "1024",
        "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "0",  # the model worker on core 0, the rest unpinned
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    child = children.start("vLLM", cmd, tmp / "vllm.log", env)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    wait_for("vLLM was not healthy", child, healthy, 600)
    return child, url


def shuniu_command() -> list[str]:
    script = Path(sys.executable).with_name("shuniu")
    return [str(script)] if script.exists() else [sys.executable, "-m", "shuniu.core"]


DEPLOYMENT = """\
# generated by benchmarks/vllm_overhead.py
gateway: {{host: 127.0.0.1, port: 0}}
models:
  {model}:
    balancer: {{policy: {balancer}}}
{scheduler}    endpoints:
      - kind: vllm
        name: vllm-0
        options: {{base_url: "{url}"}}
"""


def start_gateway(
    children: Children, vllm_url: str, balancer: str, scheduler: str | None, tmp: Path
) -> tuple[Child, str]:
    deployment = tmp / "deployment.yaml"
    deployment.write_text(
        DEPLOYMENT.format(
            model=SERVED,
            balancer=balancer,
            scheduler=f"    scheduler: {{policy: {scheduler}}}\n" if scheduler else "",
            url=vllm_url,
        )
    )
    log = tmp / "gateway.log"
    child = children.start("gateway", [*shuniu_command(), "serve", str(deployment), "--port", "0"], log)
    m = wait_for(
        "the gateway did not say it was serving", child, lambda: _GATEWAY_READY.search(log.read_text()), 60
    )
    url = f"http://{m.group(1)}:{m.group(2)}"

    def endpoint_healthy() -> bool:
        body = http_json(f"{url}/ready")
        try:
            return bool(body and all(e["healthy"] for e in body["models"][SERVED]["endpoints"]))
        except (KeyError, TypeError):
            return False

    wait_for("the gateway's vLLM endpoint was not healthy", child, endpoint_healthy, 60)
    return child, url


def endpoint_limit(gateway_url: str) -> Any:
    """The gateway's current concurrency limit for the vLLM endpoint (``None``: none; the
    adaptive limit only binds when vLLM reports a backlog)."""
    body = http_json(f"{gateway_url}/ready")
    try:
        return body["models"][SERVED]["endpoints"][0].get("limit")
    except (KeyError, IndexError, TypeError):
        return "unknown"


def ensure_model(python: Path, model_dir: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from tiny_model import is_built  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    if not is_built(model_dir):
        console.print(f"building the tiny model into {model_dir}")
        subprocess.run([str(python), str(ROOT / "tests" / "tiny_model.py"), str(model_dir)], check=True)


def vllm_version(python: Path) -> str:
    venv = python.parent.parent
    for dist in sorted(venv.glob("lib/python3*/site-packages/vllm*.dist-info")):
        return dist.name.removesuffix(".dist-info").rsplit("-", 1)[1]
    return "unknown"


# -- the client ----------------------------------------------------------------------------


@dataclass
class Sample:
    ttft_s: float | None = None
    e2e_s: float | None = None
    tokens: int | None = None
    chunks: int = 0
    error: str | None = None
    first_event: bytes = b""


def chat_body(i: int, max_tokens: int) -> bytes:
    words = " ".join(_WORDS[(i + k) % len(_WORDS)] for k in range(12))
    return json.dumps(
        {
            "model": SERVED,
            "messages": [{"role": "user", "content": f"request {i}: {words}"}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


async def one_request(session: aiohttp.ClientSession, url: str, body: bytes, max_tokens: int) -> Sample:
    s = Sample()
    t0 = time.perf_counter()
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                s.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return s
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                if s.ttft_s is None:
                    s.ttft_s = time.perf_counter() - t0
                    s.first_event = line[:300]
                if line.startswith(b"data: [DONE]"):
                    s.e2e_s = time.perf_counter() - t0
                    break
                s.chunks += 1
                if b'"completion_tokens"' in line:
                    usage = json.loads(line[6:]).get("usage") or {}
                    s.tokens = usage.get("completion_tokens")
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        s.error = f"{type(exc).__name__}: {exc}"
        return s
    if s.e2e_s is None:
        s.error = "the stream ended without data: [DONE]"
    elif s.tokens != max_tokens:
        s.error = f"{s.tokens} completion tokens, not {max_tokens}"
    return s


@dataclass
class Book:
    """One target (``direct`` or ``gateway``) at one concurrency: its samples and CPU books."""

    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    gateway_cpu_s: float = 0.0
    vllm_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    machine_busy_ticks: int = 0
    machine_total_ticks: int = 0
    machine_irq_ticks: int = 0
    first_event: str | None = None
    """The first SSE event of the first measured request, to show what TTFT was taken from."""


class Bench:
    def __init__(
        self,
        urls: dict[str, str],
        gateway_pid: int,
        vllm_pgid: int,
        max_tokens: int,
        progress: Progress,
    ) -> None:
        self.urls = {k: f"{v}/v1/chat/completions" for k, v in urls.items()}
        self.gateway_pid = gateway_pid
        self.vllm_pgid = vllm_pgid
        self.max_tokens = max_tokens
        self.progress = progress
        self.counter = 0

    def _vllm_cpu(self) -> float:
        return sum(proc_cpu_s(p) for p in group_pids(self.vllm_pgid))

    async def block(
        self, session: aiohttp.ClientSession, target: str, n: int, c: int, task: Any, book: Book | None
    ) -> None:
        """``n`` requests to ``target`` from ``c`` workers; recorded in ``book`` unless warm-up."""
        url = self.urls[target]
        todo = list(range(self.counter, self.counter + n))
        self.counter += n
        results: list[Sample] = []

        async def worker() -> None:
            while todo:
                i = todo.pop(0)
                results.append(
                    await one_request(session, url, chat_body(i, self.max_tokens), self.max_tokens)
                )
                self.progress.advance(task)

        g0, v0, m0, t0 = proc_cpu_s(self.gateway_pid), self._vllm_cpu(), machine_ticks(), time.perf_counter()
        me0 = os.times()
        await asyncio.gather(*(worker() for _ in range(min(c, n))))
        t1, m1, v1, g1 = time.perf_counter(), machine_ticks(), self._vllm_cpu(), proc_cpu_s(self.gateway_pid)
        me1 = os.times()
        if book is None:
            return
        if book.first_event is None and results:
            book.first_event = results[0].first_event.decode(errors="replace").strip()
        book.samples.extend(results)
        book.wall_s += t1 - t0
        book.gateway_cpu_s += g1 - g0
        book.vllm_cpu_s += v1 - v0
        book.client_cpu_s += me1.user + me1.system - me0.user - me0.system
        book.machine_busy_ticks += m1[0] - m0[0]
        book.machine_total_ticks += m1[1] - m0[1]
        book.machine_irq_ticks += m1[2] - m0[2]

    async def run(self, c: int, requests: int, warmup: int, task: Any) -> dict[str, Book]:
        books = {"direct": Book(), "gateway": Book()}
        block = max(4 * c, 8)  # c=16: 64 requests a block, four waves
        rounds = max(1, -(-requests // block))
        timeout = aiohttp.ClientTimeout(total=600, sock_connect=10)
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            for target in ("direct", "gateway"):  # warm up both paths (connections, caches)
                await self.block(session, target, warmup, c, task, None)
            for r in range(rounds):
                # direct, gateway | gateway, direct | ...: each path goes first half the time.
                order = ("direct", "gateway") if r % 2 == 0 else ("gateway", "direct")
                for target in order:
                    n = min(block, requests - r * block)
                    await self.block(session, target, n, c, task, books[target])
        return books


# -- the report ----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (q in [0, 100])."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 2)


def idle_gateway_rate(all_books: list[dict[str, Book]]) -> float:
    """The gateway's CPU seconds per second while the traffic went direct (its health and
    ``/metrics`` probes), pooled over every concurrency: the per-block reads are in 10 ms
    ticks, too coarse for the few seconds of direct blocks at one concurrency."""
    cpu = sum(b["direct"].gateway_cpu_s for b in all_books)
    wall = sum(b["direct"].wall_s for b in all_books)
    return cpu / wall if wall else 0.0


def summarize(books: dict[str, Book], max_tokens: int, idle_rate: float) -> dict[str, Any]:
    """Percentiles, throughput and CPU of both paths at one concurrency, and the differences;
    ``idle_rate`` (CPU s/s) is subtracted from the gateway's CPU for the net figure."""
    out: dict[str, Any] = {}
    for target, b in books.items():
        ok = [s for s in b.samples if s.error is None]
        ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
        e2e = [s.e2e_s for s in ok if s.e2e_s is not None]
        cores = os.cpu_count() or 1
        share = cores / b.machine_total_ticks if b.machine_total_ticks else 0.0
        machine = b.machine_busy_ticks * share
        irq = b.machine_irq_ticks * share
        ours = (b.gateway_cpu_s + b.vllm_cpu_s + b.client_cpu_s) / b.wall_s if b.wall_s else 0.0
        out[target] = {
            "requests": len(b.samples),
            "errors": len(b.samples) - len(ok),
            "error_examples": sorted({s.error for s in b.samples if s.error})[:3],
            "ttft_ms": {f"p{q}": _ms(percentile(ttft, q)) for q in (50, 90, 99)},
            "e2e_ms": {f"p{q}": _ms(percentile(e2e, q)) for q in (50, 90, 99)},
            "output_tokens_per_s": round(len(ok) * max_tokens / b.wall_s, 1) if b.wall_s else None,
            "sse_events_per_request": round(sum(s.chunks for s in ok) / len(ok), 2) if ok else None,
            "wall_s": round(b.wall_s, 3),
            "gateway_cpu_s": round(b.gateway_cpu_s, 3),
            "vllm_cpu_s": round(b.vllm_cpu_s, 3),
            "client_cpu_s": round(b.client_cpu_s, 3),
            "machine_cores_busy": round(machine, 3),
            "irq_cores": round(irq, 3),
            "other_cores": round(max(machine - irq - ours, 0.0), 3),
            "first_event_example": b.first_event,
        }
    d, g = out["direct"], out["gateway"]
    n = g["requests"] or 1
    chunks = sum(x.chunks for x in books["gateway"].samples)
    gross = books["gateway"].gateway_cpu_s / n
    net = (books["gateway"].gateway_cpu_s - idle_rate * books["gateway"].wall_s) / n
    out["added"] = {
        "ttft_p50_ms": _delta(g["ttft_ms"]["p50"], d["ttft_ms"]["p50"]),
        "ttft_p90_ms": _delta(g["ttft_ms"]["p90"], d["ttft_ms"]["p90"]),
        "e2e_p50_ms": _delta(g["e2e_ms"]["p50"], d["e2e_ms"]["p50"]),
        "e2e_p90_ms": _delta(g["e2e_ms"]["p90"], d["e2e_ms"]["p90"]),
        "gateway_cpu_ms_per_request_gross": round(1000 * gross, 3),
        "gateway_idle_cpu_ms_per_s": round(1000 * idle_rate, 3),
        "gateway_cpu_ms_per_request_net": round(1000 * net, 3),
        "gateway_cpu_us_per_chunk_net": round(1e6 * net * n / max(chunks, 1), 2),
    }
    return out


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 2)


def render(results: dict[int, dict[str, Any]], meta: dict[str, Any]) -> list[Table]:
    lat = Table(
        title="shuniu gateway in front of a real vLLM server (vLLM CPU build, tiny model)",
        caption=(
            f"{meta['requests']} streamed chat requests per path and concurrency (after "
            f"{meta['warmup']} unmeasured), {meta['max_tokens']} output tokens each (ignore_eos, "
            f"temperature 0), alternating blocks of direct and gateway requests; gateway: "
            f"balancer {meta['balancer']}, scheduler {meta['scheduler']}; vLLM {meta['vllm']}, "
            f"{meta['cpus']} CPUs shared by vLLM, the gateway and the client"
        ),
    )
    lat.add_column("c", justify="right")
    lat.add_column("path")
    for h in ("TTFT p50", "p90", "p99", "e2e p50", "p90", "p99"):
        lat.add_column(f"{h} (ms)", justify="right")
    lat.add_column("tok/s", justify="right")
    lat.add_column("errors", justify="right")

    def f(x: float | None, fmt: str = ".1f") -> str:
        return "-" if x is None else format(x, fmt)

    for c, r in results.items():
        for target in ("direct", "gateway"):
            t = r[target]
            lat.add_row(
                str(c),
                target,
                *(f(t["ttft_ms"][p]) for p in ("p50", "p90", "p99")),
                *(f(t["e2e_ms"][p]) for p in ("p50", "p90", "p99")),
                f(t["output_tokens_per_s"], ",.0f"),
                str(t["errors"]),
            )
        a = r["added"]
        lat.add_row(
            "", "[bold]added[/]", f"[bold]{f(a['ttft_p50_ms'], '+.1f')}[/]", f(a["ttft_p90_ms"], "+.1f"), "",
            f"[bold]{f(a['e2e_p50_ms'], '+.1f')}[/]", f(a["e2e_p90_ms"], "+.1f"), "", "", "",
        )  # fmt: skip
        lat.add_section()

    cpu = Table(
        title="CPU (the less noisy figure)",
        caption=(
            "gateway CPU: utime + stime over the gateway blocks, per request (gross), less its idle "
            "rate over the direct blocks (net); client: this process, per request; interrupts: "
            "irq + softirq (loopback TCP), charged to no process; other: the rest of the machine"
        ),
    )
    cpu.add_column("c", justify="right")
    cpu.add_column("gateway CPU ms/request (gross)", justify="right")
    cpu.add_column("idle gateway CPU ms/s", justify="right")
    cpu.add_column("[bold]gateway CPU ms/request (net)[/]", justify="right")
    cpu.add_column("gateway CPU µs/chunk (net)", justify="right")
    cpu.add_column("client CPU ms/request direct / gateway", justify="right")
    cpu.add_column("vLLM CPU ms/request direct / gateway", justify="right")
    cpu.add_column("interrupts (cores) direct / gateway", justify="right")
    cpu.add_column("other processes (cores)", justify="right")
    for c, r in results.items():
        a, d, g = r["added"], r["direct"], r["gateway"]
        cpu.add_row(
            str(c),
            f"{a['gateway_cpu_ms_per_request_gross']:.2f}",
            f"{a['gateway_idle_cpu_ms_per_s']:.2f}",
            f"[bold]{a['gateway_cpu_ms_per_request_net']:.2f}[/]",
            f"{a['gateway_cpu_us_per_chunk_net']:.0f}",
            f"{_per_request_ms(d, 'client_cpu_s'):.2f} / {_per_request_ms(g, 'client_cpu_s'):.2f}",
            f"{_per_request_ms(d, 'vllm_cpu_s'):.0f} / {_per_request_ms(g, 'vllm_cpu_s'):.0f}",
            f"{d['irq_cores']:.2f} / {g['irq_cores']:.2f}",
            f"{max(d['other_cores'], g['other_cores']):.2f}",
        )
    return [lat, cpu]


def _per_request_ms(t: dict[str, Any], key: str) -> float:
    return 1000 * float(t[key]) / max(int(t["requests"]), 1)


# -- main ----------------------------------------------------------------------------------


def _on_signal(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--requests", type=int, default=256, help="measured requests per path and concurrency (default 256)"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help="unmeasured requests per path first (default 2c, at least 4)"
    )
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens per request (default 32)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16], help="default: 1 16")
    parser.add_argument(
        "--vllm-python",
        type=Path,
        default=DEFAULT_VENV / "bin" / "python",
        help="Python of a virtualenv with vllm-cpu (default $SHUNIU_VLLM_VENV or .venv-vllm)",
    )
    parser.add_argument(
        "--model-dir", type=Path, default=DEFAULT_MODEL, help="built if missing (tests/tiny_model.py)"
    )
    parser.add_argument("--balancer", default="round_robin")
    parser.add_argument("--scheduler", default=None, help="scheduler policy (default: the gateway's default)")
    parser.add_argument(
        "--quick", action="store_true", help="16 requests per path and concurrency: a smoke run"
    )
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help=f"default {DEFAULT_JSON.relative_to(ROOT)}"
    )
    args = parser.parse_args(argv)
    requests = 16 if args.quick else max(1, min(100_000, args.requests))
    max_tokens = max(1, min(900, args.max_tokens))
    concurrency = [max(1, min(256, c)) for c in args.concurrency]
    if not args.vllm_python.exists():
        console.print(
            f"[red]no vLLM Python at {args.vllm_python}[/] (see DESIGN.md; .ci/vllm-venv.sh builds one)"
        )
        return 2

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)

    ensure_model(args.vllm_python, args.model_dir)
    b0 = machine_ticks()
    time.sleep(1.0)
    b1 = machine_ticks()
    busy_before = (b1[0] - b0[0]) / max(b1[1] - b0[1], 1) * (os.cpu_count() or 1)
    if busy_before > 0.2:
        console.print(
            f"[yellow]warning: {busy_before:.2f} cores already busy; the numbers will be noisier[/]"
        )
    children = Children()
    all_books: dict[int, dict[str, Book]] = {}
    limits: dict[int, Any] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shuniu-vllm-overhead-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress:
                boot = progress.add_task("starting vLLM (about a minute)", total=None)
                vllm, vllm_url = start_vllm(children, args.vllm_python, args.model_dir, tmp)
                progress.update(boot, description="starting the gateway")
                gateway, gateway_url = start_gateway(children, vllm_url, args.balancer, args.scheduler, tmp)
                progress.remove_task(boot)
                console.print(
                    f"vLLM pid {vllm.pid} at {vllm_url}; gateway pid {gateway.pid} at {gateway_url}"
                )
                bench = Bench(
                    {"direct": vllm_url, "gateway": gateway_url}, gateway.pid, vllm.pid, max_tokens, progress
                )
                for c in concurrency:
                    warmup = args.warmup if args.warmup is not None else max(4, 2 * c)
                    task = progress.add_task(f"c={c}", total=2 * (warmup + requests))
                    all_books[c] = asyncio.run(bench.run(c, requests, warmup, task))
                    limits[c] = endpoint_limit(gateway_url)
                    for who in (vllm, gateway):
                        if who.proc.poll() is not None:
                            raise RuntimeError(f"{who.name} exited:\n{who.tail()}")
                gateway_problems = [
                    ln for ln in gateway.tail(500).splitlines() if re.search(r"ERROR|Traceback", ln)
                ]
        except KeyboardInterrupt:
            console.print("[red]interrupted; stopping the processes this run started[/]")
            return 130
        except RuntimeError as exc:
            console.print(f"[red]benchmark failed:[/] {exc}")
            return 1
        finally:
            children.stop_all()

    idle_rate = idle_gateway_rate(list(all_books.values()))
    results = {c: summarize(books, max_tokens, idle_rate) for c, books in all_books.items()}
    for c, r in results.items():
        r["gateway_endpoint_limit_after"] = limits[c]
    meta = {
        "requests": requests,
        "warmup": args.warmup if args.warmup is not None else "max(4, 2c)",
        "max_tokens": max_tokens,
        "concurrency": concurrency,
        "balancer": args.balancer,
        "scheduler": args.scheduler or "priority (the default)",
        "vllm": vllm_version(args.vllm_python),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "cores_busy_before": round(busy_before, 3),
        "duration_s": round(time.monotonic() - started, 1),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
    }
    for table in render(results, meta):
        console.print(table)
    for c, r in results.items():
        for target in ("direct", "gateway"):
            if r[target]["errors"]:
                console.print(
                    f"[red]c={c} {target}: {r[target]['errors']} errors[/] {r[target]['error_examples']}"
                )
        if max(r["direct"]["other_cores"], r["gateway"]["other_cores"]) > OTHER_LOAD_WARN_CORES:
            console.print(
                f"[yellow]c={c}: other processes used CPU during the run; rerun on a quiet machine[/]"
            )
    if gateway_problems:
        console.print("[yellow]the gateway logged errors (last 5):[/]\n" + "\n".join(gateway_problems[-5:]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"meta": meta, "results": {str(c): r for c, r in results.items()}}, indent=2)
    )
    console.print(f"numbers written to {args.json}")
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


__all__ = ["Sample", "main", "percentile", "summarize"]

if __name__ == "__main__":
    sys.exit(main())
