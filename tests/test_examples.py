"""Every example deployment validates; the OpenAI-upstream example serves real traffic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import openai
import pytest

from shuniu.core.config.loader import load_deployment
from shuniu.core.plugin_manager import load_plugins

ROOT = Path(__file__).resolve().parent.parent
# The third-party example needs its own plugin installed; its tests install it.
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"quickstart.yaml", "openai_upstream.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path: Path) -> None:
    load_deployment(path, load_plugins(), env={})


@pytest.fixture
def instant_upstream():  # type: ignore[no-untyped-def]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "instant_upstream.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "serving on http://" in line, line
    yield line.strip().rsplit(" ", 1)[-1]
    proc.terminate()
    proc.wait(10)


def test_openai_upstream_example_serves(gateway_factory, instant_upstream: str) -> None:  # type: ignore[no-untyped-def]
    text = (ROOT / "examples" / "openai_upstream.yaml").read_text()
    gw = gateway_factory(text, env={"UPSTREAM_URL": f"{instant_upstream}/v1", "UPSTREAM_MODEL": "bench"})
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    resp = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert resp.model == "gpt-4o-mini"  # the client's name, not the upstream's
    assert resp.usage is not None and resp.usage.completion_tokens == 5
    assert resp.choices[0].message.content == "tok" * 5
    chunks = list(
        client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "tok" * 7
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7
    completion = client.completions.create(model="chat", prompt="x", max_tokens=3)
    assert completion.choices[0].text == "tok" * 3


def test_tiers_and_routing_example_simulates() -> None:
    """The routing example in virtual time: the free tier lands on the small pool only,
    long prompts on the long pool, and the canary gets a share of the rest."""
    from shuniu.core.traffic import load_workload
    from shuniu.plugins.tools.simulate import simulate

    plugins = load_plugins()
    resolved = load_deployment(ROOT / "examples" / "tiers_and_routing.yaml", plugins, env={})
    workload = load_workload(ROOT / "examples" / "workloads" / "chat-shared-prefix.yaml")
    result = simulate(resolved, plugins, workload, duration=40, seed=3)
    per = result.per_endpoint
    small = sum(per[f"chat-small-{i}"]["completed"] for i in range(2))
    assert result.tiers["free"].completed > 0
    assert small == result.tiers["free"].completed
    main = [per[f"chat-{i}"]["completed"] for i in range(4)]
    assert all(n > 0 for n in main)  # three v1 replicas and the v2 canary all served
    assert result.rejected == 0


def test_tenancy_example_serves_keys_tiers_limits_and_cache(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory((ROOT / "examples" / "tenancy.yaml").read_text())
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.base_url, api_key="wrong", max_retries=0).models.with_raw_response.list()
        openai.OpenAI(base_url=gw.base_url, api_key="wrong", max_retries=0).chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}]
        )
    a = openai.OpenAI(base_url=gw.base_url, api_key="sk-shuniu-demo-team-a-not-secret", max_retries=0)
    b = openai.OpenAI(base_url=gw.base_url, api_key="sk-shuniu-demo-team-b-not-secret", max_retries=0)
    ask = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    first = a.chat.completions.with_raw_response.create(**ask)
    assert first.headers["x-shuniu-cache"] == "miss"
    assert first.headers["x-ratelimit-limit-requests"] == "600"
    assert a.chat.completions.with_raw_response.create(**ask).headers["x-shuniu-cache"] == "hit"
    other = b.chat.completions.with_raw_response.create(**ask)
    assert other.headers["x-shuniu-cache"] == "miss"  # another tenant
    assert other.headers["x-ratelimit-limit-requests"] == "10"  # the key's own limit
    assert other.parse().usage.completion_tokens <= 128  # the free tier's default max_tokens


def test_routing_by_request_example_serves_pictures_and_text(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory((ROOT / "examples" / "routing_by_request.yaml").read_text())
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=60)
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    for content in ("hello", [{"type": "text", "text": "what is this?"}, picture]):
        resp = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": content}],
            max_tokens=3,  # type: ignore[misc]
        )
        assert resp.model == "gpt-4o-mini" and resp.usage is not None and resp.usage.completion_tokens <= 3
    with pytest.raises(openai.BadRequestError) as err:  # the large model takes text only
        client.chat.completions.create(
            model="assistant-large",
            messages=[{"role": "user", "content": [picture]}],
            max_tokens=3,  # type: ignore[misc]
        )
    assert err.value.code == "unsupported_modality"


def test_the_autoscaling_example_asks_for_replicas_a_lead_time_before_the_slo_breaks() -> None:
    """examples/autoscaling (as docs/kubernetes.md quotes it), up to just after the first
    window that breaks the SLO on the two fixed replicas."""
    from shuniu.core.traffic import load_workload
    from shuniu.plugins.tools.simulate import simulate

    plugins = load_plugins()
    resolved = load_deployment(ROOT / "examples" / "autoscaling" / "deployment.yaml", plugins, env={})
    workload = load_workload(ROOT / "examples" / "autoscaling" / "ramp.yaml")
    result = simulate(resolved, plugins, workload, duration=360, seed=0)
    summary = result.scaling_summary()["chat"]
    lead_time = resolved.deployment.models["chat"].autoscaling.lead_time_s  # type: ignore[union-attr]
    assert summary["replicas"] == 2 and summary["slo_broken_at_s"] is not None
    assert summary["lead_s"] > lead_time
