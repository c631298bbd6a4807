"""The whole gateway's views when it runs as several workers (:mod:`.workers`).

The worker a request reaches answers for all of them: it asks the other workers over their
Unix sockets (with :data:`LOCAL` set, so they answer for themselves only) and merges:

- ``/metrics``: every worker's series, each with a ``worker`` label, grouped by family as
  the exposition format requires (``sum by (...)`` across ``worker`` gives the gateway's);
- ``/status.json``: per model, the recent requests, errors and rates summed, the
  percentiles combined (p50 weighted by requests, p99 the workers' highest: an upper
  bound), each endpoint's counts summed; and ``workers``, one entry per worker;
- admin changes: replayed to every other worker after the one asked applied them.

A worker that does not answer within :data:`PEER_TIMEOUT_S` (one being restarted) is left
out, and ``/status.json`` says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec

from shuniu.core.http.workers import WorkerInfo

__all__ = ["LOCAL", "PEER_TIMEOUT_S", "Peers", "label_page", "merge_metrics", "merge_status"]

LOCAL = b"x-shuniu-worker-local"
"""Header of a request one worker makes to another: answer for yourself, do not gather."""
PEER_TIMEOUT_S = 2.0

_decode = msgspec.json.decode


class Peers:
    """HTTP over the other workers' Unix sockets (a raw HTTP/1.1 exchange: a handful of
    requests a second at most, so no client library or pool)."""

    __slots__ = ("worker",)

    def __init__(self, worker: WorkerInfo) -> None:
        self.worker = worker

    async def ask_all(
        self, method: str, path: str, headers: Sequence[tuple[bytes, bytes]], body: bytes = b""
    ) -> list[tuple[int, int, bytes] | None]:
        """``(worker, status, body)`` from every other worker, ``None`` for one that did
        not answer."""
        peers = self.worker.peers()
        return list(await asyncio.gather(*(self._ask(i, method, path, headers, body) for i in peers)))

    async def _ask(
        self, index: int, method: str, path: str, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> tuple[int, int, bytes] | None:
        try:
            async with asyncio.timeout(PEER_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(str(self.worker.socket(index)))
                try:
                    head = [f"{method} {path} HTTP/1.1".encode(), b"host: worker", LOCAL + b": 1"]
                    head += [k + b": " + v for k, v in headers if k not in _HOP and k != LOCAL]
                    head += [b"content-length: %d" % len(body), b"connection: close"]
                    writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
                    await writer.drain()
                    raw = await reader.read()
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            return None
        status, payload = _parse_response(raw)
        return None if status is None else (index, status, payload)


_HOP = frozenset({b"host", b"content-length", b"connection", b"transfer-encoding", b"keep-alive"})


def _parse_response(raw: bytes) -> tuple[int | None, bytes]:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        return None, b""
    lines = head.split(b"\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        return None, b""
    chunked = any(
        line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower() for line in lines[1:]
    )
    return status, _dechunk(body) if chunked else body


def _dechunk(body: bytes) -> bytes:
    out = []
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out.append(rest[:size])
        body = rest[size + 2 :]
    return b"".join(out)


# -- /metrics -------------------------------------------------------------------------------


def label_page(page: bytes, worker: int) -> list[tuple[str, list[bytes], list[bytes]]]:
    """A metrics page as ``(family, comment lines, sample lines)``, each sample with
    ``worker="N"`` added."""
    families: list[tuple[str, list[bytes], list[bytes]]] = []
    current: tuple[str, list[bytes], list[bytes]] | None = None
    label = b'worker="%d"' % worker
    for line in page.splitlines():
        if not line:
            continue
        if line.startswith(b"#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in (b"HELP", b"TYPE"):
                name = parts[2].decode()
                if current is None or current[0] != name:
                    current = (name, [], [])
                    families.append(current)
                current[1].append(line)
            continue
        if current is None:
            current = ("", [], [])
            families.append(current)
        brace = line.find(b"{")
        space = line.find(b" ")
        if brace != -1 and (space == -1 or brace < space):
            close = line.find(b"}", brace)
            inner = line[brace + 1 : close]
            labelled = line[: brace + 1] + label + (b"," + inner if inner else b"") + line[close:]
        else:
            labelled = line[:space] + b"{" + label + b"}" + line[space:]
        current[2].append(labelled)
    return families


def merge_metrics(pages: Sequence[tuple[int, bytes]]) -> bytes:
    """Several workers' pages as one: each family once (its comments from the first page
    that has it), every worker's samples under it."""
    order: list[str] = []
    comments: dict[str, list[bytes]] = {}
    samples: dict[str, list[bytes]] = {}
    for worker, page in pages:
        for name, lines, values in label_page(page, worker):
            if name not in samples:
                order.append(name)
                comments[name] = lines
                samples[name] = []
            samples[name].extend(values)
    out: list[bytes] = []
    for name in order:
        out.extend(comments[name])
        out.extend(samples[name])
    return b"\n".join(out) + b"\n"


# -- /status.json ---------------------------------------------------------------------------

_SUMMED = ("requests", "errors", "rps")
_ENDPOINT_SUMMED = ("in_flight", "completed", "errors", "queued")


def _combine_recent(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    parts = [p for p in parts if p]
    if not parts:
        return None
    out = dict(parts[0])
    for key in _SUMMED:
        if all(isinstance(p.get(key), int | float) for p in parts):
            out[key] = round(sum(p[key] for p in parts), 3)
    requests = out.get("requests") or 0
    out["error_rate"] = round(out.get("errors", 0) / requests, 4) if requests else None
    for key in ("ttft_p50", "e2e_p50"):
        weighted = [(p[key], p.get("requests") or 0) for p in parts if p.get(key) is not None]
        total = sum(n for _, n in weighted)
        out[key] = round(sum(v * n for v, n in weighted) / total, 4) if total else None
    for key in ("ttft_p99", "e2e_p99"):
        values = [p[key] for p in parts if p.get(key) is not None]
        out[key] = max(values) if values else None
    return out


def merge_status(
    own: dict[str, Any], own_index: int, others: Sequence[tuple[int, dict[str, Any]]]
) -> dict[str, Any]:
    """This worker's ``/status.json`` and the others' as the gateway's."""
    everyone = [(own_index, own), *others]
    merged = dict(own)
    merged["models"] = {}
    for name, model in own.get("models", {}).items():
        copies = [s.get("models", {}).get(name) for _, s in everyone]
        copies = [c for c in copies if isinstance(c, dict)]
        entry = dict(model)
        entry["queued"] = sum(c.get("queued", 0) for c in copies)
        entry["recent"] = _combine_recent([c.get("recent") for c in copies])
        if isinstance(model.get("endpoints"), list):
            endpoints = []
            for ep in model["endpoints"]:
                same = [
                    e
                    for c in copies
                    for e in c.get("endpoints", [])
                    if isinstance(e, dict) and e.get("name") == ep.get("name")
                ]
                combined = dict(ep)
                for key in _ENDPOINT_SUMMED:
                    if all(isinstance(e.get(key), int) for e in same):
                        combined[key] = sum(e[key] for e in same)
                combined["draining"] = any(e.get("draining") for e in same)
                endpoints.append(combined)
            entry["endpoints"] = endpoints
        merged["models"][name] = entry
    merged["unrouted"] = _combine_recent([s.get("unrouted") for _, s in everyone])
    merged["ready"] = all(s.get("ready") for _, s in everyone)
    merged["workers"] = [
        {"index": i, "pid": s.get("pid"), "ready": s.get("ready"), "answered": True} for i, s in everyone
    ]
    return merged


def decode_status(body: bytes) -> dict[str, Any] | None:
    try:
        data = _decode(body)
    except msgspec.DecodeError:
        return None
    return data if isinstance(data, dict) else None
