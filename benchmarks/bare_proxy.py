"""The bare proxy: the least a Python gateway can do, as the floor shuniu is compared with.

A Litestar app on uvicorn (uvloop + httptools, as ``shuniu serve`` runs), forwarding
``POST /v1/chat/completions`` and ``/v1/completions`` to one upstream over one pooled
aiohttp session: the body is decoded with msgspec only to read ``stream``, sent on as it
came, and the answer's bytes are returned as they arrive (a streamed answer block by block,
no SSE parsing). No auth, limits, metrics, retries or timeouts beyond aiohttp's.

Run it: ``python benchmarks/bare_proxy.py --upstream http://127.0.0.1:9000 --port 0``; it
prints ``bare-proxy serving on http://HOST:PORT`` when it listens.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import AsyncIterator

import aiohttp
import msgspec
import uvicorn
from litestar import Litestar, Request, Response, post
from litestar.response import Stream


class _Head(msgspec.Struct):
    stream: bool = False


_head = msgspec.json.Decoder(_Head).decode
_HEADERS = {"content-type": "application/json"}


def make_app(upstream: str) -> Litestar:
    state: dict[str, aiohttp.ClientSession] = {}

    async def open_session() -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        state["session"] = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close_session() -> None:
        await state["session"].close()

    async def forward(request: Request, path: str) -> Response[bytes] | Stream:
        body = await request.body()
        resp = await state["session"].post(upstream + path, data=body, headers=_HEADERS)
        if not _head(body).stream:
            data = await resp.read()
            return Response(data, status_code=resp.status, media_type="application/json")

        async def blocks() -> AsyncIterator[bytes]:
            async with resp:
                async for block in resp.content.iter_any():
                    yield block

        return Stream(blocks(), status_code=resp.status, media_type="text/event-stream")

    @post("/v1/chat/completions")
    async def chat(request: Request) -> Response[bytes] | Stream:
        return await forward(request, "/v1/chat/completions")

    @post("/v1/completions")
    async def completions(request: Request) -> Response[bytes] | Stream:
        return await forward(request, "/v1/completions")

    return Litestar([chat, completions], on_startup=[open_session], on_shutdown=[close_session])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True, help="The upstream's root, e.g. http://127.0.0.1:9000")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((args.host, args.port))
    host, port = sock.getsockname()[:2]
    print(f"bare-proxy serving on http://{host}:{port}", flush=True)
    config = uvicorn.Config(
        make_app(args.upstream.rstrip("/")),
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
