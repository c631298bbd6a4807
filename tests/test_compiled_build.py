"""The package as a regular install builds it: ``setup.py`` compiles the modules listed in
``core/compiled.py`` with mypyc (the simulator's engine; a request's credential, tier and
rate limits; prefix-aware placement). Built here as a user's ``pip install .`` would (a
wheel from a copy of this tree), the compiled simulator must give the same results as the
pure-Python source it was compiled from, bit for bit, and every compiled module must pass
its own tests compiled.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from shuniu.backends.sim import COMPILED_MODULES
from shuniu.core.compiled import COMPILED_PATHS, compiled
from tests.sim_summaries import summaries

ROOT = Path(__file__).resolve().parent.parent
SIM_TESTS = [
    "tests/test_sim_engine.py",
    "tests/test_sim_leaps.py",
    "tests/test_sim_cohort.py",
    "tests/test_sim_core.py",
    "tests/test_sim_costmodel.py",
    "tests/test_sim_costmodel_terms.py",
    "tests/test_sim_stats.py",
    "tests/test_sim_faults.py",
    "tests/test_kvcache.py",
    "tests/test_disaggregation.py",
    "tests/test_simulate.py",
    "tests/test_sim_plan.py",
    "tests/test_sim_serve.py",
]
"""The simulator's tests that run again on the compiled build."""
TENANCY_TESTS = [
    "tests/test_ratelimit_binding.py",
    "tests/test_ratelimit_stores.py",
    "tests/test_tenancy.py",
    "tests/test_tenancy_e2e.py",
    "tests/test_tenancy_redis_e2e.py",
    "tests/test_auth_api_keys.py",
    "tests/test_auth_jwt.py",
    "tests/test_http_api.py",
]
"""The tests of the compiled request-path modules (credentials, tiers, rate limits, their
headers), run again on the compiled build."""
ROUTING_TESTS = [
    "tests/test_balancers.py",
    "tests/test_precise_prefix.py",
    "tests/test_prefix_affinity.py",
    "tests/test_new_prefixes.py",
    "tests/test_routing.py",
]
"""The prefix balancers' tests, run again with their block hashes and placement compiled (the
simulator's summaries above place requests with both balancers too)."""

HTTP_TESTS = [
    "tests/test_http_protocol.py",
    "tests/test_http_layer.py",
    "tests/test_slow_clients.py",
    "tests/test_stream_coalescing.py",
    "tests/test_h1_client.py",
]
"""The tests of the HTTP/1.1 server protocol and the engine calls' client, run again with both
compiled (the gateway processes they start import the compiled build too)."""

PATH_TESTS = [
    "tests/test_e2e_openai.py",
    "tests/test_openai_api.py",
    "tests/test_anthropic_api.py",
    "tests/test_resilience_e2e.py",
    "tests/test_deadline_wheel.py",
    "tests/test_response_cache.py",
    "tests/test_passthrough.py",
    "tests/test_intake.py",
    "tests/test_metrics.py",
    "tests/test_scheduling_e2e.py",
    "tests/test_usage_details.py",
    "tests/test_running_loop.py",
    "tests/test_token_scan.py",
    "tests/test_client_gone.py",
]
"""The request path's tests (intake, routing, attempts and retries, delivery, deadlines,
the record of each request), run again with its steps compiled."""

pytestmark = pytest.mark.timeout(900)


def _build_problem() -> str | None:
    """Why a compiled build cannot be made here, or ``None``."""
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc is not installed (the test extra installs it)"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "no Python headers (Python.h)"
    return None


@pytest.fixture(scope="module")
def compiled_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the installed files of a wheel built from this tree."""
    problem = _build_problem()
    if problem is not None:
        pytest.skip(problem)
    if compiled():
        pytest.skip("this process already runs compiled modules: compare from a source checkout")
    base = tmp_path_factory.mktemp("compiled")
    src = base / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd")
    for part in ("core", "plugins", "backends", "hardware"):
        shutil.copytree(ROOT / part, src / part, ignore=skip)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    dist = base / "dist"
    env = {**os.environ, "SHUNIU_COMPILE": "1"}
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", dist, src],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    notes = [line for line in (build.stdout + build.stderr).splitlines() if "shuniu build:" in line]
    assert not notes, "\n".join(notes)  # the build fell back to pure Python
    (wheel,) = dist.glob("shuniu-*.whl")
    site = base / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def _run_on(site: Path, *argv: str, **env_vars: str) -> subprocess.CompletedProcess[str]:
    """``python argv`` in this checkout with the wheel's files first on the path: its
    ``shuniu`` shadows the editable install (the checkout's root, on the path for
    ``tests``, holds no ``shuniu`` folder)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), **env_vars}
    command = [sys.executable, *argv]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=800)


def test_no_compiled_coroutine_awaits_in_a_finally() -> None:
    # mypyc 2.4.1 compiles a `finally:` that awaits so that it raises again an exception a
    # handler below it had handled, once the exception came through another compiled
    # coroutine's await (a client that left became a CancelledError in the server's log,
    # and a stream's idle timeout closed the connection). The request path does those ends
    # after its try statements instead (core/pipeline/path.py's _serve).
    found = []
    for path in COMPILED_PATHS:
        tree = ast.parse((ROOT / path).read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Try) and any(
                    isinstance(inner, (ast.Await, ast.AsyncFor, ast.AsyncWith))
                    for stmt in node.finalbody
                    for inner in ast.walk(stmt)
                ):
                    found.append(f"{path}:{node.lineno} ({fn.name})")
    assert found == []


def test_the_build_environment_holds_every_runtime_dependency() -> None:
    # pip builds in an isolated environment holding only the build requirements; mypy needs
    # the runtime dependencies' types there, or it stops and the install is pure Python
    # (the wheel below is built without isolation, so it cannot see this).
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    build = set(project["build-system"]["requires"])
    assert set(project["project"]["dependencies"]) <= build


def test_the_build_compiles_the_hot_modules(compiled_site: Path) -> None:
    probe = _run_on(compiled_site, "-c", "from shuniu.core.compiled import compiled; print(*compiled())")
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert probe.stdout.split() == [path.removesuffix(".py").replace("/", ".") for path in COMPILED_PATHS]
    # The memory store's bindings take the compiled loops there, which the compiled tenancy
    # calls directly (they are a core Binding).
    check = (
        "from shuniu.core.tenancy.binding import Binding\n"
        "from shuniu.plugins.ratelimit.memory import MemoryRateLimitStore as M\n"
        "b = M().bind([], [], [])\n"
        "print(b.take, isinstance(b.native, Binding))"
    )
    probe = _run_on(compiled_site, "-c", check)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert "LoopBinding" in probe.stdout and probe.stdout.split()[-1] == "True"


def test_compiled_and_pure_simulations_agree_bit_for_bit(compiled_site: Path) -> None:
    duration = 20.0
    run = _run_on(compiled_site, "-m", "tests.sim_summaries", str(duration))
    assert run.returncode == 0, run.stderr[-3000:]
    *compiled, built = run.stdout.splitlines()
    assert built == "compiled " + json.dumps(list(COMPILED_MODULES))
    pure = summaries(duration)
    assert len(compiled) == len(pure)
    for ours, theirs in zip(pure, compiled, strict=True):
        assert ours == theirs, f"{ours.split(' ', 2)[:2]} differs compiled"


def test_the_simulator_tests_pass_compiled(compiled_site: Path) -> None:
    # CI=0: a test that cannot apply to compiled code skips (it patches an engine method);
    # every skip must be one of those.
    pytest = ("-m", "pytest", "-q", "-rs", "-x", "-p", "no:cacheprovider")
    run = _run_on(compiled_site, *pytest, *SIM_TESTS, CI="0")
    assert run.returncode == 0, run.stdout[-4000:]
    skips = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("compiled engine" in line for line in skips), skips


def test_the_tenancy_tests_pass_compiled(compiled_site: Path) -> None:
    run = _run_on(compiled_site, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *TENANCY_TESTS)
    assert run.returncode == 0, run.stdout[-4000:]


def test_the_routing_tests_pass_compiled(compiled_site: Path) -> None:
    run = _run_on(compiled_site, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *ROUTING_TESTS)
    assert run.returncode == 0, run.stdout[-4000:]


def test_the_http_tests_pass_compiled(compiled_site: Path) -> None:
    run = _run_on(compiled_site, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *HTTP_TESTS)
    assert run.returncode == 0, run.stdout[-4000:]


def test_the_request_path_tests_pass_compiled(compiled_site: Path) -> None:
    run = _run_on(compiled_site, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *PATH_TESTS)
    assert run.returncode == 0, run.stdout[-4000:]
