"""CPU per request of the gateway's own code, without HTTP: its ASGI app driven directly with
an instant backend registered in code, so the figure is what the request path costs and
nothing else (no server, no client, no upstream). It sees below the noise of
gateway_overhead.py; to compare two trees, run each tree's own interpreter, alternating:

    python benchmarks/inprocess_overhead.py CONFIGURATION N json|stream

with CONFIGURATION one of plain, minimal, auth, key-limits, limits, features, full, governed.

``plain``: one endpoint, the default scheduler and balancer; ``minimal``: one endpoint,
``round_robin`` and ``fifo`` (what ``benchmarks/peers.py`` calls ``minimal``); ``features``: what
``benchmarks/peers.py`` calls ``full`` (API keys, key and tenant RPM/TPM/concurrency limits in
the memory store, never binding, ``priority`` and ``prefix_affinity`` over one endpoint);
``full``: API keys, memory rate limits, the response cache, prefix_affinity and priority over
four endpoints; ``auth``, ``key-limits``, ``limits``: ``features`` built up one at a time
(the API key; its RPM/TPM/concurrency limits; the tenant's too), over one endpoint with the
default scheduler and balancer, to attribute each one's cost; ``governed``:
``plain`` with a SQLite usage ledger (in a temporary folder), prices and two never-binding
budgets of the tenant, reserved and settled on every request (the ledger's writer thread
is in the figure). Prints one
JSON line with ``us_per_req`` (process CPU time per request after 500 warm-up requests).
``PROFILE=1`` prints a cProfile of the measured requests; ``PROFILE=out.prof`` writes it to a
file instead. ``CONC=64`` runs the requests 64 at a time (gathered) instead of one after
another: closer to a loaded server (more state live at once, more interleaving), and each
feature's cost there is about twice its cost one at a time.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import hashlib
import json
import os
import pstats
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

from shuniu.core import hookimpl
from shuniu.core.config.loader import load_deployment
from shuniu.core.contracts import BackendBase, EndpointSpec, RegisterBackend
from shuniu.core.gateway import Gateway
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.types import Chunk, Completion, InferenceRequest, Usage

KEY = "sk-test-0123456789abcdef"
PLAIN = """
models:
  m:
    endpoints: [{kind: instant}]
"""
# What ``benchmarks/peers.py`` calls ``minimal``: round_robin and fifo.
MINIMAL = """
models:
  m:
    balancer: {policy: round_robin}
    scheduler: {policy: fifo}
    endpoints: [{kind: instant}]
"""
AUTH = f"""
auth:
  authenticators:
    - kind: api_keys
      options:
        keys: [{{id: k1, hash: "sha256:{hashlib.sha256(KEY.encode()).hexdigest()}", tenant: t1, tier: free}}]
"""
FULL = (
    AUTH
    + """
tiers:
  free: {priority: 1, tenant_limits: {rpm: 100000000, tpm: 1000000000}}
rate_limits: {store: memory}
cache: {store: memory}
models:
  m:
    balancer: {policy: prefix_affinity}
    scheduler: {policy: priority}
    endpoints: [{kind: instant, replicas: 4}]
"""
)

NEVER_BINDING = "{rpm: 10000000, tpm: 10000000000, concurrency: 100000}"
FEATURES = (
    AUTH
    + f"""
tiers:
  free: {{key_limits: {NEVER_BINDING}, tenant_limits: {NEVER_BINDING}}}
rate_limits: {{store: memory}}
models:
  m:
    balancer: {{policy: prefix_affinity}}
    scheduler: {{policy: priority}}
    endpoints: [{{kind: instant}}]
"""
)

# ``features`` built up one feature at a time, to attribute its cost.
_ONE_ENDPOINT = """
models:
  m:
    endpoints: [{kind: instant}]
"""
AUTH_ONLY = AUTH + "tiers: {free: {}}\n" + _ONE_ENDPOINT
KEY_LIMITS = (
    AUTH
    + f"""
tiers:
  free: {{key_limits: {NEVER_BINDING}}}
rate_limits: {{store: memory}}
"""
    + _ONE_ENDPOINT
)
LIMITS = (
    AUTH
    + f"""
tiers:
  free: {{key_limits: {NEVER_BINDING}, tenant_limits: {NEVER_BINDING}}}
rate_limits: {{store: memory}}
"""
    + _ONE_ENDPOINT
)

GOVERNED = (
    PLAIN
    + """
governance:
  ledger: {url: "sqlite:///LEDGER"}
  prices: {m: {prompt: 0.5, completion: 1.5}}
  tenants: {anonymous: {budgets: [{period: day, tokens: 1000000000000}, {period: month, cost: 1000000000}]}}
"""
)


class Instant(BackendBase):
    """Answers at once: 16 chunks, or the whole completion."""

    kind = "instant"

    def __init__(self, spec: EndpointSpec) -> None:
        self.spec = spec

    async def stream(self, req: InferenceRequest) -> AsyncIterator[Chunk]:  # type: ignore[override]
        for _ in range(16):
            yield Chunk("tok ", 1)
        yield Chunk("", 0, "stop", Usage(5, 16, 21))

    async def complete(self, req: InferenceRequest) -> Completion:
        return Completion("tok " * 16, "stop", Usage(5, 16, 21))


class Plugin:
    @hookimpl
    def register_backends(self, register: RegisterBackend) -> None:
        register("instant", Instant)


async def measure(cfg: str, n: int, stream: bool) -> float:
    plugins = load_plugins(extra=[("instant", Plugin())])
    text = {
        "full": FULL,
        "features": FEATURES,
        "plain": PLAIN,
        "minimal": MINIMAL,
        "governed": GOVERNED,
        "auth": AUTH_ONLY,
        "key-limits": KEY_LIMITS,
        "limits": LIMITS,
    }[cfg]
    if cfg == "governed":
        text = text.replace("LEDGER", os.path.join(tempfile.mkdtemp(prefix="shuniu-ledger-"), "ledger.db"))
    gw = Gateway(load_deployment(None, plugins, text=text), plugins)
    await gw.start()
    messages = [{"role": "user", "content": "hello there, how are you today?"}]
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": 16, "stream": stream}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if cfg in ("full", "features", "auth", "key-limits", "limits"):
        headers.append((b"authorization", b"Bearer " + KEY.encode()))
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}

    async def send(message: Any) -> None:
        return None

    async def one() -> None:
        first = True

        async def receive() -> dict[str, Any]:
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the client never leaves
            return {}

        await gw.app(scope, receive, send)

    for _ in range(500):
        await one()
    gc.collect()
    prof = cProfile.Profile() if os.environ.get("PROFILE") else None
    if prof is not None:
        prof.enable()
    start = time.process_time()
    conc = int(os.environ.get("CONC", "1"))
    if conc == 1:
        for _ in range(n):
            await one()
    else:
        for _ in range(n // conc):
            await asyncio.gather(*(one() for _ in range(conc)))
    spent = time.process_time() - start
    if prof is not None:
        prof.disable()
        stats = pstats.Stats(prof)
        if os.environ["PROFILE"].endswith(".prof"):
            stats.dump_stats(os.environ["PROFILE"])  # for a diff of two configurations
        else:
            stats.sort_stats("tottime").print_stats(30)
    await gw.stop()
    return spent / n * 1e6


def main() -> None:
    cfg, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    us = asyncio.run(measure(cfg, n, mode == "stream"))
    print(json.dumps({"cfg": cfg, "stream": mode == "stream", "us_per_req": round(us, 2)}))


if __name__ == "__main__":
    main()
