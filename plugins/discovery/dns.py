"""``dns``: engines found in DNS, e.g. a Kubernetes headless Service's records.

Looks the name up (A and AAAA records, or SRV records whose targets are then looked up),
and looks again when the answer's TTL runs out, bounded by ``min_interval_s`` and
``interval_s``. Every address is one engine (``port`` from the options, or the SRV
record's). A name that does not exist, or has no records of the type asked, is an empty
set (its engines drain); a server that does not answer or fails (timeout, SERVFAIL) is a
failure, and the gateway keeps the engines it has.

The lookups use dnspython (the ``dns`` extra), which reads ``/etc/resolv.conf`` unless
``nameservers`` says otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Discovery, RegisterDiscovery, Target
from shuniu.core.extras import require

__all__ = ["DnsDiscovery", "DnsOptions", "parse_nameserver"]


def parse_nameserver(text: str) -> tuple[str, int]:
    """``127.0.0.1``, ``127.0.0.1:5353``, ``::1`` or ``[::1]:5353`` → (address, port)."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
        return host, int(port) if port else 53
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, int(port)
    return text, 53


class DnsOptions(Options):
    """Where the engines' records are."""

    name: str = Field(min_length=1)
    """The name to look up, e.g. ``vllm-engines.llm.svc.cluster.local`` (a headless
    Service) or ``_http._tcp.vllm-engines.llm.svc.cluster.local`` (its SRV records)."""
    record: Literal["A", "AAAA", "any", "SRV"] = "any"
    """``A`` or ``AAAA`` addresses, ``any`` (both), or ``SRV`` records (each gives a host
    name, looked up in turn, and the port)."""
    port: int | None = Field(None, ge=1, le=65535)
    """The engines' port (every address found serves on it). Required unless ``record`` is
    ``SRV``, whose records carry the port."""
    interval_s: float = Field(30.0, gt=0)
    """The longest wait between lookups, whatever the TTL."""
    min_interval_s: float = Field(1.0, gt=0)
    """The shortest wait between lookups (a TTL of 0 does not mean a busy loop)."""
    nameservers: list[str] = Field(default_factory=list)
    """Servers to ask (``10.96.0.10``, ``127.0.0.1:5353``, ``[::1]:53``); empty: those of
    ``/etc/resolv.conf``."""
    timeout_s: float = Field(2.0, gt=0)
    """How long one lookup may take, retries across the servers included."""

    @field_validator("nameservers")
    @classmethod
    def _servers(cls, servers: list[str]) -> list[str]:
        for s in servers:
            try:
                parse_nameserver(s)
            except ValueError:
                raise ValueError(f"{s!r} is not an address or address:port") from None
        return servers

    @model_validator(mode="after")
    def _port(self) -> DnsOptions:
        if self.record != "SRV" and self.port is None:
            raise ValueError(f"port is required: {self.record} records carry no port (SRV records do)")
        if self.min_interval_s > self.interval_s:
            raise ValueError("min_interval_s must be at most interval_s")
        return self


class DnsDiscovery:
    """Targets from DNS records, looked up again as their TTL runs out."""

    def __init__(self, options: DnsOptions) -> None:
        self.options = options
        self._dns: Any = None

    def _resolver(self) -> Any:
        if self._dns is None:
            require("dns.asyncresolver", "dns", "discovery: dns")
            import dns.asyncresolver
            import dns.nameserver
            import dns.resolver

            o = self.options
            resolver = dns.asyncresolver.Resolver(configure=not o.nameservers)
            if o.nameservers:
                resolver.nameservers = [
                    dns.nameserver.Do53Nameserver(*parse_nameserver(s)) for s in o.nameservers
                ]
            resolver.lifetime = o.timeout_s
            resolver.timeout = o.timeout_s
            resolver.cache = None  # the TTL is honoured here, by when the next lookup runs
            self._dns = (resolver, dns.resolver)
        return self._dns

    async def _addresses(self, name: str, kinds: Sequence[str]) -> tuple[list[str], float | None]:
        resolver, errors = self._resolver()
        found: list[str] = []
        ttl: float | None = None
        for kind in kinds:
            try:
                answer = await resolver.resolve(name, kind, search=False)
            except (errors.NXDOMAIN, errors.NoAnswer):
                continue  # none of this kind: an answer, not a failure
            found.extend(r.address for r in answer)
            ttl = answer.rrset.ttl if ttl is None else min(ttl, answer.rrset.ttl)
        return found, ttl

    async def lookup(self) -> tuple[list[Target], float | None]:
        """The targets now, and the shortest TTL of the records that gave them."""
        o = self.options
        if o.record != "SRV":
            kinds = ("A", "AAAA") if o.record == "any" else (o.record,)
            addresses, ttl = await self._addresses(o.name, kinds)
            assert o.port is not None
            return [Target(f"{a}-{o.port}", a, o.port) for a in sorted(set(addresses))], ttl
        resolver, errors = self._resolver()
        try:
            answer = await resolver.resolve(o.name, "SRV", search=False)
        except (errors.NXDOMAIN, errors.NoAnswer):
            return [], None
        ttl: float | None = answer.rrset.ttl
        targets: dict[str, Target] = {}
        for record in sorted(answer, key=lambda r: (r.priority, -r.weight)):
            host = record.target.to_text(omit_final_dot=True)
            addresses, host_ttl = await self._addresses(host, ("A", "AAAA"))
            if host_ttl is not None:
                ttl = host_ttl if ttl is None else min(ttl, host_ttl)
            for a in addresses:
                key = f"{a}-{record.port}"
                targets.setdefault(key, Target(key, a, int(record.port), labels={"hostname": host}))
        return sorted(targets.values(), key=lambda t: t.key), ttl

    async def watch(self) -> AsyncIterator[Sequence[Target]]:
        o = self.options
        last: list[Target] | None = None
        while True:
            targets, ttl = await self.lookup()
            if targets != last:
                yield targets
                last = targets
            wait = o.interval_s if ttl is None else min(o.interval_s, max(o.min_interval_s, float(ttl)))
            await asyncio.sleep(wait)


def _dns(options: DnsOptions) -> Discovery:
    return DnsDiscovery(options)


@hookimpl
def register_discovery(register: RegisterDiscovery) -> None:
    register(
        "dns",
        _dns,
        options=DnsOptions,
        description="engines from DNS: A/AAAA or SRV records (a headless Service), TTL-aware",
    )
