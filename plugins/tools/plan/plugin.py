"""Adds ``shuniu plan`` to the command line."""

from __future__ import annotations

import click

from shuniu.core import hookimpl

__all__ = ["register_commands"]


@hookimpl
def register_commands(cli: click.Group) -> None:
    # Imported here, not at load: loading the plugins (every gateway start) stays cheap.
    from shuniu.plugins.tools.plan.command import plan_command

    cli.add_command(plan_command)
