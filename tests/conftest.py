"""Shared fixtures: run a real gateway process on a free port and talk to it over HTTP."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.dns_server import dns_server  # noqa: F401
from tests.postgres_server import postgres_server, postgres_server_factory, postgres_url  # noqa: F401
from tests.redis_server import redis_server, redis_server_factory, redis_url  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
_LISTEN = re.compile(r"serving .* on http://(\S+):(\d+)")


@dataclass
class GatewayProcess:
    """A ``shuniu serve`` child process."""

    proc: subprocess.Popen[str]
    host: str
    port: int
    output: list[str]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def output_containing(self, *parts: str, timeout: float = 10.0) -> str:
        """The output so far, once it contains every one of ``parts`` (the process is
        returned after its first banner line; later lines arrive through a reader thread)."""

        def ready() -> str | None:
            text = "".join(self.output)
            return text if all(p in text for p in parts) else None

        return wait_until(ready, timeout=timeout)  # type: ignore[no-any-return]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)


def start_gateway(
    config: str | None,
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    timeout: float = 30,
) -> GatewayProcess:
    """Start ``shuniu serve`` (on port 0 = a free port) and wait until it listens.

    The tests read endpoint details from ``/ready``, which a gateway shows only to admin keys
    unless its deployment says ``readiness_details: public``: that is added to every
    deployment that does not set ``readiness_details`` itself (the tests of the default set
    ``admin``)."""
    cmd = [sys.executable, "-m", "shuniu.core", "serve", "--port", "0", *args]
    if config is not None:
        path = tmp_path / "deployment.yaml"
        path.write_text(with_public_readiness(textwrap.dedent(config)))
        cmd.insert(4, str(path))
    return start_process(cmd, cwd=tmp_path, env=env, timeout=timeout)


def with_public_readiness(text: str) -> str:
    """``text`` with ``gateway.readiness_details: public`` unless it sets the field: added
    as the gateway block's first line, or as a new block at the end (no line moves)."""
    if "readiness_details" in text:
        return text
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.strip() == "gateway:":
            indent = next((len(nxt) - len(nxt.lstrip()) for nxt in lines[i + 1 :] if nxt.strip()), 2)
            lines.insert(i + 1, " " * indent + "readiness_details: public")
            return "\n".join(lines)
        if line.lstrip().startswith("gateway: {"):
            lines[i] = line.replace("gateway: {", "gateway: {readiness_details: public, ", 1)
            return "\n".join(lines)
    # The top level's own indentation (a text that dedent could not flatten: a wrapped line).
    first = next((line for line in lines if line.strip()), "")
    pad = " " * (len(first) - len(first.lstrip()))
    return text.rstrip("\n") + f"\n{pad}gateway:\n{pad}  readiness_details: public\n"


def start_process(
    cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 30
) -> GatewayProcess:
    """Start a server command that prints shuniu's "serving ... on http://HOST:PORT" banner,
    and wait for that line."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    output: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        output.append(line)
        m = _LISTEN.search(line)
        if m:
            gw = GatewayProcess(proc, m.group(1), int(m.group(2)), output)
            _drain_output(proc, output)
            return gw
    proc.kill()
    raise RuntimeError(f"{' '.join(cmd[:5])} did not start:\n" + "".join(output))


def _drain_output(proc: subprocess.Popen[str], output: list[str]) -> None:
    """Keep reading the child's output so it never blocks on a full pipe."""
    import threading

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)

    threading.Thread(target=pump, daemon=True).start()


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[object]:
    started: list[GatewayProcess] = []

    def factory(config: str | None = None, **kwargs: object) -> GatewayProcess:
        gw = start_gateway(config, tmp_path, **kwargs)  # type: ignore[arg-type]
        started.append(gw)
        return gw

    yield factory
    for gw in started:
        gw.stop()


FAST_SIM = """
gateway:
  graceful_shutdown_s: 10
models:
  tiny:
    aliases: [tiny-alias]
    max_model_len: 2048
    health: {interval_s: 0.05}
    endpoints:
      - kind: sim
        replicas: 2
        options: {ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 8, output_tokens_max: 40}
"""


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway, shared by the tests that only read from it, serving ``tiny``: two
    instant simulated replicas."""
    gw = start_gateway(FAST_SIM, tmp_path_factory.mktemp("shared-gateway"))
    yield gw
    gw.stop()


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns something truthy (returned), or fail at ``timeout``.

    This waits for a condition to become true; it never stands in for one.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s (last value: {value!r})")
        time.sleep(interval)


# -- CI cannot pass by skipping ---------------------------------------------------------------

_FALSE = {"", "0", "false", "no", "off"}


def in_ci() -> bool:
    """Whether this run is CI (``CI`` set, as CI services and ``.ci/run`` set it)."""
    return os.environ.get("CI", "").strip().lower() not in _FALSE


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """In CI a skipped test is a failed one: a suite whose real part (vLLM, Redis, Chromium, an
    extra) is missing must not turn the run green. Outside CI skips stay skips, listed with
    their reasons at the end of the run (``-rs``)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (CI is set, so a skip fails the run): {reason}"
