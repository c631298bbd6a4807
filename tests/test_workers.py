"""``shuniu serve --workers N``: several gateway processes on one port, supervised, seen
from outside as one gateway (one ``/metrics`` with every worker's series, one
``/status.json``, admin changes applied by all), restarted when one dies, drained together
on SIGTERM; and the deployments that cannot run in several workers are refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shuniu.core.http.fleet import label_page, merge_metrics
from shuniu.plugins.auth.api_keys import hash_key
from tests.conftest import GatewayProcess, start_gateway, wait_until

ADMIN = "sk-admin-workers-test"
DEPLOYMENT = f"""
gateway:
  workers: 2
  graceful_shutdown_s: 20
  admin_keys: ["{hash_key(ADMIN)}"]
models:
  chat:
    health: {{interval_s: 0.05}}
    endpoints:
      - kind: sim
        name: a
        options: {{ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 4, output_tokens_max: 4}}
      - kind: sim
        name: b
        options: {{ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 4, output_tokens_max: 4}}
  slow:
    endpoints:
      - {{kind: sim, replicas: 2, options: {{ttft_ms: 0, tokens_per_s: 20}}}}
"""
ASK = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[GatewayProcess]:
    server = start_gateway(DEPLOYMENT, tmp_path)
    yield server
    server.stop()


def _fresh(url: str, path: str, **kw: Any) -> httpx.Response:
    """A request on a new connection (the kernel picks a worker per connection)."""
    with httpx.Client(timeout=30) as client:
        return client.post(url + path, **kw) if "json" in kw else client.get(url + path, **kw)


def _requests_by_worker(url: str) -> dict[str, float]:
    page = _fresh(url, "/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page):  # the merged page is valid exposition
        if family.name == "shuniu_requests":
            for s in family.samples:
                if s.labels.get("model") == "chat" and s.name.endswith("_total"):
                    out[s.labels["worker"]] = out.get(s.labels["worker"], 0) + s.value
    return out


def _status(url: str) -> dict[str, Any]:
    return _fresh(url, "/status.json").json()  # type: ignore[no-any-return]


def test_workers_share_the_port_and_answer_as_one_gateway(gw: GatewayProcess) -> None:
    assert "with 2 workers" in gw.output[0]
    for _ in range(40):
        assert _fresh(gw.url, "/v1/chat/completions", json=ASK).status_code == 200
    by_worker = wait_until(lambda: (r := _requests_by_worker(gw.url)) and sum(r.values()) == 40 and r)
    assert set(by_worker) == {"0", "1"} and all(n > 0 for n in by_worker.values()), by_worker
    status = _status(gw.url)
    assert [w["index"] for w in status["workers"]] == [0, 1] and all(w["answered"] for w in status["workers"])
    assert len({w["pid"] for w in status["workers"]}) == 2
    chat = status["models"]["chat"]
    assert chat["recent"]["requests"] == 40
    assert sum(e["completed"] for e in chat["endpoints"]) == 40


def test_a_dead_worker_is_restarted(gw: GatewayProcess) -> None:
    before = {w["index"]: w["pid"] for w in _status(gw.url)["workers"]}
    os.kill(before[0], signal.SIGKILL)
    # The other worker keeps serving meanwhile (the kernel drops the dead one's socket).
    for _ in range(10):
        assert _fresh(gw.url, "/v1/chat/completions", json=ASK).status_code == 200

    def restarted() -> dict[int, Any] | None:
        workers = {w["index"]: w for w in _status(gw.url)["workers"]}
        fresh = workers[0]
        return workers if fresh["answered"] and fresh["pid"] not in (None, before[0]) else None

    after = wait_until(restarted, timeout=20)
    assert after[1]["pid"] == before[1]
    gw.output_containing("worker 0 exited")


def test_an_admin_change_reaches_every_worker(gw: GatewayProcess) -> None:
    headers = {"authorization": f"Bearer {ADMIN}"}
    drained = _fresh(gw.url, "/admin/endpoints/a/drain", json={}, headers=headers)
    assert drained.status_code == 200, drained.text
    for _ in range(30):
        assert _fresh(gw.url, "/v1/chat/completions", json=ASK).status_code == 200
    # Whichever worker took a request, none went to the drained endpoint.
    endpoints = {e["name"]: e for e in _status(gw.url)["models"]["chat"]["endpoints"]}
    assert endpoints["a"]["completed"] == 0 and endpoints["b"]["completed"] == 30
    assert endpoints["a"]["draining"] is True


def test_sigterm_drains_every_worker(gw: GatewayProcess) -> None:
    results: list[tuple[int, bool]] = []

    def stream() -> None:
        body = {
            "model": "slow",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 100,
            "stream": True,
        }
        body["ignore_eos"] = True
        with (
            httpx.Client(timeout=60) as client,
            client.stream("POST", gw.url + "/v1/chat/completions", json=body) as r,
        ):
            text = "".join(r.iter_text())
        results.append((r.status_code, text.rstrip().endswith("data: [DONE]")))

    threads = [threading.Thread(target=stream) for _ in range(8)]
    for t in threads:
        t.start()
    # Each worker has streams running (5 s at 20 tokens/s: long enough for all eight to
    # have started on a loaded machine) before the signal.
    wait_until(lambda: sum(m["in_flight"] for m in _in_flight(gw.url)) >= 8, timeout=10)
    code = gw.stop(signal.SIGTERM, timeout=60)
    for t in threads:
        t.join(60)
    assert code == 0
    assert results == [(200, True)] * 8


def _in_flight(url: str) -> list[dict[str, Any]]:
    return [e for e in _status(url)["models"]["slow"]["endpoints"]]


LAUNCHED = """
models:
  chat:
    endpoints:
      - kind: vllm
        launch: {command: ["vllm", "serve", "m", "--port", "{port}"]}
"""
LIMITED = """
tiers:
  default: {key_limits: {rpm: 10}}
models:
  chat:
    endpoints: [{kind: sim}]
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (LAUNCHED, "engines the gateway launches need gateway.workers: 1"),
        (LIMITED, "rate limits in the memory store would be 2 times too generous"),
    ],
)
def test_what_cannot_run_in_several_workers_is_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "shuniu.core", "serve", str(path), "--workers", "2", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_merging_pages_keeps_families_whole() -> None:
    one = b'# HELP x_total things\n# TYPE x_total counter\nx_total{a="1"} 2\n# TYPE y gauge\ny 3\n'
    two = b'# HELP x_total things\n# TYPE x_total counter\nx_total{a="1"} 5\n# TYPE y gauge\ny 4\n'
    page = merge_metrics([(0, one), (1, two)]).decode()
    families = {f.name: f for f in text_string_to_metric_families(page)}
    x = {(s.labels["worker"], s.labels["a"]): s.value for s in families["x"].samples}
    assert x == {("0", "1"): 2.0, ("1", "1"): 5.0}
    assert {s.labels["worker"]: s.value for s in families["y"].samples} == {"0": 3.0, "1": 4.0}
    assert page.count("# TYPE x_total") == 1
    assert label_page(b"z 1\n", 3) == [("", [], [b'z{worker="3"} 1'])]
