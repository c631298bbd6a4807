"""The memory store's compiled path (:class:`MemoryBinding`, which the gateway uses for every
limited request on an in-process store) against its general one (``acquire_now`` and
``settle_now``): the same random stream of requests, refunds, overruns and clock moves goes
to two stores, one through each, and after every step the answers, the headers' figures
and the stores' whole state must be equal, bit for bit. Each binding test runs twice: with
the generated functions (a pure-Python install's) and with the loops of
``loop_binding`` (a compiled install's; ``tests/test_compiled_build.py`` runs this file
on a compiled build too)."""

from __future__ import annotations

import random

import pytest

from shuniu.core.contracts import Decision, Lease, Rate
from shuniu.core.tenancy.binding import Binding
from shuniu.plugins.ratelimit import loop_binding
from shuniu.plugins.ratelimit.memory import MemoryBinding, MemoryRateLimitOptions, MemoryRateLimitStore

MINUTE = 60.0

BOTH = pytest.mark.parametrize("loops", [False, True], ids=["generated", "loops"])
"""Run a test with each of a binding's two implementations."""


def bound(
    store: MemoryRateLimitStore, requests: list[Rate], tokens: list[Rate], leases: list[Lease], loops: bool
) -> MemoryBinding:
    binding = store.bind(requests, tokens, leases)
    if loops:
        binding.use_loops()
    return binding


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def tightest(decision: Decision, start: int, end: int) -> tuple[int, int, float]:
    """What the headers show for rates ``start`` to ``end`` of a general decision: the
    index (from ``start``) of the one with the fewest units left, those units, its reset."""
    if start == end:
        return -1, 0, 0.0
    best = min(range(start, end), key=lambda i: (decision.remaining[i], i))
    return best - start, int(decision.remaining[best]), decision.reset_s[best]


def plans(rng: random.Random) -> tuple[list[Rate], list[Rate], list[Lease]]:
    """A key scope and a tenant scope, each with some of RPM, RPD, TPM and concurrency,
    small enough that the stream runs into every one of them."""
    requests: list[Rate] = []
    tokens: list[Rate] = []
    leases: list[Lease] = []
    for scope in ("k:t:key", "t:t"):
        if rng.random() < 0.8:
            requests.append(Rate(f"{scope}:rpm", rng.choice([3, 7, 20, 1e7]), MINUTE, 1.0))
        if rng.random() < 0.3:
            requests.append(Rate(f"{scope}:rpd", rng.choice([10, 50]), 86400.0, 1.0))
        if rng.random() < 0.8:
            tokens.append(Rate(f"{scope}:tpm", rng.choice([100, 900, 1e10]), MINUTE, 1.0))
        if rng.random() < 0.6:
            leases.append(Lease(f"{scope}:conc", rng.choice([1, 2, 5])))
    return requests, tokens, leases


@BOTH
@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_a_binding_books_exactly_what_acquire_now_books(seed: int, scale: float, loops: bool) -> None:
    rng = random.Random(seed)
    requests, tokens, leases = plans(rng)
    clocks = Clock(), Clock()
    # max_keys small enough that some seeds sweep (and evict) while the stream runs.
    options = MemoryRateLimitOptions(max_keys=rng.choice([4, 1_000_000]))
    bound_store, plain = (MemoryRateLimitStore(options, clock=c, scale=scale) for c in clocks)
    binding = bound(bound_store, requests, tokens, leases, loops)
    held: list[tuple[int, float]] = []  # (token, cost) of requests not yet settled
    refused = booked = 0
    for step in range(300):
        move = rng.random()
        if move < 0.5:
            cost = float(rng.choice([0, 1, 30, 200, 2000]))
            taken = binding.take(cost, step)
            rated = [*requests, *(Rate(r.key, r.limit, r.period_s, cost) for r in tokens)]
            decision = plain.acquire_now(rated, leases, str(step))
            assert (taken is not None) == decision.allowed, step
            if taken is None:
                refused += 1
                continue
            n = len(requests)
            expected = (*tightest(decision, 0, n), *tightest(decision, n, len(rated)))
            assert taken == expected, step
            held.append((step, cost))
            booked += 1
        elif move < 0.8 and held:
            token, cost = held.pop(rng.randrange(len(held)))
            used = cost + rng.choice([-cost, -1.0, 0.0, 5.0, 500.0])
            binding.give_back(used - cost, token)
            adjust = [(Rate(r.key, r.limit, r.period_s, cost), used - cost) for r in tokens]
            plain.settle_now(adjust if used != cost else [], leases, str(token))
        else:
            moved = rng.choice([0.001, 0.5, 7.0, 61.0])
            for clock in clocks:
                clock.now += moved
        assert bound_store._tats == plain._tats, step
        assert {k: sorted(v.values()) for k, v in bound_store._leases.items()} == {
            k: sorted(v.values()) for k, v in plain._leases.items()
        }, step
    # The stream did run into the limits, and was not all refused.
    assert refused > 0 and booked > 0


@BOTH
def test_a_limit_that_refuses_everything_refuses_in_the_binding_too(loops: bool) -> None:
    store = MemoryRateLimitStore(clock=Clock(), scale=0.1)
    # 5 requests a minute scaled by 0.1 is half a request: never one.
    assert bound(store, [Rate("k:a:rpm", 5, MINUTE, 1.0)], [], [], loops).take(1.0, 1) is None
    assert not store.acquire_now([Rate("k:a:rpm", 5, MINUTE, 1.0)], [], "1").allowed
    assert bound(store, [], [Rate("k:a:tpm", 0, MINUTE, 1.0)], [], loops).take(0.0, 2) is None
    assert len(store) == 0
    unscaled = MemoryRateLimitStore(clock=Clock())
    assert bound(unscaled, [], [], [Lease("k:a:conc", 0)], loops).take(0.0, 3) is None
    assert not unscaled.acquire_now([], [Lease("k:a:conc", 0)], "3").allowed
    assert not unscaled._leases


@BOTH
def test_released_concurrency_keys_stay_bounded_without_any_rate(loops: bool) -> None:
    # A released lease leaves its key's holders dict behind, emptied, for reuse. With
    # concurrency limits only, no rate key ever grows the store to a sweep: the holders
    # dicts must trigger it themselves, or one per principal ever seen would pile up.
    store = MemoryRateLimitStore(MemoryRateLimitOptions(max_keys=8), clock=Clock())
    plain = MemoryRateLimitStore(MemoryRateLimitOptions(max_keys=8), clock=Clock())
    for i in range(100):
        lease = [Lease(f"k:t:key{i}:conc", 1)]
        binding = bound(store, [], [], lease, loops)
        assert binding.take(0.0, i) is not None
        assert store._leases[f"k:t:key{i}:conc"] == {i: store.clock() + lease[0].ttl_s}
        binding.give_back(0.0, i)
        assert plain.acquire_now([], lease, str(i)).allowed
        plain.settle_now([], lease, str(i))
        assert len(store._leases) <= 8 and len(plain._leases) <= 8, i
    # The principal's next request reuses its emptied dict.
    again = bound(store, [], [], [Lease("k:t:key99:conc", 1)], loops)
    kept = store._leases["k:t:key99:conc"]
    assert again.take(0.0, 100) is not None and store._leases["k:t:key99:conc"] is kept


def test_the_loops_are_a_core_binding_and_the_generated_functions_are_not() -> None:
    # The compiled tenancy calls a binding's ``native`` Binding directly, and settles an
    # admission booked there on it; the generated functions are called the usual way.
    store = MemoryRateLimitStore(clock=Clock())
    binding = store.bind([Rate("k:a:rpm", 5, MINUTE, 1.0)], [], [Lease("k:a:conc", 1)])
    assert (binding.native is None) == (not loop_binding.COMPILED)  # compiled: loops already
    binding.use_loops()
    assert isinstance(binding.native, Binding) and binding.take == binding.native.take


def test_a_binding_refuses_rates_that_share_a_key() -> None:
    store = MemoryRateLimitStore(clock=Clock())
    with pytest.raises(ValueError, match="distinct keys"):
        store.bind([Rate("k:a:rpm", 5, MINUTE, 1.0)], [Rate("k:a:rpm", 5, MINUTE, 1.0)], [])


@BOTH
def test_remaining_never_shows_more_than_the_limit(loops: bool) -> None:
    """The tolerance that lets a request through a rounding error would show a huge limit's
    full key as more than its limit (1e-6 s of a 1e10-per-minute rate is 166 tokens)."""
    rate = Rate("k:a:tpm", 1e10, MINUTE, 1.0)
    store = MemoryRateLimitStore(clock=Clock())
    assert bound(store, [], [rate], [], loops).take(0.0, 1) == (-1, 0, 0.0, 0, 10_000_000_000, 0.0)
    assert store.acquire_now([Rate(rate.key, rate.limit, MINUTE, 0.0)], [], "1").remaining == (1e10,)


async def test_an_admission_booked_by_a_binding_settles_there_whichever_call_settles_it() -> None:
    """The gateway books through the binding and settles with ``settle_now``; a caller that
    settles with the coroutine must give back the same reservation and lease."""
    from shuniu.core.config.loader import load_deployment
    from shuniu.core.gateway import Gateway
    from shuniu.core.plugin_manager import load_plugins
    from shuniu.core.types import InferenceRequest, Principal

    plugins = load_plugins()
    text = """
tiers:
  t: {key_limits: {concurrency: 1, tpm: 100}}
rate_limits: {store: memory}
models:
  m:
    endpoints: [{kind: sim, options: {hardware: cpu-tiny, model: tiny-llama}}]
"""
    gateway = Gateway(load_deployment(None, plugins, text=text), plugins)
    tenancy = gateway.state.tenancy
    principal = Principal(tenant="a", key_id="k", tier="t")
    tier = tenancy.tiers["t"]

    def request(max_tokens: int) -> InferenceRequest:
        return InferenceRequest(
            id="r", api="chat", model="m", body={}, prompt="hi", prompt_tokens=2, max_tokens=max_tokens,
            principal=principal,
        )  # fmt: skip

    first = tenancy.acquire_now(request(40), tier)  # reserves 42 of the 100
    assert first is not None and first.binding is not None
    with pytest.raises(Exception, match="concurrent"):
        tenancy.acquire_now(request(1), tier)  # the one lease is held
    await tenancy.settle(first, 2)  # it used 2: 40 come back, and the lease
    second = tenancy.acquire_now(request(88), tier)  # 90 more: fits only after the refund
    assert second is not None
    tenancy.settle_now(second, 90)
