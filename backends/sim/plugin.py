"""Registers the ``sim`` backend."""

from __future__ import annotations

from shuniu.backends.sim.options import SimOptions
from shuniu.core import hookimpl
from shuniu.core.interfaces import EndpointSpec


def _factory(spec: EndpointSpec):  # type: ignore[no-untyped-def]
    from shuniu.backends.sim.backend import SimBackend

    return SimBackend(spec)


@hookimpl
def register_backends(register) -> None:  # type: ignore[no-untyped-def]
    register(
        "sim",
        _factory,
        options=SimOptions,
        description="Built-in engine simulator (no GPU): continuous batching, paged KV and prefix "
        "cache, timing from hardware and model profiles or a fixed rate.",
    )


@hookimpl
def register_commands(cli) -> None:  # type: ignore[no-untyped-def]
    from shuniu.backends.sim.commands import simulate_command
    from shuniu.backends.sim.plan import plan_command
    from shuniu.backends.sim.serve import sim_group

    cli.add_command(simulate_command)
    cli.add_command(plan_command)
    cli.add_command(sim_group)
