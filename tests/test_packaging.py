"""The wheel (``pip install .``) holds every subpackage, the data files and the entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_non_editable_install_works(tmp_path: Path) -> None:
    target = tmp_path / "site"
    # Without the mypyc modules (tests/test_compiled_build.py builds and runs those): this
    # test is about what the wheel holds, and compiling takes minutes on a loaded 2-core box.
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SHUNIU_COMPILE": "0"},
    )
    assert build.returncode == 0, build.stdout + build.stderr
    for pkg in ("core", "plugins", "backends", "hardware"):
        assert (target / "shuniu" / pkg / "__init__.py").exists(), pkg
    assert (target / "shuniu" / "core" / "data" / "quickstart.yaml").exists()
    # Run from an empty directory with only the installed copy (and the dependencies) visible:
    # the source tree must not be what gets imported.
    deps = [p for p in sys.path if p.endswith("site-packages")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *deps]), "PYTHONNOUSERSITE": "1"}
    code = (
        "import json, shuniu.core, shuniu.core.cli as c;"
        "from shuniu.core.plugin_manager import load_plugins;"
        "from shuniu.core.config.loader import load_deployment;"
        "p = load_plugins(); load_deployment(None, p);"
        "print(json.dumps({'file': shuniu.core.__file__, 'plugins': sorted(i.name for i in p.plugins())}))"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["file"].startswith(str(target))
    assert {"sim", "openai", "round_robin", "fifo"} <= set(info["plugins"])


def test_every_source_package_is_listed_for_the_wheel() -> None:
    """A package folder missing from ``[tool.setuptools] packages`` works in an editable
    install and is silently left out of the wheel; the list must name every one."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    listed = set(project["tool"]["setuptools"]["packages"])
    found = {
        "shuniu." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("core", "plugins", "backends", "hardware")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found - listed == set(), "packages missing from pyproject.toml"
    assert listed - found == set(), "pyproject.toml lists packages that do not exist"
