"""The built-in balancers (weighted_round_robin, random, least_requests, power_of_two,
session_affinity) and the locality filter, called directly on endpoint lists."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from shuniu.core.contracts import Balancer, Filter
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.pools.pool import EndpointState
from shuniu.core.types import InferenceRequest
from shuniu.plugins.balancers.least_requests import LeastRequests
from shuniu.plugins.balancers.power_of_two import PowerOfTwo, PowerOfTwoOptions
from shuniu.plugins.balancers.random_pick import RandomOptions, RandomPick
from shuniu.plugins.balancers.session_affinity import SessionAffinity, SessionAffinityOptions
from shuniu.plugins.balancers.weighted_round_robin import WeightedRoundRobin
from shuniu.plugins.filters.locality import Locality, LocalityOptions


def _eps(n: int, *, weights: Sequence[float] | None = None, prefix: str = "e") -> list[EndpointState]:
    return [
        EndpointState(f"{prefix}{i}", object(), weight=weights[i] if weights else 1.0, index=i)  # type: ignore[arg-type]
        for i in range(n)
    ]


def _req(body: dict[str, Any] | None = None, headers: Sequence[tuple[bytes, bytes]] = ()) -> InferenceRequest:
    return InferenceRequest(
        id="r", api="chat", model="m", body=body or {}, prompt="", prompt_tokens=1, headers=headers
    )


REQ = _req()


def _names(picks: Sequence[EndpointState | None]) -> str:
    return "".join(p.name if p is not None else "-" for p in picks)


def _all_balancers() -> list[Balancer]:
    return [
        WeightedRoundRobin(),
        RandomPick(RandomOptions(seed=1)),
        RandomPick(RandomOptions(seed=1, weighted=False)),
        LeastRequests(),
        PowerOfTwo(PowerOfTwoOptions(seed=1)),
        SessionAffinity(),
        SessionAffinity(SessionAffinityOptions(fallback="round_robin")),
    ]


# -- common contract ------------------------------------------------------------------------


@pytest.mark.parametrize("balancer", _all_balancers(), ids=lambda b: type(b).__name__)
def test_contract_any_subset(balancer: Balancer) -> None:
    """None only for an empty list; otherwise a member of whatever subset is passed."""
    assert isinstance(balancer, Balancer)
    pool = _eps(6, weights=[1, 2, 3, 1, 2, 3])
    assert balancer.pick(REQ, []) is None
    assert balancer.pick(REQ, pool[4:5]) is pool[4]
    subsets = [pool, pool[1:4], [pool[5], pool[0]], pool[::2], pool[3:], pool]
    for i in range(60):
        candidates = subsets[i % len(subsets)]
        for req in (REQ, _req({"user": f"u{i}"})):
            assert balancer.pick(req, candidates) in candidates


# -- weighted_round_robin ---------------------------------------------------------------------


def test_wrr_is_proportional_and_smooth() -> None:
    a, b, c = pool = _eps(3, weights=[5, 1, 1], prefix="")
    a.name, b.name, c.name = "a", "b", "c"
    wrr = WeightedRoundRobin()
    seq = _names([wrr.pick(REQ, pool) for _ in range(70)])
    assert seq[:7] == "aabacaa"  # nginx's smooth order: b and c interleaved, not bunched
    for cycle in range(10):
        assert Counter(seq[7 * cycle : 7 * cycle + 7]) == {"a": 5, "b": 1, "c": 1}
    assert "aaaaa" not in seq


def test_wrr_candidate_leaves_and_returns() -> None:
    pool = _eps(3, weights=[5, 1, 1])
    wrr = WeightedRoundRobin()
    for _ in range(3):  # stop mid-cycle, so the state carried over is not all zeros
        wrr.pick(REQ, pool)
    # e2 saturated: the others share its turns in their own 5:1 proportion.
    without = Counter(p.name for p in (wrr.pick(REQ, pool[:2]) for _ in range(60)))
    assert abs(without["e0"] - 50) <= 1 and abs(without["e1"] - 10) <= 1
    assert without["e2"] == 0
    # Back: it gets its turn within a cycle and its exact share from then on.
    back = [wrr.pick(REQ, pool) for _ in range(7 + 70)]
    assert "e2" in {p.name for p in back[:7] if p is not None}
    counts = Counter(p.name for p in back if p is not None)
    for name, share in (("e0", 55), ("e1", 11), ("e2", 11)):
        assert abs(counts[name] - share) <= 1, counts


def test_wrr_state_follows_the_endpoint_not_its_position() -> None:
    pool = _eps(2, weights=[3, 1])
    wrr = WeightedRoundRobin()
    # The same endpoints in alternating order: the picks must still be 3:1.
    picks = [wrr.pick(REQ, pool if i % 2 else pool[::-1]) for i in range(40)]
    assert Counter(p.name for p in picks if p is not None) == {"e0": 30, "e1": 10}


# -- random -------------------------------------------------------------------------------------


def _within_binomial(count: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def test_random_weighted_distribution() -> None:
    pool = _eps(3, weights=[1, 2, 7])
    rnd = RandomPick(RandomOptions(seed=7))
    n = 20_000
    counts = Counter(p.name for p in (rnd.pick(REQ, pool) for _ in range(n)) if p is not None)
    # 5 binomial standard deviations (~65 picks for p = 0.7): a correct draw stays inside
    # with a fixed seed, a uniform or off-by-one draw (p = 1/3) is far outside.
    for name, p in (("e0", 0.1), ("e1", 0.2), ("e2", 0.7)):
        assert _within_binomial(counts[name], n, p), counts


def test_random_unweighted_ignores_weights() -> None:
    pool = _eps(3, weights=[1, 2, 7])
    rnd = RandomPick(RandomOptions(seed=7, weighted=False))
    n = 9_000
    counts = Counter(p.name for p in (rnd.pick(REQ, pool) for _ in range(n)) if p is not None)
    for name in ("e0", "e1", "e2"):
        assert _within_binomial(counts[name], n, 1 / 3), counts


def test_random_seed_reproduces() -> None:
    pool = _eps(5, weights=[1, 2, 3, 4, 5])

    def run(seed: int) -> str:
        rnd = RandomPick(RandomOptions(seed=seed))
        return _names([rnd.pick(REQ, pool) for _ in range(50)])

    assert run(3) == run(3)
    assert run(3) != run(4)


# -- least_requests -----------------------------------------------------------------------------


def test_least_requests_picks_fewest_per_weight() -> None:
    pool = _eps(3)
    for e, n in zip(pool, (3, 1, 2), strict=True):
        e.in_flight = n
    assert LeastRequests().pick(REQ, pool) is pool[1]
    # Relative to weight: 4 in flight on weight 4 beats 2 on weight 1.
    heavy, light = _eps(2, weights=[4, 1])
    heavy.in_flight, light.in_flight = 4, 2
    assert LeastRequests().pick(REQ, [light, heavy]) is heavy
    # Idle endpoints: the request being placed counts, so the heavier one wins.
    assert LeastRequests().pick(REQ, _eps(2, weights=[1, 3])).name == "e1"  # type: ignore[union-attr]


def test_least_requests_rotates_ties() -> None:
    lr = LeastRequests()
    pool = _eps(3)
    assert _names([lr.pick(REQ, pool) for _ in range(6)]) == "e0e1e2e0e1e2"
    pool[1].in_flight = 5  # only e0 and e2 tie now: they alternate
    assert Counter(_names([lr.pick(REQ, pool) for _ in range(6)]).split("e")[1:]) == {"0": 3, "2": 3}


def test_least_requests_fills_by_weight() -> None:
    pool = _eps(2, weights=[3, 1])
    lr = LeastRequests()
    for _ in range(8):
        e = lr.pick(REQ, pool)
        assert e is not None
        e.in_flight += 1  # what the pool does on dispatch
    assert [e.in_flight for e in pool] == [6, 2]


# -- power_of_two -------------------------------------------------------------------------------


def test_power_of_two_never_picks_the_unique_worst() -> None:
    pool = _eps(3)
    pool[1].in_flight = 10
    p2c = PowerOfTwo(PowerOfTwoOptions(seed=0))
    counts = Counter(p.name for p in (p2c.pick(REQ, pool) for _ in range(1000)) if p is not None)
    assert counts["e1"] == 0
    # Any two distinct draws include an idle one; which idle one is random.
    assert counts["e0"] > 400 and counts["e2"] > 400


def test_power_of_two_with_two_takes_the_lower() -> None:
    a, b = _eps(2)
    b.in_flight = 1
    p2c = PowerOfTwo(PowerOfTwoOptions(seed=0))
    for _ in range(50):
        assert p2c.pick(REQ, [a, b]) is a
        assert p2c.pick(REQ, [b, a]) is a
    b.in_flight = 0
    b.in_flight_tokens = 4096  # load_score counts tokens too
    assert all(p2c.pick(REQ, [b, a]) is a for _ in range(50))


def test_power_of_two_seed_reproduces_and_reaches_all() -> None:
    pool = _eps(4)

    def run(seed: int) -> str:
        p2c = PowerOfTwo(PowerOfTwoOptions(seed=seed))
        return _names([p2c.pick(REQ, pool) for _ in range(60)])

    assert run(11) == run(11)
    assert run(11) != run(12)
    assert all(f"e{i}" in run(11) for i in range(4))


# -- session_affinity ---------------------------------------------------------------------------


def _owners(sa: SessionAffinity, pool: Sequence[EndpointState], n: int = 1000) -> dict[str, str]:
    out = {}
    for i in range(n):
        e = sa.pick(_req({"user": f"u{i}"}), pool)
        assert e is not None
        out[f"u{i}"] = e.name
    return out


def test_session_affinity_same_key_same_endpoint_everywhere() -> None:
    pool = _eps(8)
    first = _owners(SessionAffinity(), pool)
    assert _owners(SessionAffinity(), pool) == first  # repeated and from a second instance
    # Another gateway: its own endpoint objects, listed in another order.
    other = _eps(8)[::-1]
    assert _owners(SessionAffinity(), other) == first
    assert len(set(first.values())) == 8
    # Pinned: the hash must not depend on the process (PYTHONHASHSEED) or change between
    # releases, or gateways of a mixed fleet would disagree on where sessions live.
    assert "".join(first[f"u{i}"][1] for i in range(32)) == "33447425125502051117251135065436"


def test_session_affinity_removing_and_adding_moves_only_what_must() -> None:
    pool = _eps(8)
    sa = SessionAffinity()
    before = _owners(sa, pool)
    gone = pool[3]
    after = _owners(sa, [e for e in pool if e is not gone])
    moved = {k for k in before if before[k] != after[k]}
    assert moved == {k for k, v in before.items() if v == gone.name}
    # ~1/8 of 1000 (binomial sd ~10.5): between 4 sd either side.
    assert 80 <= len(moved) <= 170
    # The spilled sessions spread over all the others, not onto one neighbour.
    assert len({after[k] for k in moved}) == 7
    assert _owners(sa, pool) == before  # back: every session returns
    # A ninth endpoint takes only sessions it now wins, about 1/9 of them.
    grown = [*pool, EndpointState("e8", object(), index=8)]  # type: ignore[arg-type]
    with_new = _owners(sa, grown)
    changed = {k for k in before if before[k] != with_new[k]}
    assert all(with_new[k] == "e8" for k in changed)
    assert 70 <= len(changed) <= 155


def test_session_affinity_respects_weights() -> None:
    pool = _eps(2, weights=[3, 1])
    counts = Counter(_owners(SessionAffinity(), pool, n=2000).values())
    assert _within_binomial(counts["e0"], 2000, 0.75), counts


def test_session_affinity_header_wins_and_is_case_insensitive() -> None:
    sa = SessionAffinity(SessionAffinityOptions(header="X-Session-ID"))
    pool = _eps(8)
    # ASGI header names arrive lower-cased; the option's casing must not matter.
    by_header = {sa.pick(_req({"user": f"u{i}"}, [(b"x-session-id", b"s1")]), pool) for i in range(20)}
    assert len(by_header) == 1
    # Without the header the body key applies again, and equals the same key sent as header.
    assert sa.pick(_req({"user": "s1"}), pool) in by_header
    assert len({sa.pick(_req({"user": f"u{i}"}), pool) for i in range(20)}) > 1
    header_only = SessionAffinity(SessionAffinityOptions(header="x-session-id", key=None))
    lr = LeastRequests()
    pool[0].in_flight = pool[1].in_flight = 5
    for e in pool[3:]:
        e.in_flight = 5
    # key=None: the body's user is ignored, so the least_requests fallback decides.
    assert header_only.pick(_req({"user": "s1"}), pool) is lr.pick(REQ, pool) is pool[2]


def test_session_affinity_fallback_without_key() -> None:
    pool = _eps(3)
    pool[0].in_flight, pool[1].in_flight, pool[2].in_flight = 2, 0, 1
    sa = SessionAffinity()
    for body in ({}, {"user": ""}, {"user": {"id": 1}}, {"user": True}):
        assert sa.pick(_req(body), pool) is pool[1]
    rr = SessionAffinity(SessionAffinityOptions(fallback="round_robin"))
    assert _names([rr.pick(REQ, pool) for _ in range(4)]) == "e0e1e2e0"
    # An integer user id is a key too (so it is not least_requests' e1 every time).
    assert len({sa.pick(_req({"user": i}), pool) for i in range(30)}) == 3


def test_session_affinity_custom_body_key() -> None:
    sa = SessionAffinity(SessionAffinityOptions(key="conversation_id"))
    pool = _eps(8)
    ids = {sa.pick(_req({"conversation_id": "c7", "user": f"u{i}"}), pool) for i in range(20)}
    assert len(ids) == 1


# -- locality -----------------------------------------------------------------------------------


def _zoned(*zones: str | None) -> list[EndpointState]:
    pool = _eps(len(zones))
    for e, zone in zip(pool, zones, strict=True):
        if zone is not None:
            e.labels = {"zone": zone}
    return pool


def test_locality_keeps_local() -> None:
    pool = _zoned("a", "b", "a", None, "b")
    loc = Locality(LocalityOptions(value="a"))
    assert isinstance(loc, Filter)
    assert list(loc.filter(REQ, pool)) == [pool[0], pool[2]]
    assert list(Locality(LocalityOptions(value="b")).filter(REQ, pool)) == [pool[1], pool[4]]


def test_locality_no_local_candidate_means_no_preference() -> None:
    pool = _zoned("a", "b", "a")
    loc = Locality(LocalityOptions(value="a"))
    # Local endpoints saturated: the pool left them out of the candidates.
    assert list(loc.filter(REQ, [pool[1]])) == []
    assert list(Locality(LocalityOptions(value="c")).filter(REQ, pool)) == []


def test_locality_other_label() -> None:
    pool = _eps(3)
    pool[1].labels = {"rack": "r1", "zone": "a"}
    pool[2].labels = {"zone": "r1"}
    assert list(Locality(LocalityOptions(label="rack", value="r1")).filter(REQ, pool)) == [pool[1]]


def test_locality_spill_load() -> None:
    pool = _zoned("a", "a", "b")
    pool[0].in_flight = pool[1].in_flight = 3
    spill = Locality(LocalityOptions(value="a", spill_load=2.0))
    assert list(spill.filter(REQ, pool)) == []  # every local one is above 2
    assert list(Locality(LocalityOptions(value="a")).filter(REQ, pool)) == pool[:2]  # no spill_load
    pool[1].in_flight = 2  # one local at the threshold: stay local (both of them)
    assert list(spill.filter(REQ, pool)) == pool[:2]
    pool[1].in_flight_tokens = 4096  # load_score counts tokens: 2 + 4096/2048 = 4 > 2
    assert list(spill.filter(REQ, pool)) == []


def test_locality_needs_a_value() -> None:
    with pytest.raises(ValueError):
        LocalityOptions()  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        Locality()


# -- registration -------------------------------------------------------------------------------


def test_registered_by_the_installed_plugins() -> None:
    pm = load_plugins()
    balancers = pm.registered("balancers")
    expected = {
        "weighted_round_robin": (WeightedRoundRobin, None),
        "random": (RandomPick, RandomOptions),
        "least_requests": (LeastRequests, None),
        "power_of_two": (PowerOfTwo, PowerOfTwoOptions),
        "session_affinity": (SessionAffinity, SessionAffinityOptions),
    }
    for name, (factory, options) in expected.items():
        reg = balancers[name]
        assert reg.factory is factory and reg.options is options, name
        assert reg.description
        # factory(options) with the defaults (what a config without ``options:`` gets).
        built = factory(options() if options else None)
        assert isinstance(built, Balancer)
        assert built.pick(REQ, _eps(2)) is not None
    loc = pm.registered("filters")["locality"]
    assert loc.factory is Locality and loc.options is LocalityOptions and loc.description
