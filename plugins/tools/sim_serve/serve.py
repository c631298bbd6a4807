"""``shuniu sim serve``: one simulated engine behind an OpenAI-compatible server that looks
like ``vllm serve`` from outside.

It answers ``/v1/chat/completions`` and ``/v1/completions`` (streamed or not), ``/v1/models``
(with ``max_model_len``), ``/health`` and a Prometheus ``/metrics`` with vLLM's metric names,
so a router (shuniu's own ``vllm`` backend, or another project's) can be run and measured in
front of simulated H200s as if they were vLLM servers. The server is the ordinary shuniu
gateway serving a one-model deployment (kind ``sim``, one endpoint, no gateway-side
concurrency limit, so every request goes straight to the engine and queues *inside* it, where
``vllm:num_requests_waiting`` shows it).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import click
from litestar import Response, get

from shuniu.core.errors import ConfigError
from shuniu.core.types import Chunk, InferenceRequest

__all__ = ["build_server", "default_model_name", "deployment_for", "serve_command", "sim_group"]

_LOG_LEVELS = ["debug", "info", "warning", "error"]
_SOURCE = "<shuniu sim serve>"


@click.group("sim", context_settings={"help_option_names": ["-h", "--help"]})
def sim_group() -> None:
    """The engine simulator as a standalone server."""


def default_model_name(model: str | None) -> str:
    """The name a model profile is served under when ``--served-model-name`` is not given:
    the profile's name without a ``@precision`` suffix (a file's stem for a path), or ``sim``."""
    if not model:
        return "sim"
    base, at, spec = model.rpartition("@")
    if not at or "/" in spec:
        base = model
    if "/" in base or base.endswith((".yaml", ".yml")):
        return Path(base).stem
    return base


def deployment_for(
    served: list[str], options: dict[str, Any], *, host: str, port: int, tokenizer: str | None = None
) -> dict[str, Any]:
    """The one-model deployment ``sim serve`` runs: the first served name is the model,
    the others are aliases; one ``sim`` endpoint with ``options``; no gateway-side limits;
    ``tokenizer``: the model's tokenizer, whose token ids the engine then computes on."""
    name, *aliases = served
    model: dict[str, Any] = {
        "aliases": aliases,
        "owned_by": "vllm",
        "endpoints": [{"kind": "sim", "name": "engine-0", "max_concurrency": 0, "options": options}],
    }
    if tokenizer is not None:
        model["tokenizer"] = tokenizer
    return {"gateway": {"host": host, "port": port, "graceful_shutdown_s": 5}, "models": {name: model}}


class _FinishTally:
    """Counts why the engine's requests ended (``stop`` or ``length``), which only the
    backend adapter knows, for ``vllm:request_success_total``."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, int] = {"stop": 0, "length": 0}

    def wrap(
        self, stream: Callable[[InferenceRequest], AsyncIterator[Chunk]]
    ) -> Callable[[InferenceRequest], AsyncIterator[Chunk]]:
        counts = self.counts

        async def counted(req: InferenceRequest) -> AsyncIterator[Chunk]:
            gen = stream(req)
            try:
                async for chunk in gen:
                    reason = chunk.finish_reason
                    if reason is not None:
                        counts[reason] = counts.get(reason, 0) + 1
                    yield chunk
            finally:
                # Close the engine's stream now (not at garbage collection), so a client that
                # went away frees its sequence at once.
                await gen.aclose()  # type: ignore[attr-defined]

        return counted


def build_server(
    served: list[str],
    options: dict[str, Any],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    tokenizer: str | None = None,
) -> tuple[Any, Any, str]:
    """(gateway, the engine's backend, model name): a gateway serving one simulated engine
    plus ``/metrics``. Raises :class:`ConfigError` for bad options or profiles."""
    from shuniu.backends.sim import CONTENT_TYPE, render_metrics
    from shuniu.core.config.loader import load_deployment
    from shuniu.core.gateway import Gateway
    from shuniu.core.plugin_manager import load_plugins

    plugins = load_plugins()
    data = deployment_for(served, options, host=host, port=port, tokenizer=tokenizer)
    # load_deployment reads text; JSON is YAML, and keeps every name and value as given.
    resolved = load_deployment(_SOURCE, plugins, text=json.dumps(data))
    model_name = served[0]
    holder: dict[str, Any] = {}
    tally = _FinishTally()
    created = time.time()

    @get("/metrics", sync_to_thread=False, include_in_schema=False)
    def metrics() -> Response[bytes]:
        core = holder["core"]
        body = render_metrics(core, model_name, finish_reasons=tally.counts, created=created)
        # Litestar appends "; charset=utf-8" to text/* media types itself.
        return Response(body, media_type=CONTENT_TYPE.removesuffix("; charset=utf-8"))

    try:
        gateway = Gateway(resolved, plugins, extra_routes=[metrics])
    except ConfigError:
        raise  # a profile's problems, already with field paths
    except (ValueError, LookupError, OSError, ImportError) as exc:
        from shuniu.core.errors import Problem

        raise ConfigError([Problem("", str(exc))], _SOURCE) from None
    backend = gateway.pools[model_name].endpoints[0].backend
    holder["core"] = backend.engine.core
    backend.stream = tally.wrap(backend.stream)
    return gateway, backend, model_name


_KV_EVENTS_KEYS = frozenset(
    {
        "enable_kv_cache_events",
        "publisher",
        "endpoint",
        "replay_endpoint",
        "buffer_steps",
        "hwm",
        "max_queue_size",
        "topic",
    }
)


def kv_events_publisher(text: str | None) -> Any:
    """The ZMQ publisher ``--kv-events-config`` asks for (vLLM's JSON and defaults), or
    ``None`` (not given, events disabled, or the ``null`` publisher)."""
    from shuniu.core.errors import Problem

    if text is None:
        return None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError([Problem("--kv-events-config", f"not JSON: {exc}")], "command line") from None
    if not isinstance(cfg, dict):
        raise ConfigError([Problem("--kv-events-config", "must be a JSON object")], "command line")
    unknown = sorted(set(cfg) - _KV_EVENTS_KEYS)
    if unknown:
        raise ConfigError(
            [
                Problem(
                    f"--kv-events-config.{unknown[0]}",
                    f"unknown key; known: {', '.join(sorted(_KV_EVENTS_KEYS))}",
                )
            ],
            "command line",
        )
    publisher = cfg.get("publisher", "zmq" if cfg.get("enable_kv_cache_events") else "null")
    if not cfg.get("enable_kv_cache_events") or publisher == "null":
        return None
    if publisher != "zmq":
        raise ConfigError(
            [Problem("--kv-events-config.publisher", "must be 'zmq' or 'null'")], "command line"
        )
    from shuniu.core.kv_events.zmq_transport import ZmqPublisher

    try:
        return ZmqPublisher(
            str(cfg.get("endpoint", "tcp://*:5557")),
            topic=str(cfg.get("topic", "")),
            replay_endpoint=cfg.get("replay_endpoint"),
            buffer_steps=int(cfg.get("buffer_steps", 10_000)),
            hwm=int(cfg.get("hwm", 100_000)),
        )
    except Exception as exc:  # a bad address, a port in use
        raise ConfigError([Problem("--kv-events-config.endpoint", str(exc))], "command line") from None


def _report(exc: ConfigError) -> None:
    click.secho(f"shuniu sim serve: {len(exc.problems)} problem(s)", fg="red", err=True)
    for problem in exc.problems:
        path = str(problem.path)
        message = problem.message.removeprefix("Value error, ")
        if ".options" in path:
            # The deployment is built from the flags: name the flag, not the deployment path.
            field = path.rsplit(".options", 1)[1].lstrip(".")
            where = f"--{field.replace('_', '-')}: " if field else ""
        elif exc.source == _SOURCE and path.endswith(".tokenizer"):
            where = "--tokenizer: "
        elif exc.source == _SOURCE:
            where = "--served-model-name: " if path.startswith("models") else ""
        elif problem.line is not None:
            where = f"{exc.source}, {path or '<root>'} (line {problem.line}): "  # a profile file's field
        else:
            where = f"{path}: " if path else ""
        click.echo(f"  - {where}{message}", err=True)


@sim_group.command("serve")
@click.option("--hardware", default=None, help="Hardware profile (h200, h100-sxm, ..., or a YAML path).")
@click.option(
    "--model",
    default=None,
    help="Model profile (qwen2.5-7b, llama-3.1-8b, ..., NAME@fp8, or a YAML path). With "
    "--hardware, timing comes from the roofline cost model; without both, fixed-rate timing.",
)
@click.option("--tensor-parallel-size", "-tp", type=int, default=None, help="Devices one engine spans.")
@click.option(
    "--pipeline-parallel-size",
    "-pp",
    type=int,
    default=None,
    help="Pipeline stages (nodes of --tensor-parallel-size devices) one engine spans.",
)
@click.option(
    "--served-model-name",
    multiple=True,
    help="Name clients use (repeat for aliases; the first is reported in metrics). "
    "Default: the model profile's name, or 'sim'.",
)
@click.option(
    "--tokenizer",
    default=None,
    help="The model's tokenizer.json or model directory (needs shuniu[tokenizers]): prompts are "
    "tokenized with it and its chat template, as vLLM would, so the engine caches and publishes "
    "blocks of the same token ids (default: word-sized pseudo tokens).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address.")
@click.option("--port", default=8000, show_default=True, type=int, help="Listen port (0 = a free port).")
@click.option("--max-num-seqs", type=int, default=None, help="Sequences the engine runs at once.")
@click.option("--max-num-batched-tokens", type=int, default=None, help="Token budget of one iteration.")
@click.option("--max-model-len", type=int, default=None, help="Context window in tokens.")
@click.option(
    "--gpu-memory-utilization", type=float, default=None, help="Share of device memory the engine may use."
)
@click.option(
    "--tokens-per-s",
    type=float,
    default=None,
    help="Fixed-rate timing: tokens per second of each running request (0 = instant).",
)
@click.option("--ttft-ms", type=float, default=None, help="Fixed delay before a request reaches the engine.")
@click.option("--kv-cache-tokens", type=int, default=None, help="KV-cache capacity in tokens.")
@click.option("--block-size", type=int, default=None, help="Tokens per KV block.")
@click.option("--no-prefix-caching", is_flag=True, help="Disable prefix caching.")
@click.option(
    "--scheduling-policy",
    type=click.Choice(["fcfs", "priority"]),
    default=None,
    help="Order of the engine's waiting queue (default fcfs).",
)
@click.option(
    "--kv-events-config",
    default=None,
    help="Publish KV-cache events as vLLM does (its JSON), e.g. "
    '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}\'.',
)
@click.option(
    "--log-level",
    default="warning",
    type=click.Choice(_LOG_LEVELS),
    show_default=True,
)
def serve_command(
    hardware: str | None,
    model: str | None,
    tensor_parallel_size: int | None,
    pipeline_parallel_size: int | None,
    served_model_name: tuple[str, ...],
    tokenizer: str | None,
    host: str,
    port: int,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    max_model_len: int | None,
    gpu_memory_utilization: float | None,
    tokens_per_s: float | None,
    ttft_ms: float | None,
    kv_cache_tokens: int | None,
    block_size: int | None,
    no_prefix_caching: bool,
    scheduling_policy: str | None,
    kv_events_config: str | None,
    log_level: str,
) -> None:
    """Serve one simulated engine with vLLM's OpenAI API and Prometheus /metrics.

    \b
    Examples:
      shuniu sim serve --hardware h200 --model qwen2.5-7b --port 8001
      shuniu sim serve --tokens-per-s 20 --max-num-seqs 8     # fixed-rate timing
    """
    from shuniu.core.http.server import is_loopback, run_gateway
    from shuniu.core.version import __version__

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    given = {
        "hardware": hardware,
        "model": model,
        "tensor_parallel_size": tensor_parallel_size,
        "pipeline_parallel_size": pipeline_parallel_size,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_model_len": max_model_len,
        "gpu_memory_utilization": gpu_memory_utilization,
        "tokens_per_s": tokens_per_s,
        "ttft_ms": ttft_ms,
        "kv_cache_tokens": kv_cache_tokens,
        "block_size": block_size,
        "enable_prefix_caching": False if no_prefix_caching else None,
        "scheduling_policy": scheduling_policy,
    }
    options = {k: v for k, v in given.items() if v is not None}
    served = list(served_model_name) or [default_model_name(model)]
    try:
        events = kv_events_publisher(kv_events_config)
        gateway, backend, name = build_server(served, options, host=host, port=port, tokenizer=tokenizer)
    except ConfigError as exc:
        _report(exc)
        sys.exit(2)
    if events is not None:
        backend.engine.publish_kv_events(events.publish)

    def ready(bound_host: str, bound_port: int) -> None:
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        if bound_host in ("0.0.0.0", "::", "[::]"):
            shown = "127.0.0.1"
        cfg = backend.engine.core.config
        what = f"{hardware} / {model}" if hardware else "fixed-rate timing"
        click.secho(
            f"shuniu {__version__} engine simulator ({what}) serving {name} on http://{shown}:{bound_port}",
            fg="green",
        )
        click.echo(f"  engine: {backend.description}")
        click.echo(
            f"  max_model_len {backend.max_model_len}, KV cache {cfg.num_blocks * cfg.block_size} tokens "
            f"({cfg.num_blocks} blocks of {cfg.block_size}), max_num_seqs {cfg.max_num_seqs}, "
            f"max_num_batched_tokens {cfg.max_num_batched_tokens}, prefix caching "
            f"{'on' if cfg.prefix_caching else 'off'}, {'priority' if cfg.priority else 'fcfs'} scheduling"
        )
        click.echo(
            "  routes: /v1/chat/completions /v1/completions /v1/models /health /metrics (vLLM metric names)"
        )
        if not is_loopback(bound_host):
            click.secho(
                f"  WARNING: listening on {bound_host} with NO authentication.", fg="red", bold=True, err=True
            )
        sys.stdout.flush()

    run_gateway(gateway, host, port, on_ready=ready, log_level=log_level)
