"""The example third-party plugin (``examples/third_party_plugin``, distribution
``shuniu-least-busy``): installed as a separate distribution it appears in ``shuniu
plugins``, a deployment selecting ``least_busy`` validates and serves; and its balancer's
pick logic does what its docs say.

The install goes into a temporary ``--target`` folder put on ``PYTHONPATH`` of the child
processes, so the shared virtualenv is never changed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from openai import OpenAI

from shuniu.core.config.loader import load_deployment
from shuniu.core.contracts import BackendBase
from shuniu.core.errors import ConfigError
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.pools.pool import EndpointState, Pool
from shuniu.core.types import InferenceRequest, Outcome
from shuniu.plugins.schedulers.fifo import FifoScheduler

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "third_party_plugin"
EXAMPLE_DEPLOYMENT = EXAMPLE / "deployment.yaml"
_PROJECT = tomllib.loads((EXAMPLE / "pyproject.toml").read_text("utf-8"))["project"]
DIST_NAME: str = _PROJECT["name"]
DIST_VERSION: str = _PROJECT["version"]


@pytest.fixture(autouse=True)
def _no_plugin_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The allow/deny lists of the surrounding environment must not leak into these tests
    (the gateway and CLI children inherit ``os.environ``)."""
    monkeypatch.delenv("SHUNIU_PLUGINS", raising=False)
    monkeypatch.delenv("SHUNIU_DISABLE_PLUGINS", raising=False)


# -- installing the example as its own distribution ---------------------------------------


def _setuptools_builds_wheels_alone() -> bool:
    """setuptools < 70.1 needs the separate ``wheel`` package to build a wheel; without it
    ``--no-build-isolation`` fails with ``invalid command 'bdist_wheel'``."""
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return False
    if importlib.util.find_spec("wheel") is not None:
        return True
    m = re.match(r"(\d+)\.(\d+)", version)
    return m is not None and (int(m.group(1)), int(m.group(2))) >= (70, 1)


def _pip_install_target(src: Path, target: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(src)]
    if _setuptools_builds_wheels_alone():
        # Offline and quick: build with the virtualenv's own setuptools.
        cmd.insert(4, "--no-build-isolation")
    # Otherwise pip builds in an isolated environment and fetches `setuptools>=61` from the
    # configured package index (a local one on these machines, so this works offline too).
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"},
    )


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``shuniu-least-busy`` installed with pip into a fresh ``--target`` folder."""
    base = tmp_path_factory.mktemp("least_busy")
    # Build from a copy: the build writes build/ and *.egg-info next to the sources.
    src = base / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "dist"))
    site = base / "site"
    result = _pip_install_target(src, site)
    if result.returncode != 0:
        pytest.fail(f"pip install of the example plugin failed:\n{result.stdout}\n{result.stderr}")
    dist_infos = list(site.glob("shuniu_least_busy-*.dist-info"))
    assert len(dist_infos) == 1, list(site.iterdir())
    entry_points = (dist_infos[0] / "entry_points.txt").read_text()
    assert "[shuniu.plugins]" in entry_points
    assert "least_busy = shuniu_least_busy" in entry_points
    return site


def _env(site: Path | None, **extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env.pop("SHUNIU_PLUGINS", None)
    env.pop("SHUNIU_DISABLE_PLUGINS", None)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return env


def _shuniu(*args: str, site: Path | None, columns: int = 80) -> subprocess.CompletedProcess[str]:
    # COLUMNS: rich fits the `shuniu plugins` table to it (80 when not on a terminal).
    return subprocess.run(
        [sys.executable, "-m", "shuniu.core", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(site, COLUMNS=str(columns)),
    )


def test_installed_plugin_is_listed_with_its_distribution(site_dir: Path) -> None:
    result = _shuniu("plugins", "--json", site=site_dir)
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    assert listing["failed"] == []
    by_name = {p["name"]: p for p in listing["plugins"]}
    assert by_name["least_busy"] == {
        "name": "least_busy",
        "distribution": DIST_NAME,
        "version": DIST_VERSION,
        "hooks": ["register_balancers"],
        "registers": ["balancer:least_busy"],
    }
    # The built-ins are still there, next to it.
    assert {"sim", "openai", "round_robin", "fifo"} <= by_name.keys()
    assert by_name["round_robin"]["registers"] == ["balancer:round_robin"]

    table = _shuniu("plugins", site=site_dir, columns=200)
    assert table.returncode == 0, table.stderr
    assert "least_busy" in table.stdout
    assert DIST_NAME in table.stdout


def test_deployment_selecting_least_busy_validates(site_dir: Path, tmp_path: Path) -> None:
    ok = _shuniu("validate", str(EXAMPLE_DEPLOYMENT), site=site_dir)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "OK (1 model(s), 3 endpoint(s))" in ok.stdout

    # Without the plugin on the path the same file is an error naming what is registered.
    missing = _shuniu("validate", str(EXAMPLE_DEPLOYMENT), site=None)
    assert missing.returncode == 1
    assert "models.chat.balancer.policy" in missing.stderr
    assert "unknown balancer 'least_busy'; registered: least_load, " in missing.stderr
    assert "round_robin" in missing.stderr

    # The plugin's options model validates `balancer.options`, with the field path.
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        EXAMPLE_DEPLOYMENT.read_text().replace(
            "tie_break: round_robin", "tie_break: random\n        spread: 2"
        )
    )
    invalid = _shuniu("validate", str(bad), site=site_dir)
    assert invalid.returncode == 1
    assert "models.chat.balancer.options.tie_break" in invalid.stderr
    assert "'round_robin' or 'first'" in invalid.stderr
    assert "models.chat.balancer.options.spread" in invalid.stderr
    assert "unknown field 'spread'; expected one of: tie_break" in invalid.stderr


def _completed_by_endpoint(gw: Any) -> dict[str, int]:
    ready = httpx.get(f"{gw.url}/ready", timeout=10).json()
    return {e["name"]: e["completed"] for e in ready["models"]["chat"]["endpoints"]}


def test_gateway_with_least_busy_serves_the_openai_sdk(site_dir: Path, gateway_factory: Any) -> None:
    gw = gateway_factory(EXAMPLE_DEPLOYMENT.read_text(), env={"PYTHONPATH": _env(site_dir)["PYTHONPATH"]})
    client = OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)

    models = {m.id for m in client.models.list().data}
    assert models == {"chat"}

    for i in range(5):
        resp = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=16
        )
        assert resp.object == "chat.completion"
        assert resp.choices[0].message.role == "assistant"
        assert resp.choices[0].message.content
        assert resp.usage is not None
        assert 1 <= resp.usage.completion_tokens <= 16
        assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens

    stream = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "stream please"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage is not None:
            usage = chunk.usage
    assert text
    assert usage is not None and 1 <= usage.completion_tokens <= 12

    # One request at a time, every endpoint is idle when a request is placed: least_busy
    # scores `big` (weight 2) 1/2 and each `small` 1/1, so all six went to `big`, which
    # round_robin (the default) would never do.
    assert _completed_by_endpoint(gw) == {"small-0": 0, "small-1": 0, "big": 6}
    assert gw.stop() == 0


# -- the balancer itself, in-process from the example's sources ---------------------------


@pytest.fixture
def least_busy(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The example's package imported from its source folder."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import shuniu_least_busy

    assert Path(shuniu_least_busy.__file__).resolve().parent.parent == EXAMPLE
    return shuniu_least_busy


def _req(i: int = 0) -> InferenceRequest:
    return InferenceRequest(id=f"req-{i}", api="chat", model="chat", body={}, prompt="hi", prompt_tokens=1)


def _endpoints(*weights: float, max_concurrency: int = 0) -> list[EndpointState]:
    return [
        EndpointState(f"ep{i}", BackendBase(), weight=w, max_concurrency=max_concurrency)
        for i, w in enumerate(weights)
    ]


def test_pick_prefers_fewest_in_flight_per_weight(least_busy: ModuleType) -> None:
    balancer = least_busy.LeastBusy()
    a, b, c = eps = _endpoints(1, 1, 1)
    a.in_flight, b.in_flight, c.in_flight = 2, 0, 1
    assert balancer.pick(_req(), eps) is b

    # Weights count: (3 + 1) / 4 = 1 beats (1 + 1) / 1 = 2, busier in absolute terms or not.
    light, heavy = eps = _endpoints(1, 4)
    light.in_flight, heavy.in_flight = 1, 3
    assert balancer.pick(_req(), eps) is heavy
    heavy.in_flight = 8  # (8 + 1) / 4 = 2.25 > 2
    assert balancer.pick(_req(), eps) is light

    # An idle heavier endpoint beats an idle lighter one.
    assert balancer.pick(_req(), _endpoints(1, 2, 1)).name == "ep1"

    assert balancer.pick(_req(), []) is None


def test_ties_rotate_with_round_robin_and_stick_with_first(least_busy: ModuleType) -> None:
    eps = _endpoints(1, 1, 1)
    rr = least_busy.LeastBusy(least_busy.LeastBusyOptions(tie_break="round_robin"))
    assert [rr.pick(_req(i), eps).name for i in range(7)] == [
        "ep0",
        "ep1",
        "ep2",
        "ep0",
        "ep1",
        "ep2",
        "ep0",
    ]
    first = least_busy.LeastBusy(least_busy.LeastBusyOptions(tie_break="first"))
    assert {first.pick(_req(i), eps).name for i in range(5)} == {"ep0"}

    # Only the tied minimum rotates: a busier endpoint never wins a turn.
    eps[1].in_flight = 1
    assert [rr.pick(_req(i), eps).name for i in range(4)] == ["ep2", "ep0", "ep2", "ep0"]

    # Scores equal up to float rounding are ties too: 1 / 0.3 and 3 / 0.9 differ in the last
    # bit (3.3333333333333335 and 3.333333333333333), which must not make ep1 win every time.
    x, y = eps = _endpoints(0.3, 0.9)
    y.in_flight = 2
    assert (x.in_flight + 1) / x.weight > (y.in_flight + 1) / y.weight
    rr = least_busy.LeastBusy()
    assert [rr.pick(_req(i), eps).name for i in range(4)] == ["ep0", "ep1", "ep0", "ep1"]


def test_load_follows_weights_through_a_pool(least_busy: ModuleType) -> None:
    """Dispatching through a real Pool (which counts in-flight requests) spreads requests
    in proportion to the weights, and a finished request frees its endpoint for the next."""
    eps = _endpoints(1, 1, 2)
    pool = Pool("chat", eps, least_busy.LeastBusy(), FifoScheduler())
    tickets = [pool.try_dispatch(_req(i), 0.0) for i in range(40)]
    assert all(t is not None for t in tickets)
    assert [e.in_flight for e in eps] == [10, 10, 20]

    # Two requests on ep1 finish: ep1 is now the least busy, for exactly two more requests.
    done = [t for t in tickets if t is not None and t.endpoint is eps[1]][:2]
    for t in done:
        pool.free(t, Outcome.OK)
    assert [e.in_flight for e in eps] == [10, 8, 20]
    assert [pool.try_dispatch(_req(100 + i), 0.0).endpoint.name for i in range(2)] == ["ep1", "ep1"]

    # With per-endpoint slots, the pool offers only endpoints with a free one.
    eps = _endpoints(1, 5, 1, max_concurrency=1)
    pool = Pool("chat", eps, least_busy.LeastBusy(), FifoScheduler())
    names = [pool.try_dispatch(_req(i), 0.0).endpoint.name for i in range(3)]
    assert names == ["ep1", "ep0", "ep2"]
    assert pool.try_dispatch(_req(9), 0.0) is None


def test_options_and_registration_in_process(least_busy: ModuleType) -> None:
    options = least_busy.LeastBusyOptions()
    assert options.tie_break == "round_robin"
    doc = least_busy.LeastBusyOptions.model_fields["tie_break"].description
    assert doc and "round_robin" in doc and "first" in doc

    plugins = load_plugins(extra=[("least_busy", least_busy)])
    reg = plugins.registered("balancers")["least_busy"]
    assert reg.plugin == "least_busy"
    assert reg.options is least_busy.LeastBusyOptions
    assert reg.description

    text = EXAMPLE_DEPLOYMENT.read_text().replace("tie_break: round_robin", "tie_break: first")
    resolved = load_deployment(None, plugins, text=text)
    assert resolved.balancer_options["chat"] == least_busy.LeastBusyOptions(tie_break="first")
    balancer = reg.factory(resolved.balancer_options["chat"])
    assert isinstance(balancer, least_busy.LeastBusy)
    assert balancer.options.tie_break == "first"

    with pytest.raises(ConfigError) as info:
        load_deployment(None, plugins, text=text.replace("tie_break: first", "tie_break: fastest"))
    [problem] = info.value.problems
    assert problem.path == "models.chat.balancer.options.tie_break"
    assert problem.line is not None
