"""What both ``trtllm`` backends share: probe plumbing."""

from __future__ import annotations

from typing import Any

import aiohttp

from shuniu.backends.openai.backend import ProbeError
from shuniu.backends.openai.backend import describe_error as describe
from shuniu.backends.trtllm.options import TrtllmOptions

__all__ = ["ProbeError", "describe", "get", "probe_headers", "short"]


def probe_headers(opts: TrtllmOptions) -> dict[str, str]:
    """Headers of every probe: the configured ones and the API key; uncompressed answers,
    since the pooled session does not decompress (right for proxying)."""
    headers: dict[str, Any] = {**opts.headers, "accept": "*/*", "accept-encoding": "identity"}
    if opts.api_key:
        headers["authorization"] = f"Bearer {opts.api_key}"
    return headers


async def get(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], limit: aiohttp.ClientTimeout
) -> tuple[int, bytes]:
    """GET ``url``: its status and body, within ``limit``."""
    async with session.get(url, headers=headers, timeout=limit) as resp:
        return resp.status, await resp.read()


def short(body: bytes) -> str:
    """The start of a body, for a health detail."""
    return body[:200].decode("utf-8", "replace").strip()
