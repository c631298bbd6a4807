"""Deployment files: every problem reported with its field path and line; env interpolation;
the JSON Schema; ``shuniu validate`` exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shuniu.core.config.loader import expand_endpoints, interpolate_env, load_deployment, quickstart_text
from shuniu.core.errors import ConfigError, Problem
from shuniu.core.plugin_manager import PluginManager, load_plugins

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def plugins() -> PluginManager:
    return load_plugins()


def _problems(plugins: PluginManager, text: str, env: dict[str, str] | None = None) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        load_deployment("deploy.yaml", plugins, text=textwrap.dedent(text), env=env or {})
    return info.value.problems


def test_quickstart_is_the_example(plugins: PluginManager) -> None:
    assert (ROOT / "examples" / "quickstart.yaml").read_text() == quickstart_text()
    resolved = load_deployment(None, plugins)
    assert list(resolved.deployment.models) == ["quickstart", "embed", "rerank"]
    names = [
        n for _, _, n in expand_endpoints("quickstart", resolved.deployment.models["quickstart"].endpoints)
    ]
    assert names == ["quickstart-0", "quickstart-1"]


def test_every_problem_with_path_and_line(plugins: PluginManager) -> None:
    problems = _problems(
        plugins,
        """\
        gateway:
          port: not-a-port
          colour: blue
        models:
          chat:
            endpoints:
              - kind: warp-drive
              - kind: sim
                replicas: 0
                options:
                  tokens_per_s: -1
                  turbo: true
            balancer:
              policy: psychic
        """,
    )
    by_path = {p.path: p for p in problems}
    assert set(by_path) == {
        "gateway.port",
        "gateway.colour",
        "models.chat.endpoints[0].kind",
        "models.chat.endpoints[1].replicas",
        "models.chat.endpoints[1].options.tokens_per_s",
        "models.chat.endpoints[1].options.turbo",
        "models.chat.balancer.policy",
    }
    assert by_path["gateway.port"].line == 2
    assert by_path["gateway.colour"].line == 3
    assert (
        "expected one of" in by_path["gateway.colour"].message and "host" in by_path["gateway.colour"].message
    )
    assert by_path["models.chat.endpoints[1].replicas"].line == 9
    kind = by_path["models.chat.endpoints[0].kind"]
    assert kind.line == 7
    assert "registered: ascend, openai, sim, tei, tgi, trtllm, vllm" in kind.message
    assert "registered: least_load, least_requests, " in by_path["models.chat.balancer.policy"].message
    assert by_path["models.chat.balancer.policy"].line == 14
    assert by_path["models.chat.endpoints[1].options.tokens_per_s"].line == 11
    assert "ttft_ms" in by_path["models.chat.endpoints[1].options.turbo"].message


def test_unknown_field_inside_a_model_lists_accepted_keys(plugins: PluginManager) -> None:
    [problem] = _problems(
        plugins, "models:\n  chat:\n    endpoints:\n      - kind: sim\n        replica: 2\n"
    )
    assert problem.path == "models.chat.endpoints[0].replica"
    expected = (
        "expected one of: discovery, kind, kv_events, labels, launch, max_concurrency, name, "
        "options, replicas"
    )
    assert expected in problem.message


def test_missing_and_duplicate_names(plugins: PluginManager) -> None:
    problems = _problems(plugins, "gateway: {}\n")
    assert [p.path for p in problems] == ["models"]
    problems = _problems(
        plugins,
        """\
        models:
          a:
            aliases: [shared]
            endpoints: [{kind: sim, name: one}]
          b:
            aliases: [shared]
            endpoints: [{kind: sim, name: one}]
        """,
    )
    assert any("'shared' is used by both 'a' and 'b'" in p.message for p in problems)
    problems = _problems(
        plugins,
        """\
        models:
          a:
            endpoints: [{kind: sim, name: one}]
          b:
            endpoints: [{kind: sim, name: one}]
        """,
    )
    assert [p.path for p in problems] == ["models.b.endpoints[0].name"]
    assert "already used at models.a.endpoints[0]" in problems[0].message


def test_not_yaml_and_not_a_mapping(plugins: PluginManager) -> None:
    problems = _problems(plugins, "models: [unclosed\n")
    assert problems[0].message.startswith("not valid YAML") and problems[0].line is not None
    problems = _problems(plugins, "- just\n- a list\n")
    assert "mapping" in problems[0].message


def test_env_interpolation(plugins: PluginManager) -> None:
    text = """\
    gateway:
      port: ${PORT}
      host: ${HOST:-127.0.0.2}
    models:
      m:
        endpoints:
          - kind: openai
            options:
              base_url: http://127.0.0.1:${UP_PORT}/v1
              api_key: $${literal}
    """
    resolved = load_deployment(
        "d.yaml", plugins, text=textwrap.dedent(text), env={"PORT": "9001", "UP_PORT": "7"}
    )
    assert resolved.deployment.gateway.port == 9001
    assert resolved.deployment.gateway.host == "127.0.0.2"
    opts = resolved.endpoint_options[("m", 0)]
    assert opts.base_url == "http://127.0.0.1:7/v1"
    assert opts.api_key == "${literal}"
    problems = _problems(plugins, text, env={"PORT": "1"})
    assert [p.path for p in problems] == ["models.m.endpoints[0].options.base_url"]
    assert "UP_PORT is not set" in problems[0].message
    assert problems[0].line == 9
    # The unset variable leaves the field empty, which is not reported a second time.
    problems = _problems(plugins, text, env={"UP_PORT": "1"})
    assert [(p.path, p.line) for p in problems] == [("gateway.port", 2)]
    assert "PORT is not set" in problems[0].message


def test_interpolate_env_leaves_other_types() -> None:
    problems: list[Problem] = []
    data = {"a": 1, "b": [True, "${X}"], "c": None}
    assert interpolate_env(data, problems, {"X": "y"}) == {"a": 1, "b": [True, "y"], "c": None}
    assert problems == []


def test_endpoint_naming() -> None:
    from shuniu.core.config import EndpointConfig

    eps = [
        EndpointConfig(kind="sim", replicas=2),
        EndpointConfig(kind="sim", name="big", replicas=2),
        EndpointConfig(kind="sim"),
    ]
    assert [n for _, _, n in expand_endpoints("m", eps)] == ["m-0", "m-1", "big-0", "big-1", "m-4"]


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shuniu.core", *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def test_validate_cli(tmp_path: Path) -> None:
    good = _cli("validate", str(ROOT / "examples" / "quickstart.yaml"))
    assert good.returncode == 0, good.stderr
    assert "OK (3 model(s), 5 endpoint(s))" in good.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  m:\n    endpoints:\n      - kind: nope\n        weight: -1\n")
    out = _cli("validate", str(bad))
    assert out.returncode == 1
    assert "models.m.endpoints[0].weight (line 5)" in out.stderr
    assert "Traceback" not in out.stderr
    missing = _cli("validate", str(tmp_path / "missing.yaml"))
    assert missing.returncode == 1 and "cannot read file" in missing.stderr


def test_schema_cli_includes_plugin_options(tmp_path: Path) -> None:
    out = _cli("schema")
    assert out.returncode == 0, out.stderr
    schema = json.loads(out.stdout)
    endpoint = schema["$defs"]["EndpointConfig"]
    assert endpoint["properties"]["kind"]["enum"] == [
        "ascend",
        "openai",
        "sim",
        "tei",
        "tgi",
        "trtllm",
        "vllm",
    ]
    conditions = {c["if"]["properties"]["kind"]["const"]: c["then"] for c in endpoint["allOf"]}
    sim_opts = conditions["sim"]["properties"]["options"]
    assert "tokens_per_s" in sim_opts["properties"]
    assert sim_opts["properties"]["tokens_per_s"]["description"].startswith("Fixed-rate timing")
    assert schema["$defs"]["GatewayConfig"]["properties"]["port"]["description"]
    # The schema is valid JSON Schema and accepts the quickstart while rejecting a bad file.
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    jsonschema.validate(yaml.safe_load(quickstart_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {"models": {"m": {"endpoints": [{"kind": "sim", "options": {"turbo": 1}}]}}}, schema
        )


def test_help_on_every_command() -> None:
    for cmd in ([], ["serve"], ["validate"], ["schema"], ["plugins"]):
        out = _cli(*cmd, "--help")
        assert out.returncode == 0 and "Usage:" in out.stdout, (cmd, out.stderr)
    version = _cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("shuniu, version ")


def test_serve_reports_config_errors_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  m:\n    endpoints: [{kind: sim, options: {tokens_per_s: fast}}]\n")
    out = _cli("serve", str(bad), "--port", "0")
    assert out.returncode == 2
    assert "models.m.endpoints[0].options.tokens_per_s" in out.stderr
    assert "Traceback" not in out.stderr
