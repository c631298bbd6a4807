"""The shipped GPU and NPU profiles against published serving numbers: each case is simulated
(``shuniu simulate`` on one replica) the way its source measured it, and the table gives the
simulated figure, the published one and the error.

Usage::

    .venv/bin/python benchmarks/profile_check.py             # every case, about 90 s on 2 cores
    .venv/bin/python benchmarks/profile_check.py --only h200

Sources (read, not copied; figures as published):

- TensorRT-LLM ``docs/source/performance/perf-overview.md``, the v0.17 table: maximum
  throughput (output tokens/s) of ``trtllm-bench`` with fixed input/output lengths and
  enough requests to saturate the engine. FP8 weights and KV on H100/H200, FP16 on A100.
  TensorRT-LLM is faster than vLLM at the same settings, so a vLLM-like profile is expected
  to land somewhat below it (the table reports the gap; 15% is the bar).
- vllm-ascend issue #776 (v0.7.3 on an Atlas A2 910B): Qwen2.5-7B, TP 1, ShareGPT at 1
  request/s: mean TTFT 97.9 ms and TPOT 36.5 ms. ShareGPT is approximated here by
  log-normal lengths of its published means (about 220 prompt and 200 output tokens).
- vllm-ascend ``docs/source/developer_guide/performance/performance_benchmark.md`` (the
  sample output, written with vllm-ascend v0.8.4rc2 in April 2025, PR #635; dummy weights):
  Llama-3.1-8B-Instruct, TP 1, 200 ShareGPT prompts at 1, 4 and 16 requests/s: mean TTFT
  104.1 / 115.6 / 128.5 ms, TPOT 38.8 / 51.5 / 83.6 ms. NPU variant not stated.
- vllm-ascend PR #4526 (Dec 2025, vLLM v0.12.0, aclgraph, the baseline rows): Qwen3-32B on
  910B3, TP 8, one client: TPOT 16.75 ms. The input length is not given; the output is
  about 512 tokens (from its throughput); simulated as 512 in / 512 out.
- vllm-ascend PR #6323 (v0.13.0rc1 image, ``tutorials/suffix_speculative_decoding.md``, the
  runs without speculation): Qwen3-32B on "Atlas 800T A2", TP 4, ShareGPT (mean 666 in / 231
  out) with one client: TPOT 54.1 ms.
- GPUStack performance lab (``docs/performance-lab/qwen3-8b/910b.md`` and ``h100-latency.md``,
  ShareGPT, 100 prompts, defaults): Qwen3-8B on one 910B with vllm-ascend 0.9.1, 4 clients:
  TTFT 145.9 ms, TPOT 47.3 ms; on one H100 SXM with vLLM 0.11.0, 1 and 4 clients: TTFT
  59.0 / 64.0 ms, TPOT 7.28 / 7.38 ms.

- SGLang ``benchmark/benchmark_vllm_060/README.md`` (Sept 2024): vLLM 0.6.0 and SGLang 0.3.0
  with their commands published, ShareGPT through ``sglang.bench_serving``: Llama-3.1-8B on
  one A100 80GB and Llama-3.1-70B on four H100s (TP 4); 5,000 prompts at once (output
  tokens/s: 8B 4,132.37 / 4,281.51, 70B 3,700.64 / 3,856.01) and Poisson arrivals at 4 and 8
  requests/s (1,200 and 2,400 prompts; median TPOT 8B 14.14 / 13.17 and 17.09 / 17.85 ms,
  70B 23.58 / 25.03 and 29.15 / 33.07 ms, vLLM / SGLang). About 194 output tokens per
  request (its offline output tokens over requests); the prompt mean is taken as 220.
- vLLM blog, "The State of FP8 KV-Cache and Attention Quantization in vLLM" (v0.19.1), Table
  4, BF16 KV: Llama-3.1-8B on one H100, 150 requests of about 20k prompt and 2k output tokens
  at concurrency 8: median ITL 15.18 ms, 450.3 output tokens/s.
- GPUStack performance lab, the same Qwen3-8B page: MindIE 2.1RC1 on one 910B, 1,000
  ShareGPT prompts at once: 2,711.10 output tokens/s.

Each case counts against the profile of the execution mode its source ran (graph or eager);
the other mode's profile is printed below the count, for contrast. The eager-era
vllm-ascend sources (v0.7.3, v0.8.4rc2) ran vLLM's V0 engine (V1 needed ``VLLM_USE_V1=1``
before v0.9.0rc2) and are simulated with its scheduling (``prefill_first``, no chunked
prefill).

TTFTs include the profile's serving front end (``frontend_ms``, the ``sim`` endpoint's
default ``ttft_ms``), as the published ones include the engine's. The gateway's adaptive
concurrency limit is off: the sources measured bare engines.

Closed-loop cases (a number of clients, each sending its next request when the last one
ends, as ``--max-concurrency`` runs) drive one simulated engine directly with ShareGPT-like
lengths drawn from a seeded stream; open-loop and burst cases go through ``shuniu simulate``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import random
import statistics
import textwrap
from dataclasses import dataclass

from shuniu.core.config.loader import load_deployment
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.traffic import load_workload
from shuniu.plugins.tools.simulate import simulate

TRT = "TensorRT-LLM perf-overview v0.17"
ASCEND = "vllm-ascend #776 (v0.7.3)"
ASCEND_GUIDE = "vllm-ascend benchmark guide (v0.8.4rc2)"
ASCEND_4526 = "vllm-ascend #4526 (v0.12, aclgraph)"
ASCEND_6323 = "vllm-ascend #6323 (v0.13.0rc1)"
GPUSTACK_910B = "GPUStack lab (vllm-ascend 0.9.1)"
GPUSTACK_H100 = "GPUStack lab (vLLM 0.11.0)"
SGLANG_VLLM060 = "SGLang benchmark_vllm_060, vLLM 0.6.0"
SGLANG_030 = "SGLang benchmark_vllm_060, SGLang 0.3.0"
VLLM_FP8KV = "vLLM blog, FP8 KV cache (v0.19.1)"
GPUSTACK_MINDIE = "GPUStack lab (MindIE 2.1RC1)"
SHAREGPT_SIGMA = 0.9  # log-space spread of ShareGPT-like lengths


@dataclass
class Case:
    hardware: str
    model: str
    tp: int
    metric: str
    """``throughput`` (output tokens/s at saturation, or of a closed loop), ``ttft_mean``,
    ``tpot_mean`` or ``tpot_median`` (s)."""
    published: float
    source: str
    input_tokens: int = 0
    output_tokens: int = 0
    rate: float = 0.0
    """Requests/s of an open-loop case (0: a saturating burst, or a closed loop)."""
    clients: int = 0
    """Clients of a closed-loop case (0: not one)."""
    sharegpt: tuple[float, float] = (220.0, 200.0)
    """Mean prompt and output lengths of ShareGPT-like requests (log-normal, ``SHAREGPT_SIGMA``)."""
    requests: int = 0
    """Requests of an open-loop case or a burst, as its source sent them (0: 300 s of
    arrivals; a burst of 3,000; a closed loop of 100)."""
    v0: bool = False
    """The source's engine scheduled as vLLM's V0 engine does (prefills first, in iterations
    of their own, no chunked prefill): the simulated engine runs with ``prefill_first``."""
    counted: bool = True
    """False: the profile of the other execution mode than the source's engine ran (graph or
    eager), shown for contrast and not counted."""
    max_num_seqs: int = 1024
    """The engine's batch limit (1024 for the maximum-throughput tables, which size their
    batches from the KV cache; an engine's default where its source ran the default)."""

    @property
    def name(self) -> str:
        shape = f"{self.input_tokens}/{self.output_tokens}" if self.input_tokens else "ShareGPT"
        load = f", {self.rate:g} req/s" if self.rate else f", c={self.clients}" if self.clients else ""
        return f"{self.model} TP{self.tp} on {self.hardware}, {shape}{load}"


CASES = [
    *(
        Case(hw, "llama-3.1-8b@fp8,kv=fp8", 1, "throughput", value, TRT, isl, osl)
        for hw, values in (
            ("h100-sxm", (28837, 21109, 15245, 3557, 9488)),
            ("h200", (29526, 25399, 17538, 3794, 11969)),
        )
        for (isl, osl), value in zip(
            ((128, 128), (128, 2048), (1000, 1000), (2048, 128), (2048, 2048)), values, strict=True
        )
    ),
    *(
        Case("a100-80gb", "llama-3.1-8b", 1, "throughput", value, TRT, isl, osl)
        for (isl, osl), value in zip(
            ((128, 128), (128, 2048), (1000, 1000), (2048, 128), (2048, 2048)),
            (6627, 5256, 3787, 800, 2424),
            strict=True,
        )
    ),
    Case("h100-sxm", "llama-3.1-70b@fp8,kv=fp8", 2, "throughput", 4391, TRT, 1000, 1000),
    Case("h100-sxm", "llama-3.1-70b@fp8,kv=fp8", 4, "throughput", 7431, TRT, 1000, 1000),
    Case("h200", "llama-3.1-70b@fp8,kv=fp8", 1, "throughput", 2823, TRT, 1000, 1000),
    Case("h200", "llama-3.1-70b@fp8,kv=fp8", 2, "throughput", 5165, TRT, 1000, 1000),
    Case("h200", "llama-3.1-70b@fp8,kv=fp8", 4, "throughput", 8911, TRT, 1000, 1000),
    # Eager-era vllm-ascend (before v0.9.0rc2, whose release notes first recommend the V1
    # engine and still need VLLM_USE_V1=1 for it): the V0 engine, eager mode.
    *(
        Case(hw, "qwen2.5-7b", 1, metric, value, ASCEND, rate=1.0, v0=True, counted=hw.endswith("eager"))
        for hw in ("ascend-910b", "ascend-910b-eager")
        for metric, value in (("ttft_mean", 0.0979), ("tpot_mean", 0.0365))
    ),
    *(
        Case(
            hw,
            "llama-3.1-8b",
            1,
            metric,
            value,
            ASCEND_GUIDE,
            rate=rate,
            requests=200,
            v0=True,
            counted=hw.endswith("eager"),
        )
        for hw in ("ascend-910b", "ascend-910b-eager")
        for rate, ttft, tpot in ((1.0, 0.1041, 0.0388), (4.0, 0.1156, 0.0515), (16.0, 0.1285, 0.0836))
        for metric, value in (("ttft_mean", ttft), ("tpot_mean", tpot))
    ),
    Case("ascend-910b", "qwen3-32b", 8, "tpot_mean", 0.01675, ASCEND_4526, 512, 512, clients=1),
    # v0.13 runs graph mode by default; the figure is closer to the eager profile (a
    # disagreeing source, docs/simulator.md).
    *(
        Case(
            hw,
            "qwen3-32b",
            4,
            "tpot_mean",
            0.0541,
            ASCEND_6323,
            clients=1,
            sharegpt=(666.0, 231.0),
            counted=not hw.endswith("eager"),
        )
        for hw in ("ascend-910b", "ascend-910b-eager")
    ),
    # Taken as eager (its TPOT is; the lab does not say).
    *(
        Case(hw, "qwen3-8b", 1, metric, value, GPUSTACK_910B, clients=4, counted=hw.endswith("eager"))
        for hw in ("ascend-910b", "ascend-910b-eager")
        for metric, value in (("ttft_mean", 0.1459), ("tpot_mean", 0.0473))
    ),
    *(
        Case("h100-sxm", "qwen3-8b", 1, metric, value, GPUSTACK_H100, clients=clients)
        for clients, ttft, tpot in ((1, 0.0590, 0.00728), (4, 0.0640, 0.00738))
        for metric, value in (("ttft_mean", ttft), ("tpot_mean", tpot))
    ),
    # SGLang's benchmark_vllm_060 README: ShareGPT through sglang.bench_serving, vLLM 0.6.0
    # (V0, --num-scheduler-steps 10, default max_num_seqs 256, no chunked prefill at
    # max_model_len 4096) and SGLang 0.3.0 (which runs prefill batches apart from decode
    # batches, as V0 does); offline: 5,000 prompts at once; online: Poisson arrivals, the
    # median TPOT. About 194 output tokens per request (its offline tokens / requests).
    *(
        Case(
            hw,
            model,
            tp,
            "throughput",
            value,
            source,
            requests=5000,
            sharegpt=(220.0, 194.0),
            v0=True,
            max_num_seqs=256,
        )
        for hw, model, tp, values in (
            ("a100-80gb", "llama-3.1-8b", 1, (4132.37, 4281.51)),
            ("h100-sxm", "llama-3.1-70b", 4, (3700.64, 3856.01)),
        )
        for source, value in zip((SGLANG_VLLM060, SGLANG_030), values, strict=True)
    ),
    *(
        Case(
            hw,
            model,
            tp,
            "tpot_median",
            value,
            source,
            rate=rate,
            requests=300 * int(rate),
            sharegpt=(220.0, 194.0),
            v0=True,
            max_num_seqs=256,
        )
        for hw, model, tp, rows in (
            ("a100-80gb", "llama-3.1-8b", 1, ((4.0, 0.01414, 0.01317), (8.0, 0.01709, 0.01785))),
            ("h100-sxm", "llama-3.1-70b", 4, ((4.0, 0.02358, 0.02503), (8.0, 0.02915, 0.03307))),
        )
        for rate, vllm, sglang in rows
        for source, value in ((SGLANG_VLLM060, vllm), (SGLANG_030, sglang))
    ),
    # GPUStack's Qwen3-8B page also runs MindIE 2.1RC1 on one 910B: 1,000 ShareGPT prompts at
    # once (about 217 prompt and 201 output tokens each), 2,711 output tokens/s. MindIE runs
    # graph mode; its batch limit is not stated: 200 is taken (256 or 1,024 give 2% and 5%
    # less).
    Case(
        "ascend-910b",
        "qwen3-8b",
        1,
        "throughput",
        2711.10,
        GPUSTACK_MINDIE,
        requests=1000,
        sharegpt=(217.0, 201.0),
        max_num_seqs=200,
    ),
    # vLLM's FP8 KV-cache post, Table 4 (BF16 KV): Llama-3.1-8B BF16 on one H100, 150
    # requests of ~20k prompt and ~2k output tokens at concurrency 8: median ITL 15.18 ms,
    # 450.3 output tokens/s.
    *(
        Case("h100-sxm", "llama-3.1-8b", 1, metric, value, VLLM_FP8KV, 20000, 2000, clients=8, requests=150)
        for metric, value in (("tpot_median", 0.01518), ("throughput", 450.3))
    ),
]


def closed_loop(case: Case) -> float:
    """``case.requests`` (100) requests from ``case.clients`` clients against one simulated
    engine, in virtual time; the mean TTFT or TPOT, the median TPOT (s) or the output
    tokens/s."""
    requests = case.requests or 100
    from shuniu.backends.sim.build import build_engine
    from shuniu.backends.sim.engine import Seq
    from shuniu.backends.sim.options import SimOptions
    from shuniu.core.traffic import synthetic_ids
    from shuniu.plugins.tools.simulate import run_virtual

    options = SimOptions(
        hardware=case.hardware,
        model=case.model,
        tensor_parallel_size=case.tp,
        max_num_seqs=case.max_num_seqs,
        max_num_batched_tokens=8192,
        max_model_len=max(8192, case.input_tokens + case.output_tokens + 16),
        enable_chunked_prefill=not case.v0,
        prefill_first=case.v0,
    )
    engine = build_engine(options).engine
    rng = random.Random(0)
    ttfts: list[float] = []
    tpots: list[float] = []
    numbers = itertools.count()

    def length(mean: float, cap: int) -> int:
        # log-normal with this mean (median = mean / exp(sigma^2 / 2))
        median = mean / math.exp(SHAREGPT_SIGMA**2 / 2)
        return max(4, min(cap, round(rng.lognormvariate(0.0, SHAREGPT_SIGMA) * median)))

    async def client() -> None:
        loop = asyncio.get_running_loop()
        while (i := next(numbers)) < requests:
            if case.input_tokens:
                prompt, output = case.input_tokens, case.output_tokens
            else:
                prompt, output = length(case.sharegpt[0], 4000), length(case.sharegpt[1], 2000)
            seq = Seq(str(i), synthetic_ids(i + 1, prompt), output, output_seed=i, arrival=loop.time())
            seq.done = loop.create_future()
            engine.submit(seq)
            await seq.done
            assert seq.first_token_at is not None and seq.finished_at is not None
            ttfts.append(seq.first_token_at - seq.arrival)
            if output > 1:
                tpots.append((seq.finished_at - seq.first_token_at) / (output - 1))

    async def main() -> float:
        await asyncio.gather(*(client() for _ in range(case.clients)))
        await engine.stop()
        return asyncio.get_running_loop().time()

    elapsed = run_virtual(main())
    if case.metric == "throughput":
        return engine.load().generated_tokens / elapsed
    if case.metric == "tpot_median":
        return statistics.median(tpots)
    values = ttfts if case.metric == "ttft_mean" else tpots
    return sum(values) / len(values)


def run(case: Case, plugins) -> float:  # type: ignore[no-untyped-def]
    if case.clients:
        return closed_loop(case)
    options = (
        f"{{hardware: {case.hardware}, model: '{case.model}', tensor_parallel_size: {case.tp}, "
        f"max_num_seqs: {case.max_num_seqs}, max_num_batched_tokens: 8192, max_model_len: 8192"
        + (", enable_chunked_prefill: false, prefill_first: true}" if case.v0 else "}")
    )
    text = textwrap.dedent(
        f"""
        models:
          m:
            load: {{adaptive_concurrency: false}}  # the engine as its source ran it: no gateway
            endpoints:
              - kind: sim
                max_concurrency: 0
                options: {options}
        """
    )
    resolved = load_deployment(None, plugins, text=text)
    prompt, output = case.sharegpt
    spread = f"sigma: {SHAREGPT_SIGMA}, min: 4"
    sharegpt = (
        f"input_tokens: {{dist: lognormal, mean: {prompt:g}, {spread}, max: 4000}}, "
        f"output_tokens: {{dist: lognormal, mean: {output:g}, {spread}, max: 2000}}"
    )
    if case.rate:  # open loop, ShareGPT-like lengths
        stream = f"{{arrival: {{rate: {case.rate}}}, {sharegpt}}}"
        duration = case.requests / case.rate if case.requests else 300.0
    else:  # a burst that keeps the engine saturated for the whole run
        if case.input_tokens:
            lengths = f"input_tokens: {case.input_tokens}, output_tokens: {case.output_tokens}"
        else:
            lengths = sharegpt
        stream = "{arrival: {rate: 1000}, " + lengths + "}"
        duration = (case.requests or 3000) / 1000  # 3,000 requests (or the source's) at once
    workload = load_workload("w", text=f"name: w\nduration_s: {duration}\nstreams:\n  - {stream}\n")
    result = simulate(resolved, plugins, workload, duration=duration, seed=0)
    if case.metric == "throughput":
        return result.generated_tokens / result.sim_time_s
    if case.metric == "ttft_mean":
        return result.ttft.mean()
    if case.metric == "tpot_median":
        return result.tpot.quantile(0.5)
    return result.tpot.mean()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="only cases whose name contains this")
    args = ap.parse_args()
    plugins = load_plugins()
    rows = []
    chosen = [c for c in CASES if not args.only or args.only in c.name]
    counted = [c for c in chosen if c.counted]
    contrast = [c for c in chosen if not c.counted]
    for case in counted + contrast:
        if contrast and case is contrast[0]:
            print("\nFor contrast, the profile of the other execution mode (not counted):")
        value = run(case, plugins)
        error = value / case.published - 1
        unit = "tok/s" if case.metric == "throughput" else "ms"
        scale = 1.0 if case.metric == "throughput" else 1000.0
        if case.counted:
            rows.append((case, value * scale, case.published * scale, error, unit))
        print(
            f"{case.name:<52} {case.metric:<10} sim {value * scale:>9,.1f} {unit:<5} "
            f"published {case.published * scale:>9,.1f}  {error:+6.0%}  ({case.source})",
            flush=True,
        )
    within = sum(1 for r in rows if abs(r[3]) <= 0.15)
    print(f"\n{within} of {len(rows)} cases within 15%")


if __name__ == "__main__":
    main()
