"""The build's one piece of code: compile a few hot modules with mypyc.

Everything else about the package is in ``pyproject.toml``. The modules are listed in
``core/compiled.py``: the simulated engine (its iterations, KV blocks, cohorts, cost model
and latency histograms), where ``shuniu simulate`` and ``shuniu plan`` spend their time
(compiled, about a fifth faster: ``benchmarks/sim_speed.py``), and the feature code every
limited request runs (credentials, tiers, rate limits and their headers, prefix-aware
placement). Compiled, they give the same results bit for bit
(``tests/test_compiled_build.py``). The pure-Python modules stay the reference and the
fallback:

* ``SHUNIU_COMPILE=0`` builds without compiling;
* an editable install (``pip install -e .``) never compiles, so an edited source file
  takes effect at once;
* a build that cannot compile (no C compiler, a mypyc error) says so and installs the
  pure-Python modules instead of failing.
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _compiled_paths() -> list[str]:
    """The modules to compile, as paths in this tree (each is imported as ``shuniu.<path>``):
    ``COMPILED_PATHS`` of ``core/compiled.py``, read without importing it."""
    tree = ast.parse((ROOT / "core" / "compiled.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "COMPILED_PATHS":
            return list(ast.literal_eval(node.value))
    raise RuntimeError("core/compiled.py has no COMPILED_PATHS")


MYPY_FLAGS = ("--follow-imports=silent", "--explicit-package-bases")
"""Only the compiled modules are checked (the ones they import are read for their types);
a module is named after its path under the stage (``shuniu/backends/...``)."""
PARTS = ("core", "plugins", "backends", "hardware")
"""The top-level folders that ``pyproject.toml`` maps to ``shuniu.<folder>``."""


def _wanted() -> bool:
    if os.environ.get("SHUNIU_COMPILE", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    # An editable install runs the sources where they are: a compiled copy beside them
    # would hide every later edit.
    return not any(arg in ("editable_wheel", "develop") for arg in sys.argv[1:])


def _note(message: str) -> None:
    print(f"shuniu build: {message}", file=sys.stderr)


def _drop_stale_builds() -> None:
    """Remove compiled modules an earlier build left in ``build/``: a wheel packs what is
    there, and one built without compiling must not carry an old compiled module."""
    # Every extension module under the package, not only the listed ones: a module taken
    # off the list must not stay compiled (an old one would also fail to import).
    for lib in ROOT.glob("build/lib*"):
        stale = [*lib.glob("shuniu_*__mypyc*"), *lib.glob("shuniu/**/*.so"), *lib.glob("shuniu/**/*.pyd")]
        for found in stale:
            found.unlink()


def _extensions() -> list[Any]:
    _drop_stale_builds()
    if not _wanted():
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _note("mypyc is not installed: every module stays pure Python")
        return []
    stage = ROOT / "build" / "mypyc-src"
    cwd = Path.cwd()
    try:
        # mypy names a module after its path: the sources are staged as a ``shuniu`` tree
        # (links to the folders), which is how they are imported.
        shutil.rmtree(stage, ignore_errors=True)
        (stage / "shuniu").mkdir(parents=True)
        for part in PARTS:
            (stage / "shuniu" / part).symlink_to(ROOT / part, target_is_directory=True)
        os.chdir(stage)
        extensions = mypycify(
            [*(f"shuniu/{path}" for path in _compiled_paths()), *MYPY_FLAGS],
            target_dir=str(ROOT / "build" / "mypyc-c"),  # absolute: the C files' names hold after the chdir
            group_name="shuniu_compiled",
        )
    except (Exception, SystemExit) as exc:  # mypy exits through SystemExit on a type error;
        # a file system without symbolic links fails the staging
        _note(f"mypyc could not compile ({exc!r}): every module stays pure Python")
        return []
    finally:
        os.chdir(cwd)
    return extensions


class BuildExtOrPure(build_ext):
    """``build_ext`` that, when a compiled module fails to build, builds none: the shared
    part and every module's part come together or not at all, and the pure-Python modules
    (always installed) take their place."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # a missing compiler, a compiler error
            _note(f"compiling failed ({exc}): every module stays pure Python")
            for output in self.get_outputs():
                Path(output).unlink(missing_ok=True)
            self.extensions = []


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExtOrPure})
