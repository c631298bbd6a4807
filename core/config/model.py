"""The deployment file schema: gateway settings and models, each a pool of endpoints.

Models are pydantic classes (start-up only, never on the hot path) so that validation
reports every problem at once with its field path, and ``shuniu schema`` can print a JSON
Schema whose descriptions come from the field docstrings below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from shuniu.core.config.autoscaling import AutoscalingConfig, CapacityConfig
from shuniu.core.config.base import Options
from shuniu.core.config.base import Strict as _Strict
from shuniu.core.config.batch import BatchesConfig, FilesConfig
from shuniu.core.config.endpoints import (
    LAUNCH_PLACEHOLDERS,
    DiscoveryConfig,
    EndpointConfig,
    KvEventsConfig,
    LaunchConfig,
    RestartConfig,
    placeholders,
)
from shuniu.core.config.governance import (
    BudgetConfig,
    BudgetsConfig,
    GovernanceConfig,
    LedgerConfig,
    ManagedKeysConfig,
    PriceConfig,
)
from shuniu.core.redis_client import check_redis_url

Modality = Literal["text", "image", "audio", "video", "file"]
"""An input modality a model takes."""

Served = Literal["chat", "completions", "embeddings", "rerank"]
"""An API a model serves (``rerank`` includes vLLM's ``/v1/score``)."""

__all__ = [
    "LAUNCH_PLACEHOLDERS",
    "AccessLogConfig",
    "AuthConfig",
    "AuthenticatorConfig",
    "AutoscalingConfig",
    "BalancerConfig",
    "BatchesConfig",
    "BudgetConfig",
    "BudgetsConfig",
    "CacheConfig",
    "CapacityConfig",
    "ClassifierConfig",
    "DegradeConfig",
    "Deployment",
    "DiscoveryConfig",
    "EndpointConfig",
    "FilesConfig",
    "FilterConfig",
    "FleetConfig",
    "GatewayConfig",
    "GovernanceConfig",
    "HealthConfig",
    "KvEventsConfig",
    "LaunchConfig",
    "LedgerConfig",
    "LimitsConfig",
    "LoadConfig",
    "ManagedKeysConfig",
    "ModelConfig",
    "Options",
    "OutlierConfig",
    "PoolingConfig",
    "PriceConfig",
    "RateLimitsConfig",
    "RestartConfig",
    "RetryConfig",
    "RouteRule",
    "SchedulerConfig",
    "ScorerConfig",
    "TierConfig",
    "TimeoutsConfig",
    "TracingConfig",
    "placeholders",
]


class AccessLogConfig(_Strict):
    """One JSON line per finished request."""

    path: str | None = None
    """File to append to; ``None``: standard error."""
    include_prompt: bool = False
    """Also write each request's prompt text (off by default: prompts may hold personal data)."""


class TracingConfig(_Strict):
    """OpenTelemetry tracing of each request."""

    exporter: Literal["auto", "otlp", "console", "none"] = "auto"
    """``otlp``: export spans over OTLP/HTTP to ``endpoint`` (needs ``shuniu[otel]``);
    ``console``: print them (debugging); ``auto``: trace only when the process already has
    an OpenTelemetry SDK tracer provider (e.g. under ``opentelemetry-instrument``);
    ``none``: off."""
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    """The OTLP/HTTP traces endpoint of a collector."""
    service_name: str = "shuniu"
    """``service.name`` of the spans."""
    sample_ratio: float = Field(1.0, ge=0, le=1)
    """Share of new traces recorded; a client's sampled ``traceparent`` is always followed."""
    timeout_s: float = Field(10.0, gt=0)
    """Export timeout (exports run in a background thread)."""


class GatewayConfig(_Strict):
    """Where and how the gateway listens."""

    host: str = "127.0.0.1"
    """Address to listen on. Use 0.0.0.0 (or ::) to accept connections from other hosts."""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port; 0 picks a free one."""
    workers: int = Field(1, ge=1, le=64)
    """Gateway processes on this host sharing the port (``SO_REUSEPORT``), supervised: a
    dead worker is restarted, ``SIGTERM`` drains them all (``docs/scaling.md``). Each has its
    own scheduler queue and balancer state; ``/metrics`` and ``/status.json`` cover them
    all. Needs rate limits in Redis when any are set, and no launched engines."""
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    """Largest request body accepted; bigger ones get 413."""
    graceful_shutdown_s: float = Field(30.0, ge=0)
    """On SIGTERM: stop accepting, let in-flight requests finish for up to this long."""
    server: str = Field("uvicorn", pattern="^(uvicorn)$")
    """HTTP server. Only ``uvicorn`` for now: uvicorn's server loop on uvloop, running shuniu's
    HTTP/1.1 protocol (httptools)."""
    identity_headers: bool = False
    """Take the tenant and tier from the ``x-shuniu-tenant`` and ``x-shuniu-tier`` request
    headers. Only for a gateway behind a proxy that authenticates clients and sets them;
    anyone who can reach the gateway could otherwise claim any tier. Ignored when
    ``auth.authenticators`` are configured (the credential decides)."""
    max_header_bytes: int = Field(32 * 1024, ge=1024)
    """Largest total size of the request headers (names and values); bigger gets 431,
    enforced on the bytes as they arrive (before parsing) and again on inference requests."""
    header_timeout_s: float = Field(10.0, gt=0)
    """Longest a client may take to send a request line and headers (from connecting, or
    from the first byte of the next request on a kept-alive connection); slower gets 408
    and is closed (slowloris)."""
    body_timeout_s: float = Field(30.0, gt=0)
    """Longest a request body may stop arriving while the gateway waits to read it; the
    connection is then closed."""
    keep_alive_s: float = Field(30.0, gt=0)
    """How long an idle kept-alive connection stays open between requests."""
    max_connections: int = Field(4096, ge=16)
    """Open connections at most. At the cap a new connection closes the one that has waited
    longest in its headers, or else the longest idle one; when every connection is busy it
    is answered 503. Keep it below the process's file limit (``ulimit -n``)."""
    max_messages: int = Field(2048, ge=1)
    """Most messages a chat request may carry; more gets 400."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Longest prompt (estimated tokens) accepted on any model, before the context-window
    check; longer gets 400. ``None``: only the model's context window and the tier's limit."""
    gc_young_threshold: int | None = Field(20_000, ge=100)
    """The cyclic garbage collector's young-generation threshold while the gateway serves
    (Python's default is 700). Requests in flight keep thousands of young objects alive; at
    700 a young collection runs every few requests and rescans them all, ~4% of the CPU per
    request at 64 concurrent requests (``benchmarks/gc_pauses.py``). Garbage in reference
    cycles is still freed, once this many objects have accumulated. ``None``: leave the
    interpreter's setting. ``shuniu_gc_pause_seconds_total`` shows what collections cost."""
    metrics: bool = True
    """Serve Prometheus metrics at ``/metrics`` (see docs/observability.md)."""
    metrics_hardware: bool = True
    """Include the hardware probes' readings (GPU/NPU memory, utilization, temperature,
    power) in ``/metrics``; the probes run at most every 2 s, in worker threads."""
    access_log: AccessLogConfig | None = None
    """Write one JSON line per finished request. ``None``: no access log."""
    admin_keys: list[str] = Field(default_factory=list)
    """SHA-256 hashes (``sha256:<hex>``, as ``shuniu keys new`` prints) of the keys that may use
    the admin API (``/admin/...``: traffic weights, drain, add and remove endpoints). Empty:
    the admin API answers 403."""
    admin_keys_env: str | None = None
    """An environment variable holding more admin key hashes (comma or space separated)."""
    readiness_details: Literal["admin", "public"] = "admin"
    """What ``/ready`` and ``/status.json`` show without an admin key: ``admin`` (the
    default) says ready or not with counts per model, and keeps endpoint names, addresses,
    health details, launched engines' PIDs, ports and logs for an admin key; ``public``
    shows everything to anyone who can reach them (a gateway only trusted hosts reach)."""
    metrics_keys: list[str] = Field(default_factory=list)
    """SHA-256 hashes (``sha256:<hex>``) of bearer tokens that may read ``/metrics`` (admin
    keys may too). Empty: ``/metrics`` is open, as Prometheus scrapes usually are inside a
    cluster."""
    metrics_keys_env: str | None = None
    """An environment variable holding more metrics token hashes (comma or space separated)."""
    tracing: TracingConfig | None = None
    """OpenTelemetry tracing. ``None``: as ``exporter: auto`` (on only when the process
    already has an SDK tracer provider); a client's ``traceparent`` is passed to engines
    either way."""


class FilterConfig(_Strict):
    """One filter of a composed balancer."""

    name: str
    """A registered filter name (``shuniu plugins`` lists them)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of that filter, validated by it."""


class ScorerConfig(_Strict):
    """One weighted scorer of a composed balancer."""

    name: str
    """A registered scorer name (``shuniu plugins`` lists them)."""
    weight: float = Field(1.0, gt=0)
    """Relative weight of this scorer's score (0..1 per endpoint) in the sum."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of that scorer, validated by it."""


class BalancerConfig(_Strict):
    """Which balancer picks an endpoint for each request: a named ``policy``, or a
    composition of ``filters`` and weighted ``scorers`` (the endpoint with the highest
    weighted sum wins)."""

    policy: str | None = None
    """A registered balancer name (``shuniu plugins`` lists them). Default ``round_robin``
    when no ``scorers`` are given; not allowed together with them."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of that balancer, validated by it."""
    filters: list[FilterConfig] = Field(default_factory=list)
    """Filters applied in order to the endpoints that have a free slot; each narrows the
    candidates (e.g. ``locality``). A filter that would leave none leaves them all."""
    scorers: list[ScorerConfig] = Field(default_factory=list)
    """Weighted scorers, e.g. ``[{name: prefix, weight: 0.6}, {name: load, weight: 0.4}]``."""

    @model_validator(mode="after")
    def _policy_or_parts(self) -> BalancerConfig:
        if self.policy is not None and (self.scorers or self.filters):
            raise ValueError("give either `policy` or `filters`/`scorers`, not both")
        if self.filters and not self.scorers:
            raise ValueError("`filters` need at least one scorer in `scorers` to choose among what is left")
        if self.options and self.policy is None:
            raise ValueError("`options` belong to a named `policy`; scorers and filters take their own")
        return self

    @property
    def effective_policy(self) -> str | None:
        """The named policy in force, or ``None`` for a composition."""
        if self.scorers:
            return None
        return self.policy or "round_robin"


class SchedulerConfig(_Strict):
    """Which scheduler owns the pool's queue."""

    policy: str = "priority"
    """A registered scheduler name (``shuniu plugins`` lists them)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of that scheduler, validated by it."""


class HealthConfig(_Strict):
    """Background health checking of a model's endpoints."""

    interval_s: float = Field(5.0, gt=0)
    """Seconds between probes of each endpoint."""
    timeout_s: float = Field(2.0, gt=0)
    """A probe slower than this counts as a failure."""
    unhealthy_after: int = Field(2, ge=1)
    """Consecutive failed probes before an endpoint leaves balancing."""
    healthy_after: int = Field(1, ge=1)
    """Consecutive passed probes before it returns."""
    generation_every: int | None = Field(None, ge=1)
    """Also ask the engine for one token (a tiny completion, prompt ``ping``) every this
    many probes, and count a failure or a timeout as a failed probe: catches an engine
    whose health route answers while generation is stuck. ``None``: only the cheap probe."""
    generation_timeout_s: float = Field(10.0, gt=0)
    """Longest the generation probe may take."""


class LoadConfig(_Strict):
    """How the gateway watches each endpoint's own load, and limits what it dispatches."""

    interval_s: float = Field(0.5, gt=0)
    """Seconds between load snapshots of each endpoint (``/metrics`` for vLLM)."""
    timeout_s: float | None = Field(None, gt=0)
    """Seconds one snapshot may take before it counts as failed (the last one then ages);
    default: ``interval_s``, at least 1. A busy engine answers its metrics page slowest
    exactly when its load matters: raise this on heavily loaded hosts."""
    stale_after_s: float = Field(2.0, gt=0)
    """A snapshot older than this counts less and less, and not at all at twice this age;
    balancers then rely on the gateway's own in-flight counts."""
    adaptive_concurrency: bool = True
    """Tighten an endpoint's concurrency limit while its engine reports a backlog (more than
    ``max_engine_waiting`` waiting, or KV usage above ``max_kv_usage``), and widen it again
    when the engine's queue is empty, so requests queue in the gateway where priorities apply."""
    max_engine_waiting: int = Field(2, ge=0)
    """Requests the engine may hold waiting before the limit tightens."""
    max_kv_usage: float = Field(0.95, gt=0, le=1)
    """KV-cache usage above which the limit tightens (preemption is close)."""
    min_concurrency: int = Field(1, ge=1)
    """The adaptive limit never goes below this."""
    max_adaptive_concurrency: int = Field(1024, ge=1)
    """Ceiling of the adaptive limit for endpoints without ``max_concurrency``."""


class RouteRule(_Strict):
    """Send matching requests for this model to another model's pool. All given conditions
    must hold; rules are tried in order and the first match wins."""

    to: str
    """The model (pool) that serves matching requests."""
    api: list[Literal["chat", "completions"]] | None = None
    """Request kinds that match (``chat``, ``completions``)."""
    tiers: list[str] | None = None
    """Tiers that match (the principal's tier)."""
    min_prompt_tokens: int | None = Field(None, ge=0)
    """Match prompts of at least this many tokens (as the model counts them)."""
    max_prompt_tokens: int | None = Field(None, ge=0)
    """Match prompts of at most this many tokens (as the model counts them)."""
    modalities: list[Modality] | None = None
    """Match requests that carry any of these input modalities beyond text (image, audio,
    video or file parts), e.g. to send pictures to a vision model."""
    tools: bool | None = None
    """``true``: match requests that offer tools; ``false``: requests without."""
    reasoning_effort: list[str] | None = None
    """Match requests whose ``reasoning_effort`` is one of these (``low``, ``medium``,
    ``high``, ...)."""
    response_format: list[Literal["text", "json_object", "json_schema"]] | None = None
    """Match requests whose ``response_format.type`` is one of these (no ``response_format``
    is ``text``)."""
    labels: list[str] | None = None
    """Match requests the model's ``classifier`` labelled with one of these."""


class ClassifierConfig(_Strict):
    """A plugin that labels each request of the model before its routing rules run (e.g. a
    small model that tells simple requests from hard ones); rules match on ``labels``."""

    kind: str
    """A registered classifier (``shuniu plugins`` lists them; built in: ``heuristic``)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of that classifier, validated by it."""


class TimeoutsConfig(_Strict):
    """Time limits of one request on an engine. An engine's connect timeout is the
    backend's own option (``connect_timeout_s``)."""

    ttft_s: float | None = Field(120.0, gt=0)
    """From being given an endpoint to the first token (or, not streamed, the whole
    answer). Exceeded: the engine call is cancelled and the request retried elsewhere
    (see ``retries``) or answered 504 ``ttft_timeout``. ``None``: no limit. A limit of 5 s
    or more is checked four times a second (it fires up to 0.5 s late), a shorter one by a
    timer of its own."""
    idle_s: float | None = Field(60.0, gt=0)
    """Longest gap between two streamed chunks. Exceeded after the first byte: the stream
    ends with an SSE error event ``idle_timeout`` and ``[DONE]``, and the engine call is
    cancelled. ``None``: no limit."""
    total_s: float | None = Field(None, gt=0)
    """Longest a request may take from arrival to its last byte (504 ``request_timeout``
    before the first byte, an SSE error event after it). ``None``: no limit."""


class RetryConfig(_Strict):
    """Retrying requests that failed before their first byte reached the client."""

    max_retries: int = Field(2, ge=0)
    """Further attempts, each on an endpoint not tried yet, after a connection error, an
    engine 5xx or a time-to-first-token timeout. 0: no retries."""
    budget_ratio: float = Field(0.2, ge=0, le=1)
    """Retries in flight may be at most this share of the pool's requests in flight (as
    Envoy's retry budget), so retries cannot multiply an outage..."""
    min_retries: int = Field(3, ge=0)
    """...but this many concurrent retries are always allowed (a quiet pool can retry)."""
    fallback: str | None = None
    """A model whose pool serves the request when this pool's attempts are used up (or it
    has no other endpoint), e.g. a smaller model. The response keeps the requested name."""


class OutlierConfig(_Strict):
    """Passive outlier detection: endpoints that fail requests are ejected from balancing."""

    consecutive_failures: int | None = Field(5, ge=1)
    """Eject after this many failures in a row (connection errors, engine 5xx, timeouts;
    never client errors). ``None``: off."""
    failure_rate: float | None = Field(0.5, gt=0, le=1)
    """Eject when the share of failed requests in the current window reaches this...
    ``None``: off."""
    min_requests: int = Field(10, ge=1)
    """...once the window holds at least this many requests."""
    window_s: float = Field(10.0, gt=0)
    """Length of the failure-rate window."""
    base_ejection_s: float = Field(10.0, gt=0)
    """Ejection time; the n-th ejection of an endpoint lasts n times this..."""
    max_ejection_s: float = Field(300.0, gt=0)
    """...up to this. After it, the endpoint returns at its next passing health probe."""
    max_ejected_share: float = Field(0.5, ge=0, le=1)
    """Never eject more than this share of the pool's endpoints at once (rounded down: a
    one-endpoint pool is never ejected)."""


class PoolingConfig(_Strict):
    """How embeddings, rerank and score requests are spread over the pool's endpoints."""

    split_inputs: int = Field(32, ge=1)
    """A request with more inputs (embeddings) or documents (rerank, score) than this is
    split into engine calls of at most this many, which the balancer places on the pool's
    endpoints one by one (so a long list runs on several replicas at once); the answers are
    put back together in the client's order. TEI refuses more than 32 per call by default
    (``--max-client-batch-size``)."""


class ModelConfig(_Strict):
    """A logical model: the name clients send, and the pool of endpoints serving it."""

    aliases: list[str] = Field(default_factory=list)
    """Other names clients may use for this model."""
    max_model_len: int | None = Field(None, ge=1)
    """Context window in tokens; requests whose prompt plus ``max_tokens`` exceed it get 400.
    When unset, the backend's own value is used if it reports one."""
    modalities: list[Modality] = Field(default_factory=lambda: ["text"], min_length=1)
    """The input the model takes: ``text``, and ``image``, ``audio``, ``video`` or ``file``
    parts. A request carrying a modality no model it can reach takes is refused with 400
    before any engine sees it (default: text only, so a picture never reaches a text-only
    engine)."""
    serves: list[Served] = Field(default_factory=lambda: ["chat", "completions"], min_length=1)
    """The APIs the model answers: ``chat`` and ``completions`` for a generative model,
    ``embeddings`` for an embedding model, ``rerank`` for a reranker (a cross-encoder, or an
    embedding model whose engine scores pairs, as vLLM does): ``/v1/rerank`` and
    ``/v1/score``. A request to a model that does not serve its API gets 400, naming the
    models that do."""
    pooling: PoolingConfig = Field(default_factory=PoolingConfig)
    """How embeddings, rerank and score requests are split over the endpoints."""
    classifier: ClassifierConfig | None = None
    """Labels each request (``labels`` in ``routes``) before the routing rules run."""
    tokenizer: str | None = None
    """How prompts are counted in tokens for every limit (context window,
    ``max_prompt_tokens``, TPM, length routing): a local ``tokenizer.json`` or the model
    directory holding it (needs ``shuniu[tokenizers]``; the chat template is applied as
    engines apply it), or ``engine`` to ask the engine's ``/tokenize`` (vLLM, TGI, SGLang
    through ``openai`` with ``tokenize_path``). Unset: shuniu's estimate (``docs/tokens.md``)."""
    endpoints: list[EndpointConfig] = Field(min_length=1)
    """The engines serving this model."""
    balancer: BalancerConfig = Field(default_factory=BalancerConfig)
    """How each request picks one of the endpoints."""
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    """How requests wait for, and are given, endpoint slots."""
    health: HealthConfig = Field(default_factory=HealthConfig)
    """Background health checks of the endpoints."""
    load: LoadConfig = Field(default_factory=LoadConfig)
    """Load snapshots of the endpoints and the adaptive concurrency limit."""
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    """Time to first token, idle gap and total time limits."""
    retries: RetryConfig = Field(default_factory=RetryConfig)
    """Retries on other endpoints (before the first byte), with a retry budget."""
    outlier: OutlierConfig = Field(default_factory=OutlierConfig)
    """Ejection of endpoints that fail requests."""
    routes: list[RouteRule] = Field(default_factory=list)
    """Rules that send some requests for this model to another model's pool (by kind,
    prompt length or tier), tried before balancing."""
    traffic: dict[str, float] = Field(default_factory=dict)
    """Version label → weight: each request runs on one version, drawn by weight (a canary
    split, e.g. ``{v1: 95, v2: 5}``). Empty: any version."""
    version_header: str = "x-shuniu-version"
    """A request with this header runs on the version it names (pinning)."""
    owned_by: str = "shuniu"
    """Shown in ``/v1/models``."""
    autoscaling: AutoscalingConfig | None = None
    """Scaling signals for this pool (``shuniu_pool_desired_replicas`` and its inputs), for
    an HPA or KEDA to scale the engines on. Unset: none."""

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, value: str | None) -> str | None:
        if value is None or value == "engine":
            return value
        path = Path(value).expanduser()
        if path.is_dir():
            if not (path / "tokenizer.json").is_file():
                raise ValueError(f"the directory {value} holds no tokenizer.json")
        elif not path.is_file():
            raise ValueError(
                f"must be 'engine', a tokenizer.json or a model directory; {value} does not exist"
            )
        return value

    @model_validator(mode="after")
    def _labels_need_a_classifier(self) -> ModelConfig:
        if self.classifier is None and any(r.labels for r in self.routes):
            raise ValueError("routes match on labels, but the model has no classifier to give them")
        return self

    @model_validator(mode="after")
    def _traffic_versions(self) -> ModelConfig:
        versions = {ep.version for ep in self.endpoints}
        for version, weight in self.traffic.items():
            if version not in versions:
                raise ValueError(
                    f"traffic names version {version!r}, which no endpoint has "
                    f"(versions: {', '.join(sorted(versions))})"
                )
            if weight < 0:
                raise ValueError(f"traffic weight of {version!r} must not be negative")
        if self.traffic and not any(w > 0 for w in self.traffic.values()):
            raise ValueError("traffic needs at least one version with a weight above 0")
        return self


class LimitsConfig(_Strict):
    """Rate limits of one scope. Unset: no limit of that kind."""

    rpm: int | None = Field(None, ge=1)
    """Requests per minute (a burst of up to this many, refilled continuously)."""
    rpd: int | None = Field(None, ge=1)
    """Requests per day."""
    tpm: int | None = Field(None, ge=1)
    """Tokens per minute: prompt plus ``max_tokens`` reserved at admission, settled with
    the real usage when the request ends."""
    tpd: int | None = Field(None, ge=1)
    """Tokens per day, counted as ``tpm``."""
    concurrency: int | None = Field(None, ge=1)
    """Requests in flight at once."""


class DegradeConfig(_Strict):
    """What a tier gives up while its model's pool is overloaded. The pool is overloaded
    when its queue wait (an average over recent requests) passes ``queue_wait_s`` or its
    share of requests refused by the scheduler passes ``refused_share``; it recovers when
    both fall below half their thresholds."""

    queue_wait_s: float = Field(2.0, gt=0)
    """Average queue wait (recent requests) that marks the pool overloaded."""
    refused_share: float = Field(0.05, gt=0, le=1)
    """Share of recent requests the scheduler refused (full queue, wait limits, shed) that
    marks the pool overloaded."""
    max_tokens: int | None = Field(None, ge=1)
    """While overloaded: ``max_tokens`` capped at this (the request's own, smaller, wins)."""
    route_to: str | None = None
    """While overloaded: serve the tier's requests from this model's pool instead (e.g. a
    smaller model)."""
    shed: bool = False
    """While overloaded: refuse the tier's requests at once (503 ``overloaded``, with
    ``Retry-After``), leaving the capacity to better tiers."""
    half_life_s: float = Field(5.0, gt=0)
    """How fast the overload signals fade without new requests (the smallest value of all
    tiers applies to every pool): the pool recovers by itself once the load is gone."""


class TierConfig(_Strict):
    """A class of service: what its clients may use and how much."""

    priority: int | None = None
    """Scheduling priority of the tier's requests (smaller runs first). Used by the
    ``priority`` scheduler unless its own ``tiers`` options name this tier."""
    models: list[str] | None = None
    """Models (names or aliases) the tier may use; ``None``: all. Others get 404, as if
    they did not exist."""
    max_tokens_default: int | None = Field(None, ge=1)
    """``max_tokens`` applied when a request sets none."""
    max_tokens_limit: int | None = Field(None, ge=1)
    """Largest ``max_tokens`` a request may ask for; more gets 400."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Longest prompt (estimated tokens) the tier may send; longer gets 400."""
    key_limits: LimitsConfig | None = None
    """Limits of each credential (API key, token subject) of this tier; a key's own
    ``limits`` override them field by field."""
    tenant_limits: LimitsConfig | None = None
    """Limits of each tenant of this tier, all its credentials together."""
    degrade: DegradeConfig | None = None
    """How the tier degrades while its model is overloaded (``None``: it does not)."""
    cache: bool = False
    """Cache this tier's answers even when the request is not deterministic (no
    ``temperature: 0``, no ``seed``). Needs ``cache:`` configured."""

    @model_validator(mode="after")
    def _max_tokens(self) -> TierConfig:
        if (
            self.max_tokens_default is not None
            and self.max_tokens_limit is not None
            and self.max_tokens_default > self.max_tokens_limit
        ):
            raise ValueError("max_tokens_default must not exceed max_tokens_limit")
        return self


class AuthenticatorConfig(_Strict):
    """One authenticator in the chain."""

    kind: str
    """A registered authenticator (``api_keys``, ``jwt``, or a plugin's)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of that authenticator, validated by it."""


class AuthConfig(_Strict):
    """Who may call the gateway."""

    authenticators: list[AuthenticatorConfig] = Field(default_factory=list)
    """Asked in order; the first that recognises the credential decides. Empty: the
    gateway is open and every request is anonymous (``shuniu serve`` warns when such a
    gateway listens beyond loopback)."""


class RateLimitsConfig(_Strict):
    """Where rate-limit state lives."""

    store: str = "memory"
    """A registered rate-limit store: ``memory`` (this process only) or ``redis``
    (shared by every gateway using the same Redis)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of that store, validated by it."""
    default_output_tokens: int = Field(256, ge=1)
    """Completion tokens reserved against token limits for a request that sets no
    ``max_tokens`` (and whose tier sets no default)."""
    headers: bool = True
    """Send OpenAI's ``x-ratelimit-*`` headers on every response of a limited request."""


class CacheConfig(_Strict):
    """The exact-match response cache."""

    store: str = "memory"
    """A registered cache store: ``memory`` (a bounded LRU in this process) or ``redis``
    (shared by every gateway using the same Redis)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of that store, validated by it."""
    ttl_s: float = Field(3600.0, gt=0)
    """How long an answer stays cached."""
    kb_version_header: str = "x-shuniu-kb-version"
    """A request header whose value joins the cache key (e.g. the version of the knowledge
    base a RAG prompt was built from), so a new version never gets an old answer."""
    max_entry_bytes: int = Field(1024 * 1024, ge=1024)
    """Answers larger than this (encoded) are not cached."""
    lock_ttl_s: float = Field(60.0, gt=0)
    """Shared stores: how long the gateway filling an entry holds the fill lock, and how
    long other gateways wait for that entry before asking the engine themselves."""

    @field_validator("kb_version_header")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()


class FleetConfig(_Strict):
    """Routing state shared by the gateways of a fleet (several hosts, or the workers of
    one) through Redis: which endpoint was sent which prompt blocks (prefix affinity holds
    across gateways) and every gateway's requests in flight per endpoint (load balancing
    sees the others' traffic at once, not a poll later). Nothing is asked of Redis per
    request: each gateway publishes what it did and reads what the others did in one round
    trip every ``sync_interval_s`` (``docs/scaling.md``)."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    """The Redis to share through: one server (``redis://``, ``rediss://``, ``unix://``),
    a primary that Sentinels watch (``redis+sentinel://host:port,host:port/SERVICE/db``)
    or a Redis Cluster (``redis+cluster://host:port,host:port``); the password never
    appears in logs."""
    key_prefix: str = "shuniu:fleet:"
    """Put before the fleet's keys; gateways with one prefix (and one Redis) are one fleet."""
    sync_interval_s: float = Field(0.1, gt=0, le=10)
    """How often each gateway publishes and reads: with the Redis round trip, how stale
    another gateway's decisions can be."""
    stale_after_s: float = Field(2.0, gt=0)
    """A gateway not heard from for this long stops counting (its requests in flight drop
    out of the others' load view): a gateway that died is forgotten within this."""
    max_entries: int = Field(20_000, ge=100)
    """Published batches Redis keeps (older ones are trimmed); a gateway that starts reads
    them, so it starts with the fleet's prefix knowledge."""
    timeout_s: float = Field(0.5, gt=0)
    """Longest a sync may wait for Redis; a slower one counts as Redis being unavailable
    (routing goes on from the local view)."""

    @field_validator("redis_url")
    @classmethod
    def _known_shape(cls, url: str) -> str:
        return check_redis_url(url)


class Deployment(_Strict):
    """A whole shuniu deployment."""

    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    """Listening address and request limits."""
    auth: AuthConfig = Field(default_factory=AuthConfig)
    """Authentication. Without it the gateway is open."""
    tiers: dict[str, TierConfig] = Field(default_factory=dict)
    """Tier name → class of service. A tier ``default`` (no limits) exists even when not
    listed; anonymous requests and credentials without a tier get it."""
    rate_limits: RateLimitsConfig | None = None
    """The rate-limit store. Without it, limits (if any tier or key sets some) are kept in
    this process's memory."""
    cache: CacheConfig | None = None
    """The response cache. Without it nothing is cached."""
    fleet: FleetConfig | None = None
    """Routing state shared with the fleet's other gateways through Redis. Without it each
    gateway (and each worker) routes on what it alone has seen."""
    files: FilesConfig = Field(default_factory=FilesConfig)
    """The Files API's store and limits (``docs/batch.md``)."""
    batches: BatchesConfig = Field(default_factory=BatchesConfig)
    """The Batch API's queue and its use of idle capacity (``docs/batch.md``)."""
    governance: GovernanceConfig | None = None
    """The usage ledger, prices, budgets and keys managed at run time
    (``docs/governance.md``). Without it nothing is recorded and no budget applies."""
    models: dict[str, ModelConfig] = Field(min_length=1)
    """Model name → model. The name is what clients put in ``model``."""

    @field_validator("models")
    @classmethod
    def _names(cls, models: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
        for name in models:
            if not name or name.strip() != name:
                raise ValueError(f"model name {name!r} must be non-empty without spaces at the ends")
        return models

    @model_validator(mode="after")
    def _unique_names(self) -> Deployment:
        seen: dict[str, str] = {}
        for name, model in self.models.items():
            for alias in [name, *model.aliases]:
                if alias in seen and seen[alias] != name:
                    raise ValueError(
                        f"model name or alias {alias!r} is used by both {seen[alias]!r} and {name!r}"
                    )
                seen[alias] = name
        for name, model in self.models.items():
            for i, rule in enumerate(model.routes):
                if rule.to not in self.models:
                    raise ValueError(
                        f"models.{name}.routes[{i}].to: no model named {rule.to!r} "
                        f"(models: {', '.join(self.models)})"
                    )
                if rule.to == name:
                    raise ValueError(f"models.{name}.routes[{i}].to: a model cannot route to itself")
                unserved = set(model.serves) - set(self.models[rule.to].serves)
                if unserved:
                    raise ValueError(
                        f"models.{name}.routes[{i}]: sends {name!r}'s {' and '.join(sorted(unserved))} "
                        f"requests to {rule.to!r}, which serves {', '.join(self.models[rule.to].serves)} "
                        f"(models.{rule.to}.serves)"
                    )
                missing = set(rule.modalities or ()) - set(self.models[rule.to].modalities)
                if missing:
                    raise ValueError(
                        f"models.{name}.routes[{i}]: sends {' and '.join(sorted(missing))} requests to "
                        f"{rule.to!r}, which takes {', '.join(self.models[rule.to].modalities)} "
                        f"(add them to models.{rule.to}.modalities)"
                    )
        if self.batches.enabled and not self.files.enabled:
            raise ValueError("batches.enabled needs files.enabled (a batch's input and output are files)")
        if self.governance is not None:
            for name in self.governance.prices:
                if name not in self.models:
                    raise ValueError(
                        f"governance.prices.{name}: no model named {name!r} "
                        f"(models: {', '.join(self.models)})"
                    )
        for name, model in self.models.items():
            fallback = model.retries.fallback
            if fallback is not None and fallback not in self.models:
                raise ValueError(
                    f"models.{name}.retries.fallback: no model named {fallback!r} "
                    f"(models: {', '.join(self.models)})"
                )
            if fallback == name:
                raise ValueError(f"models.{name}.retries.fallback: a model cannot fall back to itself")
            if fallback is not None:
                unserved = set(model.serves) - set(self.models[fallback].serves)
                if unserved:
                    raise ValueError(
                        f"models.{name}.retries.fallback: {fallback!r} does not serve "
                        f"{' or '.join(sorted(unserved))}, which {name!r} serves "
                        f"(it serves {', '.join(self.models[fallback].serves)})"
                    )
        for tier_name, tier in self.tiers.items():
            if (
                tier.degrade is not None
                and tier.degrade.route_to is not None
                and tier.degrade.route_to not in self.models
            ):
                raise ValueError(
                    f"tiers.{tier_name}.degrade.route_to: no model named {tier.degrade.route_to!r} "
                    f"(models: {', '.join(self.models)})"
                )
            if tier.degrade is not None and tier.degrade.route_to is not None:
                target = self.models[tier.degrade.route_to]
                if not {"chat", "completions"} & set(target.serves):
                    raise ValueError(
                        f"tiers.{tier_name}.degrade.route_to: {tier.degrade.route_to!r} serves "
                        f"{', '.join(target.serves)}, not chat or completions"
                    )
            for model in tier.models or ():
                if model not in seen:
                    raise ValueError(
                        f"tiers.{tier_name}.models: no model or alias named {model!r} "
                        f"(models: {', '.join(sorted(seen))})"
                    )
        return self
