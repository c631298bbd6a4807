"""Routing by what a request carries and asks for: input modalities (a picture never reaches
a text-only engine), tools, reasoning effort, response format, and a classifier's label.

Each simulated model answers a fixed number of tokens, so a response's ``completion_tokens``
says which pool served it."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shuniu.core.api.openai import parse_request
from shuniu.core.config.loader import load_deployment
from shuniu.core.errors import ConfigError
from shuniu.core.pipeline.routing import classify
from shuniu.core.plugin_manager import load_plugins
from tests.conftest import GatewayProcess, start_gateway


def _sim(tokens: int) -> str:
    options = f"{{ttft_ms: 0, tokens_per_s: 0, output_tokens_min: {tokens}, output_tokens_max: {tokens}}}"
    return f"[{{kind: sim, options: {options}}}]"


CONFIG = f"""
models:
  assistant:
    routes:
      - {{modalities: [image], to: vision}}
      - {{tools: true, to: large}}
      - {{reasoning_effort: [high], to: large}}
      - {{response_format: [json_schema], to: large}}
    endpoints: {_sim(2)}
  large:
    endpoints: {_sim(3)}
  vision:
    modalities: [text, image]
    endpoints: {_sim(5)}
  text-only:
    endpoints: {_sim(2)}
  triage:
    classifier: {{kind: heuristic, options: {{complex_prompt_tokens: 50, tools: false}}}}
    routes: [{{labels: [complex], to: large}}]
    endpoints: {_sim(2)}
"""
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    g = start_gateway(CONFIG, tmp_path_factory.mktemp("modality"))
    yield g
    g.stop()


def _chat(gw: GatewayProcess, model: str, content: Any, **extra: Any) -> httpx.Response:
    body = {"model": model, "max_tokens": 50, "messages": [{"role": "user", "content": content}], **extra}
    return httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=30)


def _served_by(r: httpx.Response) -> int:
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["completion_tokens"])


def test_a_picture_never_reaches_a_text_only_model(gw: GatewayProcess) -> None:
    r = _chat(gw, "text-only", [{"type": "text", "text": "what is this?"}, IMAGE])
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "unsupported_modality" and "image" in error["message"]
    assert "text-only" in error["message"]
    # the vision model takes it; audio it does not
    assert _served_by(_chat(gw, "vision", [IMAGE])) == 5
    r = _chat(gw, "vision", [AUDIO])
    assert r.status_code == 400 and "audio" in r.json()["error"]["message"]


def test_rules_route_by_modality_tools_effort_and_format(gw: GatewayProcess) -> None:
    assert _served_by(_chat(gw, "assistant", "hello")) == 2
    assert _served_by(_chat(gw, "assistant", [{"type": "text", "text": "this?"}, IMAGE])) == 5
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert _served_by(_chat(gw, "assistant", "hello", tools=tools)) == 3
    assert _served_by(_chat(gw, "assistant", "hello", reasoning_effort="high")) == 3
    assert _served_by(_chat(gw, "assistant", "hello", reasoning_effort="low")) == 2
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    assert _served_by(_chat(gw, "assistant", "hello", response_format=schema)) == 3
    assert _served_by(_chat(gw, "assistant", "hello", response_format={"type": "json_object"})) == 2


def test_a_classifier_sends_hard_requests_to_the_large_model(gw: GatewayProcess) -> None:
    assert _served_by(_chat(gw, "triage", "a short question")) == 2
    long = " ".join(["word"] * 60)  # 60 tokens and more: complex for this classifier
    assert _served_by(_chat(gw, "triage", long)) == 3
    # its options turned tools off as a reason
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert _served_by(_chat(gw, "triage", "short", tools=tools)) == 2


def test_the_other_apis_carry_their_pictures_too(gw: GatewayProcess) -> None:
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    body = {"model": "text-only", "max_tokens": 5, "messages": [{"role": "user", "content": [block]}]}
    r = httpx.post(f"{gw.url}/v1/messages", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "image" in r.json()["error"]["message"]
    request = {
        "model": "assistant",
        "input": [
            {"role": "user", "content": [{"type": "input_image", "image_url": IMAGE["image_url"]["url"]}]}
        ],
    }
    r = httpx.post(f"{gw.url}/v1/responses", json=request, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 5  # routed to vision


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            """
            models:
              m:
                routes: [{labels: [hard], to: m}]
                endpoints: [{kind: sim}]
            """,
            "no classifier",
        ),
        (
            """
            models:
              m:
                classifier: {kind: oracle}
                endpoints: [{kind: sim}]
            """,
            "heuristic",
        ),
        (
            """
            models:
              m:
                modalities: [text, smell]
                endpoints: [{kind: sim}]
            """,
            "models.m.modalities",
        ),
        (
            """
            models:
              m:
                routes: [{modalities: [image], to: other}]
                endpoints: [{kind: sim}]
              other:
                endpoints: [{kind: sim}]
            """,
            "sends image requests to 'other', which takes text",
        ),
    ],
)
def test_bad_routing_config_is_named(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_deployment("d.yaml", load_plugins(), text=textwrap.dedent(text), env={})
    assert problem in str(err.value)


async def test_a_classifier_that_fails_gives_no_label() -> None:
    class Broken:
        async def classify(self, req: Any) -> str | None:
            raise RuntimeError("model file missing")

    req = parse_request(b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}', "chat", "r", 0.0)
    req.label = "stale"
    await classify(req, Broken())
    assert req.label is None
