"""Hot reload of the deployment file (SIGHUP and POST /admin/reload) through a real gateway
process: applied without dropping a stream in flight; a bad file changes nothing; a key it
removes is refused at once."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from shuniu.plugins.auth.api_keys import hash_key, new_key
from tests.conftest import GatewayProcess, wait_until, with_public_readiness

ADMIN = new_key()


def _config(endpoints: list[str], extra_model: str = "") -> str:
    lines = [
        "gateway:",
        f'  admin_keys: ["{hash_key(ADMIN)}"]',
        "models:",
        "  chat:",
        "    health: {interval_s: 0.05}",
        "    endpoints:",
        *(f"      - {e}" for e in endpoints),
    ]
    if extra_model:
        lines.append(extra_model)
    return "\n".join(lines) + "\n"


A = [
    "{kind: sim, name: a, replicas: 2, options: {ttft_ms: 1, tokens_per_s: 100}}",
    "{kind: sim, name: c, options: {ttft_ms: 1, tokens_per_s: 100}}",
]
A0_AND_B = [  # a kept as it is, c removed, b added
    "{kind: sim, name: a, replicas: 2, options: {ttft_ms: 1, tokens_per_s: 100}}",
    "{kind: sim, name: b, options: {ttft_ms: 1, tokens_per_s: 2000}}",
]
SMALL = "  small:\n    endpoints: [{kind: sim, options: {ttft_ms: 0, tokens_per_s: 0}}]"


def _names(gw: GatewayProcess, model: str = "chat") -> set[str]:
    headers = {"authorization": f"Bearer {ADMIN}"}  # endpoint names are for admins
    ready = httpx.get(f"{gw.url}/ready", headers=headers, timeout=10).json()
    if model not in ready["models"]:
        return set()
    return {e["name"] for e in ready["models"][model]["endpoints"]}


def _reload(gw: GatewayProcess) -> httpx.Response:
    return httpx.post(f"{gw.url}/admin/reload", headers={"authorization": f"Bearer {ADMIN}"}, timeout=30)


def test_sighup_applies_a_new_file_without_dropping_a_stream(gateway_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_config(A))
    path = tmp_path / "deployment.yaml"
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=60)
    done: dict[str, Any] = {}
    # A stream in flight across the reload: ~2 s at 100 tokens/s.
    stream = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "long"}],
        max_tokens=200,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    first = next(iter(stream))

    def finish() -> None:
        try:
            chunks = [first, *stream]
            done["usage"] = chunks[-1].usage
        except Exception as exc:
            done["error"] = exc

    reader = threading.Thread(target=finish)
    reader.start()
    path.write_text(_config(A0_AND_B, SMALL))
    gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: _names(gw) == {"a-0", "a-1", "b"} and _names(gw, "small") == {"small-0"}, timeout=20)
    assert "deployment reloaded" in gw.output_containing("deployment reloaded")
    # The new model and endpoint serve.
    reply = client.chat.completions.create(
        model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert reply.choices[0].message.content is not None
    reader.join(30)
    assert "error" not in done, done
    assert done["usage"].completion_tokens == 200  # the stream finished whole


def test_a_bad_file_changes_nothing_and_says_why(gateway_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_config(A))
    path = tmp_path / "deployment.yaml"
    path.write_text(_config(["{kind: simm, name: a}"]))
    r = _reload(gw)
    assert r.status_code == 400
    problems = r.json()["error"]["problems"]
    assert any("models.chat.endpoints[0].kind" in p and "simm" in p for p in problems)
    assert _names(gw) == {"a-0", "a-1", "c"}
    # SIGHUP with the same bad file: logged, nothing changed.
    gw.proc.send_signal(signal.SIGHUP)
    assert "reload refused" in gw.output_containing("reload refused")
    assert _names(gw) == {"a-0", "a-1", "c"}
    # What only a restart can change is refused too.
    path.write_text(_config(A).replace("gateway:\n", "gateway:\n  port: 9\n"))
    r = _reload(gw)
    assert r.status_code == 400 and any("gateway.port" in p for p in r.json()["error"]["problems"])
    path.write_text(_config(A) + "batches: {concurrency: 3}\n")
    r = _reload(gw)
    assert r.status_code == 400 and any(p.startswith("batches") for p in r.json()["error"]["problems"])
    # A good file again: applied, and the answer lists the changes.
    path.write_text(_config(A0_AND_B))
    r = _reload(gw)
    assert r.status_code == 200, r.text
    changes = r.json()["changes"]
    assert any("added endpoint b " in c for c in changes), changes
    assert any("removing endpoint c " in c for c in changes), changes
    wait_until(lambda: _names(gw) == {"a-0", "a-1", "b"})


def test_a_static_key_removed_by_a_reload_is_refused_at_once(gateway_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # A key that passed is remembered (plugins/auth/api_keys.py); a reload builds the
    # authenticators again, so what it remembered goes with the key.
    keep, drop = new_key(), new_key()

    def config(*keys: str) -> str:
        entries = "".join(
            f'          - {{id: k{i}, hash: "{hash_key(k)}", tenant: t}}\n' for i, k in enumerate(keys)
        )
        auth = "auth:\n  authenticators:\n    - kind: api_keys\n      options:\n        keys:\n" + entries
        return _config(A) + auth

    def ask(key: str) -> None:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        client.chat.completions.create(model="chat", messages=messages, max_tokens=2)  # type: ignore[arg-type]

    gw = gateway_factory(config(keep, drop))
    for _ in range(3):  # both pass, and are remembered
        ask(keep)
        ask(drop)
    (tmp_path / "deployment.yaml").write_text(with_public_readiness(config(keep)))
    r = _reload(gw)
    assert r.status_code == 200, r.text
    with pytest.raises(openai.AuthenticationError):
        ask(drop)
    ask(keep)
