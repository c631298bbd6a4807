"""Which modules a regular install compiles with mypyc, and which of them this process runs
compiled.

``setup.py`` reads :data:`COMPILED_PATHS` (without importing this module) and compiles those
modules when it can: a C compiler at install time; ``SHUNIU_COMPILE=0`` opts out; an
editable install never compiles. The compiled modules are the same source and give the same
results, bit for bit; each runs its own tests compiled in ``tests/test_compiled_build.py``.
"""

from __future__ import annotations

import importlib

__all__ = ["COMPILED_PATHS", "compiled", "runs_compiled"]

COMPILED_PATHS = (
    # The simulator's engine (its list is backends/sim/compiled.py's COMPILED_MODULES).
    "backends/sim/stats.py",
    "backends/sim/costmodel.py",
    "backends/sim/kvcache.py",
    "backends/sim/cohort.py",
    "backends/sim/engine.py",
    # A request's credential, tier and rate limits: the memory store's booking, the
    # x-ratelimit-* headers, the tenancy and the request path's step that calls it.
    "core/tenancy/binding.py",
    "core/tenancy/admission.py",
    "plugins/ratelimit/loop_binding.py",
    "core/tenancy/ratelimit_headers.py",
    "core/tenancy/tenancy.py",
    "core/tenancy/auth.py",
    "core/pipeline/identity.py",
    # Prefix-aware placement: a prompt's block hashes and the prefix balancers' cost model.
    "core/pools/prefix.py",
    "plugins/balancers/placement.py",
    # The HTTP/1.1 server side: parsing callbacks, the response head, the guards.
    "core/http/protocol.py",
    # The engine calls' HTTP/1.1 client.
    "backends/http/h1.py",
    # The request path's own steps (closed: plugins are called from them, never subclass
    # them): the ASGI helpers, intake, routing, attempts and delivery, the disconnect watch,
    # the deadlines and timer wheels, the record of a finished request.
    "core/http/asgi.py",
    "core/pipeline/path.py",
    "core/pipeline/attempts.py",
    "core/pipeline/disconnect.py",
    "core/pipeline/routing.py",
    "core/pools/resilience.py",
    "core/pipeline/delivery.py",
    "core/pipeline/intake.py",
    "core/pipeline/recording.py",
    "core/timers.py",
    # The prompt's token estimate, of ASCII text (the regular expressions' count, in one pass).
    "core/token_scan.py",
)
"""The compiled modules, as paths in the source tree (each is imported as ``shuniu.<path>``)."""


def compiled() -> list[str]:
    """The modules of :data:`COMPILED_PATHS` that this process imported compiled (from an
    extension module rather than their ``.py`` file), as dotted names under ``shuniu``."""
    names = (path.removesuffix(".py").replace("/", ".") for path in COMPILED_PATHS)
    return [name for name in names if runs_compiled(name)]


def runs_compiled(name: str) -> bool:
    """Whether the module ``shuniu.<name>`` was imported compiled (from an extension module
    rather than its ``.py`` file); imports it."""
    return not (importlib.import_module(f"shuniu.{name}").__file__ or "").endswith(".py")
