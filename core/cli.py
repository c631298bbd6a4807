"""The ``shuniu`` command line. Plugins add their own subcommands via ``register_commands``."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

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
    @click.pass_context
    def serve(
        ctx: click.Context, file: Path | None, host: str | None, port: int | None, log_level: str
    ) -> None:
        """Serve a deployment FILE (without one: the built-in quickstart, two simulated replicas)."""
        from shuniu.core.config_loader import QUICKSTART_NAME, load_deployment
        from shuniu.core.gateway import Gateway
        from shuniu.core.server import is_loopback, run_gateway

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
        try:
            gateway = Gateway(resolved, plugins)
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
            source = "built-in quickstart" if resolved.source == QUICKSTART_NAME else resolved.source
            click.secho(f"shuniu {__version__} serving {source} on http://{shown}:{bound_port}", fg="green")
            click.echo(f"  models: {', '.join(resolved.deployment.models)}")
            click.echo("  try:")
            url = f"http://{shown}:{bound_port}/v1/chat/completions"
            body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello"}}]}}'
            click.echo(f"    curl {url} -H 'content-type: application/json' \\\n      -d '{body}'")
            if not is_loopback(bound_host):
                click.secho(
                    f"  WARNING: listening on {bound_host} with NO authentication: anyone who can "
                    "reach this port can use every model.",
                    fg="red",
                    bold=True,
                    err=True,
                )
            sys.stdout.flush()

        run_gateway(gateway, host, port, on_ready=ready, log_level=log_level)

    @cli.command()
    @click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
    @click.pass_context
    def validate(ctx: click.Context, file: Path) -> None:
        """Check a deployment FILE; print every problem with its field path and line."""
        from shuniu.core.config_loader import expand_endpoints, load_deployment

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
        from shuniu.core.schema import deployment_schema

        click.echo(json.dumps(deployment_schema(_plugins(ctx)), indent=indent or None))

    @cli.command("plugins")
    @click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
    @click.pass_context
    def plugins_cmd(ctx: click.Context, as_json: bool) -> None:
        """List installed plugins, their distribution, version and hooks, and what they registered."""
        from shuniu.core.plugin_manager import CATEGORIES

        plugins = _plugins(ctx)
        registered: dict[str, list[str]] = {}
        try:
            for category in CATEGORIES:
                for name, reg in plugins.registered(category).items():
                    registered.setdefault(reg.plugin, []).append(
                        f"{category[:-1] if category != 'hardware' else category}:{name}"
                    )
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

    manager.add_commands(cli)
    return cli


def main(argv: list[str] | None = None) -> None:
    build_cli()(args=argv, prog_name="shuniu")
