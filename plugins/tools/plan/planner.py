"""``shuniu plan``'s entry point: :func:`plan` checks the inputs, loads the profiles and the
workload, builds the :class:`~shuniu.plugins.tools.plan.shapes.Space` of configurations and
runs the search of :mod:`~shuniu.plugins.tools.plan.search` (described there), then gathers
the :class:`~shuniu.plugins.tools.plan.results.PlanResult`."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from shuniu.backends.sim import kv_report, load_hardware, load_model
from shuniu.core.errors import ConfigError, Problem
from shuniu.core.plugin_manager import PluginManager, load_plugins
from shuniu.core.traffic import Slo, Workload, describe, load_workload
from shuniu.plugins.tools.plan.deployment import check_deployment
from shuniu.plugins.tools.plan.estimates import fresh_tokens_rate
from shuniu.plugins.tools.plan.results import PlanError, PlanReporter, PlanResult
from shuniu.plugins.tools.plan.search import Planner
from shuniu.plugins.tools.plan.shapes import PREFILL_HEAVY, SPLITS, Shape, Space
from shuniu.plugins.tools.plan.steady import warmup_s
from shuniu.plugins.tools.plan.workers import trial_pool

__all__ = [
    "DEFAULT_GOODPUT",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DEFAULT_MAX_REPLICAS",
    "DEFAULT_SEARCH_DURATION",
    "plan",
]

DEFAULT_MAX_REPLICAS = 64
DEFAULT_SEARCH_DURATION = 120.0
"""Simulated seconds of each search trial (more for a workload that warms up); answers are
confirmed over the full duration."""
DEFAULT_GOODPUT = 0.99
"""Share of requests that must meet the per-request thresholds, when the SLO has its own."""
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


def _with_slo(
    workload: Workload, ttft_p99: float | None, itl_p99: float | None, e2e_p99: float | None
) -> Workload:
    """The workload with SLO targets overridden (a per-request threshold of an overridden
    metric follows the new target)."""
    if ttft_p99 is None and itl_p99 is None and e2e_p99 is None:
        return workload
    data = workload.slo.model_dump() if workload.slo is not None else {}
    for metric, value in (("ttft", ttft_p99), ("itl", itl_p99), ("e2e", e2e_p99)):
        if value is not None:
            if not value > 0:
                raise PlanError([Problem(f"--{metric}-p99", f"must be positive (got {value:g})")], "options")
            data[f"{metric}_p99_s"] = value
            data[f"{metric}_s"] = None
    slo = Slo.model_validate(data)
    return workload.model_copy(update={"slo": slo}).with_base_dir(workload.base_dir)


def _split(values: str | list[str] | None) -> list[str] | None:
    if values is None:
        return None
    items = values.split(",") if isinstance(values, str) else values
    out = [v.strip() for v in items if v.strip()]
    return out or None


def _splits(
    value: str | list[str] | None, fresh_tokens: float, output_tokens: float
) -> list[tuple[int, int]]:
    """The prefill/decode splits to try: ``auto`` (the default) tries :data:`SPLITS` besides
    none for a workload whose prompts bring :data:`PREFILL_HEAVY` times more tokens to compute
    (those no prefix cache holds, ``fresh_tokens`` per request) than its answers; ``off``
    tries none; else the listed ``P:D`` units (``off`` among them keeps no split)."""
    items = _split(value) or ["auto"]
    if items == ["auto"]:
        heavy = fresh_tokens >= PREFILL_HEAVY * max(output_tokens, 1.0)
        return [(0, 0), *SPLITS] if heavy else [(0, 0)]
    out: list[tuple[int, int]] = []
    for item in items:
        if item == "off":
            out.append((0, 0))
            continue
        p, sep, d = item.partition(":")
        if not (sep and p.isdigit() and d.isdigit() and int(p) > 0 and int(d) > 0):
            raise PlanError(
                [Problem("--prefill-decode", f"expected auto, off or P:D units such as 1:2, not {item!r}")],
                "options",
            )
        out.append((int(p), int(d)))
    return list(dict.fromkeys(out))


def plan(
    model: str,
    hardware: str,
    workload: Workload | str | Path,
    *,
    duration: float | None = None,
    search_duration: float | None = DEFAULT_SEARCH_DURATION,
    seed: int = 0,
    max_replicas: int = DEFAULT_MAX_REPLICAS,
    tensor_parallel_size: int | None = None,
    pipeline_parallel_size: int | None = None,
    prefill_decode: str | list[str] | None = None,
    balancer: str | list[str] | None = None,
    goodput: float | None = None,
    ttft_p99: float | None = None,
    itl_p99: float | None = None,
    e2e_p99: float | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_num_seqs: int | list[int] | None = None,
    max_num_batched_tokens: int | list[int] | None = None,
    weight_precision: str | list[str] | None = None,
    kv_precision: str | list[str] | None = None,
    prefix_caching: bool | None = None,
    price: float | None = None,
    max_model_len: int | None = None,
    jobs: int | None = 1,
    plugins: PluginManager | None = None,
    reporter: PlanReporter | None = None,
) -> PlanResult:
    """Find the cheapest configuration of ``model`` on ``hardware`` that meets ``workload``'s
    SLO, by simulation (see the module's docstring for the search).

    ``model`` and ``hardware`` are profile names or paths. A knob given here is pinned (a list
    or comma-separated string: searched among those values): ``tensor_parallel_size``,
    ``pipeline_parallel_size`` (otherwise above 1 only for a model that fits no node),
    ``prefill_decode`` (``auto``, ``off`` or ``P:D`` units: prefill/decode splits),
    ``balancer``, ``max_num_seqs``, ``max_num_batched_tokens``, ``weight_precision``,
    ``kv_precision`` (a precision in ``model``'s ``@`` suffix pins it too),
    ``prefix_caching``. ``price``: of one device-hour (default: the hardware profile's).
    ``jobs``: trials run side by side in that many worker processes (``None``: one per
    CPU; 1: all in this process). ``duration``: simulated seconds the answer is confirmed
    over (default: the workload's);
    ``search_duration``: seconds of each search trial (``None``: the full duration).
    ``goodput``: share of requests that must meet the per-request thresholds (default 0.99
    when the SLO has thresholds of its own, else unchecked). ``ttft_p99``/``itl_p99``/
    ``e2e_p99`` override the workload's SLO targets (seconds).

    Raises :class:`PlanError` (a ``ConfigError``) for unusable inputs; a workload no
    configuration meets is not an error: the result's ``recommendation`` is ``None`` and its
    ``notes`` say why."""
    started = time.perf_counter()
    seqs_list = [max_num_seqs] if isinstance(max_num_seqs, int) else max_num_seqs
    chunk_list = (
        [max_num_batched_tokens] if isinstance(max_num_batched_tokens, int) else max_num_batched_tokens
    )
    problems = []
    if max_replicas < 1:
        problems.append(Problem("--max-replicas", f"must be at least 1 (got {max_replicas})"))
    if duration is not None and not duration > 0:
        problems.append(Problem("--duration", f"must be positive (got {duration:g})"))
    if search_duration is not None and not search_duration > 0:
        problems.append(Problem("--search-duration", f"must be positive (got {search_duration:g})"))
    if goodput is not None and not 0 <= goodput <= 1:
        problems.append(Problem("--goodput", f"must be between 0 and 1 (got {goodput:g})"))
    if not 0 < gpu_memory_utilization <= 1:
        problems.append(Problem("--gpu-memory-utilization", "must be in (0, 1]"))
    if seqs_list is not None and min(seqs_list) < 1:
        problems.append(Problem("--max-num-seqs", "must be at least 1"))
    if chunk_list is not None and min(chunk_list) < 16:
        problems.append(Problem("--max-num-batched-tokens", "must be at least 16"))
    if max_model_len is not None and max_model_len < 16:
        problems.append(Problem("--max-model-len", "must be at least 16"))
    if jobs is not None and jobs < 1:
        problems.append(Problem("--jobs", f"must be at least 1 (got {jobs})"))
    if price is not None and not price > 0:
        problems.append(Problem("--price", f"must be positive (got {price:g})"))
    if problems:
        raise PlanError(problems, "options")

    base_model = load_model(model)
    weights = _split(weight_precision)
    kvs = _split(kv_precision)
    if "@" in model:  # precisions in the model's name are pinned
        weights = weights or [base_model.weight_precision]
        kvs = kvs or [base_model.kv_precision]
    for name, values in (("weight_precision", weights), ("kv_precision", kvs)):
        for value in values or ():
            try:
                load_model(model, **{name: value})
            except ConfigError as exc:  # an unknown precision
                option = f"--{name.replace('_', '-')}"
                raise PlanError([Problem(option, p.message) for p in exc.problems], "options") from None
    hw = load_hardware(hardware)
    if not isinstance(workload, Workload):
        workload = load_workload(workload)
    workload = _with_slo(workload, ttft_p99, itl_p99, e2e_p99)
    slo = workload.slo
    if slo is None or all(
        v is None for v in (slo.ttft_p99_s, slo.itl_p99_s, slo.e2e_p99_s, *slo.request_thresholds)
    ):
        raise PlanError(
            [
                Problem(
                    "slo",
                    "the workload has no SLO to plan for: add `slo: {ttft_p99_s: ..., itl_p99_s: ...}` "
                    "to it, or give --ttft-p99 / --itl-p99 / --e2e-p99",
                )
            ],
            workload.name or "workload",
        )
    own_thresholds = any(v is not None for v in (slo.ttft_s, slo.itl_s, slo.e2e_s))
    if goodput is None and own_thresholds:
        goodput = DEFAULT_GOODPUT
    if goodput == 0:
        goodput = None

    full = duration if duration is not None else workload.duration_s
    desc = describe(workload, full)
    warm = warmup_s(workload, full, seed)
    short = full if search_duration is None else min(full, warm + search_duration)
    shared = bool(desc["prefix_groups"]) or any(s["type"] == "chat" for s in desc["streams"])
    space = Space(
        base_model,
        model,
        hw,
        util=gpu_memory_utilization,
        max_model_len=max_model_len,
        tensor_parallel=tensor_parallel_size,
        pipeline_parallel=pipeline_parallel_size,
        weight_precisions=weights,
        kv_precisions=kvs,
        chunks=chunk_list,
        max_num_seqs=seqs_list,
        prefix_caching=prefix_caching,
        balancers=_split(balancer),
        shared_prefixes=shared,
        splits=_splits(
            prefill_decode,
            fresh_tokens_rate(workload, desc) / max(desc["request_rate"], 1e-9),
            desc["mean_output_tokens"],
        ),
    )
    plugins = plugins or load_plugins()
    unit_price = price if price is not None else hw.price_per_hour
    planner = Planner(
        space=space,
        hardware=hardware,
        workload=workload,
        desc=desc,
        duration=full,
        search_duration=short,
        seed=seed,
        max_replicas=max_replicas,
        goodput_target=goodput,
        price=unit_price,
        max_model_len=max_model_len,
        plugins=plugins,
        reporter=reporter or PlanReporter(),
        jobs=jobs if jobs is not None else (os.cpu_count() or 1),
    )
    itl = slo.itl_p99_s if slo.itl_p99_s is not None else slo.request_thresholds[1]
    start = space.base(itl, _decode_batch(planner, space, desc, itl))
    for b in space.balancers:  # a bad --balancer (or engine setting) is reported against its option
        check_deployment(planner.deployment(dataclasses.replace(start, balancer=b), 1), plugins)
    if warm > 0:
        planner.notes.append(
            f"the workload's load grows for about {warm:,.0f} s (conversations lengthen): "
            f"search trials run {short:,.0f} s"
        )
    if planner.jobs > 1:
        planner.pool = trial_pool(planner.jobs)
    try:
        answer = planner.solve(start)
    finally:
        if planner.pool is not None:
            planner.pool.shutdown(cancel_futures=True)
    best = answer[1] if answer is not None else None
    if best is None:
        planner.notes.insert(0, "no configuration meets the SLO")
    shape = answer[0] if answer is not None else start
    kv_model = space.model_at(shape.weight_precision, shape.kv_precision)
    input_tokens = max(1, round(desc["mean_input_tokens"]))
    output_tokens = max(1, round(desc["mean_output_tokens"]))
    report = kv_report(
        kv_model,
        hw,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        tp=shape.tensor_parallel,
        pp=shape.pipeline_parallel,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=shape.max_num_seqs,
    )
    room = report.kv_blocks // max(-(-(input_tokens + output_tokens) // report.block_size), 1)
    quality = space.quality(shape) if answer is not None else None
    native = None
    if quality is not None:
        at_native = [
            t
            for t in planner.tried
            if t.met
            and t.phase == "search"
            and (t.config["weight_precision"], t.config["kv_precision"]) == space.native
        ]
        native = min(at_native, key=lambda t: (t.cost_per_hour, t.ttft_p99), default=None)
    sizes = space.tp_sizes(shape.weight_precision, shape.kv_precision)
    return PlanResult(
        model=kv_model.spec,
        hardware=hw.name,
        workload={
            k: desc[k]
            for k in ("name", "request_rate", "mean_input_tokens", "mean_output_tokens", "prefix_groups")
        },
        slo=slo.model_dump(exclude_none=True),
        goodput_target=goodput,
        duration_s=full,
        search_duration_s=short,
        seed=seed,
        balancer=shape.balancer,
        max_replicas=max_replicas,
        tensor_parallel_sizes=[tp for tp, _ in sizes] if isinstance(sizes, list) else [],
        pipeline_parallel=shape.pipeline_parallel,
        recommendation=best,
        tried=planner.tried,
        kv=report,
        kv_room_seqs=room,
        max_num_seqs=shape.max_num_seqs,
        notes=planner.notes,
        wall_s=time.perf_counter() - started,
        price_per_hour=unit_price,
        rejected=planner.rejected,
        frontier=planner.frontier(),
        quality=quality,
        native=native,
        warmup_s=warm,
    )


def _decode_batch(planner: Planner, space: Space, desc: dict[str, Any], itl: float | None) -> int:
    """Sequences a replica typically decodes at once: the workload's decode work spread over
    the roofline's replica count at the smallest chunk."""
    sizes = space.tp_sizes(*space.precisions[0])
    if not isinstance(sizes, list):
        return 32
    tp, pp = sizes[0]
    probe = Shape(tp, *space.precisions[0], space.chunks[0], 256, True, space.balancers[0], pp)
    replicas = planner.guess(probe)
    cm = space.cost_model(probe)
    ctx = max(1, round(desc["mean_input_tokens"] + desc["mean_output_tokens"] / 2))
    step = cm.decode_time(32, ctx)
    if itl is not None:
        step = min(step, itl)
    busy = desc["request_rate"] * desc["mean_output_tokens"] * step / replicas
    return max(1, min(256, round(busy)))
