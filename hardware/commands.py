"""``shuniu hardware``: the probes' readings as a table or JSON (added to the command line
through ``register_commands``, so ``shuniu.core`` does not import the probes)."""

from __future__ import annotations

import json
import sys

import click

from shuniu.core import hookimpl

__all__ = ["register_commands"]


@hookimpl
def register_commands(cli: click.Group) -> None:
    @cli.command("hardware")
    @click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
    @click.option("--probe", "names", multiple=True, metavar="NAME", help="Run only this probe (repeatable).")
    @click.pass_context
    def hardware(ctx: click.Context, as_json: bool, names: tuple[str, ...]) -> None:
        """Show this machine's GPUs, NPUs and CPU: memory, utilization, temperature, power."""
        # The probes arrive through the register_hardware hook; shuniu.hardware only runs them.
        from shuniu.hardware import hardware_snapshot, probe_all

        try:
            if as_json:
                snapshot = hardware_snapshot(names or None, plugins=_plugins(ctx))
                click.echo(json.dumps(snapshot, indent=2))
                return
            reports = probe_all(names or None, plugins=_plugins(ctx))
        except ValueError as exc:
            click.secho(str(exc), fg="red", err=True)
            ctx.exit(2)
        from rich.console import Console

        from shuniu.hardware.render import print_reports

        print_reports(reports, Console(width=None if sys.stdout.isatty() else 160))


def _plugins(ctx: click.Context):  # type: ignore[no-untyped-def]
    from shuniu.core.plugin_manager import PluginManager, load_plugins

    return ctx.find_object(PluginManager) or load_plugins()
