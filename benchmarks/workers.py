"""Requests/s and streamed chunks/s of one gateway with 1 and with N worker processes, in
front of the instant upstream, in alternating rounds of ``shuniu bench`` (closed loop).

    python benchmarks/workers.py [--workers 2] [--rounds 2] [--duration 8] [--concurrency 64]

Every process shares this machine's cores: the client, the upstream and the gateway's
workers. Prints a table and, with ``--json``, writes the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from harness import ROOT, Children, handle_signals, shuniu_command, wait_http_ok, wait_serving

DEPLOYMENT = """
gateway:
  host: 127.0.0.1
  port: 0
  workers: {workers}
models:
  bench:
    endpoints:
      - kind: openai
        options: {{base_url: "{upstream}/v1", model: bench}}
"""


def bench(url: str, *, stream: bool, concurrency: int, duration: float, out: Path) -> dict[str, float]:
    import subprocess

    cmd = [*shuniu_command(), "bench", f"{url}/v1", "-m", "bench", "-c", str(concurrency)]
    cmd += ["--duration", str(duration), "--warmup", "2", "--prompt-tokens", "16", "--output-tokens", "16"]
    cmd += ["--stream" if stream else "--no-stream", "--json", str(out), "--quiet"]
    subprocess.run(cmd, check=True, timeout=duration + 120)
    s = json.loads(out.read_text())
    return {
        "rps": s["qps"],
        "chunks_per_s": s["output_tokens_per_s"] if stream else 0.0,
        "p50_ms": s["e2e_ms"]["p50"],
        "failed": s["requests"]["failed"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    handle_signals()
    work = Path(tempfile.mkdtemp(prefix="shuniu-workers-bench-"))
    results: dict[str, list[dict[str, float]]] = {}
    with Children() as children:
        upstream = children.start(
            "upstream",
            [sys.executable, str(ROOT / "benchmarks" / "instant_upstream.py"), "--port", "0"],
            work / "up.log",
        )
        wait_serving(upstream, 30)
        gateways = {}
        for n in (1, args.workers):
            path = work / f"gw-{n}.yaml"
            path.write_text(DEPLOYMENT.format(workers=n, upstream=upstream.url))
            child = children.start(
                f"gateway-{n}", [*shuniu_command(), "serve", str(path)], work / f"gw-{n}.log"
            )
            wait_serving(child, 60)
            wait_http_ok(child, f"{child.url}/ready", 60)
            gateways[n] = child
        for r in range(args.rounds):
            for n, child in gateways.items():
                for stream in (False, True):
                    key = f"{n} worker{'s' if n > 1 else ''}, {'streamed' if stream else 'not streamed'}"
                    out = work / f"r{r}-{n}-{stream}.json"
                    figures = bench(
                        child.url,
                        stream=stream,
                        concurrency=args.concurrency,
                        duration=args.duration,
                        out=out,
                    )
                    results.setdefault(key, []).append(figures)
                    print(f"round {r + 1}: {key}: {figures}", flush=True)
    print()
    print(f"{'configuration':32} {'requests/s':>12} {'chunks/s':>12} {'p50 ms':>8}")
    for key, runs in results.items():
        rps = sum(x["rps"] for x in runs) / len(runs)
        chunks = sum(x["chunks_per_s"] for x in runs) / len(runs)
        p50 = sum(x["p50_ms"] for x in runs) / len(runs)
        print(f"{key:32} {rps:12,.0f} {chunks:12,.0f} {p50:8.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
