"""``least_busy``: an example third-party shuniu plugin (a load balancer).

Everything shuniu needs from this package is the entry point in ``pyproject.toml``::

    [project.entry-points."shuniu.plugins"]
    least_busy = "shuniu_least_busy"

which points at this module, whose :func:`register_balancers` hook registers the balancer
under the name a deployment selects with ``balancer: {policy: least_busy}``.
"""

from __future__ import annotations

from shuniu.core import hookimpl
from shuniu.core.contracts import RegisterBalancer
from shuniu_least_busy.balancer import LeastBusy, LeastBusyOptions

__all__ = ["LeastBusy", "LeastBusyOptions", "register_balancers"]


@hookimpl
def register_balancers(register: RegisterBalancer) -> None:
    register(
        "least_busy",
        LeastBusy,
        options=LeastBusyOptions,
        description="The endpoint with the fewest in-flight requests per unit of weight.",
    )
