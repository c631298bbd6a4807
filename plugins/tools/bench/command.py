"""``shuniu bench URL``: load-test any OpenAI-compatible endpoint (shuniu, a bare engine,
another gateway) and report throughput, latency percentiles, errors and goodput.

Added to the command line by :mod:`shuniu.plugins.tools.bench.plugin`. Only :mod:`click` is
imported when the plugin loads; the client, the traffic model and rich are imported when the
command runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import click

__all__ = ["bench_command"]

_SOURCE_DEFAULT = click.core.ParameterSource.DEFAULT


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) not in (_SOURCE_DEFAULT, None)


def _fail(message: str) -> None:
    raise click.UsageError(message)


def _parse_headers(values: tuple[str, ...]) -> list[tuple[str, str]]:
    out = []
    for raw in values:
        name, sep, value = raw.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or any(c in name for c in " \t\r\n") or any(c in value for c in "\r\n\0"):
            _fail(f"--header takes NAME:VALUE (got {raw.split(':')[0]!r}...)")
        if name.lower() in ("host", "content-length", "content-type", "transfer-encoding", "connection"):
            _fail(f"--header {name}: that header is set by shuniu bench itself")
        out.append((name, value))
    return out


def _first_model(models_url: str, headers: list[tuple[str, str]], timeout: float, verify: bool) -> str:
    """The first model id listed at ``models_url`` (GET /models)."""
    import ssl
    import urllib.request

    request = urllib.request.Request(models_url, headers=dict(headers))
    context = None
    if models_url.startswith("https:") and not verify:
        context = ssl._create_unverified_context()
    with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
        data = json.loads(resp.read())
    models = data.get("data") if isinstance(data, dict) else None
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise ValueError("the list is empty")
    return str(models[0]["id"])


def _progress_display(console: Any, by_time: bool) -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    unit = "s" if by_time else "sent"
    return Progress(
        TextColumn("[bold]{task.fields[phase]:<8}[/]"),
        BarColumn(bar_width=16),
        TextColumn(f"{{task.completed:,.0f}}/{{task.total:,.0f}} {unit}"),
        TextColumn(
            "{task.fields[done]:,} done {task.fields[rate]:,.0f}/s "
            "[red]{task.fields[errors]:,} err[/] {task.fields[in_flight]:,} in flight"
            "{task.fields[saturated]}"
        ),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        refresh_per_second=8,
    )


@click.command("bench")
@click.argument("url")
@click.option(
    "--model", "-m", default=None, help="Model to ask for (default: the first that URL/models lists)."
)
@click.option(
    "--api",
    type=click.Choice(["chat", "completions", "messages", "embeddings", "rerank"]),
    default="chat",
    show_default=True,
    help="/chat/completions, /completions, Anthropic's /messages, /embeddings or /rerank (a URL "
    "ending in one picks it).",
)
@click.option(
    "--inputs",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    metavar="N",
    help="Embeddings: inputs per request; rerank: documents per request (each --prompt-tokens long).",
)
@click.option(
    "--api-key",
    envvar="OPENAI_API_KEY",
    default=None,
    show_envvar=True,
    help="Sent as 'Authorization: Bearer KEY' (never printed or saved).",
)
@click.option(
    "--header",
    "-H",
    "headers",
    multiple=True,
    metavar="NAME:VALUE",
    help="Extra request header (repeatable).",
)
@click.option(
    "--rate",
    "-r",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Open loop: requests per second.",
)
@click.option(
    "--arrival",
    type=click.Choice(["poisson", "constant", "gamma"]),
    default="poisson",
    show_default=True,
    help="Open loop: gaps between requests (gamma: burstier than Poisson, see --cv).",
)
@click.option(
    "--cv",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Coefficient of variation of gamma gaps (default 2).",
)
@click.option(
    "--ramp",
    default=None,
    metavar="FROM:TO",
    help="Open loop: rate rising linearly from FROM to TO req/s over --duration.",
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(min=1),
    default=None,
    help="Closed loop: this many users, each sending its next request when the last ends.",
)
@click.option(
    "--duration",
    "-d",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds of measured load (default 60, or the workload's duration).",
)
@click.option(
    "--requests",
    "-n",
    "num_requests",
    type=click.IntRange(min=1),
    default=None,
    help="Measured requests to send (with --duration: whichever ends first).",
)
@click.option(
    "--warmup",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds of load before measuring (sent, not counted).",
)
@click.option(
    "--prompt-tokens",
    default="256",
    show_default=True,
    metavar="DIST",
    help="Prompt length: N, uniform:MIN:MAX, lognormal:mean=M,sigma=S, exponential:mean=M.",
)
@click.option(
    "--output-tokens",
    default="128",
    show_default=True,
    metavar="DIST",
    help="max_tokens per request (same forms; 'none' leaves it unset).",
)
@click.option(
    "--shared-prefix",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="TOKENS",
    help="Start every prompt with a common prefix of this many tokens (on top of --prompt-tokens).",
)
@click.option(
    "--prefix-groups",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="K",
    help="Number of distinct shared prefixes (request i uses prefix i mod K).",
)
@click.option(
    "--stream/--no-stream",
    default=True,
    show_default=True,
    help="Streamed responses (TTFT and ITL are only measured when streaming).",
)
@click.option(
    "--ignore-eos",
    is_flag=True,
    help="Send ignore_eos: true (vLLM, shuniu) so every answer is exactly max_tokens long.",
)
@click.option(
    "--body",
    "extra_body",
    default=None,
    metavar="JSON",
    help="Fields merged into every request body, e.g. '{\"temperature\": 0}'.",
)
@click.option(
    "--workload",
    "-w",
    "workload_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A simulator workload file: its arrivals, lengths, shared prefixes and chat sessions.",
)
@click.option(
    "--rate-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="With --workload: multiply every arrival rate.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed: same seed, same requests.")
@click.option(
    "--slo-ttft-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Goodput: a request counts when its TTFT is at most this.",
)
@click.option(
    "--slo-tpot-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Goodput: ...and its time per output token at most this.",
)
@click.option(
    "--slo-e2e-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Goodput: ...and its end-to-end latency at most this.",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=2048,
    show_default=True,
    help="Open loop: requests due while this many are in flight are not sent (counted as client saturated).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds a request may take in all.",
)
@click.option("--insecure", is_flag=True, help="https: do not verify the server's certificate.")
@click.option(
    "--json",
    "json_out",
    default=None,
    metavar="FILE",
    help="Write every number as JSON to FILE ('-': stdout, tables then go to stderr).",
)
@click.option(
    "--requests-out",
    "requests_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Also write every measured request as a JSON line to FILE: when it was sent, its TTFT "
    "and end-to-end seconds, prompt, output and cached tokens (from the server's usage), error.",
)
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write latency_cdf.png and throughput.png into DIR (needs shuniu[plot]).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no tables.")
@click.pass_context
def bench_command(ctx: click.Context, url: str, **o: Any) -> None:
    """Load-test the OpenAI-compatible API at URL (an API root such as
    http://127.0.0.1:8000/v1).

    Open loop (--rate or --ramp: requests leave on schedule whatever the server does) or
    closed loop (--concurrency N users). Reports requests/s, tokens/s, TTFT, ITL, TPOT and
    end-to-end percentiles, errors by type, goodput, and whether the client itself kept up.
    """
    from shuniu.core.errors import ConfigError
    from shuniu.core.version import __version__
    from shuniu.plugins.tools.bench.client import parse_endpoint
    from shuniu.plugins.tools.bench.prompts import PromptMaker
    from shuniu.plugins.tools.bench.runner import RunSpec, raise_fd_limit
    from shuniu.plugins.tools.bench.traffic import (
        BodyBuilder,
        arrival_times,
        describe_length,
        make_arrival,
        parse_length,
        parse_ramp,
        synthetic_plan,
        workload_plan,
    )

    try:
        endpoint = parse_endpoint(url)
    except ValueError as exc:
        _fail(f"URL: {exc}")
    api: str = endpoint.api or o["api"]
    if endpoint.api and _given(ctx, "api") and o["api"] != endpoint.api:
        _fail(f"the URL names the {endpoint.api} API but --api says {o['api']}")
    pooling = api in ("embeddings", "rerank")
    if pooling:
        for name in ("stream", "workload_path", "output_tokens", "ignore_eos"):
            if _given(ctx, name) and (name != "stream" or o["stream"]):
                flag = {"workload_path": "workload", "stream": "stream"}.get(name, name).replace("_", "-")
                _fail(f"--{flag} does not go with --api {api} (one answer per request, nothing generated)")
        o["stream"] = False
    elif _given(ctx, "inputs"):
        _fail("--inputs goes with --api embeddings or rerank")

    # -- the load
    workload = None
    if o["workload_path"] is not None:
        for name in (
            "rate",
            "ramp",
            "arrival",
            "cv",
            "prompt_tokens",
            "output_tokens",
            "shared_prefix",
            "prefix_groups",
        ):
            if _given(ctx, name):
                _fail(f"--{name.replace('_', '-')} does not go with --workload (the workload file says it)")
        from shuniu.core.traffic import load_workload

        try:
            workload = load_workload(o["workload_path"])
        except ConfigError as exc:
            click.secho(f"{exc.source or 'workload'}: {len(exc.problems)} problem(s)", fg="red", err=True)
            for problem in exc.problems:
                click.echo(f"  - {problem}", err=True)
            ctx.exit(2)
        if o["rate_scale"] != 1.0:
            workload = workload.scaled(o["rate_scale"])
    elif _given(ctx, "rate_scale"):
        _fail("--rate-scale goes with --workload")
    closed = o["concurrency"] is not None
    if closed and (o["rate"] is not None or o["ramp"] is not None):
        _fail("give --concurrency (closed loop) or --rate/--ramp (open loop), not both")
    if o["rate"] is not None and o["ramp"] is not None:
        _fail("give --rate or --ramp, not both")
    if workload is None and not closed and o["rate"] is None and o["ramp"] is None:
        _fail("say how to load: --rate R or --ramp FROM:TO (open loop), or --concurrency N (closed loop)")
    if closed and (_given(ctx, "arrival") or _given(ctx, "cv")):
        _fail("--arrival and --cv shape open-loop arrivals; --concurrency is closed loop")
    if o["cv"] is not None and o["arrival"] != "gamma":
        _fail("--cv goes with --arrival gamma")
    if closed and o["concurrency"] > o["max_in_flight"]:
        o["max_in_flight"] = o["concurrency"]
    ramp = None
    if o["ramp"] is not None:
        try:
            ramp = parse_ramp(o["ramp"])
        except ValueError as exc:
            _fail(str(exc))
    duration: float | None = o["duration"]
    if duration is None and o["num_requests"] is None:
        duration = workload.duration_s if workload is not None else 60.0
    if ramp is not None and duration is None:
        _fail("--ramp needs --duration (the ramp spans it)")
    extra: dict[str, Any] | None = None
    if o["extra_body"]:
        try:
            extra = json.loads(o["extra_body"])
        except json.JSONDecodeError as exc:
            _fail(f"--body is not JSON: {exc}")
        if not isinstance(extra, dict):
            _fail("--body must be a JSON object")

    headers = _parse_headers(o["headers"])
    if o["api_key"]:
        headers.append(("Authorization", f"Bearer {o['api_key']}"))
    model = o["model"]
    if model is None:
        models_url = f"{endpoint.scheme}://{endpoint.host_header}{endpoint.root}/models"
        try:
            model = _first_model(models_url, headers, min(o["timeout"], 15.0), not o["insecure"])
        except Exception as exc:  # any failure means: say --model
            _fail(f"could not list the models at {models_url} ({exc}); give --model")

    if api == "messages" and not any(name.lower() == "anthropic-version" for name, _ in headers):
        headers.append(("anthropic-version", "2023-06-01"))
    builder = BodyBuilder(
        model, stream=o["stream"], ignore_eos=o["ignore_eos"], extra=extra, inputs=o["inputs"]
    )
    warmup: float = o["warmup"]
    seed: int = o["seed"]
    prompt_dist = output_dist = None
    if workload is None:
        try:
            prompt_dist = parse_length(o["prompt_tokens"])
            output_dist = (
                None if o["output_tokens"].strip().lower() == "none" else parse_length(o["output_tokens"])
            )
        except ValueError as exc:
            _fail(str(exc))
        times = None
        if not closed:
            try:
                arrival = make_arrival(
                    o["arrival"],
                    rate=o["rate"],
                    ramp=ramp,
                    warmup_s=warmup,
                    duration_s=duration,
                    cv=o["cv"],
                )
            except ValueError as exc:
                _fail(str(exc))
            times = arrival_times(arrival, seed)
        plan = synthetic_plan(
            api=api,
            builder=builder,
            prompt_tokens=prompt_dist,
            output_tokens=output_dist,
            prompts=PromptMaker(seed, o["shared_prefix"], o["prefix_groups"]),
            seed=seed,
            times=times,
        )
    else:
        end = math.inf if closed or duration is None else warmup + duration
        plan = workload_plan(
            workload,
            builder=builder,
            seed=seed,
            end_s=end,
            api=api if (_given(ctx, "api") or endpoint.api) else None,
        )

    # -- goodput
    slo_ms: dict[str, float] = {}
    for key in ("ttft", "tpot", "e2e"):
        if o[f"slo_{key}_ms"] is not None:
            slo_ms[f"{key}_ms"] = o[f"slo_{key}_ms"]
    if not slo_ms and workload is not None and workload.slo is not None:
        t, i, e = workload.slo.request_thresholds
        for key, v in (("ttft_ms", t), ("tpot_ms", i), ("e2e_ms", e)):
            if v is not None:
                slo_ms[key] = v * 1000
    goodput = None
    if slo_ms:
        lim_t = slo_ms.get("ttft_ms", math.inf) / 1000
        lim_i = slo_ms.get("tpot_ms", math.inf) / 1000
        lim_e = slo_ms.get("e2e_ms", math.inf) / 1000

        def goodput(ttft: float | None, tpot: float | None, e2e: float) -> bool:
            first = ttft if ttft is not None else e2e  # not streamed: the first token comes with the last
            return first <= lim_t and e2e <= lim_e and (tpot is None or tpot <= lim_i)

    # -- describe the run (no secrets: header names only)
    if closed:
        load = f"closed loop, {o['concurrency']} users"
    elif workload is not None:
        load = f"workload {workload.name or o['workload_path'].name}" + (
            f" x{o['rate_scale']:g}" if o["rate_scale"] != 1.0 else ""
        )
    elif ramp is not None:
        load = f"open loop, {o['arrival']} {ramp[0]:g} -> {ramp[1]:g} req/s"
    else:
        load = f"open loop, {o['arrival']} {o['rate']:g} req/s"
    if workload is not None and closed:
        load += f", workload {workload.name}"
    config: dict[str, Any] = {
        "tool": "shuniu bench",
        "version": __version__,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "url": endpoint.display,
        "model": model,
        "api": api if workload is None or endpoint.api or _given(ctx, "api") else "per workload stream",
        "load": load,
        "mode": "closed" if closed else "open",
        "rate": o["rate"],
        "arrival": None if closed or workload is not None else o["arrival"],
        "cv": o["cv"],
        "ramp": list(ramp) if ramp else None,
        "concurrency": o["concurrency"],
        "duration_s": duration,
        "requests": o["num_requests"],
        "warmup_s": warmup,
        "prompt_tokens": describe_length(prompt_dist) if prompt_dist is not None else None,
        "output_tokens": describe_length(output_dist) if output_dist is not None and not pooling else None,
        "inputs_per_request": o["inputs"] if pooling else None,
        "shared_prefix_tokens": o["shared_prefix"] if workload is None else None,
        "prefix_groups": o["prefix_groups"] if workload is None and o["shared_prefix"] else None,
        "workload": str(o["workload_path"]) if workload is not None else None,
        "rate_scale": o["rate_scale"] if workload is not None else None,
        "stream": o["stream"],
        "ignore_eos": o["ignore_eos"],
        "extra_body_fields": sorted(extra) if extra else [],
        "headers": [k for k, _ in headers],
        "seed": seed,
        "max_in_flight": o["max_in_flight"],
        "timeout_s": o["timeout"],
    }

    raise_fd_limit(o["max_in_flight"] + 256)
    spec = RunSpec(
        endpoint=endpoint,
        headers=headers,
        concurrency=o["concurrency"],
        duration_s=duration,
        requests=o["num_requests"],
        warmup_s=warmup,
        timeout_s=o["timeout"],
        max_in_flight=o["max_in_flight"],
        stream=o["stream"],
        verify_tls=not o["insecure"],
        user_agent=f"shuniu-bench/{__version__}",
        goodput=goodput,
        keep_requests=o["requests_out"] is not None,
    )
    _run_and_report(ctx, spec, plan, config, slo_ms or None, o)


def _run_and_report(
    ctx: click.Context, spec: Any, plan: Any, config: dict[str, Any], slo: Any, o: dict[str, Any]
) -> None:
    from rich.console import Console

    from shuniu.plugins.tools.bench.report import print_report, summarize
    from shuniu.plugins.tools.bench.runner import run_sync

    json_to_stdout = o["json_out"] == "-"
    err_console = Console(stderr=True)
    out_console = err_console if json_to_stdout else Console()
    by_time = spec.requests is None
    total = (spec.warmup_s + spec.duration_s) if by_time else spec.requests
    show_progress = not o["quiet"] and err_console.is_terminal

    if show_progress:
        display = _progress_display(err_console, by_time)
        display.start()
        task = display.add_task(
            "bench", total=total, phase="starting", done=0, rate=0.0, errors=0, in_flight=0, saturated=""
        )

        def progress(p: Any) -> None:
            display.update(
                task,
                completed=min(p.elapsed, total) if by_time else min(p.measured, total),
                phase=p.phase,
                done=p.done,
                rate=p.rate,
                errors=p.errors,
                in_flight=p.in_flight,
                saturated=f" [bold red]{p.saturated:,} not sent: client saturated[/]" if p.saturated else "",
            )
    else:
        display = None
        progress = None  # type: ignore[assignment]
    try:
        result = run_sync(spec, plan, progress)
    finally:
        if display is not None:
            display.stop()
    summary = summarize(result, config, slo)
    if o.get("requests_out") is not None:
        with Path(o["requests_out"]).open("w", encoding="utf-8") as f:
            for rec in sorted(result.records, key=lambda r: r.index):
                f.write(json.dumps(dataclasses.asdict(rec)) + "\n")
    if o["json_out"]:
        text = json.dumps(summary, indent=2)
        if json_to_stdout:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
        else:
            Path(o["json_out"]).write_text(text + "\n", "utf-8")
    if not o["quiet"]:
        print_report(summary, out_console)
    if o["plot_dir"] is not None:
        from shuniu.core.extras import MissingExtraError
        from shuniu.plugins.tools.bench.plots import write_plots

        try:
            paths = write_plots(
                result, o["plot_dir"], f"{config['model']} @ {config['url']}: {config['load']}"
            )
        except MissingExtraError as exc:
            click.secho(str(exc), fg="red", err=True)
            ctx.exit(2)
        if not o["quiet"]:
            out_console.print("plots: " + ", ".join(str(p) for p in paths))
    if result.interrupted:
        ctx.exit(130)
    if result.succeeded == 0:
        if not o["quiet"]:
            err_console.print("[bold red]no request succeeded[/]")
        ctx.exit(1)
