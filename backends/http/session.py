"""The pooled HTTP session of one engine endpoint.

aiohttp's client is used because it costs a fraction of httpx's CPU per proxied request,
and it sets TCP_NODELAY on its connections. One session per endpoint keeps its connections
alive between requests; answers are not decompressed (they are proxied as they come), so
probes ask for uncompressed pages (:func:`probe_headers`).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import msgspec

from shuniu.backends.http.h1 import H1Response

__all__ = ["end_stream", "open_session", "post_json", "probe_headers"]

_KEEPALIVE_S = 60
_DNS_TTL_S = 300


def open_session(
    *, max_connections: int, timeout_s: float, connect_timeout_s: float
) -> aiohttp.ClientSession:
    """A keep-alive connection pool of at most ``max_connections`` to one engine; a whole
    request may take ``timeout_s``, opening a connection ``connect_timeout_s``."""
    connector = aiohttp.TCPConnector(
        limit=max_connections, keepalive_timeout=_KEEPALIVE_S, ttl_dns_cache=_DNS_TTL_S
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s),
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )


def probe_headers(headers: dict[str, str], api_key: str | None) -> dict[str, str]:
    """Headers of every probe (health, metadata, metrics): the configured ones and the API
    key; plain answers (the session does not decompress, and prometheus_client gzips
    ``/metrics`` when asked)."""
    out = {**headers, "accept": "*/*", "accept-encoding": "identity"}
    if api_key:
        out["authorization"] = f"Bearer {api_key}"
    return out


def end_stream(resp: aiohttp.ClientResponse | H1Response, complete: bool) -> None:
    """Let go of a streamed answer: a complete one's connection goes back to the pool;
    an unfinished one's is closed, which is how vLLM, TGI, MindIE and friends learn the
    client went away and abort the generation."""
    if complete:
        resp.release()
    else:
        resp.close()


async def post_json(
    session: aiohttp.ClientSession, url: str, payload: Any, headers: dict[str, str], timeout_s: float
) -> Any | None:
    """POST ``payload`` as JSON and return the decoded answer, or ``None`` for any status but
    200 (for optional side calls, such as counting tokens, whose failure only means "no
    answer"). Transport errors and bodies that are not JSON raise."""
    async with session.post(
        url,
        data=msgspec.json.encode(payload),
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    ) as resp:
        if resp.status != 200:
            return None
        return msgspec.json.decode(await resp.read())
