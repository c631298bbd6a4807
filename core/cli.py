"""The ``shuniu`` command line. Plugins add their own subcommands via ``register_commands``."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click

from shuniu.core.errors import ConfigError
from shuniu.core.plugin_manager import PluginManager, load_plugins
from shuniu.core.version import __version__

__all__ = ["build_cli", "main"]


def _plugins(ctx: click.Context) -> PluginManager:
    return ctx.find_object(PluginManager) or load_plugins()


def _report_config_error(exc: ConfigError) -> None:
    click.secho(f"{exc.source or 'deployment'}: {len(exc.problems)} problem(s)", fg="red", err=True)
    for problem in exc.problems:
        click.echo(f"  - {problem}", err=True)


_URL_OPTION = click.option(
    "--url",
    default="http://127.0.0.1:8000",
    envvar="SHUNIU_URL",
    show_default=True,
    help="The gateway's address (or set SHUNIU_URL).",
)
_JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
_TIMEOUT_OPTION = click.option(
    "--timeout", default=5.0, show_default=True, help="Seconds to wait for the gateway."
)


def build_cli(plugins: PluginManager | None = None) -> click.Group:
    """The root command group with every plugin's commands added."""
    manager = plugins or load_plugins()

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(__version__, "--version", "-V", prog_name="shuniu")
    @click.pass_context
    def cli(ctx: click.Context) -> None:
        """shuniu (枢纽): a pluggable serving gateway for large language models."""
        ctx.obj = manager

    @cli.command()
    @click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
    @click.option("--host", default=None, help="Listen address (default: the file's, else 127.0.0.1).")
    @click.option("--port", default=None, type=int, help="Listen port (default: the file's, else 8000).")
    @click.option(
        "--log-level",
        default="warning",
        type=click.Choice(["debug", "info", "warning", "error"]),
        show_default=True,
    )
    @click.option(
        "--workers",
        default=None,
        type=click.IntRange(1, 64),
        help="Gateway processes sharing the port (default: the file's gateway.workers, else 1).",
    )
    @click.pass_context
    def serve(
        ctx: click.Context,
        file: Path | None,
        host: str | None,
        port: int | None,
        log_level: str,
        workers: int | None,
    ) -> None:
        """Serve a deployment FILE (without one: the built-in quickstart, two simulated replicas)."""
        from shuniu.core.config.loader import QUICKSTART_NAME, load_deployment
        from shuniu.core.gateway import Gateway
        from shuniu.core.http.server import is_loopback, run_gateway
        from shuniu.core.http.workers import WorkerInfo, check_workers, reserve_port, run_supervisor

        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        plugins = _plugins(ctx)
        try:
            resolved = load_deployment(file, plugins)
        except ConfigError as exc:
            _report_config_error(exc)
            ctx.exit(2)
        gw_cfg = resolved.deployment.gateway
        host = host or gw_cfg.host
        port = gw_cfg.port if port is None else port
        worker = WorkerInfo.from_env()
        count = gw_cfg.workers if workers is None else workers
        source = "built-in quickstart" if resolved.source == QUICKSTART_NAME else resolved.source
        if worker is None and count > 1:
            problems = check_workers(resolved, count)
            if problems:
                _report_config_error(ConfigError(problems, source=resolved.source))
                ctx.exit(2)
            try:
                reserved = reserve_port(host, port)
            except OSError as exc:
                click.secho(f"cannot listen on {host}:{port}: {exc}", fg="red", err=True)
                ctx.exit(2)
            port = reserved.getsockname()[1]
            command = [
                sys.executable,
                "-m",
                "shuniu.core",
                "serve",
                *([str(file)] if file is not None else []),
            ]
            command += ["--host", host, "--port", str(port), "--log-level", log_level]

            def supervised(bound_port: int, pids: list[int]) -> None:
                shown = (
                    "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else f"[{host}]" if ":" in host else host
                )
                click.secho(
                    f"shuniu {__version__} serving {source} on http://{shown}:{bound_port} "
                    f"with {count} workers (pids {', '.join(map(str, pids))})",
                    fg="green",
                )
                click.echo(f"  models: {', '.join(resolved.deployment.models)}")
                sys.stdout.flush()

            try:
                code = run_supervisor(
                    command, count, port, drain_s=gw_cfg.graceful_shutdown_s, on_ready=supervised
                )
            finally:
                reserved.close()
            ctx.exit(code)
        try:
            gateway = Gateway(resolved, plugins, worker=worker)
        except (ValueError, OSError) as exc:
            # A backend that cannot be built from valid-looking options (e.g. an engine
            # setting that only conflicts once the model's context length is known).
            click.secho(f"{resolved.source}: cannot build the deployment: {exc}", fg="red", err=True)
            ctx.exit(2)

        def ready(bound_host: str, bound_port: int) -> None:
            shown = f"[{bound_host}]" if ":" in bound_host else bound_host
            if bound_host in ("0.0.0.0", "::", "[::]"):
                shown = "127.0.0.1"
            model = next(iter(resolved.deployment.models))
            click.secho(f"shuniu {__version__} serving {source} on http://{shown}:{bound_port}", fg="green")
            click.echo(f"  models: {', '.join(resolved.deployment.models)}")
            if gateway.engines:
                click.echo(
                    f"  engines: {len(gateway.engines)} launched, joining as they become ready; "
                    f"watch them with: shuniu ps --url http://{shown}:{bound_port}"
                )
            click.echo("  try:")
            url = f"http://{shown}:{bound_port}/v1/chat/completions"
            body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello"}}]}}'
            click.echo(f"    curl {url} -H 'content-type: application/json' \\\n      -d '{body}'")
            if gateway.state.auth_enabled:
                kinds = ", ".join(a.kind for a in resolved.deployment.auth.authenticators)
                click.echo(f"  auth: {kinds} (send 'Authorization: Bearer <key>')")
            elif not is_loopback(bound_host):
                click.secho(
                    f"  WARNING: listening on {bound_host} with NO authentication: anyone who can "
                    "reach this port can use every model.",
                    fg="red",
                    bold=True,
                    err=True,
                )
            sys.stdout.flush()

        run_gateway(
            gateway,
            host,
            port,
            on_ready=None if worker is not None else ready,
            log_level=log_level,
            worker=worker,
        )

    @cli.command()
    @click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
    @click.pass_context
    def validate(ctx: click.Context, file: Path) -> None:
        """Check a deployment FILE; print every problem with its field path and line."""
        from shuniu.core.config.loader import expand_endpoints, load_deployment

        try:
            resolved = load_deployment(file, _plugins(ctx))
        except ConfigError as exc:
            _report_config_error(exc)
            ctx.exit(1)
        models = resolved.deployment.models
        endpoints = sum(len(expand_endpoints(n, m.endpoints)) for n, m in models.items())
        click.secho(f"{file}: OK ({len(models)} model(s), {endpoints} endpoint(s))", fg="green")

    @cli.command()
    @click.option("--indent", default=2, show_default=True, help="JSON indentation.")
    @click.pass_context
    def schema(ctx: click.Context, indent: int) -> None:
        """Print the JSON Schema of deployment files (with every installed plugin's options)."""
        from shuniu.core.config.json_schema import deployment_schema

        click.echo(json.dumps(deployment_schema(_plugins(ctx)), indent=indent or None))

    @cli.command("plugins")
    @click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
    @click.pass_context
    def plugins_cmd(ctx: click.Context, as_json: bool) -> None:
        """List installed plugins, their distribution, version and hooks, and what they registered."""
        from shuniu.core.plugin_manager import CATEGORIES, singular

        plugins = _plugins(ctx)
        registered: dict[str, list[str]] = {}
        try:
            for category in CATEGORIES:
                for name, reg in plugins.registered(category).items():
                    registered.setdefault(reg.plugin, []).append(f"{singular(category)}:{name}")
        except ConfigError as exc:
            _report_config_error(exc)
        infos = plugins.plugins()
        if as_json:
            out = {
                "plugins": [
                    {
                        "name": i.name,
                        "distribution": i.distribution,
                        "version": i.version,
                        "hooks": list(i.hooks),
                        "registers": registered.get(i.name, []),
                    }
                    for i in infos
                ],
                "failed": [
                    {"name": f.name, "distribution": f.distribution, "version": f.version, "error": f.error}
                    for f in plugins.failed
                ],
            }
            click.echo(json.dumps(out, indent=2))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="shuniu plugins")
        for col in ("plugin", "distribution", "version", "hooks", "registers"):
            table.add_column(col, overflow="fold")
        for i in infos:
            table.add_row(
                i.name, i.distribution, i.version, "\n".join(i.hooks), "\n".join(registered.get(i.name, []))
            )
        # Piped output keeps whole names (greppable) instead of an 80-column cut.
        console = Console(width=None if sys.stdout.isatty() else 200)
        console.print(table)
        if plugins.failed:
            failed = Table(title="plugins that failed to load", style="red")
            for col in ("plugin", "distribution", "version", "error"):
                failed.add_column(col, overflow="fold")
            for f in plugins.failed:
                failed.add_row(f.name, f.distribution, f.version, f.error)
            console.print(failed)

    @cli.command("ps")
    @_URL_OPTION
    @click.option(
        "--admin-key",
        envvar="SHUNIU_ADMIN_KEY",
        default=None,
        help="An admin key (or set SHUNIU_ADMIN_KEY): /ready shows engines only to admins, "
        "unless the gateway sets readiness_details: public.",
    )
    @_JSON_OPTION
    @_TIMEOUT_OPTION
    @click.pass_context
    def ps(ctx: click.Context, url: str, admin_key: str | None, as_json: bool, timeout: float) -> None:
        """Show the engines a running gateway launched (``launch:``), from its /ready."""
        try:
            body = _fetch_ready(url, timeout, admin_key)
        except (OSError, ValueError) as exc:
            click.secho(f"cannot read {url.rstrip('/')}/ready: {exc}", fg="red", err=True)
            ctx.exit(1)
        if any(isinstance(m.get("endpoints"), int) for m in body["models"].values()):
            click.secho(
                "the gateway shows endpoint details to admins only: pass --admin-key (or SHUNIU_ADMIN_KEY)",
                fg="red",
                err=True,
            )
            ctx.exit(1)
        engines = [
            {
                "model": model,
                "endpoint": ep.get("name"),
                "healthy": ep.get("healthy"),
                "health_detail": ep.get("detail"),
                **ep["launch"],
            }
            for model, view in (body.get("models") or {}).items()
            for ep in view.get("endpoints") or ()
            if isinstance(ep.get("launch"), dict)
        ]
        if as_json:
            click.echo(json.dumps({"url": url, "status": body.get("status"), "engines": engines}, indent=2))
            return
        if not engines:
            click.echo(f"{url}: no launched engines (gateway {body.get('status')})")
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"shuniu engines at {url} (gateway {body.get('status')})")
        # Short columns never wrap; a narrow terminal folds the log path and the detail.
        short = ("model", "endpoint", "state", "healthy", "pid", "port", "restarts", "last exit", "uptime")
        for col in short:
            table.add_column(col, no_wrap=True)
        for col in ("log", "detail"):
            table.add_column(col, overflow="fold")
        colours = {"ready": "green", "starting": "yellow", "restarting": "yellow", "failed": "red"}
        for e in engines:
            state = str(e.get("state"))
            table.add_row(
                e["model"],
                str(e["endpoint"]),
                f"[{colours.get(state, 'white')}]{state}[/]",
                "yes" if e.get("healthy") else "no",
                _cell(e.get("pid")),
                _cell(e.get("port")),
                _cell(e.get("restarts")),
                _cell(e.get("last_exit_code")),
                _duration(e.get("uptime_s")),
                _cell(e.get("log")),
                _cell(e.get("detail")),
            )
        # Piped output keeps whole paths (greppable) instead of an 80-column cut.
        Console(width=None if sys.stdout.isatty() else 240).print(table)

    manager.add_commands(cli)

    @cli.command("fleet")
    @_URL_OPTION
    @click.option(
        "--key",
        envvar="SHUNIU_ADMIN_KEY",
        default=None,
        help="An API or admin key, when the gateway has authentication (or set SHUNIU_ADMIN_KEY).",
    )
    @_JSON_OPTION
    @_TIMEOUT_OPTION
    @click.pass_context
    def fleet(ctx: click.Context, url: str, key: str | None, as_json: bool, timeout: float) -> None:
        """Show a running gateway's workers and the fleet it shares routing state with
        (fleet:), from its /status.json."""
        try:
            body = _fetch_json(url, "/status.json", timeout, key)
        except (OSError, ValueError) as exc:
            click.secho(f"cannot read {url.rstrip('/')}/status.json: {exc}", fg="red", err=True)
            ctx.exit(1)
        shared = body.get("fleet")
        workers = body.get("workers")
        if as_json:
            click.echo(json.dumps({"url": url, "workers": workers, "fleet": shared}, indent=2))
            return
        from rich.console import Console
        from rich.table import Table

        console = Console(width=None if sys.stdout.isatty() else 200)
        if workers:
            table = Table(title=f"workers of {url}")
            for col in ("worker", "pid", "ready", "answering"):
                table.add_column(col, no_wrap=True)
            for w in workers:
                table.add_row(str(w["index"]), _cell(w.get("pid")), "yes" if w.get("ready") else "no",
                              "yes" if w.get("answered") else "[red]no[/]")  # fmt: skip
            console.print(table)
        if not shared:
            console.print(f"{url}: no fleet (the deployment has no fleet: section)")
            return
        state = "[red]degraded: the store cannot be reached[/]" if shared["degraded"] else "[green]in sync[/]"
        console.print(
            f"{url} is {shared['gateway']}: {state}, last sync {_duration(shared.get('last_sync_s'))} ago"
        )
        table = Table(title=f"the fleet as {shared['gateway']} sees it")
        for col in ("gateway", "version", "last heard", "in flight"):
            table.add_column(col, no_wrap=True)
        for peer in shared.get("peers") or ():
            table.add_row(
                peer["gateway"],
                _cell(peer.get("version")),
                f"{peer['age_s']:.2f} s ago",
                str(peer["in_flight"]),
            )
        console.print(table)

    return cli


def _fetch_json(
    url: str, path: str, timeout: float, key: str | None = None, *, accept: tuple[int, ...] = ()
) -> dict[str, Any]:
    """A gateway's JSON view at ``path`` (an answer with a status in ``accept``, such as a
    503 from ``/ready``, still has one)."""
    import urllib.error
    import urllib.request

    target = url.rstrip("/") + path
    if not target.startswith(("http://", "https://")):
        raise ValueError("the URL must start with http:// or https://")
    request = urllib.request.Request(target)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code not in accept:
            raise OSError(f"HTTP {exc.code}") from None
        raw = exc.read()
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise ValueError("not a shuniu gateway's answer")
    return body


def _fetch_ready(url: str, timeout: float, admin_key: str | None = None) -> dict[str, Any]:
    """The gateway's ``/ready`` body (a 503 while not ready still has one)."""
    body = _fetch_json(url, "/ready", timeout, admin_key, accept=(503,))
    if not isinstance(body.get("models"), dict):
        raise ValueError("not a shuniu gateway's /ready answer")
    return body


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float):
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.0f}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def main(argv: list[str] | None = None) -> None:
    build_cli()(args=argv, prog_name="shuniu")
