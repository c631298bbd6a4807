"""The response cache's parts: keys, what is cacheable, single-flight, replay, and the
memory and Redis stores (the latter against a real redis-server)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from shuniu.core.api.openai import parse_request
from shuniu.core.config import CacheConfig
from shuniu.core.pipeline.response_cache import CachedAnswer, Filler, ResponseCache
from shuniu.core.types import Chunk, Completion, InferenceRequest, Principal, Usage
from shuniu.plugins.cache.memory import MemoryCache, MemoryCacheOptions
from shuniu.plugins.cache.redis_store import RedisCache, RedisCacheOptions


def _req(body: dict, tenant: str = "t", headers: tuple = (), api: str = "chat") -> InferenceRequest:  # type: ignore[type-arg]
    req = parse_request(json.dumps(body).encode(), api, "rid", 0.0)  # type: ignore[arg-type]
    req.principal = Principal(tenant=tenant)
    req.headers = headers
    return req


BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "temperature": 0, "max_tokens": 5}


def _cache(store: object | None = None) -> ResponseCache:
    return ResponseCache(CacheConfig(), store or MemoryCache())  # type: ignore[arg-type]


def test_key_covers_tenant_model_version_kb_and_the_whole_body() -> None:
    cache = _cache()
    base = cache.key(_req(BODY), "m", "v1")
    assert base == cache.key(_req(BODY), "m", "v1")
    # Streaming and the alias the client used do not matter.
    assert base == cache.key(_req({**BODY, "stream": True, "model": "alias"}), "m", "v1")
    different = [
        cache.key(_req(BODY, tenant="u"), "m", "v1"),
        cache.key(_req(BODY), "other", "v1"),
        cache.key(_req(BODY), "m", "v2"),
        cache.key(_req(BODY, headers=((b"x-shuniu-kb-version", b"7"),)), "m", "v1"),
        cache.key(_req({**BODY, "max_tokens": 6}), "m", "v1"),
        cache.key(_req({**BODY, "top_p": 0.5}), "m", "v1"),
        cache.key(_req({**BODY, "tools": [{"type": "function", "function": {"name": "f"}}]}), "m", "v1"),
        cache.key(
            _req({**BODY, "messages": [{"role": "system", "content": "s"}, *BODY["messages"]]}), "m", "v1"
        ),
        cache.key(
            _req({"model": "m", "prompt": "hello", "temperature": 0, "max_tokens": 5}, api="completions"),
            "m",
            "v1",
        ),
    ]
    assert base not in different and len(set(different)) == len(different)
    # Key order in the body does not matter.
    reordered = dict(reversed(list(BODY.items())))
    assert cache.key(_req(reordered), "m", "v1") == base


def test_only_deterministic_requests_are_cacheable() -> None:
    c = ResponseCache.cacheable
    assert c(_req(BODY), False)
    assert c(_req({**BODY, "temperature": 0.0}), False)
    assert not c(_req({**BODY, "temperature": 0.7}), False)
    no_temp = {k: v for k, v in BODY.items() if k != "temperature"}
    assert not c(_req(no_temp), False)
    assert c(_req({**no_temp, "seed": 3}), False)
    assert c(_req(no_temp), True)  # the tier opts in


def test_cache_control_header() -> None:
    assert ResponseCache.control(_req(BODY)) == ""
    assert ResponseCache.control(_req(BODY, headers=((b"cache-control", b"No-Cache"),))) == "no-cache"
    assert (
        ResponseCache.control(_req(BODY, headers=((b"cache-control", b"no-store, no-cache"),))) == "no-store"
    )


def _filled(text_pieces: list[str]) -> Filler:
    f = Filler()
    for piece in text_pieces:
        f.chunk(Chunk(text=piece, tokens=1))
    f.chunk(Chunk(finish_reason="length", usage=Usage(3, len(text_pieces), 3 + len(text_pieces))))
    return f


def test_single_flight_in_process_and_replay() -> None:
    async def run() -> None:
        cache = _cache()
        req = _req(BODY)
        key = cache.key(req, "m", "v1")
        answer, fills = await cache.lookup(key)
        assert answer is None and fills
        # Three more arrive while the first fills: they wait, and get its answer.
        waiters = [asyncio.create_task(cache.lookup(key)) for _ in range(3)]
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiters)
        await cache.fill(key, req, _filled(["a", "b", "c"]))
        results = await asyncio.gather(*waiters)
        assert all(a is not None and a.pieces == ["a", "b", "c"] and not f for a, f in results)
        assert cache.coalesced == 3 and cache.misses == 1
        hit, fills = await cache.lookup(key)
        assert hit is not None and not fills and cache.hits == 1

        sse = ResponseCache.as_sse(
            _req({**BODY, "stream": True, "stream_options": {"include_usage": True}}), hit
        )
        events = [e for e in sse.decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
        assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert [p["choices"][0]["delta"].get("content") for p in payloads[1:4]] == ["a", "b", "c"]
        assert payloads[4]["choices"][0]["finish_reason"] == "length"
        assert payloads[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
        body = json.loads(ResponseCache.as_json(req, hit))
        assert body["choices"][0]["message"]["content"] == "abc" and body["usage"]["total_tokens"] == 6

    asyncio.run(run())


def test_a_failed_fill_releases_the_waiters_to_ask_themselves() -> None:
    async def run() -> None:
        cache = _cache()
        key = cache.key(_req(BODY), "m", "v1")
        _, fills = await cache.lookup(key)
        assert fills
        waiter = asyncio.create_task(cache.lookup(key))
        await asyncio.sleep(0)
        await cache.abandon(key)
        answer, fills_too = await waiter
        assert answer is None and not fills_too
        assert await cache.store.get(key) is None
        # The next one fills again.
        assert (await cache.lookup(key))[1]

    asyncio.run(run())


def test_uncacheable_fills_are_not_stored() -> None:
    async def run() -> None:
        cache = ResponseCache(CacheConfig(max_entry_bytes=1024), MemoryCache())
        req = _req(BODY)
        for filler, name in ((_filled(["x" * 5000]), "too big"), (Filler(), "no usage")):
            key = cache.key(req, name, "v1")
            await cache.lookup(key)
            await cache.fill(key, req, filler)
            assert await cache.store.get(key) is None, name
        tool = _filled(["a"])
        tool.chunk(Chunk(extra={"tool_calls": [{"index": 0}]}))
        key = cache.key(req, "tool", "v1")
        await cache.lookup(key)
        await cache.fill(key, req, tool)
        assert await cache.store.get(key) is None
        # A non-streamed answer with tool calls is stored whole, extras included.
        f = Filler()
        f.completion(Completion("", "tool_calls", Usage(1, 2, 3), {"tool_calls": [{"id": "x"}]}))
        key = cache.key(req, "tool2", "v1")
        await cache.lookup(key)
        await cache.fill(key, req, f)
        hit, _ = await cache.lookup(key)
        assert hit is not None and hit.extra == {"tool_calls": [{"id": "x"}]}

    asyncio.run(run())


def test_memory_store_is_an_lru_bounded_by_entries_bytes_and_ttl() -> None:
    async def run() -> None:
        now = [0.0]
        store = MemoryCache(MemoryCacheOptions(max_entries=3, max_bytes=2048), clock=lambda: now[0])
        for i in range(3):
            await store.put(f"k{i}", b"x" * 100, ttl_s=10)
        assert await store.get("k0") == b"x" * 100  # k0 is now the most recent
        await store.put("k3", b"y" * 100, ttl_s=10)
        assert await store.get("k1") is None and len(store) == 3
        await store.put("big", b"z" * 1900, ttl_s=10)  # forces out by bytes
        assert store.bytes <= 2048 and await store.get("big") is not None
        await store.put("huge", b"z" * 4096, ttl_s=10)  # larger than the whole cache: ignored
        assert await store.get("huge") is None
        now[0] = 11.0
        assert await store.get("big") is None and store.bytes < 2048
        assert await store.lock("k", 1) is True

    asyncio.run(run())


def test_entries_from_elsewhere_are_misses_not_errors() -> None:
    async def run() -> None:
        store = MemoryCache()
        cache = _cache(store)
        key = cache.key(_req(BODY), "m", "v1")
        await store.put(key, b"not msgpack of a CachedAnswer", 10)
        answer, fills = await cache.lookup(key)
        assert answer is None and fills

    asyncio.run(run())


CLIENTS = pytest.mark.parametrize("client", ["shuniu", "redis-py"])
"""The Redis store's two clients: the lean pipelined one (the default) and redis-py."""


@CLIENTS
def test_redis_store_shares_entries_and_fill_locks(redis_url: str, client: str) -> None:
    async def run() -> None:
        a = RedisCache(RedisCacheOptions(url=redis_url, client=client))
        b = RedisCache(RedisCacheOptions(url=redis_url, client=client))
        try:
            assert await a.get("k") is None
            await a.put("k", b"v", 5)
            assert await b.get("k") == b"v"
            assert await a.lock("k", 5) is True
            assert await b.lock("k", 5) is False
            await b.unlock("k")  # not b's lock: it stays
            assert await b.lock("k", 5) is False
            await a.unlock("k")
            assert await b.lock("k", 5) is True
        finally:
            await a.close()
            await b.close()

    asyncio.run(run())


@CLIENTS
def test_two_processes_worth_of_caches_fill_once_through_redis(redis_url: str, client: str) -> None:
    async def run() -> None:
        caches = [
            ResponseCache(CacheConfig(), RedisCache(RedisCacheOptions(url=redis_url, client=client)))
            for _ in range(2)
        ]
        req = _req(BODY)
        key = caches[0].key(req, "m", "v1")
        first = await caches[0].lookup(key)
        assert first == (None, True)
        polls = 0
        get = caches[1].store.get

        async def counted_get(k: str) -> bytes | None:
            nonlocal polls
            polls += 1
            return await get(k)

        caches[1].store.get = counted_get  # type: ignore[method-assign]
        other = asyncio.create_task(caches[1].lookup(key))  # another "process": polls Redis
        while polls < 3:  # it has looked, found no answer and the lock held, and looked again
            assert not other.done()
            await asyncio.sleep(0.005)
        assert not other.done()
        await caches[0].fill(key, req, _filled(["p", "q"]))
        answer, fills = await asyncio.wait_for(other, 5)
        assert answer is not None and answer.pieces == ["p", "q"] and not fills
        for c in caches:
            await c.store.close()

    asyncio.run(run())


@CLIENTS
def test_redis_store_outage_is_a_miss_logged_once(redis_server_factory, caplog, client) -> None:  # type: ignore[no-untyped-def]
    server = redis_server_factory(password="s3cret")
    caplog.set_level(logging.WARNING, logger="shuniu.cache.redis")

    async def run() -> None:
        # A stopped server refuses at once: the timeout only has to spare the calls that work.
        options = RedisCacheOptions(url=server.url, timeout_s=2.0, retry_after_s=0.05, client=client)
        store = RedisCache(options)
        try:
            await store.put("k", b"v", 60)
            assert await store.get("k") == b"v"
            server.stop()
            for _ in range(5):
                assert await store.get("k") is None
                await store.put("k", b"w", 60)
                assert await store.lock("k", 1) is True  # each gateway fills on its own
                await asyncio.sleep(0.06)
            server.start()
            for _ in range(50):
                if await store.get("k") is None and not store.down:
                    break
                await asyncio.sleep(0.06)
            assert not store.down
        finally:
            await store.close()

    asyncio.run(run())
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("unreachable" in m for m in warnings) == 1
    assert sum("reachable again" in m for m in warnings) == 1
    assert all("s3cret" not in m for m in warnings)


def test_cached_answer_round_trips() -> None:
    import msgspec

    a = CachedAnswer("chat", ["x"], "stop", 1, 2, None, 5.0)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(a), type=CachedAnswer) == a


@pytest.mark.parametrize("n", [2, 3])
def test_n_above_one_is_not_cacheable(n: int) -> None:
    req = _req(BODY)
    req.body["n"] = n
    assert not ResponseCache.cacheable(req, True)


def test_a_waiter_that_gets_the_lock_just_after_the_fill_takes_the_stored_answer() -> None:
    """Two processes' caches on one store. The second looks (nothing yet), and before it
    tries the lock again the first stores its answer and unlocks: the lock is free, but the
    answer is there, so the second must take it rather than ask the engine (and fill) again."""

    class SharedStore(MemoryCache):
        """The memory store with the fill lock a shared store (Redis) has."""

        def __init__(self) -> None:
            super().__init__()
            self.locked: set[str] = set()

        async def lock(self, key: str, ttl_s: float) -> bool:
            if key in self.locked:
                return False
            self.locked.add(key)
            return True

        async def unlock(self, key: str) -> None:
            self.locked.discard(key)

    async def run() -> None:
        store = SharedStore()
        first, second = (ResponseCache(CacheConfig(), store) for _ in range(2))
        req = _req(BODY)
        key = first.key(req, "m", "v1")
        assert await first.lookup(key) == (None, True)
        get = store.get
        looks = 0

        async def get_then_fill(k: str) -> bytes | None:
            nonlocal looks
            looks += 1
            value = await get(k)
            if looks == 2:  # the second process's first look after waiting: it saw nothing...
                await first.fill(key, req, _filled(["p", "q"]))  # ...and now the fill lands
            return value

        store.get = get_then_fill  # type: ignore[method-assign]
        answer, fills = await asyncio.wait_for(second.lookup(key), 5)
        assert answer is not None and answer.pieces == ["p", "q"] and not fills
        assert not store.locked  # the second released the lock it took

    asyncio.run(run())
