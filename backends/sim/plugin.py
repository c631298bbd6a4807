"""Registers the ``sim`` backend. The tools built on the simulator register their own commands
(:mod:`shuniu.plugins.tools`)."""

from __future__ import annotations

from shuniu.backends.sim.options import SimOptions
from shuniu.core import hookimpl
from shuniu.core.contracts import Backend, EndpointSpec, RegisterBackend


def _factory(spec: EndpointSpec) -> Backend:
    from shuniu.backends.sim.backend import SimBackend

    return SimBackend(spec)


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    register(
        "sim",
        _factory,
        options=SimOptions,
        description="Built-in engine simulator (no GPU): continuous batching, paged KV and prefix "
        "cache, timing from hardware and model profiles or a fixed rate.",
    )
