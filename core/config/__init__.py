"""The deployment file: its schema (:mod:`.model`), loading and checking it against the
installed plugins (:mod:`.loader`), and its JSON Schema (:mod:`.json_schema`).

The schema's classes are re-exported here, so plugins write ``from shuniu.core.config
import Options``.
"""

from __future__ import annotations

from shuniu.core.config.model import (
    LAUNCH_PLACEHOLDERS,
    AccessLogConfig,
    AuthConfig,
    AuthenticatorConfig,
    BalancerConfig,
    CacheConfig,
    ClassifierConfig,
    DegradeConfig,
    Deployment,
    EndpointConfig,
    FilterConfig,
    GatewayConfig,
    HealthConfig,
    LaunchConfig,
    LimitsConfig,
    LoadConfig,
    ModelConfig,
    Options,
    OutlierConfig,
    PoolingConfig,
    RateLimitsConfig,
    RestartConfig,
    RetryConfig,
    RouteRule,
    SchedulerConfig,
    ScorerConfig,
    TierConfig,
    TimeoutsConfig,
    TracingConfig,
    placeholders,
)

__all__ = [
    "LAUNCH_PLACEHOLDERS",
    "AccessLogConfig",
    "AuthConfig",
    "AuthenticatorConfig",
    "BalancerConfig",
    "CacheConfig",
    "ClassifierConfig",
    "DegradeConfig",
    "Deployment",
    "EndpointConfig",
    "FilterConfig",
    "GatewayConfig",
    "HealthConfig",
    "LaunchConfig",
    "LimitsConfig",
    "LoadConfig",
    "ModelConfig",
    "Options",
    "OutlierConfig",
    "PoolingConfig",
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
