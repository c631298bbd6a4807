"""Autoscaling signals: the replicas a pool needs to meet its SLO at the load expected when
a replica asked for now would be serving.

Per model with ``autoscaling:`` (:class:`~shuniu.core.config.AutoscalingConfig`):

- :class:`~shuniu.core.pools.demand.Demand` counts the pool's arrivals (and their prompt
  tokens) and finished answers (and their tokens) in one-second buckets. The request path
  calls it once per request: an index and two additions, no allocation.
- Every ``interval_s``, :class:`PoolScaler` fits a least-squares line through the last
  ``window_s`` per-second arrival counts: its value at the end of the window is the rate
  *now*, its value ``lead_time_s`` later the *forecast*. The token mix is the window's mean
  prompt and answer lengths, with the share of prompt tokens the engines' own prefix-cache
  counters report as hits.
- The pool's capacity model (:class:`~shuniu.core.contracts.CapacityModel`; ``simulated``
  runs the planner's simulator) says how many requests per second one replica serves at
  that mix within the SLO. The mix is rounded to a grid first — lengths up to the next
  quarter power of two, the cached share down to a tenth, both towards less capacity — and
  each grid point is computed once, in a worker process (in a thread, with virtual time
  standing still, under ``shuniu simulate``), never on the request path. Until the first
  answer arrives the signal holds the current replica count.
- ``demand = max(now, forecast) * (1 + headroom) / capacity`` replicas' worth of work;
  ``desired = ceil(demand)`` within ``min_replicas..max_replicas``. Going up it leads the
  load by the lead time; going down it follows the rate now (a replica leaves at once,
  there is nothing to anticipate), and the HPA's or KEDA's stabilisation window keeps it
  from flapping.

Several gateways (or workers) each see a share of the traffic: their ``demand`` gauges add
up to the fleet's (``ceil(sum(shuniu_pool_replica_demand))``), which is what to scale on
there (``docs/kubernetes.md``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from shuniu.core.config.autoscaling import AutoscalingConfig
from shuniu.core.config.loader import ResolvedDeployment
from shuniu.core.contracts.capacity import CapacityModel, TokenMix
from shuniu.core.pools.demand import Signals, fit_rate
from shuniu.core.pools.pool import Pool
from shuniu.core.state import GatewayState

__all__ = ["Autoscalers", "PoolScaler", "grid_mix", "near"]

log = logging.getLogger("shuniu.autoscale")

CACHED_SHARE_HALF_LIFE = 4
"""Evaluations over which the engines' prefix-cache hit share is smoothed (half-life)."""


STEP = 2**0.25
"""Ratio between neighbouring lengths of the capacity grid."""
STICKY = 1.1
"""A mix stays on its grid point while it is within this factor of the point's cell (and
its cached share within half a step), so a mean hovering at a cell's edge does not make the
capacity flip between two answers."""


def grid_mix(mix: TokenMix) -> TokenMix:
    """``mix`` on the capacity grid, rounded towards less capacity: lengths up to the next
    quarter power of two, the cached share down to a tenth."""

    def up(x: float) -> float:
        x = max(x, 1.0)
        return float(round(2 ** (math.ceil(4 * math.log2(x) - 1e-9) / 4)))

    share = math.floor(10 * mix.cached_share + 1e-9) / 10
    return TokenMix(up(mix.prompt_tokens), up(mix.output_tokens), share)


def near(mix: TokenMix, point: TokenMix) -> bool:
    """Whether ``mix`` is within :data:`STICKY` of ``point``'s grid cell."""
    for x, p in ((mix.prompt_tokens, point.prompt_tokens), (mix.output_tokens, point.output_tokens)):
        if not p / STEP / STICKY <= x <= p * STICKY:
            return False
    return point.cached_share - 0.05 <= mix.cached_share <= point.cached_share + 0.15


class PoolScaler:
    """The signals of one pool: its :class:`Demand`, its capacity model and the capacities
    computed so far, one per grid mix."""

    def __init__(self, pool: Pool, config: AutoscalingConfig, model: CapacityModel) -> None:
        assert pool.demand is not None
        self.pool = pool
        self.demand = pool.demand
        self.config = config
        self.model = model
        self.capacities: dict[TokenMix, float] = {}
        self.failed: dict[TokenMix, str] = {}
        self.pending: dict[TokenMix, Future[float]] = {}
        n = self._replicas()
        self.signals = Signals(replicas=n, desired=n, lead_time_s=config.lead_time_s)
        pool.scaling = self.signals
        self._cached_share = 0.0
        self._point: TokenMix | None = None
        self._prefix: dict[str, tuple[float, float]] = {}

    def _replicas(self) -> int:
        return sum(1 for e in self.pool.endpoints if not e.draining)

    def _observe_cache(self) -> float:
        """The share of prompt tokens the engines found cached since the last evaluation,
        smoothed; from their own counters (endpoints that report none are left out)."""
        queries = hits = 0.0
        seen: dict[str, tuple[float, float]] = {}
        for e in self.pool.endpoints:
            load = e.load
            if load is None or load.prefix_queries is None or load.prefix_hits is None:
                continue
            q, h = float(load.prefix_queries), float(load.prefix_hits)
            seen[e.name] = (q, h)
            last = self._prefix.get(e.name)
            if last is not None and q >= last[0] and h >= last[1]:  # a restart resets them
                queries += q - last[0]
                hits += h - last[1]
        self._prefix = seen
        if queries > 0:
            alpha = 1 - 0.5 ** (1 / CACHED_SHARE_HALF_LIFE)
            self._cached_share += alpha * (min(1.0, hits / queries) - self._cached_share)
        return self._cached_share

    def evaluate(
        self,
        now: float,
        submit: Callable[[TokenMix], Future[float] | float],
        peers: tuple[float, int] = (0.0, 0),
    ) -> Signals:
        """Recompute the signals at ``now``. A capacity not known yet is asked of
        ``submit`` (which answers at once, or with a future). ``peers``: the fleet's other
        gateways' summed ``max(rate, forecast)`` for this pool, and how many they are."""
        cfg = self.config
        counts, prompt, finished, output = self.demand.window(now)
        rate, forecast = fit_rate(counts, cfg.lead_time_s)
        share = self._observe_cache()
        arrivals = sum(counts)
        mix = self.signals.mix
        if arrivals and finished:
            mix = TokenMix(prompt / arrivals, output / finished, share)
        replicas = self._replicas()
        sig = Signals(rate, forecast, mix, replicas=replicas, desired=replicas, lead_time_s=cfg.lead_time_s)
        ahead = max(rate, forecast)
        if peers[1]:
            sig.peers, sig.fleet_ahead = peers[1], ahead + peers[0]
        if mix is None:
            if not arrivals and not peers[0]:
                # Nothing arrives: no mix is needed to know that the floor is enough.
                sig.state, sig.demand, sig.desired = "ready", 0.0, cfg.min_replicas
            else:
                sig.state = "starting"  # requests arrived, none finished yet: hold
            self.signals = self.pool.scaling = sig
            return sig
        point = grid_mix(mix)
        if self._point is not None and point != self._point and near(mix, self._point):
            point = self._point
        self._point = point
        capacity = self._capacity(point, submit)
        sig.capacity = capacity
        if capacity is None:
            sig.state = "failed" if point in self.failed else "starting"
            if sig.state == "starting" and self.signals.capacity is not None:
                # A new mix is being computed: the last one's answer stands in meanwhile.
                sig.capacity = capacity = self.signals.capacity
        if capacity is not None and capacity <= 0:
            sig.state = "unreachable"
        elif capacity is not None:
            sig.state = "ready"
            sig.demand = ahead * (1 + cfg.headroom) / capacity
            fleet = sig.demand if sig.fleet_ahead is None else sig.fleet_ahead * (1 + cfg.headroom) / capacity
            sig.desired = min(cfg.max_replicas, max(cfg.min_replicas, math.ceil(fleet - 1e-9)))
        self.signals = self.pool.scaling = sig
        return sig

    def _capacity(self, key: TokenMix, submit: Callable[[TokenMix], Future[float] | float]) -> float | None:
        if key in self.capacities:
            return self.capacities[key]
        if key in self.failed:
            return None
        fut = self.pending.get(key)
        if fut is None:
            try:
                answer = submit(key)
            except Exception as exc:  # a capacity model that fails inline
                self._fail(key, exc)
                return None
            if not isinstance(answer, Future):
                self.capacities[key] = float(answer)
                return self.capacities[key]
            fut = self.pending[key] = answer
        if not fut.done():
            return None
        del self.pending[key]
        try:
            self.capacities[key] = float(fut.result())
        except Exception as exc:
            self._fail(key, exc)
            return None
        return self.capacities[key]

    def _fail(self, key: TokenMix, exc: BaseException) -> None:
        self.failed[key] = f"{type(exc).__name__}: {exc}"
        log.warning(
            "autoscaling of %s: the capacity model failed at %s: %s", self.pool.name, key, self.failed[key]
        )


class Autoscalers:
    """The gateway's part: one :class:`PoolScaler` per model with ``autoscaling:``,
    re-evaluated every ``interval_s`` by one task; capacities computed in one worker process
    (``inline``: in a thread the event loop waits on, for ``shuniu simulate``'s virtual time,
    which stands still meanwhile). The scalers follow a reload: a pool that keeps its
    ``autoscaling:`` keeps its capacities (its :class:`Demand` is carried by the reload)."""

    def __init__(
        self,
        state: GatewayState,
        build_model: Callable[[ResolvedDeployment, str], CapacityModel],
        *,
        inline: bool = False,
    ) -> None:
        self.state = state
        self.build_model = build_model
        self.inline = inline
        self.scalers: dict[str, PoolScaler] = {}
        self._configs: dict[str, tuple[AutoscalingConfig, Any]] = {}
        self._executor: Executor | None = None
        self._task: asyncio.Task[None] | None = None
        self._due: dict[str, float] = {}
        self.peers: Callable[[str], tuple[float, int]] | None = None
        """With ``fleet:``: the other gateways' demand for a pool (``FleetSync.peer_demand``)."""
        self.sync()

    def sync(self) -> None:
        """Match the scalers to the pools now (after a reload: new pool objects, models
        added or removed, ``autoscaling:`` changed)."""
        resolved = self.state.resolved
        scalers: dict[str, PoolScaler] = {}
        for name, pool in self.state.pools.items():
            cfg = resolved.deployment.models[name].autoscaling
            if cfg is None or pool.demand is None:
                continue
            key = (cfg, resolved.capacity_options.get(name))
            old = self.scalers.get(name)
            if old is not None and self._configs.get(name) != key:
                try:
                    old = PoolScaler(pool, cfg, self.build_model(resolved, name))
                except Exception:
                    log.exception("autoscaling of %s: the new capacity model failed; keeping the old", name)
            elif old is None:
                old = PoolScaler(pool, cfg, self.build_model(resolved, name))  # at start-up: raises
            # Tried once per configuration: a model that failed is not rebuilt every interval.
            self._configs[name] = key
            # A pool the reload rebuilt: the scaler (and its last signals) move to it.
            old.pool, old.demand = pool, pool.demand
            pool.scaling = old.signals
            scalers[name] = old
        self.scalers = scalers

    def _submit(self, scaler: PoolScaler) -> Callable[[TokenMix], Future[float] | float]:
        def submit(mix: TokenMix) -> Future[float] | float:
            if self._executor is None:
                if self.inline:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="shuniu-capacity")
                else:
                    # spawn, not fork: the gateway's event loop and sockets stay out of it.
                    ctx = multiprocessing.get_context("spawn")
                    self._executor = ProcessPoolExecutor(1, mp_context=ctx)
            fut = self._executor.submit(scaler.model.replica_capacity, mix)
            # Virtual time: block until the answer, so that no simulated time passes.
            return fut.result() if self.inline else fut

        return submit

    def evaluate(self, now: float, *, force: bool = False) -> None:
        """Re-evaluate the pools whose interval is up at ``now`` (``force``: all of them)."""
        self.sync()
        self._due = {name: due for name, due in self._due.items() if name in self.scalers}
        for name, scaler in self.scalers.items():
            if force or now >= self._due.get(name, now):
                try:
                    peers = self.peers(name) if self.peers is not None else (0.0, 0)
                    scaler.evaluate(now, self._submit(scaler), peers)
                except Exception:
                    log.exception("autoscaling of %s: evaluation failed", name)
                self._due[name] = now + scaler.config.interval_s

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            self.evaluate(now)
            nxt = min(self._due.values(), default=now + 60.0)
            await asyncio.sleep(max(0.0, nxt - now))

    def start(self) -> None:
        # Even with no scaler yet: a reload may give a model ``autoscaling:``.
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="shuniu-autoscale")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        executor, self._executor = self._executor, None
        if executor is None:
            return
        terminate = getattr(executor, "terminate_workers", None)
        if isinstance(executor, ProcessPoolExecutor) and terminate is not None:
            terminate()  # Python 3.14: shuts down and ends the worker at once
            return
        # A simulation still running would hold the exit up for seconds (the executor joins
        # its workers at exit): end the worker now, through the only handle to it before
        # Python 3.14 (taken before shutdown, which drops it).
        procs = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
