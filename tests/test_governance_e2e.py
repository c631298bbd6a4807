"""Governance end to end, on real gateway processes: the example's budget running out for
the official OpenAI SDK, the ledger and budgets across a restart, usage reports (the API,
``shuniu usage``, the status page's data), keys managed at run time through ``shuniu keys``
on one gateway and used on another, and one budget shared by two gateways through Redis."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import ROOT, wait_until
from tests.test_status_page import _chromium, needs_chromium

EXAMPLE = (ROOT / "examples" / "governance.yaml").read_text()
BUDGET_KEY = "sk-shuniu-demo-budget-not-secret"
TEAM_A_KEY = "sk-shuniu-demo-team-a-not-secret"
ADMIN_KEY = "sk-shuniu-demo-admin-not-secret"
HELLO = [{"role": "user", "content": "Hello"}]


def _client(gw, key: str) -> openai.OpenAI:  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)


def _spend(gw, key: str, max_tokens: int = 300) -> tuple[int, list[str], openai.RateLimitError]:  # type: ignore[no-untyped-def]
    """Requests until the budget refuses one: (tokens used, warnings seen, the refusal)."""
    client = _client(gw, key)
    used, warnings = 0, []
    for _ in range(50):
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="chat", messages=HELLO, max_tokens=max_tokens
            )
        except openai.RateLimitError as err:
            return used, warnings, err
        resp = raw.parse()
        assert resp.usage is not None
        used += resp.usage.total_tokens
        if (w := raw.headers.get("x-shuniu-budget-warning")) is not None:
            warnings.append(w)
    raise AssertionError("the budget never ran out")


def _usage(gw, key: str, **params: str) -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.get(
        f"{gw.url}/v1/usage", params=params, headers={"authorization": f"Bearer {key}"}, timeout=10
    )


def test_the_example_budget_runs_out_within_a_few_requests_and_survives_a_restart(
    gateway_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(EXAMPLE)
    used, warnings, refusal = _spend(gw, BUDGET_KEY)
    assert 0 < used <= 2000
    assert len(warnings) >= 1 and all('key="budget-demo"' in w and "period=day" in w for w in warnings)
    body = refusal.body
    assert isinstance(body, dict) and body["code"] == "budget_exceeded"
    assert "2,000 tokens" in body["message"]
    retry = int(refusal.response.headers["retry-after"])
    assert 1 <= retry <= 86400
    # Another tenant's key is not touched by that budget.
    assert _client(gw, TEAM_A_KEY).chat.completions.create(model="chat", messages=HELLO, max_tokens=5)
    assert (tmp_path / "shuniu-ledger.db").is_file()
    before = _usage(gw, ADMIN_KEY, group_by="tenant").json()["data"]
    gw.stop()
    # A restarted gateway (counting budgets in its memory) reads the day's spend back from
    # the ledger: the key stays refused, and no record was lost.
    again = gateway_factory(EXAMPLE)
    with pytest.raises(openai.RateLimitError):
        _client(again, BUDGET_KEY).chat.completions.create(model="chat", messages=HELLO, max_tokens=300)
    after = {r["groups"]["tenant"]: r for r in _usage(again, ADMIN_KEY, group_by="tenant").json()["data"]}
    for row in before:
        old = after[row["groups"]["tenant"]]
        assert old["total_tokens"] == row["total_tokens"]
        assert old["requests"] == row["requests"] + (1 if row["groups"]["tenant"] == "trial-user" else 0)
    metrics = httpx.get(f"{again.url}/metrics", timeout=10).text
    assert 'shuniu_budget_refusals_total{level="key",period="day"} 1.0' in metrics


def test_usage_reports_see_their_own_tenant_or_everything(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(EXAMPLE)
    _client(gw, TEAM_A_KEY).chat.completions.create(model="chat", messages=HELLO, max_tokens=20)
    _client(gw, BUDGET_KEY).chat.completions.create(model="chat", messages=HELLO, max_tokens=20)
    with pytest.raises(openai.AuthenticationError):
        _client(gw, "sk-shuniu-wrong").chat.completions.create(model="chat", messages=HELLO)
    everyone = _usage(gw, ADMIN_KEY, group_by="tenant,model,status").json()
    tenants = {(r["groups"]["tenant"], r["groups"]["status"]) for r in everyone["data"]}
    assert {("team-a", 200), ("trial-user", 200), ("anonymous", 401)} <= tenants
    assert everyone["currency"] == "USD"
    team = next(r for r in everyone["data"] if r["groups"]["tenant"] == "team-a")
    # The example's price: 0.50 per million prompt tokens, 1.50 per million completion tokens.
    assert team["cost"] == pytest.approx(
        (team["prompt_tokens"] * 0.5 + team["completion_tokens"] * 1.5) / 1e6, abs=1e-6
    )
    own = _usage(gw, TEAM_A_KEY, group_by="tenant,key,project").json()
    assert own["tenant"] == "team-a"
    assert [(r["groups"]["tenant"], r["groups"]["key"], r["groups"]["project"]) for r in own["data"]] == [
        ("team-a", "team-a-demo", "search")
    ]
    assert _usage(gw, TEAM_A_KEY, tenant="trial-user").status_code == 403
    assert _usage(gw, "nope").status_code == 401
    for params, field in (
        ({"since": "yesterday-ish"}, "since"),
        ({"group_by": "colour"}, "group_by"),
        ({"limit": "0"}, "limit"),
    ):
        answer = _usage(gw, ADMIN_KEY, **params)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == field
    assert _usage(gw, ADMIN_KEY, since="1d", model="chat").json()["data"][0]["requests"] >= 2
    # The status page's data carries the last day by tenant and model, scoped the same way.
    status = httpx.get(f"{gw.url}/status.json", headers={"authorization": f"Bearer {TEAM_A_KEY}"}).json()
    assert [r["groups"]["tenant"] for r in status["usage"]["rows"]] == ["team-a"]


def test_shuniu_usage_prints_a_table_and_plots(gateway_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(EXAMPLE)
    for key in (TEAM_A_KEY, BUDGET_KEY):
        _client(gw, key).chat.completions.create(model="chat", messages=HELLO, max_tokens=20)
    plot = tmp_path / "usage.png"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "shuniu.core",
            "usage",
            "--url",
            gw.url,
            "--key",
            ADMIN_KEY,
            "--since",
            "7d",
            "--by",
            "tenant,model,day",
            "--plot",
            str(plot),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert "team-a" in out.stdout and "trial-user" in out.stdout and "total" in out.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    refused = subprocess.run(
        [sys.executable, "-m", "shuniu.core", "usage", "--url", gw.url, "--key", "sk-shuniu-wrong"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "HTTP 401" in refused.stderr and "Traceback" not in refused.stderr


MANAGED = EXAMPLE.replace("  currency: USD\n", "  currency: USD\n  keys: {refresh_s: 0.2}\n")


def _shuniu_keys(gw, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run(
        [sys.executable, "-m", "shuniu.core", "keys", *args, "--url", gw.url],
        capture_output=True,
        text=True,
        timeout=60,
        env={"SHUNIU_ADMIN_KEY": ADMIN_KEY, "PATH": "/usr/bin:/bin"},
    )


def test_keys_created_at_run_time_work_on_every_gateway_until_revoked(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    one = gateway_factory(MANAGED)
    two = gateway_factory(MANAGED)  # the same ledger file: the same key table
    made = _shuniu_keys(
        one,
        "create",
        "--tenant",
        "team-b",
        "--tier",
        "pro",
        "--id",
        "team-b-ci",
        "--budget",
        "day:tokens=100000",
        "--limits",
        "rpm=100",
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("sk-shuniu-")
    assert _client(one, key).chat.completions.create(model="chat", messages=HELLO, max_tokens=5)

    def works_on_two() -> bool:
        try:
            _client(two, key).chat.completions.create(model="chat", messages=HELLO, max_tokens=5)
            return True
        except openai.AuthenticationError:
            return False

    wait_until(works_on_two, timeout=10)
    listed = _shuniu_keys(two, "list")
    assert listed.returncode == 0 and "team-b-ci" in listed.stdout and "active" in listed.stdout
    clash = _shuniu_keys(one, "create", "--tenant", "x", "--id", "team-a-demo")
    assert clash.returncode != 0 and "HTTP 409" in clash.stderr
    rotated = _shuniu_keys(two, "rotate", "team-b-ci", "--grace", "0")
    assert rotated.returncode == 0, rotated.stderr
    new_key = rotated.stdout.strip()
    assert _client(two, new_key).chat.completions.create(model="chat", messages=HELLO, max_tokens=5)
    assert _shuniu_keys(one, "revoke", "team-b-ci").returncode == 0

    def refused_everywhere() -> bool:
        for gw in (one, two):
            for k in (key, new_key):
                try:
                    _client(gw, k).chat.completions.create(model="chat", messages=HELLO, max_tokens=5)
                    return False
                except openai.AuthenticationError:
                    pass
        return True

    wait_until(refused_everywhere, timeout=10)

    # Its usage stays in the reports under its id. Two of its requests were served by the
    # other gateway, whose records reach the shared ledger within its flush interval.
    def rows() -> list[dict]:  # type: ignore[type-arg]
        return _usage(one, ADMIN_KEY, group_by="key", tenant="team-b").json()["data"]

    wait_until(lambda: sum(r["requests"] for r in rows()) >= 3, timeout=10)
    assert [r["groups"]["key"] for r in rows()] == ["team-b-ci"]
    bad = httpx.post(
        f"{one.url}/admin/keys",
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
        json={"tenant": "t", "budgets": [{"period": "week", "tokens": 1}]},
    )
    assert bad.status_code == 400 and "budgets.0.period" in bad.json()["error"]["message"]
    assert (
        httpx.get(f"{one.url}/admin/keys", headers={"authorization": f"Bearer {TEAM_A_KEY}"}).status_code
        == 403
    )


SHARED = """
gateway:
  admin_keys: ["sha256:f1852789774b976c91b1136bef38298f395c5c14ea0a5b1ddf45099c306ff22d"]
auth:
  authenticators:
    - kind: api_keys
      options:
        keys:
          - id: shared
            hash: "sha256:ce14d3784fbab5251f63e795499c645da81d5ae1d8535f242f305c861366f6d0"
            tenant: t
            budgets: [{period: day, tokens: 2000}]
governance:
  ledger: {url: "sqlite:///LEDGER"}
  redis_url: REDIS
  settle_interval_s: 0.05
models:
  chat:
    endpoints:
      - kind: sim
        options: {ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 300, output_tokens_max: 600}
"""


def test_two_gateways_share_one_budget_through_redis(gateway_factory, redis_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gateways = [
        gateway_factory(
            SHARED.replace("LEDGER", str(tmp_path / f"ledger-{i}.db")).replace("REDIS", redis_url)
        )
        for i in range(2)
    ]
    used, admitted = 0, 0
    for i in range(20):
        try:
            resp = _client(gateways[i % 2], BUDGET_KEY).chat.completions.create(
                model="chat", messages=HELLO, max_tokens=300
            )
        except openai.RateLimitError as err:
            assert isinstance(err.body, dict) and err.body["code"] == "budget_exceeded"
            continue
        assert resp.usage is not None
        used += resp.usage.total_tokens
        admitted += 1
    # Each request uses 309 tokens: six fit in 2,000 across both gateways, not six on each.
    assert admitted == 6 and used <= 2000
    ready = httpx.get(f"{gateways[0].url}/ready", timeout=10).json()
    assert ready["stores"]["budgets"] == {"degraded": False}
    # Each gateway kept its own ledger; together they hold every request, refused ones too.
    total = sum(sum(r["requests"] for r in _usage(gw, ADMIN_KEY).json()["data"]) for gw in gateways)
    assert total == 20


OPEN = """
governance:
  prices: {chat: {prompt: 1.0, completion: 2.0}}
models:
  chat:
    endpoints:
      - kind: sim
        options: {ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 5, output_tokens_max: 9}
"""


@needs_chromium
def test_the_status_page_shows_the_last_days_usage(gateway_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(OPEN)
    for _ in range(3):
        _client(gw, "unused").chat.completions.create(model="chat", messages=HELLO, max_tokens=5)
    done = _chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", f"{gw.url}/status", timeout=30)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert 'data-loaded="1"' in dom, dom[-3000:]
    section = re.search(r'<section class="model" id="usage">(.*?)</section>', dom, re.DOTALL)
    assert section is not None, dom[-3000:]
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", section.group(1))
    # One row: tenant, model, requests, refused, prompt, cached, completion, cost.
    assert cells[:4] == ["anonymous", "chat", "3", "0"]
    assert "cost (USD)" in section.group(1)
