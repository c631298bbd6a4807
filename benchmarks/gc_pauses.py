"""What the cyclic garbage collector costs a gateway under load, by young-generation threshold.

Usage::

    python benchmarks/gc_pauses.py [--thresholds 700,20000] [--targets minimal,full]
                                   [--rounds 3] [--duration 5] [--concurrency 64]

For each target (``benchmarks/peers.py``'s deployments: ``minimal``, ``full``) and each
``gateway.gc_young_threshold`` (700 is Python's own default, 20000 shuniu's), one gateway is
started in front of the instant upstream. Then, ``--rounds`` times, in an order rotated each
round, each gets ``--concurrency`` keep-alive connections sending non-streamed requests for
``--duration`` seconds (``loadgen.py rps``), and ``/metrics`` is read before and after: the
gateway's own ``shuniu_gc_pause_seconds_total`` and ``shuniu_gc_collections_total`` over its
``shuniu_requests_total`` give the collector's time and collections per request, which do
not drift with the machine's speed the way requests/s does. The table shows medians over
rounds, with requests/s and CPU per request (same run, alternating) beside them.

Only 127.0.0.1 is used; every process started is stopped by its PID on exit or Ctrl-C.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

from harness import (
    Children,
    failed,
    handle_signals,
    run_loadgen,
    wait_http_ok,
    wait_serving,
    warn_if_busy,
    write_json,
)
from peers import MODEL, deployment
from rich.console import Console
from rich.table import Table

from shuniu.plugins.auth.api_keys import new_key

HERE = Path(__file__).resolve().parent
console = Console(width=None if sys.stdout.isatty() else 150)
_SAMPLE = re.compile(
    rb"^(shuniu_gc_pause_seconds_total|shuniu_gc_collections_total|shuniu_requests_total)\{([^}]*)\} (\S+)$",
    re.M,
)


def scrape(url: str) -> dict[str, float]:
    """GC seconds and collections by generation, and requests finished, from ``/metrics``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read()
    out: dict[str, float] = {"requests": 0.0}
    for name, labels, value in _SAMPLE.findall(text):
        if name == b"shuniu_requests_total":
            out["requests"] += float(value)
            continue
        generation = re.search(rb'generation="(\d)"', labels)
        assert generation is not None
        kind = "seconds" if name == b"shuniu_gc_pause_seconds_total" else "collections"
        out[f"{kind}{generation.group(1).decode()}"] = float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--thresholds", default="700,20000", help="young-generation thresholds to compare")
    ap.add_argument("--targets", default="minimal,full", help="of peers.py's shuniu targets: minimal, full")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--json", type=Path, metavar="OUT", help="write every number to OUT")
    args = ap.parse_args(argv)
    thresholds = [int(t) for t in args.thresholds.split(",") if t]
    targets = [t for t in args.targets.split(",") if t]
    if any(t not in ("minimal", "full") for t in targets):
        ap.error("targets are minimal and full")
    handle_signals()
    warn_if_busy(console.print, "other load makes requests/s noisier (GC per request much less so)")
    key = new_key()
    cases = [(t, g) for t in targets for g in thresholds]
    rows: dict[tuple[str, int], list[dict[str, float]]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory(prefix="shuniu-gc-") as tmp, Children() as children:
        tmpdir = Path(tmp)
        try:
            upstream = children.start(
                "upstream",
                [sys.executable, str(HERE / "instant_upstream.py"), "--port", "0"],
                tmpdir / "up.log",
            )
            wait_serving(upstream, 30)
            gateways = {}
            for target, young in cases:
                text = deployment(target, upstream.port, key, "")
                text = text.replace("port: 0}", f"port: 0, gc_young_threshold: {young}}}", 1)
                config = tmpdir / f"{target}-{young}.yaml"
                config.write_text(text)
                child = children.start(
                    f"{target} gc={young}",
                    [sys.executable, "-m", "shuniu.core", "serve", str(config)],
                    tmpdir / f"{target}-{young}.log",
                )
                wait_serving(child, 60)
                wait_http_ok(child, f"{child.url}/ready", 60)
                gateways[(target, young)] = child
            for n in range(args.rounds):
                order = cases[n % len(cases) :] + cases[: n % len(cases)]
                for case in order:
                    target, young = case
                    child = gateways[case]
                    console.print(f"round {n + 1}: {target}, threshold {young}")
                    headers = [f"--header=Authorization:Bearer {key}"] if target == "full" else []
                    before = scrape(child.url)
                    res = run_loadgen(
                        children,
                        tmpdir,
                        f"{target} {young}",
                        [
                            "rps",
                            f"{child.url}/v1",
                            "-c",
                            str(args.concurrency),
                            "--duration",
                            f"{args.duration:g}",
                            "--warmup",
                            "1",
                            f"--watch=target={child.pid}",
                            "--model",
                            MODEL,
                            *headers,
                        ],
                        args.duration + 60,
                    )
                    after = scrape(child.url)
                    done = after["requests"] - before["requests"]
                    row = {
                        "rps": res["rps"],
                        "cpu_ms_per_request": res["cpu_ms_per_request"].get("target", float("nan")),
                        "errors": res["errors"],
                        "gc_us_per_request": 1e6
                        * sum(after[f"seconds{g}"] - before[f"seconds{g}"] for g in range(3))
                        / done,
                    }
                    for g in range(3):
                        row[f"gen{g}_per_1000"] = (
                            1000 * (after[f"collections{g}"] - before[f"collections{g}"]) / done
                        )
                    rows[case].append(row)
        except (KeyboardInterrupt, RuntimeError) as exc:
            return failed(console.print, exc)
    summary = {f"{t}@{g}": {k: statistics.median(r[k] for r in rows[(t, g)]) for k in rows[(t, g)][0]}
               for t, g in cases}  # fmt: skip
    table = Table(
        title=f"The cyclic GC under c={args.concurrency} (medians of {args.rounds} alternating rounds)"
    )
    for col in ("target", "gc_young_threshold", "req/s", "CPU ms/req", "GC µs/req", "gen 0 / 1000 req",
                "gen 1 / 1000 req", "gen 2 / 1000 req", "errors"):  # fmt: skip
        table.add_column(col, justify="left" if col == "target" else "right")
    for t, g in cases:
        s = summary[f"{t}@{g}"]
        cells = [f"{s['rps']:,.0f}", f"{s['cpu_ms_per_request']:.3f}", f"{s['gc_us_per_request']:.2f}"]
        cells += [f"{s[f'gen{n}_per_1000']:.2f}" for n in range(3)]
        table.add_row(t, f"{g:,}", *cells, f"{s['errors']:.0f}")
    console.print(table)
    if args.json is not None:
        write_json(args.json, {"args": vars(args) | {"json": str(args.json)}, "summary": summary})
        console.print(f"numbers written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
