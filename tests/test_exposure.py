"""What a gateway tells whom: ``/ready`` and ``/status.json`` give counts to everyone and
engine details (names, kinds, health details, load, launched engines) to admin keys only;
``/admin/hardware`` needs an admin key; ``/metrics`` can require a bearer token."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from shuniu.plugins.auth.api_keys import hash_key, new_key
from tests.conftest import GatewayProcess, start_gateway

ADMIN, TENANT, SCRAPER = new_key(), new_key(), new_key()
DEPLOYMENT = f"""
gateway:
  readiness_details: admin
  admin_keys: ["{hash_key(ADMIN)}"]
  metrics_keys: ["{hash_key(SCRAPER)}"]
auth:
  authenticators:
    - kind: api_keys
      options:
        keys: [{{id: t1, hash: "{hash_key(TENANT)}", tenant: acme}}]
models:
  secret-model-name:
    endpoints:
      - {{kind: sim, name: engine-at-10-0-0-7, replicas: 2, options: {{ttft_ms: 0, tokens_per_s: 0}}}}
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = start_gateway(DEPLOYMENT, tmp_path_factory.mktemp("exposure"))
    yield gw
    gw.stop()


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_ready_gives_counts_without_an_admin_key(gw: GatewayProcess) -> None:
    for headers in ({}, _bearer(TENANT), _bearer("sk-wrong")):
        r = httpx.get(f"{gw.url}/ready", headers=headers)
        assert r.status_code == 200
        assert r.json() == {
            "status": "ready",
            "models": {"secret-model-name": {"healthy_endpoints": 2, "endpoints": 2, "queued": 0}},
        }
        assert "engine-at-10-0-0-7" not in r.text and "detail" not in r.text


def test_ready_gives_everything_to_an_admin_key(gw: GatewayProcess) -> None:
    body = httpx.get(f"{gw.url}/ready", headers=_bearer(ADMIN)).json()
    endpoints = body["models"]["secret-model-name"]["endpoints"]
    assert [e["name"] for e in endpoints] == ["engine-at-10-0-0-7-0", "engine-at-10-0-0-7-1"]
    assert all(e["kind"] == "sim" and "detail" in e for e in endpoints)


def test_status_json_follows_the_same_rule(gw: GatewayProcess) -> None:
    assert httpx.get(f"{gw.url}/status.json").status_code == 401  # auth is on
    tenant = httpx.get(f"{gw.url}/status.json", headers=_bearer(TENANT)).json()
    assert tenant["models"]["secret-model-name"]["endpoints"] == 2 and "engine-at" not in str(tenant)
    admin = httpx.get(f"{gw.url}/status.json", headers=_bearer(ADMIN)).json()
    assert len(admin["models"]["secret-model-name"]["endpoints"]) == 2


def test_hardware_readings_need_an_admin_key(gw: GatewayProcess) -> None:
    assert httpx.get(f"{gw.url}/admin/hardware").status_code == 401
    assert httpx.get(f"{gw.url}/admin/hardware", headers=_bearer(TENANT)).status_code == 403
    assert httpx.get(f"{gw.url}/admin/hardware", headers=_bearer(ADMIN), timeout=30).status_code == 200


def test_metrics_can_require_a_token(gw: GatewayProcess) -> None:
    r = httpx.get(f"{gw.url}/metrics")
    assert (r.status_code, r.json()["error"]["code"]) == (401, "missing_api_key")
    assert httpx.get(f"{gw.url}/metrics", headers=_bearer(TENANT)).status_code == 403
    for key in (SCRAPER, ADMIN):
        r = httpx.get(f"{gw.url}/metrics", headers=_bearer(key), timeout=30)
        assert r.status_code == 200 and "shuniu_build_info" in r.text


def test_ps_needs_the_admin_key(gw: GatewayProcess) -> None:
    from click.testing import CliRunner

    from shuniu.core.cli import build_cli

    refused = CliRunner().invoke(build_cli(), ["ps", "--url", gw.url])
    assert refused.exit_code == 1 and "--admin-key" in refused.output
    shown = CliRunner().invoke(build_cli(), ["ps", "--url", gw.url, "--admin-key", ADMIN])
    assert shown.exit_code == 0 and "no launched engines" in shown.output
