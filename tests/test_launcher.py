"""Managed engines (``launch:``): the gateway starts, watches, restarts and stops engine
processes. The engines here are ``shuniu sim serve`` (a simulated engine with vLLM's API,
``/health`` and ``/metrics``) behind ``kind: vllm`` endpoints, plus tiny Python commands that
exit at once or never become ready. Everything listens on 127.0.0.1; every process a test
starts is ended by its PID or process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from shuniu.core.config import LaunchConfig
from shuniu.core.config.loader import load_deployment
from shuniu.core.errors import ConfigError
from shuniu.core.gateway import Gateway
from shuniu.core.plugin_manager import PluginManager, load_plugins
from shuniu.core.pools.build import PoolBuilder
from shuniu.core.pools.launcher import (
    EngineState,
    ManagedEngine,
    _live_members,
    backoff_delay,
    connect_host,
    plan_engine,
)
from tests.conftest import GatewayProcess, start_gateway, wait_until
from tests.ports import quiet_ports

ROOT = Path(__file__).resolve().parent.parent
ENGINE = [
    sys.executable, "-m", "shuniu.core", "sim", "serve", "--port", "{port}",
    "--served-model-name", "{model}", "--tokens-per-s", "0", "--ttft-ms", "0",
]  # fmt: skip
SLOW_ENGINE = [*ENGINE[:-4], "--tokens-per-s", "20", "--ttft-ms", "0"]
"""Each request streams 20 tokens a second: 60 tokens take three seconds."""
EXITS_AT_ONCE = [sys.executable, "-c", "import sys; print('boom', flush=True); sys.exit(3)", "{port}"]
NEVER_READY = [
    sys.executable, "-c",
    # Ignores SIGTERM, so stopping it takes the SIGKILL after stop_grace_s.
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
    "time.sleep(60)",
    "{port}",
]  # fmt: skip


def _deployment(logs: Path) -> str:
    # JSON is YAML: the commands go in as JSON lists, whatever characters they hold.
    return f"""
gateway: {{graceful_shutdown_s: 5}}
models:
  chat:
    health: {{interval_s: 0.05, timeout_s: 2}}
    load: {{interval_s: 0.1}}
    endpoints:
      - kind: vllm
        replicas: 2
        launch:
          command: {json.dumps(ENGINE)}
          log_dir: {json.dumps(str(logs))}
          stop_grace_s: 10
          restart: {{backoff_s: 0.2}}
  queue:
    health: {{interval_s: 0.05, timeout_s: 2}}
    endpoints:
      - kind: vllm
        replicas: 2
        max_concurrency: 2
        launch:
          command: {json.dumps(SLOW_ENGINE)}
          log_dir: {json.dumps(str(logs))}
          restart: {{backoff_s: 0.2}}
  broken:
    health: {{interval_s: 0.05}}
    endpoints:
      - kind: vllm
        launch:
          command: {json.dumps(EXITS_AT_ONCE)}
          log_dir: {json.dumps(str(logs))}
          restart: {{max_restarts: 2, backoff_s: 0.1, max_backoff_s: 0.2}}
  sleepy:
    health: {{interval_s: 0.05}}
    endpoints:
      - kind: vllm
        launch:
          command: {json.dumps(NEVER_READY)}
          log_dir: {json.dumps(str(logs))}
          ready_timeout_s: 2
          stop_grace_s: 0.3
          restart: {{max_restarts: 1, backoff_s: 0.1}}
"""


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway for the module, launching two simulated engines for ``chat``, one engine
    that exits at once (``broken``) and one that never becomes ready (``sleepy``)."""
    tmp = tmp_path_factory.mktemp("launcher")
    gw = start_gateway(_deployment(tmp / "logs"), tmp)
    try:
        yield gw
    finally:
        gw.stop()


def _ready(gw: GatewayProcess) -> dict[str, Any]:
    return httpx.get(f"{gw.url}/ready", timeout=10).json()  # type: ignore[no-any-return]


def _endpoints(gw: GatewayProcess, model: str) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in _ready(gw)["models"][model]["endpoints"]}


def _model_ready(gw: GatewayProcess, model: str) -> dict[str, dict[str, Any]] | None:
    eps = _endpoints(gw, model)
    ok = all(e["healthy"] and e["launch"]["state"] == "ready" for e in eps.values())
    return eps if ok else None


def _chat_ready(gw: GatewayProcess) -> dict[str, dict[str, Any]] | None:
    return _model_ready(gw, "chat")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)


def _ask(client: openai.OpenAI, model: str = "chat") -> int:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    return reply.usage.completion_tokens


# ------------------------------------------------------------------------------ the gateway


def test_launched_replicas_serve_once_ready(managed: GatewayProcess) -> None:
    eps = wait_until(lambda: _chat_ready(managed), timeout=30)
    pids = [e["launch"]["pid"] for e in eps.values()]
    ports = [e["launch"]["port"] for e in eps.values()]
    assert len(set(pids)) == 2 and all(isinstance(p, int) and not _gone(p) for p in pids)
    assert len(set(ports)) == 2 and all(p > 0 for p in ports)  # port 0: two free ports picked
    for name, e in eps.items():
        launch = e["launch"]
        assert (launch["restarts"], launch["last_exit_code"]) == (0, None)
        assert launch["uptime_s"] >= 0 and launch["detail"].startswith("ready in")
        log = Path(launch["log"])
        assert log.name == f"{name}.log"
        # The engine's own banner, on the port shuniu chose for it.
        assert f"serving chat on http://127.0.0.1:{launch['port']}" in log.read_text()
    client = _client(managed)
    assert _ask(client) == 4
    # The context window comes from the engines once they answer (unknown at start-up).
    (model,) = [m for m in client.models.list().data if m.id == "chat"]
    assert model.model_extra["max_model_len"] == 8192  # type: ignore[index]
    client.close()


def test_an_engine_that_exits_at_once_is_given_up_on(managed: GatewayProcess) -> None:
    def failed() -> dict[str, Any] | None:
        (e,) = _endpoints(managed, "broken").values()
        return e if e["launch"]["state"] == "failed" else None

    e = wait_until(failed, timeout=30)
    launch = e["launch"]
    assert e["healthy"] is False
    assert (launch["restarts"], launch["last_exit_code"], launch["pid"]) == (2, 3, None)
    assert "exited with code 3" in launch["detail"] and "gave up after 2 restart(s)" in launch["detail"]
    assert Path(launch["log"]).read_text().splitlines().count("boom") == 3  # the first start and 2 restarts
    # One line per event, with the exit code, the growing backoff and the log's path.
    out = managed.output_containing("engine broken-0 exited with code 3; giving up after 2 restart(s)")
    assert out.count("engine broken-0 exited with code 3; restarting in 0.1 s (restart 1; log: ") == 1
    assert out.count("engine broken-0 exited with code 3; restarting in 0.2 s (restart 2; log: ") == 1
    # The other models are still served; this one is refused with the usual 503.
    wait_until(lambda: _chat_ready(managed), timeout=30)
    client = _client(managed)
    assert _ask(client) == 4
    with pytest.raises(openai.APIStatusError) as info:
        _ask(client, "broken")
    assert info.value.status_code == 503
    client.close()


def test_ready_timeout_keeps_the_endpoint_out(managed: GatewayProcess) -> None:
    pids: set[int] = set()

    def failed() -> dict[str, Any] | None:
        (e,) = _endpoints(managed, "sleepy").values()
        if e["launch"]["pid"] is not None:
            pids.add(e["launch"]["pid"])
            assert e["healthy"] is False  # never in balancing while it is not ready
        return e if e["launch"]["state"] == "failed" else None

    e = wait_until(failed, timeout=30)
    launch = e["launch"]
    assert e["healthy"] is False and launch["restarts"] == 1
    assert "was not ready within 2 s" in launch["detail"]
    assert launch["last_exit_code"] == -signal.SIGKILL  # it ignored SIGTERM for stop_grace_s
    managed.output_containing("engine sleepy-0 was not ready within 2 s; giving up after 1 restart(s)")
    assert all(_gone(pid) for pid in pids)
    ready = httpx.get(f"{managed.url}/ready", timeout=10)
    assert ready.status_code == 503  # a model without a ready engine: the gateway is not ready


def test_ps_prints_the_engines(managed: GatewayProcess) -> None:
    eps = wait_until(lambda: _chat_ready(managed), timeout=30)
    cmd = [sys.executable, "-m", "shuniu.core", "ps", "--url", managed.url]
    table = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert table.returncode == 0, table.stderr
    for name, e in eps.items():
        row = next(line for line in table.stdout.splitlines() if f" {name} " in line)
        assert "ready" in row and str(e["launch"]["pid"]) in row and str(e["launch"]["port"]) in row
    assert "broken-0" in table.stdout and "sleepy-0" in table.stdout
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    engines = {e["endpoint"]: e for e in data["engines"]}
    assert set(engines) >= {"chat-0", "chat-1", "broken-0", "sleepy-0"}
    assert engines["chat-0"]["model"] == "chat" and engines["chat-0"]["healthy"] is True
    assert {"state", "pid", "port", "restarts", "last_exit_code", "uptime_s", "log"} <= set(engines["chat-0"])
    nobody = subprocess.run(
        [sys.executable, "-m", "shuniu.core", "ps", "--url", "http://127.0.0.1:9", "--timeout", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert nobody.returncode == 1 and "cannot read http://127.0.0.1:9/ready" in nobody.stderr


def test_a_killed_engine_is_restarted_and_rejoins(managed: GatewayProcess) -> None:
    eps = wait_until(lambda: _chat_ready(managed), timeout=30)
    victim, survivor = eps["chat-0"], eps["chat-1"]
    old_pid = victim["launch"]["pid"]
    client = _client(managed)
    os.kill(old_pid, signal.SIGKILL)
    # The supervisor takes it out of balancing as soon as the process is gone.
    wait_until(lambda: not _endpoints(managed, "chat")["chat-0"]["healthy"], timeout=10)
    errors_before = _endpoints(managed, "chat")["chat-0"]["errors"]
    served = 0

    def back() -> dict[str, Any] | None:
        nonlocal served
        assert _ask(client) == 4  # every request is served (by chat-1) meanwhile
        served += 1
        e = _endpoints(managed, "chat")["chat-0"]
        return e if e["healthy"] and e["launch"]["state"] == "ready" else None

    e = wait_until(back, timeout=30)
    assert served >= 1
    launch = e["launch"]
    assert launch["restarts"] == 1 and launch["last_exit_code"] == -signal.SIGKILL
    assert launch["pid"] != old_pid and not _gone(launch["pid"]) and _gone(old_pid)
    after = _endpoints(managed, "chat")
    assert after["chat-0"]["errors"] == errors_before  # nothing was sent to the dead engine
    assert after["chat-1"]["launch"]["pid"] == survivor["launch"]["pid"]
    assert after["chat-1"]["completed"] >= survivor["completed"] + served
    # It rejoined balancing: round robin gives it requests again.
    completed = after["chat-0"]["completed"]
    for _ in range(4):
        _ask(client)
    assert _endpoints(managed, "chat")["chat-0"]["completed"] >= completed + 1
    out = managed.output_containing(
        "engine chat-0 was killed by SIGKILL; restarting in 0.2 s (restart 1; log: "
    )
    assert out.count("engine chat-0 was killed by SIGKILL") == 1
    client.close()


def test_queued_requests_survive_an_engine_killed_mid_stream(managed: GatewayProcess) -> None:
    """Two engines, two streams each; four more requests wait in the gateway. One engine is
    killed: its streams fail, and every waiting request completes on the other engine (the
    dead one is taken out before its freed slots could pull the queue into errors)."""
    eps = wait_until(lambda: _model_ready(managed, "queue"), timeout=30)
    victim = eps["queue-0"]["launch"]["pid"]
    client = _client(managed)
    outcomes: list[dict[str, Any]] = [{} for _ in range(8)]

    def run(out: dict[str, Any]) -> None:
        try:
            stream = client.chat.completions.create(
                model="queue",
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=60,
                stream=True,
                stream_options={"include_usage": True},
            )
            for chunk in stream:
                out.setdefault("first", True)
                if chunk.usage is not None:
                    out["tokens"] = chunk.usage.completion_tokens
        except openai.APIError as exc:
            out["error"] = str(exc)
        out["done"] = True

    threads = [threading.Thread(target=run, args=(o,)) for o in outcomes]
    for t in threads:
        t.start()

    def full() -> bool:
        if sum("first" in o for o in outcomes) < 4 or any("done" in o for o in outcomes):
            return False
        return all(e["in_flight"] == 2 for e in _endpoints(managed, "queue").values())

    try:
        wait_until(full, timeout=30)
        queued = [o for o in outcomes if "first" not in o]
        os.kill(victim, signal.SIGKILL)
    finally:
        for t in threads:
            t.join(60)
    assert len(queued) == 4
    assert all(o.get("tokens") == 60 and "error" not in o for o in queued), outcomes
    assert sum("error" in o for o in outcomes) <= 2  # only the streams on the killed engine
    back = wait_until(lambda: _model_ready(managed, "queue"), timeout=30)
    assert back["queue-0"]["launch"]["restarts"] == 1 and back["queue-0"]["launch"]["pid"] != victim
    client.close()


def test_sigterm_stops_every_engine(managed: GatewayProcess) -> None:
    eps = wait_until(lambda: _chat_ready(managed), timeout=30)
    queue = wait_until(lambda: _model_ready(managed, "queue"), timeout=30)
    pids = [e["launch"]["pid"] for e in [*eps.values(), *queue.values()]]
    assert managed.stop(signal.SIGTERM) == 0
    wait_until(lambda: all(_gone(pid) for pid in pids), timeout=15)


# ------------------------------------------------------------------------------ configuration


@pytest.fixture(scope="module")
def plugins() -> PluginManager:
    return load_plugins()


def _problems(plugins: PluginManager, text: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_deployment("x.yaml", plugins, text=text, env={})
    return {p.path: p.message for p in info.value.problems}


def _launched(launch: str, *, replicas: int = 1, kind: str = "vllm", options: str = "{}") -> str:
    return f"""
models:
  m:
    endpoints:
      - kind: {kind}
        replicas: {replicas}
        options: {options}
        launch: {launch}
"""


def test_config_errors_name_the_field(plugins: PluginManager) -> None:
    at = "models.m.endpoints[0]"
    p = _problems(plugins, _launched("{command: []}"))
    assert p[f"{at}.launch.command"].startswith("must name the program to run")
    p = _problems(plugins, _launched('{command: [vllm, serve, --port, "{prot}"]}'))
    assert p[f"{at}.launch.command[3]"].startswith("unknown placeholder {prot} in '{prot}'; known: {host}")
    p = _problems(plugins, _launched('{command: [x, "{port:05d}"]}'))
    assert "takes no format spec" in p[f"{at}.launch.command[1]"]
    p = _problems(plugins, _launched('{command: [x, "{port"]}'))
    assert "literal braces" in p[f"{at}.launch.command[1]"]
    p = _problems(plugins, _launched('{command: [x, "{port}"], env: {A: "{gpu}"}}'))
    assert p[f"{at}.launch.env.A"].startswith("unknown placeholder {gpu}")
    p = _problems(plugins, _launched('{command: [x, "{port}"], port: 70000}'))
    assert p[f"{at}.launch.port"].startswith("Input should be less than or equal to 65535")
    p = _problems(plugins, _launched("{command: [x]}"))
    assert "must pass it on as {port}" in p[f"{at}.launch"]
    p = _problems(plugins, _launched("{command: [x], port: 9000}", replicas=2))
    assert "must pass {port} on to the engine" in p[at]
    p = _problems(plugins, _launched('{command: [x, "{port}"], port: 65535}', replicas=2))
    assert "runs past port 65535" in p[at]
    p = _problems(plugins, _launched('{command: [x, "{port}"], restart: {backoff_s: 5, max_backoff_s: 1}}'))
    assert p[f"{at}.launch.restart"] == "max_backoff_s must be at least backoff_s"
    p = _problems(plugins, _launched('{command: [x, "{port}"], env: {A: true}}'))
    assert f"{at}.launch.env.A" in p
    p = _problems(plugins, _launched('{command: [x, "{port}"], restrat: {}}'))
    assert p[f"{at}.launch.restrat"].startswith("unknown field 'restrat'; expected one of: command, cwd")


def test_fixed_ports_must_not_collide(plugins: PluginManager) -> None:
    text = """
gateway: {port: 9001}
models:
  a:
    endpoints:
      - kind: vllm
        replicas: 2
        launch: {command: [x, "{port}"], port: 9000}
  b:
    endpoints:
      - kind: vllm
        launch: {command: [x, "{port}"], port: 9002}
      - kind: vllm
        launch: {command: [x, "{port}"], port: 9002}
"""
    p = _problems(plugins, text)
    assert p == {
        "models.a.endpoints[0].launch.port": "port 9001 (endpoint 'a-1') is also used by the gateway "
        "itself (gateway.port)",
        "models.b.endpoints[1].launch.port": "port 9002 (endpoint 'b-1') is also used by endpoint 'b-0'",
    }


def test_launch_without_base_url_validates_and_the_url_is_derived(plugins: PluginManager) -> None:
    text = """
models:
  m:
    endpoints:
      - kind: vllm
        name: fixed
        replicas: 2
        launch: {command: [x, --port, "{port}", --name, "{name}", --replica, "{replica}"], port: 9100,
                 host: 0.0.0.0, env: {PORT: "{port}", N: 4}}
      - kind: openai
        name: api
        launch: {command: [x, "{port}"], host: "::1"}
      - kind: vllm
        name: elsewhere
        options: {base_url: "http://10.0.0.1:8000/v1"}
        launch: {command: [x, "{port}"]}
"""
    resolved = load_deployment("x.yaml", plugins, text=text, env={})
    gw = Gateway(resolved, plugins)
    eps = {e.name: e for e in gw.pools["m"].endpoints}
    assert [eps[f"fixed-{i}"].backend.vllm_options.base_url for i in (0, 1)] == [
        "http://127.0.0.1:9100",
        "http://127.0.0.1:9101",
    ]
    assert gw.engines["fixed-1"].plan.argv == ["x", "--port", "9101", "--name", "fixed-1", "--replica", "1"]
    assert gw.engines["fixed-1"].plan.env == {"PORT": "9101", "N": "4"}
    api_port = gw.engines["api"].plan.port
    assert api_port > 0 and eps["api"].backend.options.base_url == f"http://[::1]:{api_port}/v1"
    assert eps["elsewhere"].backend.vllm_options.base_url == "http://10.0.0.1:8000"  # given: kept
    # Out of balancing until started and probed; not started yet.
    assert all(not e.healthy for e in eps.values())
    assert {e.snapshot()["state"] for e in gw.engines.values()} == {"stopped"}


# ------------------------------------------------------------------------------ units


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_delay(n, 1.0, 60.0) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff_delay(0, 1.0, 60.0) == 0.0
    assert backoff_delay(3, 0.0, 60.0) == 0.0
    assert backoff_delay(5, 0.25, 10.0) == 4.0
    assert backoff_delay(10_000, 1.0, 60.0) == 60.0  # no overflow


def test_connect_host() -> None:
    assert connect_host("0.0.0.0") == "127.0.0.1"
    assert connect_host("::") == "[::1]"
    assert connect_host("::1") == "[::1]"
    assert connect_host("10.1.2.3") == "10.1.2.3"


def test_placeholders_and_literal_braces(tmp_path: Path) -> None:
    cfg = LaunchConfig(
        command=["srv", "--port", "{port}", "--json", '{{"model": "{model}"}}'], log_dir=str(tmp_path)
    )
    plan = plan_engine(cfg, model="chat", name="chat-3", replica=3, port=8103)
    assert plan.argv == ["srv", "--port", "8103", "--json", '{"model": "chat"}']
    assert plan.log_path == tmp_path / "chat-3.log"
    assert (
        plan_engine(cfg.model_copy(update={"log_dir": None}), model="c", name="n", replica=0, port=1).log_path
        is None
    )


def test_a_launched_engine_is_told_where_to_publish_its_kv_events(plugins: PluginManager) -> None:
    """Each replica of an entry with ``kv_events:`` gets vLLM's ``--kv-events-config``: its own
    port (the entry's plus its number) bound, where the gateway connects."""
    text = """
    models:
      m:
        balancer: {policy: precise_prefix}
        endpoints:
          - kind: vllm
            replicas: 2
            kv_events: {endpoint: "tcp://127.0.0.1:5557", replay_endpoint: "tcp://127.0.0.1:5600", topic: kv}
            launch: {command: [vllm, serve, /m, --port, "{port}"], port: 8100}
          - kind: vllm
            kv_events: {endpoint: "tcp://127.0.0.1:5700", bind: true}
            launch: {command: [vllm, serve, /m, --port, "{port}"], port: 8200}
          - kind: vllm
            kv_events: {endpoint: "tcp://127.0.0.1:5800"}
            launch: {command: [vllm, serve, /m, --kv-events-config, "{{}}"], port: 8300}
    """
    resolved = load_deployment("d.yaml", plugins, text=textwrap.dedent(text), env={})
    built = PoolBuilder(plugins).build(resolved)
    flags = {}
    for name, engine in built.engines.items():
        argv = engine.plan.argv
        flags[name] = json.loads(argv[argv.index("--kv-events-config") + 1])
        assert argv.count("--kv-events-config") == 1
    on = {"enable_kv_cache_events": True, "publisher": "zmq"}
    assert flags["m-0"] == {
        **on,
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5600",
        "topic": "kv",
    }
    assert flags["m-1"] == {
        **on,
        "endpoint": "tcp://*:5558",
        "replay_endpoint": "tcp://*:5601",
        "topic": "kv",
    }
    # The gateway binds: the engine connects to its address.
    assert flags["m-2"] == {**on, "endpoint": "tcp://127.0.0.1:5700", "topic": ""}
    assert flags["m-3"] == {}  # the command's own flag is left alone
    # The gateway subscribes where each replica publishes.
    subscribed = [e.kv_events.endpoint for e in built.pools["m"].endpoints if e.kv_events is not None]
    assert subscribed == [
        "tcp://127.0.0.1:5557",
        "tcp://127.0.0.1:5558",
        "tcp://127.0.0.1:5700",
        "tcp://127.0.0.1:5800",
    ]


async def test_stop_kills_the_whole_group_after_the_grace(tmp_path: Path) -> None:
    """An engine that ignores SIGTERM, with a worker in its group that ignores it too: SIGTERM,
    then SIGKILL to the group."""
    script = "trap '' TERM; sleep 30 & echo started; wait"
    cfg = LaunchConfig(command=["sh", "-c", script, "{port}"], stop_grace_s=0.3, log_dir=str(tmp_path))
    downs: list[bool] = []
    engine = ManagedEngine(
        plan_engine(cfg, model="m", name="m-0", replica=0, port=quiet_ports()[0]),
        on_down=lambda: downs.append(True),
    )
    engine.start()
    try:
        log = tmp_path / "m-0.log"
        # "\nstarted": the echo, not the command line the log header repeats.
        await _eventually(lambda: log.exists() and "\nstarted" in log.read_text())
        pid = engine.pid
        assert pid is not None and engine.state is EngineState.STARTING
        assert os.getpgid(pid) == pid  # its own process group
        assert engine.admits(engine.generation) and engine.state is EngineState.READY
        assert not engine.admits(engine.generation - 1)  # a probe from before a restart
    finally:
        await engine.stop()
    assert engine.state is EngineState.STOPPED and engine.snapshot()["pid"] is None
    assert engine.last_exit_code == -signal.SIGKILL and downs
    assert _live_members(pid) == 0 and _gone(pid)


async def test_a_command_that_cannot_start_is_counted(tmp_path: Path) -> None:
    cfg = LaunchConfig(
        command=[str(tmp_path / "no-such-engine"), "{port}"],
        log_dir=str(tmp_path),
        restart={"max_restarts": 1, "backoff_s": 0},  # type: ignore[arg-type]
    )
    engine = ManagedEngine(plan_engine(cfg, model="m", name="m-0", replica=0, port=quiet_ports()[0]))
    engine.start()
    try:
        await _eventually(lambda: engine.state is EngineState.FAILED)
        assert engine.restarts == 1 and "No such file" in engine.detail
        assert engine.snapshot()["pid"] is None
    finally:
        await engine.stop()


async def _eventually(predicate: Any, within_s: float = 10.0) -> None:
    """Poll ``predicate`` until true; it waits for a condition, never stands in for one."""
    import asyncio

    async with asyncio.timeout(within_s):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
