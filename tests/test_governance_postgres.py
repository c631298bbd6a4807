"""The ledger and the key table in a real PostgreSQL (Debian's ``postgresql``, started by
the tests): the schema and reports, keys shared by two gateways, and a database outage
under traffic (records held, then written, none lost, none doubled)."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import openai
import pytest

from shuniu.core.config import ManagedKeysConfig
from shuniu.core.governance import MIGRATIONS, KeyManager, KeyRow, LedgerRecord, UsageQuery, open_database
from tests.conftest import wait_until

HELLO = [{"role": "user", "content": "Hello"}]
ADMIN_KEY = "sk-shuniu-demo-admin-not-secret"
KEY = "sk-shuniu-demo-team-a-not-secret"


def _rec(i: int, ts: float, tenant: str) -> LedgerRecord:
    return LedgerRecord(
        f"id-{i}", f"r-{i}", ts, tenant, "k", "p", "pro", "chat", "chat", "e0", "chat",
        200 if i % 4 else 429, "ok", None, 100, 20, 50, 0.5, 0.05, 0.2, False, "g",
    )  # fmt: skip


async def test_the_schema_reports_and_keys_in_postgres(postgres_url: str) -> None:
    database = open_database(postgres_url, base=None, timeout_s=10)  # type: ignore[arg-type]
    await database.connect()
    assert await database.migrate() == MIGRATIONS[-1][0]
    assert await database.migrate() == MIGRATIONS[-1][0]  # idempotent
    day = 86400.0
    records = [_rec(i, 100 * day + i * day / 4, "acme" if i % 2 else "beta") for i in range(12)]
    await database.write(records)
    await database.write(records[:5])  # written again: skipped
    rows = await database.usage(UsageQuery(since=0, until=1e12, group_by=("tenant", "day")))
    assert sum(r.requests for r in rows) == 12
    by = {(r.groups["tenant"], r.groups["day"]): r for r in rows}
    assert by[("beta", "1970-04-11")].requests == 2 and by[("beta", "1970-04-11")].refused == 1
    assert all(r.cost == pytest.approx(0.5 * r.requests) for r in rows)
    spent = await database.spent_since(101 * day)
    assert sum(s[3] for s in spent) == 8 * 150
    keys = KeyManager(ManagedKeysConfig(), database)
    key, _row = await keys.create(KeyRow(id="pg-1", hash="", tenant="acme"))
    assert keys.table.authenticate(key, []) is not None
    other = KeyManager(ManagedKeysConfig(), database)
    await other.refresh()
    assert other.table.authenticate(key, []) is not None
    await database.close()


DEPLOYMENT = """
gateway:
  admin_keys: ["sha256:f1852789774b976c91b1136bef38298f395c5c14ea0a5b1ddf45099c306ff22d"]
auth:
  authenticators:
    - kind: api_keys
      options:
        keys:
          - id: team-a-demo
            tenant: team-a
            hash: "sha256:147a7f176cd43c982bcb8872b196e18766eb47442f8b2a6361aa3d44f74540f5"
governance:
  ledger: {url: "URL", flush_interval_s: 0.1, retry_interval_s: 0.2, timeout_s: 1.0}
  keys: {refresh_s: 0.2}
models:
  chat:
    endpoints:
      - kind: sim
        options: {ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 5, output_tokens_max: 9}
"""


def _metric(gw, name: str) -> float:  # type: ignore[no-untyped-def]
    for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


async def _count(url: str) -> tuple[int, int]:
    conn = await asyncpg.connect(url)
    try:
        # One statement: one snapshot (the gateways keep writing meanwhile).
        total, distinct, served = await conn.fetchrow(
            "SELECT COUNT(*), COUNT(DISTINCT id), COUNT(*) FILTER (WHERE status = 200) FROM shuniu_usage"
        )
    finally:
        await conn.close()
    assert total == distinct, "a record was written twice"
    return int(served), int(total)


def test_a_postgres_outage_under_traffic_loses_and_doubles_nothing(
    gateway_factory, postgres_server_factory
) -> None:  # type: ignore[no-untyped-def]
    server = postgres_server_factory()
    one = gateway_factory(DEPLOYMENT.replace("URL", server.url))
    two = gateway_factory(DEPLOYMENT.replace("URL", server.url))
    # A key made on one gateway works on the other: one key table in PostgreSQL.
    made = httpx.post(
        f"{one.url}/admin/keys",
        json={"tenant": "team-b", "id": "pg-key"},
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
        timeout=10,
    )
    assert made.status_code == 201, made.text
    new_key = made.json()["key"]

    def works_on_two() -> bool:
        try:
            openai.OpenAI(base_url=two.base_url, api_key=new_key, max_retries=0).chat.completions.create(
                model="chat", messages=HELLO, max_tokens=3
            )
            return True
        except openai.AuthenticationError:
            return False

    wait_until(works_on_two, timeout=10)
    sent = 1
    clients = [
        openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0, timeout=30) for gw in (one, two)
    ]
    for i in range(10):
        clients[i % 2].chat.completions.create(model="chat", messages=HELLO, max_tokens=3)
        sent += 1
    wait_until(lambda: asyncio.run(_count(server.url))[0] == sent, timeout=10)
    server.stop()
    # The database is down: requests are still served; their records are held.
    for i in range(30):
        clients[i % 2].chat.completions.create(model="chat", messages=HELLO, max_tokens=3)
        sent += 1
    wait_until(lambda: _metric(one, "shuniu_ledger_degraded") == 1.0, timeout=10)
    assert _metric(one, "shuniu_ledger_buffered") >= 15 and _metric(two, "shuniu_ledger_buffered") >= 15
    # Keys read before keep working while the key table cannot be read.
    assert clients[0].chat.completions.create(model="chat", messages=HELLO, max_tokens=3)
    sent += 1
    server.start()
    wait_until(
        lambda: _metric(one, "shuniu_ledger_buffered") == 0 and _metric(two, "shuniu_ledger_buffered") == 0,
        timeout=20,
    )
    assert _metric(one, "shuniu_ledger_degraded") == 0.0
    served, total = asyncio.run(_count(server.url))
    assert served == sent  # every answered request, none twice (refused 401s are rows too)
    # Graceful stops write what is left; nothing more, nothing less.
    one.stop()
    two.stop()
    assert asyncio.run(_count(server.url)) == (served, total)
