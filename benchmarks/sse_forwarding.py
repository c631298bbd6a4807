"""CPU per streamed event of the gateway's SSE path, without the network: the events of
``instant_upstream.py`` (an OpenAI stream of ``--tokens`` text chunks, usage asked for) split
into lines, turned into chunks by the OpenAI engine's stream parser and written by the
OpenAI stream encoder, as ``EventStream`` and delivery do. Two ways, alternating:

* ``forwarded``: ordinary text events forwarded as the engine wrote them
  (``backends/http/passthrough.py``, what the gateway does for an OpenAI stream);
* ``decoded``: every event decoded with msgspec and re-encoded (what it does for a stream
  whose text it must read, such as a response-cache fill).

    python benchmarks/sse_forwarding.py [--streams 2000] [--tokens 32] [--rounds 5]

Prints a table of microseconds per event for each, medians over rounds, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from shuniu.backends.http import EventStream, LineSplitter, OpenAIEngine, OpenAIOptions
from shuniu.core.api.openai import StreamEncoder, parse_request
from shuniu.core.contracts import EndpointSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from instant_upstream import build_response


def sse_body(body: bytes) -> bytes:
    """The SSE events ``instant_upstream.py`` answers ``body`` with (its chunked framing
    taken off)."""
    response, _ = build_response("chat", body, created=1)
    rest = response.split(b"\r\n\r\n", 1)[1]
    out = bytearray()
    while True:
        size, rest = rest.split(b"\r\n", 1)
        n = int(size, 16)
        if n == 0:
            return bytes(out).replace(b"@", b"0")  # the id's placeholder
        out += rest[:n]
        rest = rest[n + 2 :]


def one_round(body: bytes, events: bytes, streams: int, forwarded: bool) -> float:
    """Process CPU seconds per event over ``streams`` streams."""
    engine = OpenAIEngine(EndpointSpec("bench-0", "bench", OpenAIOptions(base_url="http://127.0.0.1:9/v1")))
    count = 0
    started = time.process_time()
    for i in range(streams):
        req = parse_request(body, "chat", f"r{i}", 0.0)
        req.raw_events = forwarded
        stream = EventStream(engine, req)
        encoder = StreamEncoder(req, created=1)
        stream._parse(LineSplitter().feed(events))  # one network read holding the whole answer
        out = [encoder.start()]
        for chunk in stream._chunks:
            out.append(encoder.chunk(chunk))
            count += 1
        out.append(encoder.end())
        b"".join(out)
    return (time.process_time() - started) / count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    body = (
        b'{"model":"bench","messages":[{"role":"user","content":"hi"}],"stream":true,'
        b'"max_tokens":%d,"stream_options":{"include_usage":true}}' % args.tokens
    )
    events = sse_body(body)
    times: dict[str, list[float]] = {"forwarded": [], "decoded": []}
    one_round(body, events, 200, True)  # warm-up
    one_round(body, events, 200, False)
    for _ in range(args.rounds):
        for name in times:
            times[name].append(one_round(body, events, args.streams, name == "forwarded"))
    title = f"SSE path, CPU per event ({args.tokens} text chunks per stream, {args.rounds} rounds)"
    table = Table(title=title)
    table.add_column("path")
    table.add_column("µs per event", justify="right")
    for name, values in times.items():
        table.add_row(name, f"{1e6 * statistics.median(values):.2f}")
    ratios = [f / d for f, d in zip(times["forwarded"], times["decoded"], strict=True)]
    table.add_row("forwarded / decoded", f"{statistics.median(ratios):.2f}")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
