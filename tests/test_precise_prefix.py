"""The ``precise_prefix`` balancer and the cost both prefix balancers weigh: a request stays
on the engine its events say holds its prefix while the queued prefill there is shorter than
a cold prefill elsewhere, moves once it is not, never past the load bound, spreads an idle
pool; the pool counts each endpoint's queued prefill from dispatch to first output; and a
gateway wires its sim engines' events into the balancer's index (and again after a reload)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from shuniu.backends.sim.engine import Seq
from shuniu.core.contracts import BackendBase, Ticket
from shuniu.core.kv_events import BlockRemoved, BlockStored, EventBatch, KvBlockIndex
from shuniu.core.pools.pool import EndpointState, Pool
from shuniu.core.types import EndpointLoad, InferenceRequest, Outcome
from shuniu.plugins.balancers.precise_prefix import PrecisePrefix, PrecisePrefixOptions

SHARED = list(range(1000, 1512))  # 512 tokens: 32 blocks of 16


def _req(ids: list[int]) -> InferenceRequest:
    return InferenceRequest(
        id="r", api="completions", model="m", body={}, prompt="", prompt_tokens=len(ids), token_ids=ids
    )


def _endpoints(n: int) -> list[EndpointState]:
    eps = [EndpointState(f"e{i}", BackendBase()) for i in range(n)]
    for i, e in enumerate(eps):
        e.index = i
    return eps


def _holds(index: KvBlockIndex, endpoint: int, ids: list[int], bs: int = 16) -> None:
    """``endpoint``'s engine reports it cached ``ids`` (whole blocks)."""
    n = len(ids) // bs
    index.apply(
        endpoint, EventBatch(0.0, [BlockStored(list(range(n)), None, ids[: n * bs], bs, medium="GPU")])
    )


def test_a_request_stays_on_its_cached_engine_while_waiting_there_is_cheaper() -> None:
    bal = PrecisePrefix(PrecisePrefixOptions(slack_tokens=0))
    eps = _endpoints(2)
    _holds(bal.kv_index(), 1, SHARED)
    req = _req([*SHARED, 1, 2, 3])
    eps[1].prefill_tokens = 400  # queued there: less than the 512 a cold prefill costs
    assert bal.pick(req, eps) is eps[1] and req.expected_cached == 512
    eps[1].prefill_tokens = 700  # now the wait is longer than computing it all elsewhere
    moved = _req([*SHARED, 4, 5, 6])
    assert bal.pick(moved, eps) is eps[0] and moved.expected_cached == 0
    # The fleet's other gateways' prefill there counts as much as this gateway's.
    eps[1].prefill_tokens, eps[0].remote_prefill_tokens = 0, 2000
    assert bal.pick(_req([*SHARED, 7]), eps) is eps[1]


def test_the_exact_index_beats_a_guess_and_an_eviction_is_believed() -> None:
    bal = PrecisePrefix()
    eps = _endpoints(3)
    index = bal.kv_index()
    _holds(index, 2, SHARED)
    assert bal.pick(_req([*SHARED, 9]), eps) is eps[2]
    index.apply(2, EventBatch(1.0, [BlockRemoved(list(range(32)), "GPU")]))  # evicted
    assert index.blocks(2) == 0
    _holds(index, 0, SHARED)
    assert bal.pick(_req([*SHARED, 10]), eps) is eps[0]


def test_never_past_the_load_bound_and_an_idle_pool_spreads() -> None:
    bal = PrecisePrefix(PrecisePrefixOptions(balance_abs=4, balance_rel=1.5))
    eps = _endpoints(2)
    _holds(bal.kv_index(), 0, SHARED)
    eps[0].in_flight = 6  # 6 above the other: past both bounds, however cheap its cache
    assert bal.pick(_req([*SHARED, 1]), eps) is eps[1]
    idle = _endpoints(4)
    fresh = PrecisePrefix()
    chosen = {fresh.pick(_req([k] * 64), idle).name for k in range(4)}  # type: ignore[union-attr]
    assert chosen == {"e0", "e1", "e2", "e3"}


def test_a_burst_of_a_new_prefix_stays_together_before_any_event() -> None:
    bal = PrecisePrefix()
    eps = _endpoints(4)
    first = bal.pick(_req([*SHARED, 0]), eps)
    assert all(bal.pick(_req([*SHARED, k]), eps) is first for k in range(1, 6))


def test_the_pool_counts_queued_prefill_from_dispatch_to_first_output() -> None:
    eps = _endpoints(2)
    bal = PrecisePrefix()
    _holds(bal.kv_index(), 0, SHARED)
    pool = Pool("m", eps, bal, object())  # type: ignore[arg-type]
    cached = pool.try_dispatch(_req([*SHARED, *range(20)]), 0.0)
    cold = pool.try_dispatch(_req(list(range(5000, 5300))), 0.0)
    assert isinstance(cached, Ticket) and isinstance(cold, Ticket)
    assert cached.endpoint is eps[0] and eps[0].prefill_tokens == 20  # only the uncached tail
    assert cold.endpoint is eps[1] and eps[1].prefill_tokens == 300
    pool.first_output(cached)
    pool.first_output(cached)  # once only
    assert eps[0].prefill_tokens == 0
    pool.free(cold, Outcome.ERROR)  # ended before any output: given back on release
    assert eps[1].prefill_tokens == 0 and eps[1].in_flight == 0


def test_a_prompt_that_is_all_cached_still_computes_its_last_block() -> None:
    # vLLM (and the simulator) reuse at most (n - 1) // block blocks: the last token's logits
    # are needed, so a prompt of exactly 32 cached blocks finds 31 of them.
    bal = PrecisePrefix()
    eps = _endpoints(2)
    _holds(bal.kv_index(), 0, SHARED)
    whole = _req(list(SHARED))
    assert bal.pick(whole, eps) is eps[0] and whole.expected_cached == 31 * 16
    longer = _req([*SHARED, 7])
    assert bal.pick(longer, eps) is eps[0] and longer.expected_cached == 32 * 16


def test_the_pool_counts_the_hits_it_expected_per_endpoint() -> None:
    eps = _endpoints(2)
    bal = PrecisePrefix()
    _holds(bal.kv_index(), 1, SHARED)
    pool = Pool("m", eps, bal, object())  # type: ignore[arg-type]
    for k in range(3):
        assert isinstance(pool.try_dispatch(_req([*SHARED, k]), 0.0), Ticket)
    assert isinstance(pool.try_dispatch(_req(list(range(9000, 9100))), 0.0), Ticket)
    assert (eps[0].expected_hits, eps[1].expected_hits) == (0, 3 * 512)


def test_by_default_a_reported_queue_does_not_move_a_request_off_its_cache() -> None:
    # A load snapshot says six requests wait in the engine that holds the prefix. By default
    # the request stays there (the count is the same for every request until the next
    # snapshot, so weighing it moved bursts off their cache); at the old 1,024 tokens a
    # queued request, it would pay a cold prefill on the idle engine.
    eps = _endpoints(2)
    eps[0].load, eps[0].load_weight = EndpointLoad(running=8, waiting=6), 1.0
    for options, where in ((PrecisePrefixOptions(), 0), (PrecisePrefixOptions(waiting_cost_tokens=1024), 1)):
        bal = PrecisePrefix(options)
        _holds(bal.kv_index(), 0, SHARED)
        assert bal.pick(_req([*SHARED, 1]), eps) is eps[where]


def test_a_cached_request_waits_on_its_engine_past_the_adaptive_limit_not_cold_elsewhere() -> None:
    eps = _endpoints(2)
    bal = PrecisePrefix(PrecisePrefixOptions(past_limit_cost_tokens=1024))
    _holds(bal.kv_index(), 0, SHARED)
    pool = Pool("m", eps, bal, object())  # type: ignore[arg-type]
    eps[0].limit, eps[0].in_flight = 4, 4  # the adaptive limit binds: no free slot there
    hot = pool.try_dispatch(_req([*SHARED, 1]), 0.0)
    assert isinstance(hot, Ticket) and hot.endpoint is eps[0] and eps[0].in_flight == 5
    cold = pool.try_dispatch(_req(list(range(7000, 7300))), 0.0)
    assert isinstance(cold, Ticket) and cold.endpoint is eps[1]  # nothing cached: not past a limit
    # Each request sent past the limit makes the next wait longer: past a cold prefill's cost
    # plus the slack, the next one goes to the free engine after all.
    sent = [pool.try_dispatch(_req([*SHARED, k]), 0.0) for k in range(2, 12)]
    where = [t.endpoint.name for t in sent if isinstance(t, Ticket)]
    assert where[0] == "e0" and where[-1] == "e1"
    # All at their limit: a request no engine holds waits in the gateway; a cached one does not.
    eps[1].limit, eps[1].in_flight = eps[1].in_flight, eps[1].in_flight
    assert pool.try_dispatch(_req(list(range(8000, 8300))), 0.0) is None
    eps[0].in_flight = eps[0].limit  # its overflow drained
    assert isinstance(pool.try_dispatch(_req([*SHARED, 99]), 0.0), Ticket)
    # max_concurrency is a hard limit: never past it.
    eps[0].max_concurrency = eps[0].in_flight
    eps[0].limit = eps[0].in_flight
    capped = pool.try_dispatch(_req([*SHARED, 5]), 0.0)
    assert capped is None or capped.endpoint is not eps[0]


def test_an_engine_that_went_down_loses_its_entries_at_once() -> None:
    from shuniu.plugins.balancers.prefix_affinity import PrefixAffinity

    eps = _endpoints(2)
    bal = PrecisePrefix()
    index = bal.kv_index()
    _holds(index, 0, SHARED)
    _holds(index, 1, SHARED[:256])
    pool = Pool("m", eps, bal, object())  # type: ignore[arg-type]
    pool.engine_down(eps[0])  # what a launched engine's exit calls
    assert not eps[0].healthy and index.blocks(0) == 0 and index.blocks(1) == 16
    # The approximate balancer forgets what it sent there too.
    approx = PrefixAffinity()
    others = _endpoints(2)
    ids = [*SHARED, 1]
    first = approx.pick(_req(ids), others)
    again = _req(ids)
    assert approx.pick(again, others) is first and again.expected_cached == 512
    assert first is not None
    Pool("a", others, approx, object()).engine_down(first)  # type: ignore[arg-type]
    after = _req(ids)
    approx.pick(after, others)
    assert after.expected_cached == 0


async def test_a_gateway_feeds_its_sim_engines_events_to_the_balancer_and_again_after_a_reload(
    tmp_path: Path,
) -> None:
    from shuniu.core.config.loader import load_deployment
    from shuniu.core.gateway import Gateway
    from shuniu.core.plugin_manager import load_plugins

    text = textwrap.dedent(
        """
        models:
          m:
            balancer: {policy: precise_prefix}
            endpoints:
              - {kind: sim, replicas: 2, options: {ttft_ms: 0, tokens_per_s: 0, prefill_tokens_per_s: 0}}
        """
    )
    path = tmp_path / "deployment.yaml"
    path.write_text(text)
    plugins = load_plugins()
    gateway = Gateway(load_deployment(str(path), plugins), plugins)
    await gateway.start()
    try:
        pool = gateway.pools["m"]
        assert [f.name for f in gateway.state.kv_events.feeds["m"]] == ["m-0", "m-1"]
        target = pool.endpoints[1]
        await target.backend.run_seq(Seq("s", SHARED, 2))  # type: ignore[attr-defined]
        index = pool.balancer.kv_index()  # type: ignore[attr-defined]
        assert index.blocks(target.index) == 32
        assert pool.balancer.pick(_req([*SHARED, 1]), pool.endpoints) is target
        path.write_text(text.replace("replicas: 2", "replicas: 2, weight: 2"))
        await gateway.operations.reload()
        again = gateway.pools["m"]
        assert again.balancer is not pool.balancer and len(gateway.state.kv_events.feeds["m"]) == 2
        await again.endpoints[0].backend.run_seq(Seq("t", list(range(64)), 2))  # type: ignore[attr-defined]
        assert again.balancer.kv_index().blocks(again.endpoints[0].index) == 4  # type: ignore[attr-defined]
        assert index.blocks(again.endpoints[0].index) == 0  # the old index is fed no more
    finally:
        await gateway.stop()


def _prompt(k: int, tokens: int) -> list[int]:
    """A system prompt of its own (ids no other prompt shares) and a question."""
    return [*range(100_000 * (k + 1), 100_000 * (k + 1) + tokens), 7, 8, 9]


def test_new_prefixes_spread_evenly_over_the_caches_not_by_load() -> None:
    # A pool's first moments: sixteen new system prompts arrive while the requests already
    # placed load the engines unevenly (here engine 3 always looks idlest). By load alone
    # every new prefix lands on engine 3, which then has to hold them all; counting the new
    # prompt tokens each engine took, four go to each.
    def split(options: PrecisePrefixOptions) -> list[int]:
        bal = PrecisePrefix(options)
        eps = _endpoints(4)
        for e, busy in zip(eps, (9, 7, 5, 0), strict=True):
            e.in_flight = busy
        taken = [0, 0, 0, 0]
        for k in range(16):
            chosen = bal.pick(_req(_prompt(k, 1800 + 25 * k)), eps)
            assert chosen is not None
            taken[chosen.index] += 1
        return taken

    assert split(PrecisePrefixOptions(new_prefix_window_s=0)) == [0, 0, 0, 16]
    assert split(PrecisePrefixOptions(new_prefix_window_s=3600)) == [4, 4, 4, 4]


def test_a_request_of_a_placed_prefix_follows_it_whatever_was_placed_there() -> None:
    bal = PrecisePrefix(PrecisePrefixOptions(new_prefix_window_s=3600))
    eps = _endpoints(2)
    first = bal.pick(_req(_prompt(0, 1000)), eps)
    assert first is not None
    # The same prefix again: it goes where the prefix went, although that engine took the
    # most new tokens.
    again = _req([*_prompt(0, 1000)[:1000], 5, 5])
    assert bal.pick(again, eps) is first and again.expected_cached > 0
    # A new one goes to the other engine.
    other = bal.pick(_req(_prompt(1, 1000)), eps)
    assert other is not None and other is not first


def test_a_prompt_shorter_than_a_block_is_no_new_prefix() -> None:
    # Short prompts start no cached prefix anywhere: they go by load, and they do not count
    # as new tokens against the engine they went to (so a stream of them does not push the
    # next real new prefix away from an otherwise equal engine).
    bal = PrecisePrefix(PrecisePrefixOptions(new_prefix_window_s=3600))
    eps = _endpoints(2)
    eps[0].in_flight = 1
    for _ in range(5):
        assert bal.pick(_req([1, 2, 3, 4, 5]), eps) is eps[1]  # the less loaded
    assert bal.new is not None and bal.new.tokens(1, bal.new.now()) == 0.0
    eps[0].in_flight = 0
    first = bal.pick(_req(_prompt(0, 1000)), eps)
    assert first is not None and bal.new.tokens(first.index, bal.new.now()) > 0
