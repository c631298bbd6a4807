"""RSS of one gateway process over a long run: ``--requests`` (a million by default) through
the full pipeline, RSS read after every segment.

Usage::

    python benchmarks/long_run.py [--requests 1000000] [--segment 30] [--stream] [--json OUT]

The gateway runs what ``benchmarks/peers.py`` calls ``full`` (API keys, key and tenant
RPM/TPM/concurrency limits in the memory store, ``priority``, ``prefix_affinity``, metrics)
in front of ``benchmarks/instant_upstream.py``; ``loadgen.py rps`` (or ``stream`` with
``--stream``) drives it at c=64 for ``--segment`` seconds at a time until the requests add
up. The first segment warms the process (its caches, the allocator's arenas); the figure is
the growth of RSS from the end of the first segment to the end of the run, which a leak of
a few bytes per request shows (100 bytes a request is 95 MiB over a million). Only 127.0.0.1 is
used; every process started is stopped by its PID on exit.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from harness import (
    Children,
    failed,
    handle_signals,
    rss_mib,
    run_loadgen,
    shuniu_command,
    wait_http_ok,
    wait_serving,
    write_json,
)
from peers import deployment
from rich.console import Console
from rich.table import Table

from shuniu.plugins.auth.api_keys import new_key

HERE = Path(__file__).resolve().parent
console = Console()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--segment", type=float, default=30.0, help="seconds per load segment")
    parser.add_argument("--concurrency", "-c", type=int, default=64)
    parser.add_argument("--stream", action="store_true", help="streamed requests (32 chunks each)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    handle_signals()
    tmpdir = Path(tempfile.mkdtemp(prefix="shuniu-long-run-"))
    key = new_key()
    rows: list[tuple[int, float, float]] = []  # (requests so far, RSS MiB, req/s of the segment)
    with Children() as children:
        try:
            upstream = [sys.executable, str(HERE / "instant_upstream.py"), "--port", "0"]
            up = children.start("upstream", upstream, tmpdir / "up.log")
            wait_serving(up, 30)
            cfg = tmpdir / "full.yaml"
            cfg.write_text(deployment("full", up.port, key, ""))
            gw = children.start("gateway", [*shuniu_command(), "serve", str(cfg)], tmpdir / "gateway.log")
            wait_serving(gw, 60)
            wait_http_ok(gw, f"{gw.url}/ready", 60)
            start_rss = rss_mib(gw.pid)
            console.print(f"gateway started: {start_rss:.1f} MiB RSS; {args.requests:,} requests to go")
            total = 0
            began = time.monotonic()
            mode = "stream" if args.stream else "rps"
            while total < args.requests:
                load = [mode, f"{gw.url}/v1", "--model", "bench", "--max-tokens", "32",
                        f"--header=Authorization:Bearer {key}", "-c", str(args.concurrency),
                        "--duration", f"{args.segment:g}", "--warmup", "0"]  # fmt: skip
                result = run_loadgen(children, tmpdir, f"segment {len(rows) + 1}", load, args.segment + 120)
                if result["errors"]:
                    raise RuntimeError(f"segment {len(rows) + 1}: {result['errors']} errors")
                total += result["requests"]
                rss = rss_mib(gw.pid)
                rows.append((total, rss, result["rps"]))
                console.print(
                    f"  {total:>9,} requests  {rss:7.1f} MiB  {result['rps']:8,.0f} req/s  "
                    f"({time.monotonic() - began:.0f} s)"
                )
        except (KeyboardInterrupt, RuntimeError) as exc:
            return failed(console.print, exc)
    warm = rows[0][1]
    last = rows[-1][1]
    peak = max(r[1] for r in rows)
    growth = (last - warm) / warm * 100
    table = Table(title=f"gateway RSS over {rows[-1][0]:,} {'streamed ' if args.stream else ''}requests")
    for col in ("at start", "after the first segment", "at the end", "peak", "growth after warm-up"):
        table.add_column(col, justify="right")
    table.add_row(
        f"{start_rss:.1f} MiB",
        f"{warm:.1f} MiB ({rows[0][0]:,} req)",
        f"{last:.1f} MiB",
        f"{peak:.1f} MiB",
        f"{growth:+.1f}%",
    )
    console.print(table)
    console.print(f"flat within ±5%: {'yes' if abs(growth) <= 5 and (peak - warm) / warm <= 0.05 else 'NO'}")
    if args.json is not None:
        write_json(
            args.json,
            {
                "requests": rows[-1][0],
                "stream": args.stream,
                "rss_start_mib": round(start_rss, 1),
                "rss_warm_mib": round(warm, 1),
                "rss_end_mib": round(last, 1),
                "rss_peak_mib": round(peak, 1),
                "growth_pct": round(growth, 2),
                "segments": [{"requests": r[0], "rss_mib": round(r[1], 1), "rps": r[2]} for r in rows],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
