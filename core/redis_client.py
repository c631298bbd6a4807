"""Redis in the three shapes fleets run it, behind one URL: a single server, a primary that
Sentinel watches and replaces when it fails, or a Redis Cluster.

- ``redis://[[user]:password@]host:port/db`` (``rediss://`` for TLS, ``unix:///path``): one
  server, as redis-py reads such URLs.
- ``redis+sentinel://[[user]:password@]host:port[,host:port…]/service[/db]``: the
  Sentinels (default port 26379) that watch ``service``; every connection goes to the
  primary they name, and after a failover to the new one. The userinfo is the data nodes'
  credential; ``?sentinel_password=…`` (and ``sentinel_username``) is the Sentinels' own,
  when they require one. ``rediss+sentinel://`` for TLS to the data nodes.
- ``redis+cluster://[[user]:password@]host:port[,host:port…]``: any nodes of a Redis
  Cluster (default port 6379; the rest are discovered), database 0 only.
  ``rediss+cluster://`` for TLS.

Every shared store (rate limits, the response cache and its fill locks, the fleet's
routing state) connects through :func:`connect_redis`, so each works against all three.
In a Cluster, a Lua script's keys must share a hash slot: the rate-limit store puts a hash
tag in its key prefix for that (:func:`hash_tagged`).

Clients never retry inside redis-py: the stores have their own back-off, and a retry
doubles what a dead server costs each request. A Cluster client still follows ``MOVED``
redirections and re-reads the slot map after a connection error, and a Sentinel client
asks the Sentinels for the primary's address on each new connection — which is how both
find the new primary after a failover.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from shuniu.core.extras import require

__all__ = [
    "RedisConnection",
    "RedisTarget",
    "check_redis_url",
    "connect_redis",
    "hash_tagged",
    "parse_redis_url",
]

Shape = Literal["server", "sentinel", "cluster"]

_SCHEMES: dict[str, tuple[Shape, bool]] = {
    "redis": ("server", False),
    "rediss": ("server", True),
    "unix": ("server", False),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
}
_QUERY: dict[Shape, frozenset[str]] = {
    "sentinel": frozenset({"sentinel_password", "sentinel_username", "ssl_cert_reqs", "ssl_ca_certs"}),
    "cluster": frozenset({"ssl_cert_reqs", "ssl_ca_certs"}),
}
_DEFAULT_PORT: dict[Shape, int] = {"server": 6379, "sentinel": 26379, "cluster": 6379}


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """What a Redis URL names."""

    shape: Shape
    """``server``, ``sentinel`` or ``cluster``."""
    url: str
    """The URL as given (a ``server`` URL is handed to redis-py as it is)."""
    nodes: tuple[tuple[str, int], ...] = ()
    """The Sentinels, or the Cluster's seed nodes (empty for ``server``)."""
    service: str | None = None
    """The primary's name the Sentinels know (``sentinel`` only)."""
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    options: tuple[tuple[str, str], ...] = ()
    """The query's options, checked against the ones the shape takes."""

    def option(self, name: str) -> str | None:
        for key, value in self.options:
            if key == name:
                return value
        return None


def _host_port(item: str, default: int) -> tuple[str, int]:
    item = item.strip()
    if not item:
        raise ValueError("an empty host in the host list")
    if item.startswith("["):  # [IPv6]:port
        host, _, rest = item[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"cannot read host {item!r}")
    else:
        host, _, port_text = item.rpartition(":") if ":" in item else (item, "", "")
    if not port_text:
        return host, default
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"port {port_text!r} of {host!r} is not a port number")
    return host, int(port_text)


def parse_redis_url(url: str) -> RedisTarget:
    """What ``url`` names; ``ValueError`` saying what is wrong with it (never its password)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        known = ", ".join(f"{s}://" for s in _SCHEMES)
        raise ValueError(f"expected one of {known}; got {scheme + sep if sep else 'no scheme'}")
    shape, tls = _SCHEMES[scheme.lower()]
    if shape == "server":
        return RedisTarget("server", url, tls=tls)
    parts = urlsplit("x://" + rest)  # a list of hosts is no netloc urlsplit would validate
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    nodes = tuple(_host_port(h, _DEFAULT_PORT[shape]) for h in hosts.split(","))
    if not nodes or not nodes[0][0]:
        raise ValueError(f"a {scheme}:// URL needs at least one host:port")
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - _QUERY[shape])
    if unknown:
        raise ValueError(
            f"{scheme}:// URLs take the options {', '.join(sorted(_QUERY[shape]))}; not {', '.join(unknown)}"
        )
    options = tuple((k, v[-1]) for k, v in sorted(query.items()))
    path = [p for p in parts.path.split("/") if p]
    db = 0
    service = None
    if shape == "sentinel":
        if not path:
            raise ValueError(f"a {scheme}:// URL names the primary's service after the hosts: …/SERVICE[/DB]")
        service = unquote(path[0])
        if len(path) > 2:
            raise ValueError(f"a {scheme}:// URL's path is /SERVICE[/DB], not {len(path)} parts")
        if len(path) == 2:
            if not path[1].isdigit():
                raise ValueError(f"database {path[1]!r} is not a number")
            db = int(path[1])
    elif path and path != ["0"]:
        raise ValueError("a Redis Cluster has database 0 only; drop the path")
    return RedisTarget(shape, url, nodes, service, db, username, password, tls, options)


def check_redis_url(url: str) -> str:
    """A validator's check: ``url`` unchanged, or ``ValueError`` naming the problem."""
    parse_redis_url(url)
    return url


def hash_tagged(prefix: str) -> str:
    """``prefix`` with a Cluster hash tag, so that every key under it lands in one slot (a
    Lua script's keys must): unchanged when it has one, else ``{shuniu:rl}:`` for
    ``shuniu:rl:``."""
    start = prefix.find("{")
    if start >= 0 and prefix.find("}", start + 2) > start:
        return prefix
    core = prefix.rstrip(":")
    return "{" + (core or "shuniu") + "}" + prefix[len(core) :]


class RedisConnection:
    """A redis-py asyncio client for one URL (``client``: a ``Redis`` or a
    ``RedisCluster``, both with the commands, pipelines and scripts the stores use), and
    what else it opened (the Sentinels' own connections), closed together."""

    __slots__ = ("_extra", "client", "target")

    def __init__(self, target: RedisTarget, client: Any, extra: tuple[Any, ...] = ()) -> None:
        self.target = target
        self.client = client
        self._extra = extra

    @property
    def shape(self) -> Shape:
        return self.target.shape

    async def close(self) -> None:
        await self.client.aclose()
        for other in self._extra:
            await other.aclose()


def connect_redis(
    url: str,
    *,
    timeout_s: float,
    max_connections: int,
    blocking: bool = False,
    what: str = "a Redis store",
    **extra: Any,
) -> RedisConnection:
    """A client for ``url`` with ``timeout_s`` to connect and for each reply, and at most
    ``max_connections`` connections (per node, for a Cluster). ``blocking``: a caller
    beyond them waits for a free connection for up to ``timeout_s`` (one server; the
    Sentinel and Cluster pools refuse instead, so a caller that can burst bounds its own
    calls). ``extra``: more connection keywords (e.g. ``driver_info``). No connection is
    opened before the first command."""
    target = parse_redis_url(url)
    aioredis = require("redis.asyncio", "redis", what)
    from redis.asyncio.retry import Retry  # the asyncio one: redis-py 7 warns about the sync one
    from redis.backoff import NoBackoff

    common: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
        **extra,
    }
    if target.shape == "server":
        if blocking:
            pool = aioredis.BlockingConnectionPool.from_url(
                url, max_connections=max_connections, timeout=timeout_s, **common
            )
            return RedisConnection(target, aioredis.Redis.from_pool(pool))
        client = aioredis.Redis.from_url(url, max_connections=max_connections, **common)
        return RedisConnection(target, client)
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.tls:
        auth["ssl"] = True
        for name in ("ssl_cert_reqs", "ssl_ca_certs"):
            if (value := target.option(name)) is not None:
                auth[name] = value
    if target.shape == "sentinel":
        from redis.asyncio.sentinel import Sentinel

        sentinel = Sentinel(
            list(target.nodes),
            sentinel_kwargs={
                "socket_timeout": timeout_s,
                "socket_connect_timeout": timeout_s,
                "username": target.option("sentinel_username"),
                "password": target.option("sentinel_password"),
            },
        )
        assert target.service is not None
        client = sentinel.master_for(
            target.service, db=target.db, max_connections=max_connections, **auth, **common
        )
        return RedisConnection(target, client, tuple(sentinel.sentinels))
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
        max_connections=max_connections,
        **auth,
        **common,
    )
    return RedisConnection(target, client)
