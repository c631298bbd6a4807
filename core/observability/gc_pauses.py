"""The cyclic garbage collector's pauses, for ``/metrics``.

Every collection stops the event loop, and with it every request in flight, for as long as
it scans. How often that happens depends on the young-generation threshold
(``gateway.gc_young_threshold``): the gateway keeps thousands of young objects alive while
requests are in flight, and at Python's default a young collection runs every few requests
and rescans them all. These counters show what the collector costs a running gateway, by
generation, so that the threshold can be judged on a real deployment's traffic.

Collected only while the gateway runs (:meth:`GcPauses.start` adds a ``gc.callbacks`` entry,
:meth:`GcPauses.stop` removes it); the callback costs two clock reads per collection, nothing
per request.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from time import perf_counter
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["GcPauses"]

_GENERATIONS = ("0", "1", "2")


class GcPauses(Collector):
    """Pause time, collections and objects freed by the cyclic collector, per generation."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        """Time spent collecting, by generation collected (a collection of generation 2
        also scans 0 and 1: it counts once, under 2)."""
        self.collections = [0, 0, 0]
        """Collections finished, by generation."""
        self.collected = [0, 0, 0]
        """Unreachable objects freed, by generation."""
        self._began = 0.0

    def start(self) -> None:
        """Watch collections from now on (idempotent)."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        """Stop watching (idempotent)."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = perf_counter()
            return
        generation = info["generation"]
        self.seconds[generation] += perf_counter() - self._began
        self.collections[generation] += 1
        self.collected[generation] += info["collected"]

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        seconds = CounterMetricFamily(
            "shuniu_gc_pause_seconds",
            "Time the cyclic garbage collector held the event loop, by generation collected.",
            labels=["generation"],
        )
        collections = CounterMetricFamily(
            "shuniu_gc_collections", "Cyclic garbage collections, by generation.", labels=["generation"]
        )
        collected = CounterMetricFamily(
            "shuniu_gc_collected_objects",
            "Unreachable objects the cyclic collector freed, by generation.",
            labels=["generation"],
        )
        for g, label in enumerate(_GENERATIONS):
            seconds.add_metric([label], self.seconds[g])
            collections.add_metric([label], self.collections[g])
            collected.add_metric([label], self.collected[g])
        yield seconds
        yield collections
        yield collected
