"""How fast the traffic model generates requests and synthetic token ids (what the tests
used to print): ``python benchmarks/traffic_speed.py``."""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path

from shuniu.core.traffic import load_workload, synthetic_ids

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    n, length = 2000, 1000
    start = time.perf_counter()
    for seed in range(n):
        synthetic_ids(seed, length)
    per_call = (time.perf_counter() - start) / n
    print(f"synthetic_ids: {per_call * 1e6:.1f} µs per 1000 ids ({per_call / length * 1e9:.0f} ns/id)")
    for path, count in (("poisson-simple", 20_000), ("chat-shared-prefix", 10_000)):
        wl = load_workload(ROOT / "examples" / "workloads" / f"{path}.yaml")
        start = time.perf_counter()
        for _ in itertools.islice(wl.requests(duration=math.inf), count):
            pass
        with_prompts = count / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in itertools.islice(wl.requests(duration=math.inf, prompts=False), 5 * count):
            pass
        without = 5 * count / (time.perf_counter() - start)
        print(f"{path}: {with_prompts:,.0f} requests/s with prompts, {without:,.0f} without")


if __name__ == "__main__":
    main()
