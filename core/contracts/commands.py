"""The command contract: subcommands of the ``shuniu`` command line.

A ``register_commands(cli)`` hook receives the root :class:`click.Group` once, when the CLI
is built, and adds commands or groups to it (``@cli.command()``, ``cli.add_command``), as
``shuniu simulate``, ``shuniu plan``, ``shuniu sim serve``, ``shuniu bench``, ``shuniu
hardware`` and ``shuniu keys`` do. A command imports what it needs when it runs, not at
registration, so ``shuniu --help`` stays fast.
"""

from __future__ import annotations

from typing import TypeAlias

import click

__all__ = ["CommandGroup"]

CommandGroup: TypeAlias = click.Group
"""What ``register_commands`` receives: the root ``shuniu`` group."""
