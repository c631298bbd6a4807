"""The Grafana dashboard in ``examples/grafana`` (and ``docs/observability.md``) name only metrics
the gateway really exports, in the form Prometheus stores them, and the PromQL is plausible.

The exported metrics are read from a real gateway process whose deployment turns everything
on: two in-process ``sim`` replicas, a managed engine (``launch:`` running ``shuniu sim
serve``), the response cache, the hardware probes; a few requests (streamed and not, a cache
hit, a scheduler refusal, an unknown model) give the families their labels. Renaming a
metric in ``core/metrics.py`` without updating the dashboard and the docs fails here.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from shuniu.core.observability.metrics import KNOWN_CODES
from tests.conftest import start_gateway, wait_until

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "examples" / "grafana"
DASHBOARD = GRAFANA / "shuniu-dashboard.json"
OBSERVABILITY = ROOT / "docs" / "observability.md"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

ENGINE = [
    sys.executable, "-m", "shuniu.core", "sim", "serve", "--port", "{port}",
    "--served-model-name", "{model}", "--tokens-per-s", "0", "--ttft-ms", "0",
]  # fmt: skip


UNUSED = hashlib.sha256(b"unused").hexdigest()


def _deployment(logs: Path) -> str:
    # JSON is YAML: the command goes in as a JSON list.
    return f"""
gateway: {{graceful_shutdown_s: 5}}
cache: {{store: memory}}
# No Redis answers there: the fleet's families are exported all the same (degraded).
fleet: {{redis_url: "redis://127.0.0.1:9/0", timeout_s: 0.1}}
# Likewise the shared stores' gauge: a Redis limit store with no server behind it.
rate_limits: {{store: redis, options: {{url: "redis://127.0.0.1:9/0", timeout_s: 0.1}}}}
# The governance families: a ledger, a budget that warns at once, keys managed at run time
# (on, as the deployment has an authenticator: the clients' key "unused" is its one key).
auth:
  authenticators:
    - kind: api_keys
      options:
        keys: [{{id: metrics, tenant: t, hash: "sha256:{UNUSED}"}}]
governance:
  ledger: {{url: "sqlite:///ledger.db"}}
  tenants: {{t: {{budgets: [{{period: day, tokens: 1000000000, soft: 0.000001}}]}}}}
models:
  chat:
    health: {{interval_s: 0.05}}
    load: {{interval_s: 0.05}}
    autoscaling:
      ttft_p99_s: 1.0
      interval_s: 0.1
      capacity: {{kind: static, options: {{requests_per_s: 5}}}}
    endpoints:
      - kind: sim
        replicas: 2
        options: {{ttft_ms: 5, tokens_per_s: 2000, output_tokens_min: 5, output_tokens_max: 9}}
  launched:
    health: {{interval_s: 0.05, timeout_s: 2}}
    load: {{interval_s: 0.05}}
    endpoints:
      - kind: vllm
        launch:
          command: {json.dumps(ENGINE)}
          log_dir: {json.dumps(str(logs))}
          stop_grace_s: 5
  narrow:
    scheduler: {{policy: priority, options: {{max_queue: 0}}}}
    health: {{interval_s: 0.05}}
    endpoints:
      - kind: sim
        max_concurrency: 1
        options: {{ttft_ms: 0, tokens_per_s: 50}}
  precise:
    balancer: {{policy: precise_prefix}}
    health: {{interval_s: 0.05}}
    endpoints: [{{kind: sim, options: {{ttft_ms: 0, tokens_per_s: 0}}}}]
"""


@dataclass
class Family:
    name: str
    type: str
    labels: set[str] = field(default_factory=set)
    has_samples: bool = False

    @property
    def series(self) -> set[str]:
        """The names Prometheus stores this family's samples under."""
        if self.type == "counter":
            return {f"{self.name}_total"}
        if self.type == "histogram":
            return {f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count"}
        return {self.name}


# ------------------------------------------------------------------------- the real gateway


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Family]:
    """Every ``shuniu_*`` family a fully configured gateway serves at ``/metrics``, by name."""
    tmp = tmp_path_factory.mktemp("grafana")
    gw = start_gateway(_deployment(tmp / "logs"), tmp)
    try:
        # /ready answers 200 once every model has a ready endpoint: the launched engine too.
        wait_until(lambda: httpx.get(f"{gw.url}/ready", timeout=10).status_code == 200, timeout=60)
        client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)
        hello = [{"role": "user", "content": "hello"}]
        for model in ("chat", "launched"):
            list(client.chat.completions.create(model=model, messages=hello, max_tokens=5, stream=True))
            client.chat.completions.create(model=model, messages=hello, max_tokens=5)
        same = {"model": "chat", "messages": [{"role": "user", "content": "same"}], "temperature": 0}
        client.chat.completions.create(**same, max_tokens=5)
        client.chat.completions.create(**same, max_tokens=5)  # a response-cache hit
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="nope", messages=hello)
        # One slot and no queue: a second request while a stream holds the slot is refused
        # by the scheduler (429 queue_full).
        holder = client.chat.completions.create(
            model="narrow", messages=hello, max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
        )
        next(iter(holder))
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="narrow", messages=hello, max_tokens=2)
        holder.close()

        def scaled() -> bool:  # the autoscaling signals have a mix and a capacity
            signals = httpx.get(f"{gw.url}/ready", timeout=10).json()["models"]["chat"]["autoscaling"]
            return signals["state"] == "ready" and signals["replica_capacity"] is not None

        wait_until(scaled, timeout=60)
        text = httpx.get(f"{gw.url}/metrics", timeout=30).text
    finally:
        gw.stop()
    families: dict[str, Family] = {}
    for f in text_string_to_metric_families(text):
        if not f.name.startswith("shuniu_"):
            continue
        fam = families[f.name] = Family(f.name, f.type)
        for s in f.samples:
            fam.has_samples = True
            fam.labels.update(k for k in s.labels if k != "le")
    # The deployment must really turn everything on, or the check below proves little.
    for needed in (
        "shuniu_requests",
        "shuniu_time_to_first_token_seconds",
        "shuniu_engine_kv_cache_usage_ratio",
        "shuniu_managed_engine_restarts",
        "shuniu_cache_hits",
        "shuniu_scheduler_rejected",
        "shuniu_device_memory_total_bytes",
        "shuniu_pool_desired_replicas",
        "shuniu_pool_replica_capacity",
    ):
        assert needed in families and families[needed].has_samples, needed
    return families


# ------------------------------------------------------------------------- the dashboard


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text("utf-8"))  # type: ignore[no-any-return]


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def _variable_query(var: dict[str, Any]) -> str:
    query = var.get("query")
    return query.get("query", "") if isinstance(query, dict) else str(query or "")


def _expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query template variable."""
    dash = _dashboard()
    out = [
        (f"panel {p['title']!r} {t.get('refId')}", t["expr"])
        for p in _panels(dash["panels"])
        for t in p.get("targets", [])
    ]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            out.append((f"variable {var['name']}", _variable_query(var)))
            out.append((f"variable {var['name']} definition", var.get("definition", "")))
    return out


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_METRIC = re.compile(r"(?<![A-Za-z0-9_:])shuniu_[a-z0-9_]+")
_SUFFIX = re.compile(r"_(bucket|sum|count|total)$")


def _code(expr: str) -> str:
    """The expression with its string literals emptied (label values, regexes)."""
    return _STRING.sub('""', expr)


def _family_of(series: str) -> str:
    """The family name prometheus_client reports for a stored series name."""
    return _SUFFIX.sub("", series)


def _series_map(exported: dict[str, Family]) -> dict[str, Family]:
    return {s: fam for fam in exported.values() for s in fam.series}


def test_dashboard_uses_only_exported_metrics(exported: dict[str, Family]) -> None:
    series = _series_map(exported)
    used, wrong = set(), []
    for where, expr in _expressions():
        for name in _METRIC.findall(_code(expr)):
            used.add(name)
            if name in series:
                continue
            fam = exported.get(_family_of(name)) or exported.get(name)
            hint = f"exported as {sorted(fam.series)}" if fam else "not exported at all"
            wrong.append(f"{where}: {name} ({hint})")
    assert not wrong, "the dashboard names metrics the gateway does not serve:\n" + "\n".join(wrong)
    # The families the dashboard is about are all there (a typo'd panel list would pass above).
    families = {series[n].name for n in used}
    for must in (
        "shuniu_requests",
        "shuniu_time_to_first_token_seconds",
        "shuniu_inter_token_latency_seconds",
        "shuniu_request_duration_seconds",
        "shuniu_queue_wait_seconds",
        "shuniu_completion_tokens",
        "shuniu_prompt_tokens",
        "shuniu_in_flight_requests",
        "shuniu_queued_requests",
        "shuniu_endpoint_concurrency_limit",
        "shuniu_endpoint_healthy",
        "shuniu_endpoint_ejected",
        "shuniu_retries",
        "shuniu_engine_running_requests",
        "shuniu_engine_waiting_requests",
        "shuniu_engine_kv_cache_usage_ratio",
        "shuniu_engine_prefix_cache_hits",
        "shuniu_engine_prefix_cache_queries",
        "shuniu_scheduler_rejected",
        "shuniu_cache_hits",
        "shuniu_cache_misses",
        "shuniu_managed_engine_restarts",
        "shuniu_device_memory_used_bytes",
        "shuniu_device_memory_total_bytes",
        "shuniu_device_utilization_ratio",
        "shuniu_device_temperature_celsius",
        "shuniu_device_power_watts",
    ):
        assert must in families, f"no panel shows {must}"


_MATCHERS = re.compile(r"(shuniu_[a-z0-9_]+)\s*\{([^}]*)\}")
_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
TARGET_LABELS = {"instance", "job"}
"""Labels Prometheus adds to every scraped series."""


def test_selectors_use_labels_the_metrics_have(exported: dict[str, Family]) -> None:
    series = _series_map(exported)
    wrong = []
    for where, expr in _expressions():
        for name, matchers in _MATCHERS.findall(_code(expr)):
            fam = series.get(name)
            if fam is None or not fam.has_samples:
                continue
            allowed = fam.labels | TARGET_LABELS | ({"le"} if name.endswith("_bucket") else set())
            bad = [label for label in _LABEL.findall(matchers) if label not in allowed]
            wrong += [f"{where}: {name}{{{label}}}" for label in bad]
        for name, label in re.findall(r"label_values\(\s*(shuniu_[a-z0-9_]+)[^,]*,\s*(\w+)\s*\)", expr):
            fam = series.get(name)
            if fam is not None and label not in fam.labels | TARGET_LABELS:
                wrong.append(f"{where}: label_values({name}, {label})")
    assert not wrong, "selectors name labels these metrics do not have:\n" + "\n".join(wrong)


_CODE_MATCHER = re.compile(r'\bcode\s*(?:=~|=)\s*"([^"]*)"')


def test_error_codes_in_selectors_are_codes_the_gateway_reports() -> None:
    texts = _expressions()
    texts.append(("docs/observability.md", OBSERVABILITY.read_text("utf-8")))
    reported = KNOWN_CODES | {"other"}
    wrong = [
        f"{where}: code {code!r}"
        for where, text in texts
        for value in _CODE_MATCHER.findall(text)
        for code in value.split("|")
        if code not in reported
    ]
    assert not wrong, "error codes the metrics never carry:\n" + "\n".join(wrong)


def _balanced(code: str) -> bool:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for ch in code:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack


_RATED = r"\b(?:rate|irate|increase)\(\s*{name}\s*(?:\{{[^}}]*\}})?\s*\[[^\]]+\]\s*\)"
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
GRAFANA_VARIABLES = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}


def test_promql_is_plausible(exported: dict[str, Family]) -> None:
    series = _series_map(exported)
    dash = _dashboard()
    variables = {v["name"] for v in dash["templating"]["list"]} | GRAFANA_VARIABLES
    problems = []
    for where, expr in _expressions():
        if not expr.strip():
            problems.append(f"{where}: empty")
            continue
        if expr.count('"') % 2:
            problems.append(f"{where}: unbalanced quotes")
        code = _code(expr)
        if not _balanced(code):
            problems.append(f"{where}: unbalanced brackets")
        for name in set(_METRIC.findall(code)):
            fam = series.get(name)
            if fam is None or where.startswith("variable"):
                continue
            cumulative = fam.type in ("counter", "histogram")
            uses = len(re.findall(rf"(?<![A-Za-z0-9_:]){name}\b", code))
            rated = len(re.findall(_RATED.format(name=re.escape(name)), code))
            if cumulative and rated != uses:
                problems.append(f"{where}: {name} is a {fam.type}; use it inside rate(...[window])")
            if not cumulative and rated:
                problems.append(f"{where}: {name} is a {fam.type}; rate() of it means nothing")
        for m in re.finditer(r"histogram_quantile\(", code):
            inner = code[m.end() :]
            by = re.search(r"\bby\s*\(([^)]*)\)", inner)
            if by is None or "le" not in {x.strip() for x in by.group(1).split(",")}:
                problems.append(f"{where}: histogram_quantile needs the sum kept `by (le, ...)`")
        for braced, bare in _VARIABLE.findall(expr):
            name = braced or bare
            if not name.isdigit() and name not in variables:
                problems.append(f"{where}: ${name} is not a dashboard variable")
    assert not problems, "\n".join(problems)


def test_every_panel_has_a_title_and_the_datasource() -> None:
    dash = _dashboard()
    assert dash["schemaVersion"] >= 36 and dash["uid"] and dash["title"]
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    ds_vars = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert [(v["name"], v["query"]) for v in ds_vars] == [("DS_PROMETHEUS", "prometheus")]
    model = next(v for v in dash["templating"]["list"] if v["name"] == "model")
    assert re.fullmatch(r"label_values\(shuniu_requests_total(\{[^}]*\})?, model\)", _variable_query(model))
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, var["name"]
    ids, cells = set(), set()
    for p in _panels(dash["panels"]):
        assert p.get("title", "").strip(), f"panel {p.get('id')} has no title"
        assert p["id"] not in ids, f"duplicate panel id {p['id']}"
        ids.add(p["id"])
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24, p["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"panel {p['title']!r} overlaps another"
                cells.add((x, y))
        if p["type"] == "row":
            continue
        assert p.get("datasource") == DATASOURCE, f"panel {p['title']!r}: datasource {p.get('datasource')}"
        assert p.get("description"), f"panel {p['title']!r} has no description"
        targets = p.get("targets", [])
        assert targets, f"panel {p['title']!r} has no query"
        assert len({t["refId"] for t in targets}) == len(targets), p["title"]
        for t in targets:
            assert t.get("datasource") == DATASOURCE, f"panel {p['title']!r} {t['refId']}"
            assert t.get("expr", "").strip(), f"panel {p['title']!r} {t['refId']} has no expr"


def test_dashboard_file_is_pretty_printed() -> None:
    text = DASHBOARD.read_text("utf-8")
    assert text == json.dumps(json.loads(text), indent=2, ensure_ascii=False) + "\n"


def test_prometheus_example_scrapes_the_gateway() -> None:
    config = yaml.safe_load((GRAFANA / "prometheus.yml").read_text("utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    shuniu = jobs["shuniu"]
    assert shuniu.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in shuniu["static_configs"] for t in sc["targets"]]
    assert "127.0.0.1:8000" in targets
    assert config["global"]["scrape_interval"] == "15s"


# ------------------------------------------------------------------------- the docs


def test_observability_doc_lists_every_metric_by_its_stored_name(exported: dict[str, Family]) -> None:
    text = OBSERVABILITY.read_text("utf-8")
    # `shuniu_engine_*` and the like name a group, not a metric.
    documented = {n for n in _METRIC.findall(text) if not n.endswith("_")}
    missing = [
        name
        for fam in exported.values()
        for name in ([fam.name] if fam.type == "histogram" else sorted(fam.series))
        if name not in documented
    ]
    assert not missing, f"metrics not described in docs/observability.md: {missing}"
    series = _series_map(exported)
    known = set(series) | {f.name for f in exported.values() if f.type == "histogram"}
    unknown = sorted(documented - known)
    assert not unknown, f"docs/observability.md names metrics the gateway does not export: {unknown}"
