"""Prefix routing in real time, in front of four ``shuniu sim serve`` engines: shuniu's
balancers against ``sglang-router``'s ``cache_aware`` on the same engines and traffic (the
"precise prefix routing" table in docs/benchmarks.md).

The engines are the simulator as separate servers with vLLM's API and metrics (fixed-rate
timing: 20,000 prefill tokens/s, 60 tokens/s per sequence; a KV cache of 20,480 tokens each,
about half of the workload's sixteen ~2,000-token system prompts; 64 sequences at a time),
each tokenizing with the same word-level tokenizer (``--tokenizer``, written here: one token a
word of the load generator's vocabulary, ChatML template) and publishing vLLM's KV events over
ZMQ (``--kv-events-config``). The traffic is ``examples/workloads/shared-prompts-kv-pressure.yaml``
(10 requests/s) at each multiple of ``--loads``, sent by ``shuniu bench`` (open loop, Poisson,
fixed seed, ``ignore_eos``), streamed.

Routers, each in front of four fresh engines (every run starts with empty caches):

- shuniu ``precise_prefix`` (the engines' KV events, the model's tokenizer);
- shuniu ``prefix_affinity`` (its own dispatches only), ``least_load``, ``round_robin``;
- ``sglang-router`` 0.3.2 ``cache_aware`` (default thresholds), a Rust binary from PyPI::

      python -m venv ~/.cache/shuniu/peers && ~/.cache/shuniu/peers/bin/pip install sglang-router==0.3.2

Columns: TTFT p50/p99 seen by the client, the engines' own prefix-cache hit rate
(``vllm:prefix_cache_hits_total`` over ``..._queries_total``, all four; a preempted request is
looked up again when readmitted, so they count it twice), the share of the prompt tokens
each request was served from the cache (the engines' ``cached_tokens`` in each response's
usage, once per request), the engines' preemptions, goodput (requests
with TTFT <= 2 s and time per output token <= 200 ms, the workload's SLO, over those sent)
and whether the run kept the workload's SLO (P99 TTFT <= 2 s).

    python benchmarks/prefix_routing_live.py --loads 2,4,5          # ~30 min on 2 cores
    python benchmarks/prefix_routing_live.py --loads 2 --policies precise_prefix,sglang_cache_aware

Writes benchmarks/results/prefix_routing_live.json (and each run's bench JSON, its requests
one per line with their TTFT and cached tokens, and logs next to it). Everything runs on this
machine: on two cores the engines, the router and the load generator share the CPU, so
compare rows of one run, not runs of different days.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import (  # noqa: E402
    Child,
    Children,
    failed,
    free_port,
    handle_signals,
    machine_ticks,
    proc_cpu_s,
    shuniu_command,
    wait_http_ok,
    wait_serving,
    write_json,
)

from shuniu.backends.http import samples, series_pattern  # noqa: E402
from shuniu.backends.vllm.metrics import parse_vllm_metrics  # noqa: E402
from shuniu.plugins.tools.bench.prompts import VOCABULARY  # noqa: E402

WORKLOAD = ROOT / "examples" / "workloads" / "shared-prompts-kv-pressure.yaml"
RESULTS = ROOT / "benchmarks" / "results"
ENGINES = 4
MODEL = "bench"
ENGINE_ARGS = ["--tokens-per-s", "60", "--kv-cache-tokens", "20480", "--max-num-seqs", "64"]
SLO_TTFT_S = 2.0
SLO_TPOT_MS = 200.0
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SHUNIU_POLICIES = {
    "precise_prefix": "{policy: precise_prefix}",
    "prefix_affinity": "{policy: prefix_affinity}",
    "least_load": "{policy: least_load}",
    "round_robin": "{policy: round_robin}",
}
POLICIES = [*SHUNIU_POLICIES, "sglang_cache_aware"]


def write_tokenizer(out: Path) -> Path:
    """A word-level tokenizer of the load generator's vocabulary with a ChatML template:
    one token a word, as the workload counts them (the engines and shuniu load it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    words = ["<unk>", *VOCABULARY, "system", "user", "assistant"]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "</s>"])
    tok.save(str(out / "tokenizer.json"))
    config = {"eos_token": "</s>", "chat_template": CHATML}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


_PREEMPTIONS = series_pattern(["vllm:num_preemptions_total"])


def engine_counters(port: int) -> tuple[int, int, int]:
    """(prefix-cache queries, hits, preemptions), tokens and requests, from one engine's
    /metrics. A preempted request is looked up again when it is readmitted, mostly finding
    its own blocks: the engines' hit rate then counts it twice."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        page = r.read()
    m = parse_vllm_metrics(page)
    preempted = sum(v for _, _, v in samples(page, _PREEMPTIONS))
    return int(m.prefix_queries or 0), int(m.prefix_hits or 0), int(preempted)


def deployment(policy: str, engines: list[tuple[int, int]], tokenizer: Path, options: str = "") -> str:
    """shuniu's deployment for ``policy`` over the engines (HTTP port, KV-events port), with the
    balancer's ``options`` (a YAML flow mapping's inside, e.g. ``cold_weight: 2``)."""
    precise = policy == "precise_prefix"
    lines = []
    for k, (port, kv) in enumerate(engines):
        lines.append(f"      - kind: vllm\n        name: engine-{k}\n")
        lines.append(f'        options: {{base_url: "http://127.0.0.1:{port}"}}\n')
        if precise:
            lines.append(f'        kv_events: {{endpoint: "tcp://127.0.0.1:{kv}"}}\n')
    balancer = SHUNIU_POLICIES[policy] if not options else f"{{policy: {policy}, options: {{{options}}}}}"
    return (
        "models:\n"
        f"  {MODEL}:\n"
        f"    tokenizer: {json.dumps(str(tokenizer))}\n"
        f"    balancer: {balancer}\n"
        "    health: {interval_s: 1}\n"
        "    load: {interval_s: 0.25}\n"
        "    endpoints:\n" + "".join(lines)
    )


def start_engines(
    children: Children, tokenizer: Path, logs: Path
) -> tuple[list[Child], list[tuple[int, int]]]:
    started, ports = [], []
    for k in range(ENGINES):
        kv = free_port()
        events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{kv}"}
        cmd = [
            *shuniu_command(), "sim", "serve", "--port", "0", "--served-model-name", MODEL,
            "--tokenizer", str(tokenizer), "--kv-events-config", json.dumps(events), *ENGINE_ARGS,
        ]  # fmt: skip
        child = children.start(f"engine-{k}", cmd, logs / f"engine-{k}.log")
        started.append((child, kv))
    for child, kv in started:
        wait_serving(child, 60)
        ports.append((child.port, kv))
    return [c for c, _ in started], ports


def start_router(
    children: Children,
    policy: str,
    engines: list[tuple[int, int]],
    tokenizer: Path,
    logs: Path,
    sglang: str | None,
    options: str = "",
) -> Child:
    if policy == "sglang_cache_aware":
        if sglang is None:
            raise RuntimeError(
                "sglang-router not found: install it (see the module docstring) or pass --sglang-router"
            )
        port = free_port()
        workers = [f"http://127.0.0.1:{p}" for p, _ in engines]
        cmd = [sglang, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware",
               "--worker-urls", *workers, "--log-level", "warn"]  # fmt: skip
        child = children.start("sglang-router", cmd, logs / "router.log")
        child.host, child.port = "127.0.0.1", port
        wait_http_ok(child, f"{child.url}/v1/models", 60)
        return child
    path = logs / "deployment.yaml"
    path.write_text(deployment(policy, engines, tokenizer, options))
    cmd = [*shuniu_command(), "serve", str(path), "--port", "0"]
    child = children.start("shuniu", cmd, logs / "router.log")
    wait_serving(child, 60)
    wait_http_ok(child, f"{child.url}/ready", 60)  # every endpoint probed healthy
    return child


def run_one(
    policy: str,
    load: float,
    seed: int,
    args: argparse.Namespace,
    tokenizer: Path,
    sglang: str | None,
    say: Callable[[str], Any],
) -> dict[str, Any]:
    logs = RESULTS / "prefix_routing_live" / f"{policy}-x{load:g}-seed{seed}"
    logs.mkdir(parents=True, exist_ok=True)
    with Children() as children:
        engine_children, engines = start_engines(children, tokenizer, logs)
        options = args.balancer_options if policy in SHUNIU_POLICIES else ""
        router = start_router(children, policy, engines, tokenizer, logs, sglang, options)
        out = logs / "bench.json"
        cmd = [
            *shuniu_command(), "bench", f"{router.url}/v1", "-m", MODEL, "-w", str(WORKLOAD),
            "--rate-scale", f"{load:g}", "--duration", f"{args.duration:g}", "--seed", str(seed),
            "--ignore-eos", "--slo-ttft-ms", f"{SLO_TTFT_S * 1000:g}", "--slo-tpot-ms", f"{SLO_TPOT_MS:g}",
            "--timeout", "120", "--json", str(out), "--requests-out", str(logs / "requests.jsonl"), "--quiet",
        ]  # fmt: skip
        cpu0 = proc_cpu_s(router.pid)
        engines_cpu0 = sum(proc_cpu_s(c.pid) for c in engine_children)
        ticks0 = machine_ticks()
        bench = children.start("bench", cmd, logs / "bench.log")
        if args.profile and policy in SHUNIU_POLICIES:
            # The gateway's collapsed stacks over the run, for a flame graph (py-spy, PyPI).
            spy = str(Path(sys.executable).with_name("py-spy"))
            record = [spy, "record", "-p", str(router.pid), "-d", f"{args.duration:.0f}", "-r", "200",
                      "-f", "raw", "-o", str(logs / "profile.txt")]  # fmt: skip
            children.start("py-spy", record, logs / "py-spy.log")
        code = children.wait(bench, args.duration + 300)
        router_cpu = proc_cpu_s(router.pid) - cpu0
        engines_cpu = sum(proc_cpu_s(c.pid) for c in engine_children) - engines_cpu0
        ticks1 = machine_ticks()
        if code != 0:
            raise RuntimeError(f"shuniu bench exited with {code}:\n{bench.log_tail()}")
        queries = hits = preemptions = 0
        for port, _ in engines:
            q, h, p = engine_counters(port)
            queries, hits, preemptions = queries + q, hits + h, preemptions + p
    s = json.loads(out.read_text())
    # What each request was served from the cache, as the engine told its client (usage's
    # cached_tokens): counted once per request, whatever the engines readmitted.
    served_cached = served_prompt = 0
    for line in (logs / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        if not r.get("error"):
            served_cached += r.get("cached_tokens") or 0
            served_prompt += r.get("prompt_tokens") or 0
    ttft = s["ttft_ms"]
    done = s["requests"]["succeeded"]
    row = {
        "policy": policy,
        "load": load,
        "seed": seed,
        "offered_rps": s["offered_rate"],
        "succeeded": done,
        "failed": s["requests"]["failed"],
        "ttft_p50_s": (ttft["p50"] or 0) / 1000,
        "ttft_p99_s": (ttft["p99"] or 0) / 1000,
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "preemptions": preemptions,
        "served_cached_tokens": served_cached,
        "served_prompt_tokens": served_prompt,
        "served_share": served_cached / served_prompt if served_prompt else 0.0,
        "goodput": s["goodput"]["share"] if s["goodput"] else None,
        "router_cpu_ms_per_request": 1000 * router_cpu / done if done else None,
        "engines_cpu_ms_per_request": 1000 * engines_cpu / done if done else None,
        "machine_busy": (ticks1.busy - ticks0.busy) / (ticks1.total - ticks0.total),
        "client_bottleneck": s["client"]["bottleneck"],
    }
    row["slo_met"] = row["ttft_p99_s"] <= SLO_TTFT_S and row["failed"] == 0
    say(
        f"{policy} x{load:g} seed {seed}: TTFT p50 {row['ttft_p50_s']:.2f} s p99 {row['ttft_p99_s']:.2f} s, "
        f"hits {row['prefix_hit_rate']:.1%}, goodput {row['goodput']:.1%}; "
        f"machine {row['machine_busy']:.0%} busy"
    )
    return row


def med(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] or 0.0 for r in runs))


def summarize(
    rows: list[dict[str, Any]], policies: list[str]
) -> list[tuple[float, str, list[dict[str, Any]]]]:
    """(load, policy, its runs over the seeds), by load then policy."""
    groups: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["load"], r["policy"]), []).append(r)
    keys = sorted(groups, key=lambda k: (k[0], policies.index(k[1])))
    return [(load, policy, groups[(load, policy)]) for load, policy in keys]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--loads", default="2,4,5", help="Multiples of the workload's 10 requests/s.")
    ap.add_argument("--duration", type=float, default=90.0, help="Seconds of load per run.")
    ap.add_argument("--seeds", default="0", help="Traffic seeds (each load and router runs each).")
    ap.add_argument("--sglang-router", default=None, help="The sglang-router program.")
    ap.add_argument(
        "--balancer-options",
        default="",
        help="Options for shuniu's balancers, as the inside of a YAML mapping (e.g. 'cold_weight: 2').",
    )
    ap.add_argument("--profile", action="store_true", help="Record shuniu under py-spy (profile.txt).")
    ap.add_argument("--out", type=Path, default=RESULTS / "prefix_routing_live.json")
    args = ap.parse_args()
    handle_signals()
    console = Console()
    say = console.print
    sglang = args.sglang_router or shutil.which("sglang-router")
    peers = Path(os.path.expanduser("~/.cache/shuniu/peers/bin/sglang-router"))
    if sglang is None and peers.exists():
        sglang = str(peers)
    tokenizer = write_tokenizer(RESULTS / "prefix_routing_live" / "tokenizer")
    policies = args.policies.split(",")
    rows: list[dict[str, Any]] = []
    try:
        runs = [
            (load, int(seed))
            for load in (float(x) for x in args.loads.split(","))
            for seed in args.seeds.split(",")
        ]
        for n, (load, seed) in enumerate(runs):
            # Alternate the order from one round to the next: the machine's speed drifts.
            for policy in policies if n % 2 == 0 else policies[::-1]:
                rows.append(run_one(policy, load, seed, args, tokenizer, sglang, say))
                write_json(
                    args.out,
                    {"rows": rows, "started": time.time(), "args": vars(args) | {"out": str(args.out)}},
                )
    except (KeyboardInterrupt, RuntimeError) as exc:
        return failed(say, exc)
    table = Table(
        title="Prefix routing in front of 4 shuniu sim serve engines (real time; medians over seeds)"
    )
    cols = ("policy", "load", "req/s", "TTFT p50", "TTFT p99", "worst p99", "prefix hits", "served",
            "preempted", "goodput", "SLO kept", "router CPU/req")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for load, policy, runs in summarize(rows, policies):
        table.add_row(
            policy, f"x{load:g}", f"{med(runs, 'offered_rps'):.1f}", f"{med(runs, 'ttft_p50_s'):.3f} s",
            f"{med(runs, 'ttft_p99_s'):.2f} s", f"{max(r['ttft_p99_s'] for r in runs):.2f} s",
            f"{med(runs, 'prefix_hit_rate'):.2%}", f"{med(runs, 'served_share'):.3%}",
            f"{med(runs, 'preemptions'):.0f}", f"{med(runs, 'goodput'):.1%}",
            f"{sum(r['slo_met'] for r in runs)}/{len(runs)}",
            f"{med(runs, 'router_cpu_ms_per_request'):.1f} ms",
        )  # fmt: skip
    console.print(table)
    if any(r["client_bottleneck"] for r in rows):
        say("[yellow]the load generator fell behind in some runs (see their bench.json)[/yellow]")
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
