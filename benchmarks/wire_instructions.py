"""Instructions per request of a shuniu gateway on the wire: the process under valgrind's
cachegrind, the same c=1 load at two lengths, and the difference divided by the requests
between them. Start-up, warm-up and shutdown cancel out, and the count does not move with
the machine's speed (time on these shared 2-core machines drifts by ±20% between rounds,
which hides any change worth less): the measure to judge a change to the request path by.

Usage::

    python benchmarks/wire_instructions.py                                  # minimal and full
    python benchmarks/wire_instructions.py --targets full --baseline ../old-tree
    python benchmarks/wire_instructions.py --requests 300,1300 --stream
    python benchmarks/wire_instructions.py --targets full --profile 40      # where they go
    python benchmarks/wire_instructions.py --cache-sim                      # and cache misses

``--cache-sim`` also counts, per request, the misses of cachegrind's model of this machine's
caches (first-level instruction and data, last level): a change in time that the
instructions do not explain may show there (several times slower under valgrind).

``--profile N`` also prints, for each target, the N functions that spent the most
instructions per request (``cg_diff`` of the two lengths' per-function counts, read with
``cg_annotate``): compiled modules show as their own C functions (``CPyDef_...``), the
interpreter's work as ``_PyEval_EvalFrameDefault`` and the C functions it calls.

Targets are ``benchmarks/peers.py``'s shuniu deployments (``minimal``, ``full``, ``aiohttp``;
``redis`` needs a ``redis-server``, which this script does not start) in front of the
instant upstream. ``PYTHONHASHSEED=0`` keeps string hashing, and so the count, the same from
run to run (two runs of one tree agree to ~0.1%). Needs ``valgrind`` (``apt-get install -y
valgrind``); each target takes about a minute.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import Children, failed, handle_signals, run_loadgen, wait_http_ok, wait_serving
from peers import MODEL, baseline_path, deployment
from rich.console import Console
from rich.table import Table

from shuniu.plugins.auth.api_keys import new_key

HERE = Path(__file__).resolve().parent
console = Console()
_COUNTERS = re.compile(r"==\d+== (I|I1|LLi|D|D1|LLd|LL)\s+(refs|misses):\s+([\d,]+)")
"""A total of cachegrind's summary: ``I refs`` (instructions), and with the cache model the
misses of each level (``D refs`` and ``D1 misses`` also split into reads and writes)."""
CACHE_COLUMNS = ("I1 misses", "D1 misses", "LL misses")
"""The misses ``--cache-sim`` reports per request."""


def instructions(
    children: Children, tmpdir: Path, target: str, upstream_port: int, key: str, requests: int,
    stream: bool, baseline: str | None, keep: Path | None = None, cache_sim: bool = False,
) -> dict[str, int]:  # fmt: skip
    """The gateway process's totals over its whole life, serving ``requests`` c=1 requests
    (after 50 of warm-up): ``I refs`` (instructions), and with ``cache_sim`` the misses of
    each cache (``I1 misses``, ``D1 misses``, ``LL misses``, ...); ``keep``: where cachegrind
    writes its per-function counts (else nowhere)."""
    label = f"{target}@base" if baseline else target
    config = tmpdir / f"{label}.yaml"
    config.write_text(deployment(target, upstream_port, key, "redis://127.0.0.1:6379"))
    log = tmpdir / f"{label}-{requests}.valgrind"
    env = {"PYTHONHASHSEED": "0", **({"PYTHONPATH": baseline} if baseline else {})}
    shuniu = str(Path(sys.executable).with_name("shuniu"))
    sim, out_file = "yes" if cache_sim else "no", keep or "/dev/null"
    cmd = ["valgrind", "--tool=cachegrind", f"--cache-sim={sim}", f"--cachegrind-out-file={out_file}",
           f"--log-file={log}", shuniu, "serve", str(config)]  # fmt: skip
    out = tmpdir / f"{label}-{requests}.log"
    child = children.start(f"{label} under valgrind", cmd, out, env=env, grace=120)
    wait_serving(child, 300)
    wait_http_ok(child, f"{child.url}/ready", 300)
    headers = ["--header", f"Authorization:Bearer {key}"] if target in ("full", "redis") else []
    args = ["latency", f"{child.url}/v1", "--requests", str(requests), "--warmup", "50",
            "--max-seconds", "900", "--model", MODEL, "--engine", "python", *headers,
            *(["--stream"] if stream else [])]  # fmt: skip
    run_loadgen(children, tmpdir, f"{label} x{requests}", args, 1200)
    children.stop(child)  # SIGTERM: the gateway drains and exits, valgrind writes its totals
    totals = {
        f"{m[1]} {m[2]}": int(m[3].replace(",", ""))
        for m in _COUNTERS.finditer(log.read_text(errors="replace"))
    }
    if "I refs" not in totals:
        raise RuntimeError(f"no instruction count in {log} (did {label} exit cleanly?)")
    return totals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="minimal,full", help="comma-separated: minimal, full, aiohttp")
    ap.add_argument("--requests", default="300,1300", help="the two load lengths, c=1 requests")
    ap.add_argument("--stream", action="store_true", help="streamed requests")
    ap.add_argument("--baseline", type=Path, help="also count every target on this source tree")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print the N functions spending the most instructions per request")  # fmt: skip
    ap.add_argument("--cache-sim", action="store_true", help="also count cache misses per request (slower)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        console.print("[red]valgrind is not installed[/] (apt-get install -y valgrind)")
        return 2
    short, long = (int(n) for n in args.requests.split(","))
    if long <= short:
        console.print("[red]--requests: the second length must be the larger[/]")
        return 2
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    handle_signals()
    key = new_key()
    results: dict[str, float] = {}
    misses: dict[str, dict[str, float]] = {}
    profiles: dict[str, str] = {}
    with Children() as children, tempfile.TemporaryDirectory(prefix="shuniu-wire-") as tmp:
        tmpdir = Path(tmp)
        try:
            baseline = baseline_path(args.baseline, tmpdir) if args.baseline else None
            up = [sys.executable, str(HERE / "instant_upstream.py"), "--port", "0"]
            upstream = children.start("upstream", up, tmpdir / "up.log")
            wait_serving(upstream, 30)
            trees = [("", None)] + ([("@base", baseline)] if baseline else [])
            with console.status("counting") as status:
                for target in targets:
                    for suffix, tree in trees:
                        counts = []
                        kept = [tmpdir / f"{target}{suffix}-{n}.cg" for n in (short, long)]
                        for n, keep in zip((short, long), kept, strict=True):
                            status.update(f"{target}{suffix}: {n} requests under valgrind")
                            out = keep if args.profile else None
                            counts.append(instructions(children, tmpdir, target, upstream.port, key, n,
                                                       args.stream, tree, out, args.cache_sim))  # fmt: skip
                        per = {k: (counts[1][k] - counts[0].get(k, 0)) / (long - short) for k in counts[1]}
                        results[target + suffix] = per["I refs"]
                        misses[target + suffix] = {k: per.get(k, float("nan")) for k in CACHE_COLUMNS}
                        if args.profile:
                            profiles[target + suffix] = top_functions(*kept, long - short, args.profile)
        except (KeyboardInterrupt, RuntimeError) as exc:
            return failed(console.print, exc)
    kind = "streamed" if args.stream else "whole"
    table = Table(title=f"Instructions per request on the wire ({kind} answers, c=1)")
    table.add_column("target")
    table.add_column("instructions", justify="right")
    table.add_column("vs minimal", justify="right")
    table.add_column("vs its @base", justify="right")
    for column in CACHE_COLUMNS if args.cache_sim else ():
        table.add_column(column, justify="right")
    for name, count in results.items():
        plain = name.removesuffix("@base")
        ref = results.get("minimal" + name[len(plain) :])
        base = results.get(name + "@base")
        table.add_row(
            name,
            f"{count / 1000:,.1f} k",
            f"{ref / count:.3f}" if ref and name != "minimal" and plain != "minimal" else "",
            f"{count / base:.3f}" if base else "",
            *([f"{v:,.0f}" for v in misses[name].values()] if args.cache_sim else []),
        )
    console.print(table)
    console.print(
        "vs minimal: minimal's count over this one's (its requests/s ratio, if time were instructions)"
    )
    for name, text in profiles.items():
        console.print(f"\n[bold]{name}[/]: instructions per request by function", highlight=False)
        print(text)  # plain: rich would wrap the long names
    return 0


_ROW = re.compile(r"^\s*(-?[\d,]+)\s+(?:\(\s*[-\d.]+%\)\s+)?(\S.*)$")
"""A row of ``cg_annotate``'s function table: the count (with a share in 3.21 and later)."""


def top_functions(short: Path, long: Path, requests: int, n: int) -> str:
    """The ``n`` functions with the most instructions per request between two runs'
    per-function counts (``cg_diff`` long minus short, divided by the requests between)."""
    diff = short.with_suffix(".diff")
    with diff.open("w") as out_file:
        subprocess.run(["cg_diff", str(short), str(long)], stdout=out_file, check=True)
    out = subprocess.run(["cg_annotate", "--auto=no", "--threshold=0", str(diff)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    rows: list[tuple[int, str]] = []
    for line in out.splitlines():
        found = _ROW.match(line)
        if found and ":" in found.group(2):
            where = found.group(2).strip()
            source, _, function = where.rpartition(":")
            rows.append((int(found.group(1).replace(",", "")), f"{function}  ({Path(source).name})"))
    rows.sort(key=lambda row: -row[0])
    return "\n".join(f"{count / requests:10,.0f}  {where}" for count, where in rows[:n])


if __name__ == "__main__":
    sys.exit(main())
