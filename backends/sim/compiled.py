"""Which of the simulator's modules run compiled.

A regular install compiles the engine's hot modules with mypyc when it can (``setup.py``,
which reads the list in ``core/compiled.py``:
a C compiler at install time; ``SHUNIU_COMPILE=0`` opts out; an editable install never
compiles). The compiled modules are the same source and give the same results; they run
the simulator about a fifth faster.
"""

from __future__ import annotations

from shuniu.core.compiled import COMPILED_PATHS, runs_compiled

__all__ = ["COMPILED_MODULES", "compiled_modules"]

_PREFIX = "backends/sim/"
COMPILED_MODULES = tuple(p[len(_PREFIX) : -3] for p in COMPILED_PATHS if p.startswith(_PREFIX))
"""The modules of :mod:`shuniu.backends.sim` that ``setup.py`` compiles (their list is
:data:`shuniu.core.compiled.COMPILED_PATHS`)."""


def compiled_modules() -> list[str]:
    """Those of :data:`COMPILED_MODULES` that this process imported compiled (from an
    extension module rather than their ``.py`` file)."""
    return [name for name in COMPILED_MODULES if runs_compiled(f"backends.sim.{name}")]
