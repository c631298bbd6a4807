"""The status page: the recent-request window and its percentiles, the HTML shell and its
escaping, ``/status.json`` from a real gateway, and the page rendered by headless Chromium.

The browser tests need Debian's ``chromium`` package on PATH and skip without it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shuniu.core.stats import percentile
from shuniu.core.types import Outcome, RequestRecord
from shuniu.core.views.status import RING_SIZE, RecentWindow, StatusWindow, status_json
from shuniu.core.views.status_page import PAGE_HEADERS, render_page
from shuniu.plugins.auth.api_keys import hash_key, new_key
from tests.conftest import GatewayProcess, start_gateway, wait_until

EVIL = "evil<img src=x onerror=\"document.title='pwned'\">&amp;"
"""An endpoint name that must reach the page as text, never as markup."""

DEPLOYMENT = f"""
models:
  tiny:
    health: {{interval_s: 0.05}}
    endpoints:
      - kind: sim
        replicas: 2
        options: {{ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 8, output_tokens_max: 40}}
      - kind: sim
        name: {json.dumps(EVIL)}
        options: {{ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 8, output_tokens_max: 40}}
"""
ENDPOINTS = ["tiny-0", "tiny-1", EVIL]

KEY = new_key()
AUTH_DEPLOYMENT = f"""
auth:
  authenticators:
    - kind: api_keys
      options:
        keys:
          - {{id: ops, hash: "{hash_key(KEY)}", tenant: ops, tier: default}}
models:
  guarded:
    health: {{interval_s: 0.05}}
    endpoints:
      - {{kind: sim, options: {{ttft_ms: 0, tokens_per_s: 0}}}}
"""

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no `chromium` on PATH (Debian: apt-get install chromium)"
)


# -- the window and its math ------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 101])
@pytest.mark.parametrize("q", [1, 25, 50, 90, 99])
def test_percentile_matches_inclusive_quantiles(n: int, q: int) -> None:
    values = sorted((i * 37 % 101) / 7 for i in range(n))
    expected = values[0] if n == 1 else statistics.quantiles(values, n=100, method="inclusive")[q - 1]
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_edges() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_window_counts_rates_and_percentiles_of_the_last_minute() -> None:
    w = RecentWindow(created=0.0)
    w.add(5.0, False, 0.5, 9.0)  # finished more than a minute before `now`: not counted
    for i in range(100):
        w.add(100.0 + i * 0.5, i % 10 == 0, 0.01 * (i + 1), 0.1 * (i + 1))
    w.add(149.0, False, None, None)  # never reached an engine: counted, no latency
    s = w.summary(now=150.0)
    assert s["requests"] == 101 and s["errors"] == 10
    assert s["span_s"] == 60.0 and s["rps"] == pytest.approx(101 / 60, abs=1e-3)
    assert s["error_rate"] == pytest.approx(10 / 101, abs=1e-4)
    assert s["ttft_p50"] == pytest.approx(0.505) and s["ttft_p99"] == pytest.approx(0.9901)
    assert s["e2e_p50"] == pytest.approx(5.05) and s["e2e_p99"] == pytest.approx(9.901)


def test_young_and_empty_windows() -> None:
    w = RecentWindow(created=1000.0)
    empty = w.summary(now=1010.0)
    assert empty["requests"] == 0 and empty["rps"] == 0 and empty["error_rate"] is None
    assert empty["ttft_p50"] is None and empty["e2e_p99"] is None
    for t in range(5):
        w.add(1005.0 + t, False, 0.1, 0.2)
    s = w.summary(now=1010.0)
    assert s["span_s"] == 10.0 and s["rps"] == 0.5  # over the gateway's ten seconds, not a minute


def test_ring_keeps_the_last_n_and_rates_cover_what_it_holds() -> None:
    w = RecentWindow(size=4, created=0.0)
    for t in range(10):
        w.add(100.0 + t, t < 6, 0.1, 0.2)
    assert len(w.ring) == 4 and [e[0] for e in w.ring] == [106.0, 107.0, 108.0, 109.0]
    s = w.summary(now=110.0)
    assert s["requests"] == 4 and s["errors"] == 0
    assert s["span_s"] == 4.0 and s["rps"] == 1.0
    assert RecentWindow().ring.maxlen == RING_SIZE
    with pytest.raises(ValueError):
        RecentWindow(size=0)


def _record(**kw: Any) -> RequestRecord:
    base: dict[str, Any] = {
        "id": "r",
        "model": "tiny",
        "api": "chat",
        "stream": True,
        "status": 200,
        "outcome": Outcome.OK,
        "pool": "tiny",
        "arrival": 10.0,
        "admitted": 10.1,
        "first_token": 10.25,
        "finished": 12.0,
    }
    return RequestRecord(**{**base, **kw})


def test_observer_takes_ttft_from_streams_and_counts_errors() -> None:
    sw = StatusWindow(["tiny"], created=0.0)
    sw.observe(record=_record())
    sw.observe(record=_record(stream=False))
    sw.observe(record=_record(outcome=Outcome.ERROR, status=503, first_token=None, admitted=None))
    sw.observe(record=_record(outcome=Outcome.CANCELLED, status=499, first_token=None))
    sw.observe(record=_record(pool=None, model="nope", status=404, outcome=Outcome.ERROR, first_token=None))
    ring = list(sw.models["tiny"].ring)
    assert ring == [
        (12.0, False, 0.25, 2.0),
        (12.0, False, None, 2.0),
        (12.0, True, None, None),
        (12.0, False, None, None),
    ]
    s = sw.summary("tiny", now=20.0)
    assert s is not None and s["requests"] == 4 and s["errors"] == 1 and s["ttft_p50"] == 0.25
    assert sw.unrouted.summary(now=20.0)["requests"] == 1
    assert sw.summary("other", now=20.0) is None


def test_status_json_adds_recent_figures_to_readiness() -> None:
    sw = StatusWindow(["a"], created=0.0)
    sw.observe(record=_record(pool="a", finished=50.0, first_token=49.0, arrival=48.5))
    ready = {"status": "ready", "models": {"a": {"endpoints": []}}}
    body = status_json(True, ready, sw, auth=False, now=55.0)
    assert body["ready"] is True and body["status"] == "ready" and body["auth"] is False
    recent = body["models"]["a"]["recent"]
    assert recent["requests"] == 1 and recent["ttft_p50"] == 0.5 and recent["e2e_p50"] == 1.5
    assert body["unrouted"]["requests"] == 0 and body["window_s"] == 60.0


# -- the HTML shell ---------------------------------------------------------------------


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_page_escapes_what_it_embeds() -> None:
    page = render_page(title="<script>alert(1)</script>", version='1"><b>x</b>&')
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>x</b>" not in page and "1&quot;&gt;&lt;b&gt;x&lt;/b&gt;&amp;" in page
    assert page.count("<script>") == 1  # only the page's own


def test_page_is_self_contained_and_its_csp_allows_exactly_its_own_script_and_style() -> None:
    page = render_page()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # no external assets
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page and "eval(" not in page
    script = re.search(r"<script>(.*?)</script>", page, re.DOTALL)
    style = re.search(r"<style>(.*?)</style>", page, re.DOTALL)
    assert script and style
    csp = PAGE_HEADERS["content-security-policy"]
    assert f"script-src {_csp_hash(script.group(1))};" in csp
    assert f"style-src {_csp_hash(style.group(1))};" in csp
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "unsafe" not in csp


# -- a real gateway ---------------------------------------------------------------------


def _chat(gw: GatewayProcess, *, stream: bool, model: str = "tiny", key: str | None = None) -> int:
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": model, "messages": messages, "max_tokens": 4, "stream": stream}
    headers = {"authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(f"{gw.base_url}/chat/completions", json=body, headers=headers, timeout=10)
    return r.status_code


def _ready(gw: GatewayProcess) -> None:
    wait_until(lambda: httpx.get(f"{gw.url}/ready", timeout=5).status_code == 200)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = start_gateway(DEPLOYMENT, tmp_path_factory.mktemp("status"))
    try:
        _ready(gw)
        assert [_chat(gw, stream=True) for _ in range(6)] == [200] * 6
        assert [_chat(gw, stream=False) for _ in range(2)] == [200] * 2
        assert _chat(gw, stream=False, model="nope") == 404
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def auth_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = start_gateway(AUTH_DEPLOYMENT, tmp_path_factory.mktemp("status-auth"))
    try:
        _ready(gw)
        assert _chat(gw, stream=True, model="guarded", key=KEY) == 200
        yield gw
    finally:
        gw.stop()


def test_status_json_from_a_gateway(gw: GatewayProcess) -> None:
    r = httpx.get(f"{gw.url}/status.json", timeout=5)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.headers["cache-control"] == "no-store" and r.headers["x-request-id"]
    body = r.json()
    assert body["ready"] is True and body["status"] == "ready" and body["auth"] is False
    tiny = body["models"]["tiny"]
    assert [e["name"] for e in tiny["endpoints"]] == ENDPOINTS
    assert tiny["healthy_endpoints"] == 3 and tiny["queued"] == 0
    assert all(e["healthy"] and e["completed"] >= 0 for e in tiny["endpoints"])
    recent = tiny["recent"]
    assert recent["requests"] >= 8 and recent["errors"] == 0 and recent["error_rate"] == 0
    assert recent["rps"] > 0 and 0 < recent["span_s"] <= 60
    for field in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99"):
        assert isinstance(recent[field], float) and 0 <= recent[field] < 5, field
    assert recent["ttft_p50"] <= recent["ttft_p99"] and recent["e2e_p50"] <= recent["e2e_p99"]
    assert body["unrouted"]["requests"] >= 1


def test_root_redirects_and_status_serves_the_page(gw: GatewayProcess) -> None:
    r = httpx.get(f"{gw.url}/", timeout=5)
    assert r.status_code == 302 and r.headers["location"] == "status"
    r = httpx.get(f"{gw.url}/", timeout=5, follow_redirects=True)
    assert r.status_code == 200 and str(r.url) == f"{gw.url}/status"
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.headers["content-security-policy"] == PAGE_HEADERS["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"
    assert r.text == render_page()


def test_status_json_needs_a_credential_when_auth_is_on(auth_gw: GatewayProcess) -> None:
    assert httpx.get(f"{auth_gw.url}/status", timeout=5).status_code == 200  # the shell is open
    r = httpx.get(f"{auth_gw.url}/status.json", timeout=5)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    r = httpx.get(f"{auth_gw.url}/status.json", headers={"authorization": "Bearer sk-wrong"}, timeout=5)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.get(f"{auth_gw.url}/status.json", headers={"authorization": f"Bearer {KEY}"}, timeout=5)
    assert r.status_code == 200
    body = r.json()
    assert body["auth"] is True and body["models"]["guarded"]["recent"]["requests"] == 1


# -- headless Chromium ------------------------------------------------------------------


def _chromium(tmp_path: Path, *args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _text(fragment: str) -> str:
    """``fragment`` as it appears in serialised DOM text."""
    return fragment.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@needs_chromium
def test_chromium_renders_the_live_page(gw: GatewayProcess, tmp_path: Path) -> None:
    started = time.monotonic()
    done = _chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", f"{gw.url}/status", timeout=30)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert 'data-loaded="1"' in dom, dom[-3000:]  # the script ran and drew status.json
    banner = re.search(r'<div id="banner"[^>]*>(.*?)</div>', dom, re.DOTALL)
    assert banner is not None and banner.group(1) == "", banner  # no JS error, no fetch failure
    assert 'role="alert" hidden' in banner.group(0)
    assert re.search(r'<section class="model" data-model="tiny"><h2>tiny<', dom)
    assert 'id="overall" class="badge ok">ready<' in dom
    for name in ENDPOINTS:
        assert f"<strong>{_text(name)}</strong>" in dom, name
    assert dom.count('data-health="healthy"') == len(ENDPOINTS)
    assert "3 / 3 healthy" in dom
    # The hostile endpoint name is text: no element was made from it, no handler ran.
    main = dom[dom.index('<main id="models">') :]
    assert "<img" not in main and "<title>shuniu status</title>" in dom
    assert time.monotonic() - started < 20


@contextlib.contextmanager
def _cdp_page(tmp_path: Path, url: str) -> Iterator[Any]:
    """A DevTools connection to a headless Chromium page showing ``url``."""
    ws_client = pytest.importorskip("websockets.sync.client", reason="the DevTools test needs `websockets`")
    assert CHROMIUM is not None
    proc = subprocess.Popen(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        port = None
        deadline = time.monotonic() + 15
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                port = int(m.group(1))
        assert port is not None, "chromium did not start its DevTools server"
        # Keep reading its stderr so it never blocks on a full pipe.
        threading.Thread(target=proc.stderr.read, daemon=True).start()

        def page_target() -> str | None:
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
            pages = [t for t in targets if t.get("type") == "page"]
            return pages[0]["webSocketDebuggerUrl"] if pages else None

        with ws_client.connect(wait_until(page_target, timeout=10), max_size=None, open_timeout=10) as ws:
            _call(ws, "Page.navigate", {"url": url})
            loaded = f"location.href === {json.dumps(url)} && document.readyState === 'complete'"
            wait_until(lambda: _evaluate(ws, loaded), timeout=10)
            yield ws
    finally:
        proc.kill()
        proc.wait(5)


def _call(ws: Any, method: str, params: dict[str, Any], _ids: list[int] = [0]) -> Any:  # noqa: B006
    _ids[0] += 1
    ws.send(json.dumps({"id": _ids[0], "method": method, "params": params}))
    while True:
        msg = json.loads(ws.recv(timeout=10))
        if msg.get("id") == _ids[0]:
            assert "error" not in msg, msg
            return msg["result"]


def _evaluate(ws: Any, expression: str) -> Any:
    result = _call(ws, "Runtime.evaluate", {"expression": expression, "returnByValue": True})
    assert "exceptionDetails" not in result, result
    return result["result"].get("value")


@needs_chromium
def test_chromium_asks_for_a_key_and_sends_it_as_a_bearer_header(
    auth_gw: GatewayProcess, tmp_path: Path
) -> None:
    with _cdp_page(tmp_path, f"{auth_gw.url}/status") as ws:
        banner = "document.getElementById('banner').textContent"
        wait_until(lambda: "needs an API key" in (_evaluate(ws, banner) or ""), timeout=10)
        assert _evaluate(ws, "document.body.dataset.loaded") is None

        submit = "k => { const i = document.getElementById('key'); i.value = k;"
        submit += " document.getElementById('keyform').requestSubmit(); return true; }"
        assert _evaluate(ws, f"({submit})('sk-wrong')")
        wait_until(lambda: "refused this key" in (_evaluate(ws, banner) or ""), timeout=10)

        assert _evaluate(ws, f"({submit})({json.dumps(KEY)})")
        wait_until(lambda: _evaluate(ws, "document.body.dataset.loaded") == "1", timeout=10)
        assert _evaluate(ws, "sessionStorage.getItem('shuniu.status.key')") == KEY
        assert _evaluate(ws, banner) == ""
        text = _evaluate(ws, "document.getElementById('models').textContent")
        assert "guarded" in text and "guarded-0" in text and "healthy" in text
