"""Adds ``shuniu usage`` to the command line, and ``create``, ``list``, ``show``,
``revoke`` and ``rotate`` to ``shuniu keys`` (made by the ``api_keys`` plugin, or here when
that plugin is not loaded)."""

from __future__ import annotations

import click

from shuniu.core import hookimpl

__all__ = ["register_commands"]


@hookimpl(trylast=True)
def register_commands(cli: click.Group) -> None:
    # Imported here, not at load: loading the plugins (every gateway start) stays cheap.
    from shuniu.plugins.tools.usage.command import add_key_commands, usage_command

    cli.add_command(usage_command)
    keys = cli.commands.get("keys")
    if not isinstance(keys, click.Group):
        keys = click.Group("keys", help="Manage API keys.")
        cli.add_command(keys)
    add_key_commands(keys)
