"""The plugin system: entry-point loading, allow/deny lists, broken and misspelled plugins,
name clashes, errors that list what is registered, ``shuniu plugins``, and the lifecycle and
observer hooks of a running gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from click.testing import CliRunner

from shuniu.core import __version__, hookimpl
from shuniu.core.cli import build_cli
from shuniu.core.config.loader import load_deployment
from shuniu.core.errors import ConfigError
from shuniu.core.gateway import Gateway
from shuniu.core.http.server import bind_socket
from shuniu.core.plugin_manager import ENTRY_POINT_GROUP, PluginManager, load_plugins
from shuniu.core.types import Outcome, RequestRecord

BALANCERS = {
    "round_robin",
    "weighted_round_robin",
    "random",
    "least_requests",
    "power_of_two",
    "session_affinity",
    "least_load",
    "prefix_affinity",
    "precise_prefix",
}
TENANCY = {
    "bench",
    "api_keys",
    "jwt",
    "ratelimit_memory",
    "ratelimit_redis",
    "cache_memory",
    "cache_redis",
    "files_local",
    "files_redis",
}
HARDWARE = {"hw_nvidia", "hw_ascend", "hw_cpu", "hw_commands"}
TOOLS = {"simulate", "plan", "sim_serve", "usage"}
BUILTINS = {
    "sim",
    "openai",
    "vllm",
    "tgi",
    "tei",
    "trtllm",
    "ascend",
    "fifo",
    "priority",
    "locality",
    "heuristic",
    "discovery_dns",
    "capacity_simulated",
    "capacity_static",
    "discovery_kubernetes",
    *BALANCERS,
    *TENANCY,
    *HARDWARE,
    *TOOLS,
}


@pytest.fixture(autouse=True)
def _clean_plugin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHUNIU_PLUGINS", raising=False)
    monkeypatch.delenv("SHUNIU_DISABLE_PLUGINS", raising=False)


def _names(plugins: PluginManager) -> set[str]:
    return {p.name for p in plugins.plugins()}


# -- fake installed distributions -------------------------------------------------------------


def make_dist(
    root: Path,
    name: str,
    version: str,
    entry_points: dict[str, str],
    modules: dict[str, str],
) -> None:
    """Write an installed distribution (a ``.dist-info`` with entry points, plus modules) into
    ``root``, as pip would; put ``root`` on ``sys.path`` to make it visible."""
    dist_info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = [f"[{ENTRY_POINT_GROUP}]", *(f"{ep} = {target}" for ep, target in entry_points.items())]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))


BROKEN_MODULE = """
raise RuntimeError("boom: this plugin cannot start")
"""
MISSING_DEP_MODULE = """
import shuniu_test_dependency_that_is_not_installed  # noqa: F401
"""
GOOD_MODULE = """
from shuniu.core import hookimpl


class Newest:
    def __init__(self, options=None):
        self.options = options

    def pick(self, req, endpoints):
        return endpoints[-1] if endpoints else None


@hookimpl
def register_balancers(register):
    register("newest", Newest, description="Always the last endpoint.")
"""
_FAKE_MODULES = ("shuniu_test_broken", "shuniu_test_missing_dep", "shuniu_test_good")


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Three extra distributions on ``sys.path``: one whose plugin raises on import, one
    whose plugin imports a missing dependency, and a working one."""
    root = tmp_path / "site"
    make_dist(
        root,
        "broken-plugin",
        "1.2.3",
        {"broken": "shuniu_test_broken"},
        {"shuniu_test_broken": BROKEN_MODULE},
    )
    make_dist(
        root,
        "needs-dep",
        "0.0.1",
        {"needs_dep": "shuniu_test_missing_dep"},
        {"shuniu_test_missing_dep": MISSING_DEP_MODULE},
    )
    make_dist(root, "good-plugin", "2.0.0", {"good": "shuniu_test_good"}, {"shuniu_test_good": GOOD_MODULE})
    monkeypatch.syspath_prepend(str(root))
    yield root
    for module in _FAKE_MODULES:
        sys.modules.pop(module, None)


# -- built-ins through the entry points ----------------------------------------------------


def test_builtins_are_registered_through_the_entry_point_group() -> None:
    declared = {
        ep.name: ep.value
        for ep in importlib.metadata.distribution("shuniu").entry_points
        if ep.group == ENTRY_POINT_GROUP
    }
    assert BUILTINS <= declared.keys()

    plugins = load_plugins()
    assert plugins.failed == []
    infos = {p.name: p for p in plugins.plugins()}
    for name in BUILTINS:
        assert infos[name].distribution == "shuniu"
        assert infos[name].version == __version__ == importlib.metadata.version("shuniu")
        # The plugin object is the module the entry point names.
        assert plugins.pm.get_plugin(name).__name__ == declared[name]
    assert infos["sim"].hooks == ("register_backends",)
    for name in (*TOOLS, "bench"):
        assert infos[name].hooks == ("register_commands",)
    assert infos["openai"].hooks == ("register_backends",)
    assert infos["round_robin"].hooks == ("register_balancers",)
    assert infos["fifo"].hooks == ("register_schedulers",)

    backends = plugins.registered("backends")
    assert {"sim", "openai"} <= backends.keys()
    assert backends["sim"].plugin == "sim"
    assert plugins.registered("balancers")["round_robin"].plugin == "round_robin"
    assert plugins.registered("schedulers")["fifo"].plugin == "fifo"


def test_core_alone_registers_nothing() -> None:
    """``core`` never imports a concrete plugin: without the entry points nothing exists."""
    plugins = load_plugins(entry_points=False)
    assert plugins.plugins() == []
    for category in ("backends", "balancers", "schedulers"):
        assert plugins.registered(category) == {}


# -- SHUNIU_PLUGINS / SHUNIU_DISABLE_PLUGINS ---------------------------------------------------


def test_allow_list_by_entry_point_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHUNIU_PLUGINS", " sim , fifo,")
    plugins = load_plugins()
    assert _names(plugins) == {"sim", "fifo"}
    assert set(plugins.registered("backends")) == {"sim"}
    assert plugins.registered("balancers") == {}


def test_allow_list_by_distribution_name(monkeypatch: pytest.MonkeyPatch, fake_site: Path) -> None:
    monkeypatch.setenv("SHUNIU_PLUGINS", "shuniu")
    plugins = load_plugins()
    assert _names(plugins) == BUILTINS
    assert plugins.failed == []  # the broken plugins were never imported

    monkeypatch.setenv("SHUNIU_PLUGINS", "good-plugin,round_robin")
    assert _names(load_plugins()) == {"good", "round_robin"}


def test_deny_list(monkeypatch: pytest.MonkeyPatch, fake_site: Path) -> None:
    monkeypatch.setenv("SHUNIU_DISABLE_PLUGINS", "openai,broken,needs-dep")
    plugins = load_plugins()
    assert _names(plugins) == (BUILTINS - {"openai"}) | {"good"}
    assert plugins.failed == []  # denied plugins are not even imported
    assert "openai" not in plugins.registered("backends")

    # Deny wins over allow; a whole distribution can be denied.
    monkeypatch.setenv("SHUNIU_PLUGINS", "shuniu,good")
    monkeypatch.setenv("SHUNIU_DISABLE_PLUGINS", "round_robin")
    assert _names(load_plugins()) == (BUILTINS - {"round_robin"}) | {"good"}
    monkeypatch.setenv("SHUNIU_DISABLE_PLUGINS", "shuniu")
    assert _names(load_plugins()) == {"good"}


def test_disabled_backend_is_an_unknown_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHUNIU_DISABLE_PLUGINS", "openai")
    text = """
    models:
      m:
        endpoints:
          - kind: openai
            options: {base_url: "http://127.0.0.1:9/v1"}
    """
    with pytest.raises(ConfigError) as info:
        load_deployment(None, load_plugins(), text=textwrap.dedent(text))
    [problem] = info.value.problems
    assert problem.path == "models.m.endpoints[0].kind"
    assert problem.message == "unknown backend 'openai'; registered: ascend, sim, tei, tgi, trtllm, vllm"


# -- broken plugins -------------------------------------------------------------------------


class MisspelledHook:
    """``register_balancer`` (no s) matches no hookspec."""

    @hookimpl
    def register_balancer(self, register: Any) -> None:  # pragma: no cover - never called
        register("misspelled", object)

    @hookimpl
    def register_schedulers(self, register: Any) -> None:  # pragma: no cover - never called
        register("from_misspelled", object)


def test_misspelled_hook_is_caught_by_check(capsys: pytest.CaptureFixture[str]) -> None:
    plugins = load_plugins(extra=[("typo", MisspelledHook())])
    [failed] = plugins.failed
    assert failed.name == "typo"
    assert "unknown hook(s) register_balancer;" in failed.error
    assert "register_balancers" in failed.error  # the known hooks are listed, to spot the typo
    # The whole plugin is out, including its correctly spelled hook.
    assert plugins.pm.get_plugin("typo") is None
    assert "typo" not in _names(plugins)
    assert "from_misspelled" not in plugins.registered("schedulers")
    assert "misspelled" not in plugins.registered("balancers")
    # The built-ins are untouched.
    assert _names(plugins) == BUILTINS
    err = capsys.readouterr().err
    assert "plugin 'typo'" in err and "register_balancer" in err
    assert "Traceback" not in err


def test_optional_hook_with_unknown_name_is_allowed() -> None:
    class Future:
        @hookimpl(optionalhook=True)
        def register_rerankers(self, register: Any) -> None:  # pragma: no cover
            pass

    plugins = load_plugins(entry_points=False, extra=[("future", Future())])
    assert plugins.failed == []
    assert _names(plugins) == {"future"}


def test_hook_with_wrong_arguments_is_recorded() -> None:
    class WrongArgs:
        @hookimpl
        def register_balancers(self, register: Any, config: Any) -> None:  # pragma: no cover
            pass

    plugins = load_plugins(entry_points=False, extra=[("wrong_args", WrongArgs())])
    [failed] = plugins.failed
    assert failed.name == "wrong_args"
    assert "config" in failed.error
    assert _names(plugins) == set()


def test_plugin_that_raises_on_import_is_recorded_and_the_others_load(
    fake_site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plugins = load_plugins()
    failed = {f.name: f for f in plugins.failed}
    assert failed.keys() == {"broken", "needs_dep"}
    assert failed["broken"].distribution == "broken-plugin"
    assert failed["broken"].version == "1.2.3"
    assert failed["broken"].error == "RuntimeError: boom: this plugin cannot start"
    assert failed["needs_dep"].distribution == "needs-dep"
    assert failed["needs_dep"].error.startswith("ModuleNotFoundError: ")
    assert "shuniu_test_dependency_that_is_not_installed" in failed["needs_dep"].error

    # Everything else loaded, the working third-party plugin included.
    assert _names(plugins) == BUILTINS | {"good"}
    good = next(p for p in plugins.plugins() if p.name == "good")
    assert (good.distribution, good.version, good.hooks) == ("good-plugin", "2.0.0", ("register_balancers",))
    assert set(plugins.registered("balancers")) == BALANCERS | {"newest"}

    # One line per failure on stderr, naming the plugin and the error; no traceback.
    err = capsys.readouterr().err
    assert "plugin 'broken' (broken-plugin 1.2.3) was not loaded: RuntimeError: boom" in err
    assert "plugin 'needs_dep' (needs-dep 0.0.1) was not loaded: ModuleNotFoundError" in err
    assert "Traceback" not in err


def test_register_hook_that_raises_is_a_config_error_naming_the_plugin() -> None:
    class Exploding:
        @hookimpl
        def register_backends(self, register: Any) -> None:
            raise ValueError("no licence key")

    plugins = load_plugins(extra=[("exploding", Exploding())])
    with pytest.raises(ConfigError) as info:
        plugins.registered("backends")
    [problem] = info.value.problems
    assert problem.path == "plugin exploding"
    assert "register_backends failed: ValueError: no licence key" in problem.message


# -- name clashes --------------------------------------------------------------------------


def _balancer_plugin(name: str) -> object:
    class Plugin:
        @hookimpl
        def register_balancers(self, register: Any) -> None:
            register(name, lambda options=None: None)

    return Plugin()


def test_two_plugins_registering_one_balancer_name() -> None:
    plugins = load_plugins(
        extra=[("first_lb", _balancer_plugin("shared")), ("second_lb", _balancer_plugin("shared"))]
    )
    with pytest.raises(ConfigError) as info:
        plugins.registered("balancers")
    [problem] = info.value.problems
    text = str(problem)
    assert "balancer 'shared' is already registered" in text
    # The later plugin is the one blamed; the earlier one keeps the name.
    assert problem.path == "plugin second_lb"
    assert "already registered by plugin 'first_lb'" in problem.message

    # Clashing with a built-in name is caught the same way.
    plugins = load_plugins(extra=[("impostor", _balancer_plugin("round_robin"))])
    with pytest.raises(ConfigError) as info:
        plugins.registered("balancers")
    [problem] = info.value.problems
    assert "balancer 'round_robin' is already registered" in str(problem)
    assert "impostor" in str(problem) and "'round_robin'" in str(problem)


# -- unknown names in a deployment -----------------------------------------------------------

UNKNOWN_NAMES = """
models:
  chat:
    balancer: {policy: least_loaded}
    scheduler: {policy: edf}
    endpoints:
      - kind: sim
      - kind: vllm-turbo
"""


def test_unknown_names_list_what_is_registered(fake_site: Path) -> None:
    plugins = load_plugins()
    with pytest.raises(ConfigError) as info:
        load_deployment(None, plugins, text=UNKNOWN_NAMES)
    problems = {p.path: p for p in info.value.problems}
    assert problems.keys() == {
        "models.chat.balancer.policy",
        "models.chat.scheduler.policy",
        "models.chat.endpoints[1].kind",
    }
    failed_note = "; plugins that failed to load: broken, needs_dep"
    assert problems["models.chat.balancer.policy"].message == (
        "unknown balancer 'least_loaded'; registered: "
        + ", ".join(sorted(BALANCERS | {"newest"}))
        + failed_note
    )
    assert problems["models.chat.scheduler.policy"].message == (
        "unknown scheduler 'edf'; registered: fifo, priority" + failed_note
    )
    assert problems["models.chat.endpoints[1].kind"].message == (
        "unknown backend 'vllm-turbo'; registered: ascend, openai, sim, tei, tgi, trtllm, vllm" + failed_note
    )
    # With line numbers, for `shuniu validate`.
    assert problems["models.chat.balancer.policy"].line == 4
    assert problems["models.chat.endpoints[1].kind"].line == 8


def test_unknown_names_with_no_failed_plugins() -> None:
    with pytest.raises(ConfigError) as info:
        load_deployment(None, load_plugins(), text=UNKNOWN_NAMES)
    messages = [p.message for p in info.value.problems]
    assert f"unknown balancer 'least_loaded'; registered: {', '.join(sorted(BALANCERS))}" in messages
    assert not any("failed to load" in m for m in messages)


# -- `shuniu plugins` --------------------------------------------------------------------------


def test_plugins_command_shows_failed_plugins_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # rich fits the table to this
    plugins = load_plugins(extra=[("typo", MisspelledHook())])
    runner = CliRunner()

    result = runner.invoke(build_cli(plugins), ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {p["name"] for p in data["plugins"]} == BUILTINS
    [failed] = data["failed"]
    assert failed["name"] == "typo"
    assert failed["distribution"] == "(in code)"
    assert "unknown hook(s) register_balancer" in failed["error"]

    result = runner.invoke(build_cli(plugins), ["plugins"])
    assert result.exit_code == 0, result.output
    assert "plugins that failed to load" in result.stdout
    assert "typo" in result.stdout
    assert "register_balancer;" in result.stdout


def test_plugins_command_shows_failed_plugins(fake_site: Path) -> None:
    """The real command line, with the broken distributions installed."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(fake_site), os.environ.get("PYTHONPATH")) if p),
        "COLUMNS": "250",
    }
    cmd = [sys.executable, "-m", "shuniu.core", "plugins"]

    as_json = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)  # stdout is only the JSON: failures went to stderr
    assert {p["name"] for p in data["plugins"]} == BUILTINS | {"good"}
    failed = {f["name"]: f for f in data["failed"]}
    assert failed["broken"] == {
        "name": "broken",
        "distribution": "broken-plugin",
        "version": "1.2.3",
        "error": "RuntimeError: boom: this plugin cannot start",
    }
    assert failed["needs_dep"]["error"].startswith("ModuleNotFoundError")
    assert "Traceback" not in as_json.stderr
    assert "plugin 'broken' (broken-plugin 1.2.3) was not loaded" in as_json.stderr

    table = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert table.returncode == 0, table.stderr
    out = table.stdout
    assert "plugins that failed to load" in out
    failed_part = out[out.index("plugins that failed to load") :]
    for text in ("broken", "broken-plugin", "1.2.3", "RuntimeError: boom", "needs_dep", "needs-dep"):
        assert text in failed_part
    assert "good-plugin" in out[: out.index("plugins that failed to load")]
    assert "Traceback" not in out + table.stderr


# -- lifecycle and observer hooks in a serving gateway ---------------------------------------

SERVING = """
gateway:
  graceful_shutdown_s: 5
models:
  chat:
    aliases: [chat-alias]
    health: {interval_s: 0.05}
    endpoints:
      - kind: sim
        replicas: 2
        options: {ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 4, output_tokens_max: 30}
  tight:
    scheduler: {policy: fifo, options: {max_queue: 0}}
    endpoints:
      - kind: sim
        max_concurrency: 1
        options: {ttft_ms: 0, tokens_per_s: 20}
"""


class Recorder:
    """Records what the lifecycle and observer hooks receive."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.gateways: list[Any] = []
        self.records: list[RequestRecord] = []

    @hookimpl
    def gateway_startup(self, gateway: Any) -> Any:
        self.events.append("startup")
        self.gateways.append(gateway)

        async def finish_startup() -> None:
            await asyncio.sleep(0.01)
            self.events.append("startup awaited")

        return finish_startup()

    @hookimpl
    def gateway_shutdown(self, gateway: Any) -> None:
        self.events.append("shutdown")
        self.gateways.append(gateway)

    @hookimpl
    def request_finished(self, record: RequestRecord) -> None:
        self.records.append(record)


class FaultyObserver:
    """An observer that raises: logged and ignored, the others still see every request."""

    calls = 0

    @hookimpl
    def request_finished(self, record: RequestRecord) -> None:
        FaultyObserver.calls += 1
        raise RuntimeError("observer bug")


@contextlib.asynccontextmanager
async def serve_in_process(gateway: Gateway) -> AsyncIterator[str]:
    """The gateway's app under a real uvicorn server on this event loop, on a free port."""
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = uvicorn.Config(gateway.app, lifespan="on", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:  # uvicorn has no start-up event: poll its flag
            if task.done():
                task.result()
                raise RuntimeError("uvicorn stopped during start-up")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)
        sock.close()


async def _wait_for(predicate: Any, within: float = 5.0) -> None:
    """Poll state that the server task updates (observers run after the last byte is sent)."""
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


@pytest.fixture
def observed() -> tuple[Gateway, Recorder]:
    recorder = Recorder()
    FaultyObserver.calls = 0
    plugins = load_plugins(extra=[("faulty", FaultyObserver()), ("recorder", recorder)])
    assert plugins.failed == []
    resolved = load_deployment(None, plugins, text=SERVING)
    return Gateway(resolved, plugins), recorder


async def test_lifecycle_and_request_finished_hooks(
    observed: tuple[Gateway, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    gateway, rec = observed
    assert rec.events == []  # building a gateway starts nothing

    async with serve_in_process(gateway) as url:
        # Start-up hooks ran, and the awaitable one finished, before the first request.
        assert rec.events == ["startup", "startup awaited"]
        assert rec.gateways == [gateway]
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)

        # 1. A plain chat completion.
        resp = await client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "Hello there"}],
            max_tokens=7,
            extra_body={"ignore_eos": True},
            extra_headers={"x-request-id": "plain-1"},
        )
        await _wait_for(lambda: len(rec.records) == 1)
        assert resp.usage is not None and resp.usage.completion_tokens == 7
        r = rec.records[0]
        assert (r.id, r.model, r.api, r.stream) == ("plain-1", "chat", "chat", False)
        assert (r.status, r.outcome, r.error_code) == (200, Outcome.OK, None)
        assert r.prompt_tokens == resp.usage.prompt_tokens
        assert r.completion_tokens == resp.usage.completion_tokens == 7
        assert r.endpoint in {"chat-0", "chat-1"}
        assert r.admitted is not None and r.first_token is not None
        assert r.arrival <= r.admitted <= r.first_token <= r.finished

        # 2. A stream, through an alias, with the usage chunk.
        stream = await client.chat.completions.create(
            model="chat-alias",
            messages=[{"role": "user", "content": "Stream this"}],
            max_tokens=50,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None
        await _wait_for(lambda: len(rec.records) == 2)
        r = rec.records[1]
        assert (r.model, r.api, r.stream, r.status, r.outcome) == (
            "chat-alias",
            "chat",
            True,
            200,
            Outcome.OK,
        )
        assert r.prompt_tokens == usage.prompt_tokens
        assert r.completion_tokens == usage.completion_tokens
        assert 4 <= r.completion_tokens <= 30

        # 3. The legacy completions API.
        comp = await client.completions.create(model="chat", prompt="Once upon a time", max_tokens=5)
        await _wait_for(lambda: len(rec.records) == 3)
        r = rec.records[2]
        assert (r.api, r.status, r.outcome) == ("completions", 200, Outcome.OK)
        assert comp.usage is not None and r.completion_tokens == comp.usage.completion_tokens

        # 4. A request refused by the scheduler (queue full) is reported as an error.
        tight = gateway.pools["tight"].endpoints[0]
        holder = asyncio.create_task(
            client.chat.completions.create(
                model="tight",
                messages=[{"role": "user", "content": "slow"}],
                max_tokens=10,
                extra_body={"ignore_eos": True},
            )
        )
        await _wait_for(lambda: tight.in_flight == 1)
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(
                model="tight", messages=[{"role": "user", "content": "refused"}], max_tokens=3
            )
        await _wait_for(lambda: len(rec.records) == 4)
        r = rec.records[3]
        assert (r.model, r.status, r.outcome, r.error_code) == ("tight", 429, Outcome.ERROR, "queue_full")
        assert r.endpoint is None and r.completion_tokens == 0
        held = await holder
        await _wait_for(lambda: len(rec.records) == 5)
        assert rec.records[4].completion_tokens == held.usage.completion_tokens == 10

        # 5. A client that goes away mid-stream: reported as cancelled.
        async with (
            httpx.AsyncClient(base_url=url, timeout=10) as http,
            http.stream(
                "POST",
                "/v1/chat/completions",
                json={
                    "model": "tight",
                    "messages": [{"role": "user", "content": "leave early"}],
                    "max_tokens": 100,
                    "ignore_eos": True,
                    "stream": True,
                },
                headers={"x-request-id": "leaver"},
            ) as response,
        ):
            assert response.status_code == 200
            async for _ in response.aiter_bytes():
                break
        await _wait_for(lambda: len(rec.records) == 6)
        r = rec.records[5]
        assert (r.id, r.outcome, r.stream) == ("leaver", Outcome.CANCELLED, True)
        assert r.completion_tokens < 100
        await _wait_for(lambda: tight.in_flight == 0)  # the slot came back

        assert rec.events == ["startup", "startup awaited"]  # no shutdown while serving

    # Shutdown hooks ran once, with the same gateway, when the server stopped.
    assert rec.events == ["startup", "startup awaited", "shutdown"]
    assert rec.gateways == [gateway, gateway]
    # The faulty observer saw every request too; its exceptions were logged, not raised.
    assert FaultyObserver.calls == len(rec.records) == 6
    assert "a request_finished observer failed" in caplog.text


async def test_request_finished_sees_requests_rejected_before_admission(
    observed: tuple[Gateway, Recorder],
) -> None:
    gateway, rec = observed
    async with serve_in_process(gateway) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}]
            )
        await _wait_for(lambda: len(rec.records) == 1, within=1.0)
        r = rec.records[0]
        assert (r.model, r.status, r.outcome, r.error_code) == (
            "no-such-model",
            404,
            Outcome.ERROR,
            "model_not_found",
        )


def test_third_party_cannot_take_a_builtin_plugin_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A distribution sorting before "shuniu" declares an entry point named like a built-in.
    make_dist(
        tmp_path,
        "aaa-impostor",
        "1.0",
        {"sim": "shuniu_test_impostor"},
        {"shuniu_test_impostor": GOOD_MODULE},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        plugins = load_plugins()
        assert "sim" in plugins.registered("backends")  # the built-in kept its name
        [failed] = [f for f in plugins.failed if f.distribution == "aaa-impostor"]
        assert failed.name == "sim"
        assert "already taken by distribution 'shuniu'" in failed.error
    finally:
        sys.modules.pop("shuniu_test_impostor", None)


def test_allow_list_names_are_normalized(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHUNIU_PLUGINS", "Good_Plugin")
    plugins = load_plugins()
    assert [i.name for i in plugins.plugins()] == ["good"]


def test_hooks_taking_fewer_arguments_and_wrappers() -> None:
    seen: list[str] = []

    class Quiet:
        @hookimpl
        def request_finished(self) -> None:  # takes none of the spec's arguments
            seen.append("finished")

        @hookimpl
        def register_balancers(self) -> None:
            seen.append("registered")

    class Wrapping:
        @hookimpl(wrapper=True)
        def request_finished(self, record: Any) -> Any:
            return (yield)

    plugins = load_plugins(entry_points=False, extra=[("quiet", Quiet()), ("wrapping", Wrapping())])
    plugins.registered("balancers")
    for fn in plugins.hook_functions("request_finished"):
        fn(record=object())
    assert seen == ["registered", "finished"]
    [failed] = plugins.failed
    assert (
        failed.name == "wrapping" and "hook wrappers are not supported for request_finished" in failed.error
    )
