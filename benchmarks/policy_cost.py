"""Per-request cost of every balancer and scheduler, at 4 and at 64 endpoints.

    python benchmarks/policy_cost.py [--picks N] [--json OUT] [--system-chars N] [--user-chars N]

Balancers: ``pick`` on a pool whose endpoints carry realistic state (in-flight requests
and tokens, an engine load snapshot), for fresh requests with ~2,000-character prompts
(64 distinct system prompts, so the prefix policies hash, match and record every time),
each dispatch followed by its release. Schedulers: ``admit`` + ``release`` with a free
slot (the common, uncontended path), and a queued round trip (admit waits, a release hands
its slot over). Prints microseconds per request; no thresholds, just numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path
from typing import Any

from harness import write_json
from rich.console import Console
from rich.table import Table

from shuniu.core.contracts import BackendBase
from shuniu.core.pools.composite import Composite
from shuniu.core.pools.pool import EndpointState, Pool
from shuniu.core.types import EndpointLoad, InferenceRequest, Outcome, Principal
from shuniu.plugins.balancers.least_load import LeastLoad, LoadScorer
from shuniu.plugins.balancers.least_requests import LeastRequests
from shuniu.plugins.balancers.power_of_two import PowerOfTwo
from shuniu.plugins.balancers.precise_prefix import PrecisePrefix
from shuniu.plugins.balancers.prefix_affinity import PrefixAffinity, PrefixScorer
from shuniu.plugins.balancers.random_pick import RandomPick
from shuniu.plugins.balancers.round_robin import RoundRobin
from shuniu.plugins.balancers.session_affinity import SessionAffinity
from shuniu.plugins.balancers.weighted_round_robin import WeightedRoundRobin
from shuniu.plugins.schedulers.fifo import FifoScheduler
from shuniu.plugins.schedulers.priority import PriorityOptions, PriorityScheduler, TierPolicy

BALANCERS: dict[str, Any] = {
    "round_robin": RoundRobin,
    "weighted_round_robin": WeightedRoundRobin,
    "random": RandomPick,
    "least_requests": LeastRequests,
    "power_of_two": PowerOfTwo,
    "least_load": LeastLoad,
    "session_affinity": SessionAffinity,
    "prefix_affinity": PrefixAffinity,
    "precise_prefix": PrecisePrefix,
    "prefix+load (composed)": lambda: Composite([], [(PrefixScorer(), 0.6), (LoadScorer(), 0.4)]),
}


def _requests(n: int, seed: int, system_chars: int = 1500, user_chars: int = 500) -> list[InferenceRequest]:
    rng = random.Random(seed)
    systems = ["".join(rng.choices("abcdefghij ", k=system_chars)) for _ in range(64)]
    out = []
    for i in range(n):
        prompt = systems[i % 64] + "".join(rng.choices("klmnopqrst ", k=user_chars))
        out.append(
            InferenceRequest(
                id=str(i),
                api="chat",
                model="m",
                body={"user": f"user-{i % 500}"},
                prompt=prompt,
                prompt_tokens=len(prompt) // 4,
                max_tokens=200,
                principal=Principal(tenant=f"t{i % 7}", tier="free" if i % 3 else "premium"),
            )
        )
    return out


def _endpoints(n: int, rng: random.Random) -> list[EndpointState]:
    eps = []
    for i in range(n):
        e = EndpointState(f"e{i}", BackendBase(), weight=rng.choice((1.0, 2.0)))
        e.in_flight = rng.randrange(0, 50)
        e.in_flight_tokens = e.in_flight * rng.randrange(200, 2000)
        e.load = EndpointLoad(running=e.in_flight, waiting=rng.randrange(0, 3), kv_usage=rng.random())
        e.load_weight = 1.0
        eps.append(e)
    return eps


def bench_balancer(factory: Any, n_endpoints: int, reqs: list[InferenceRequest]) -> float:
    rng = random.Random(1)
    eps = _endpoints(n_endpoints, rng)
    pool = Pool("m", eps, factory(), FifoScheduler())
    for r in reqs[:200]:  # warm up (and fill the prefix index a little)
        t = pool.try_dispatch(r, 0.0)
        assert t is not None
        pool.free(t, Outcome.OK)
    fresh = [InferenceRequest(**{f: getattr(r, f) for f in r.__struct_fields__}) for r in reqs]
    try_dispatch, free, ok = pool.try_dispatch, pool.free, Outcome.OK
    start = time.perf_counter()
    for r in fresh:
        free(try_dispatch(r, 0.0), ok)  # type: ignore[arg-type]
    return (time.perf_counter() - start) / len(fresh) * 1e6


async def _scheduler(make: Any, n_endpoints: int, reqs: list[InferenceRequest]) -> tuple[float, float]:
    eps = [EndpointState(f"e{i}", BackendBase(), max_concurrency=4) for i in range(n_endpoints)]
    pool = Pool("m", eps, RoundRobin(), make())
    s = pool.scheduler
    start = time.perf_counter()
    for r in reqs:
        s.release(await s.admit(r, pool), Outcome.OK)
    free_path = (time.perf_counter() - start) / len(reqs) * 1e6
    # Queued: every slot taken, then each request waits and gets the slot a release frees.
    held = [await s.admit(r, pool) for r in reqs[: 4 * n_endpoints]]
    rest = reqs[4 * n_endpoints :]
    start = time.perf_counter()
    for r in rest:
        task = asyncio.ensure_future(s.admit(r, pool))
        await asyncio.sleep(0)
        s.release(held.pop(0), Outcome.OK)
        held.append(await task)
    queued_path = (time.perf_counter() - start) / len(rest) * 1e6
    for t in held:
        s.release(t, Outcome.OK)
    return free_path, queued_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--picks", type=int, default=20_000, help="Requests per measurement.")
    ap.add_argument("--json", type=Path, help="Write the numbers here too.")
    ap.add_argument("--system-chars", type=int, default=1500, help="Length of each of the 64 system prompts.")
    ap.add_argument("--user-chars", type=int, default=500, help="Length of each request's own part.")
    args = ap.parse_args()
    reqs = _requests(args.picks, seed=7, system_chars=args.system_chars, user_chars=args.user_chars)
    console = Console()
    results: dict[str, Any] = {"balancers": {}, "schedulers": {}}
    table = Table(title="balancer cost per request (pick + release), µs")
    table.add_column("policy")
    for n in (4, 64):
        table.add_column(f"{n} endpoints", justify="right")
    with console.status("measuring balancers"):
        for name, factory in BALANCERS.items():
            row = [bench_balancer(factory, n, reqs) for n in (4, 64)]
            results["balancers"][name] = dict(zip(("4", "64"), row, strict=True))
            table.add_row(name, *(f"{v:.2f}" for v in row))
    console.print(table)
    sched = Table(title="scheduler cost per request, µs (round_robin balancer)")
    for col in ("scheduler", "endpoints", "free slot: admit + release", "queued: admit, wait, hand-over"):
        sched.add_column(col, justify="right")
    makers = {
        "fifo": FifoScheduler,
        "priority": lambda: PriorityScheduler(
            PriorityOptions(tiers={"premium": TierPolicy(priority=0), "free": TierPolicy(priority=2)})
        ),
    }
    with console.status("measuring schedulers"):
        for name, make in makers.items():
            for n in (4, 64):
                free_path, queued_path = asyncio.run(_scheduler(make, n, reqs))
                results["schedulers"][f"{name}/{n}"] = {"free": free_path, "queued": queued_path}
                sched.add_row(name, str(n), f"{free_path:.2f}", f"{queued_path:.2f}")
    console.print(sched)
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
