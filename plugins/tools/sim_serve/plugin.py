"""Adds ``shuniu sim serve`` (the ``sim`` command group) to the command line."""

from __future__ import annotations

import click

from shuniu.core import hookimpl

__all__ = ["register_commands"]


@hookimpl
def register_commands(cli: click.Group) -> None:
    # Imported here, not at load: loading the plugins (every gateway start) stays cheap.
    from shuniu.plugins.tools.sim_serve.serve import sim_group

    cli.add_command(sim_group)
