"""Building what a deployment describes from what the plugins registered: pools of
endpoints (backends, balancers, schedulers, launched engines), resilience state, tenancy
(authenticators, rate-limit store) and the response cache.

Used at start-up, by a reload (which keeps unchanged endpoints) and by the admin API
(which adds one endpoint). Every object a plugin factory returns is checked against its
contract here, so a plugin missing a method fails at start-up, naming the plugin and the
method, instead of on the first request that needs it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from shuniu.core.config import EndpointConfig, ModelConfig
from shuniu.core.config.loader import ResolvedDeployment, expand_endpoints
from shuniu.core.contracts import (
    GENERATION,
    Authenticator,
    Backend,
    Balancer,
    CacheStore,
    CapacityModel,
    CapacityTarget,
    Classifier,
    Discovery,
    EndpointSpec,
    EngineEntry,
    FileStore,
    Filter,
    RateLimitStore,
    Registration,
    Scheduler,
    Scorer,
    conform,
)
from shuniu.core.errors import ConfigError, Problem
from shuniu.core.pipeline.response_cache import ResponseCache
from shuniu.core.plugin_manager import PluginManager
from shuniu.core.pools.composite import Composite
from shuniu.core.pools.demand import Demand
from shuniu.core.pools.launcher import (
    ManagedEngine,
    base_url_template,
    engine_url,
    pick_port,
    plan_engine,
    with_base_url,
)
from shuniu.core.pools.pool import EndpointState, Pool
from shuniu.core.pools.resilience import Resilience
from shuniu.core.tenancy.tenancy import Tenancy, limits_in_use
from shuniu.core.tokenization.counter import PromptCounter, TokenizerError
from shuniu.core.tokenization.engine import EngineCounter
from shuniu.core.tokenization.local import IdsCounter, LocalTokenizer

__all__ = ["BuiltPools", "PoolBuilder", "ReuseKey"]

ReuseKey = tuple[str, str, str]
"""(model, endpoint name, the endpoint's config entry as JSON): what a reload compares to
decide that an endpoint is unchanged and may be kept as it is."""


class BuiltPools(NamedTuple):
    pools: dict[str, Pool]
    """Model name → pool."""
    routes: dict[str, Pool]
    """Model names and aliases → pool."""
    resilience: dict[str, Resilience]
    engines: dict[str, ManagedEngine]
    """Endpoint name → the engine the gateway launches for it."""


def _checked(obj: Any, contract: type, reg: Registration, what: str) -> Any:
    missing = conform(obj, contract)
    if missing:
        raise ConfigError(
            [
                Problem(
                    f"plugin {reg.plugin}",
                    f"{what} {reg.name!r} is missing {', '.join(missing)} of the {contract.__name__} "
                    f"contract (implement them, or subclass shuniu.core.contracts.{contract.__name__} "
                    "to inherit the defaults of its optional members)",
                )
            ],
            source="plugins",
        )
    return obj


class PoolBuilder:
    """Builds pools, tenancy and the cache of one deployment."""

    def __init__(self, plugins: PluginManager) -> None:
        self.plugins = plugins
        self._tokenizers: dict[tuple[str, int], LocalTokenizer] = {}
        """Loaded tokenizers by (resolved path, modification time): a reload keeps them."""

    # -- pools ---------------------------------------------------------------------------

    def build(
        self,
        resolved: ResolvedDeployment,
        reuse: Mapping[ReuseKey, EndpointState] | None = None,
        engines: Mapping[str, ManagedEngine] | None = None,
    ) -> BuiltPools:
        """Every pool of ``resolved``. ``reuse`` (a reload): existing endpoints to keep,
        with their backend, health and engine, instead of building new ones; ``engines``
        the engines launched for them."""
        config = resolved.deployment
        backends = self.plugins.registered("backends")
        schedulers = self.plugins.registered("schedulers")
        built = BuiltPools({}, {}, {}, dict(engines or {}))
        # Ports for launched engines with `port: 0`, picked now (the backends are built with
        # their address) and kept across restarts.
        picked: set[int] = set()
        for model_name, model in config.models.items():
            endpoints: list[EndpointState] = []
            plans = []
            for index, replica, ep_name in expand_endpoints(model_name, model.endpoints):
                ep_cfg = model.endpoints[index]
                if reuse is not None:
                    kept = reuse.get((model_name, ep_name, ep_cfg.model_dump_json()))
                    if kept is not None:
                        endpoints.append(kept)
                        continue
                options = resolved.endpoint_options.get((model_name, index))
                extra: dict[str, Any] = {}
                plan = None
                if ep_cfg.launch is not None:
                    launch = ep_cfg.launch
                    port = launch.port + replica if launch.port else pick_port(launch.host, picked)
                    kv = ep_cfg.kv_events.for_replica(replica) if ep_cfg.kv_events is not None else None
                    plan = plan_engine(
                        launch, model=model_name, name=ep_name, replica=replica, port=port, kv_events=kv
                    )
                    template = base_url_template(type(options)) if options is not None else None
                    if template is not None and "base_url" not in ep_cfg.options:
                        options = with_base_url(options, engine_url(template, launch.host, port))
                    # The environment too: a backend may read its devices from it
                    # (e.g. ASCEND_RT_VISIBLE_DEVICES).
                    extra["launch"] = {"host": launch.host, "port": port, "env": dict(plan.env)}
                spec = EndpointSpec(
                    name=ep_name,
                    model=model_name,
                    options=options,
                    replica=replica,
                    max_model_len=model.max_model_len,
                    extra=extra,
                )
                endpoint = self._endpoint(backends[ep_cfg.kind], spec, ep_cfg)
                unserved = set(model.serves) - getattr(endpoint.backend, "serves", GENERATION)
                if unserved:
                    raise ConfigError(
                        [
                            Problem(
                                f"models.{model_name}.endpoints[{index}].kind",
                                f"endpoints of kind {ep_cfg.kind!r} do not serve "
                                f"{' or '.join(sorted(unserved))}, which the model serves "
                                f"(models.{model_name}.serves)",
                            )
                        ],
                        source="deployment",
                    )
                if plan is not None:
                    # Out of balancing until the engine's first passing health probe.
                    endpoint.healthy = False
                    endpoint.last_health_detail = "engine not started"
                    plans.append((endpoint, plan))
                endpoints.append(endpoint)
            balancer = self.balancer(resolved, model_name, model)
            reg = schedulers[model.scheduler.policy]
            scheduler = _checked(
                reg.factory(resolved.scheduler_options.get(model_name)), Scheduler, reg, "scheduler"
            )
            pool = Pool(model_name, endpoints, balancer, scheduler, max_model_len=model.max_model_len)
            pool.counter = self.counter(model_name, model, pool)
            takes_ids = any(getattr(e.backend, "takes_prompt_ids", False) for e in endpoints)
            if isinstance(pool.counter, LocalTokenizer) and (hasattr(balancer, "kv_index") or takes_ids):
                # Its balancer matches token ids, or an engine computes on them (the
                # simulator): one encode keeps them on the request (prompt_ids).
                pool.counter = IdsCounter(pool.counter)
            pool.accepts = frozenset(model.modalities) - {"text"}
            pool.serves = frozenset(model.serves) | ({"score"} if "rerank" in model.serves else set())
            pool.split_inputs = model.pooling.split_inputs
            pool.classifier = self.classifier(resolved, model_name, model)
            if model.autoscaling is not None:
                pool.demand = Demand(model.autoscaling.window_s)
            built.pools[model_name] = pool
            built.resilience[model_name] = Resilience(pool, model.retries, model.outlier, model.timeouts)
            for alias in [model_name, *model.aliases]:
                built.routes[alias] = pool
            for endpoint, plan in plans:
                built.engines[endpoint.name] = ManagedEngine(
                    plan, on_down=functools.partial(pool.engine_down, endpoint)
                )
            if reuse is not None:
                for endpoint in endpoints:
                    engine = built.engines.get(endpoint.name)
                    if engine is not None and engine.plan is not None:
                        # A kept engine reports going down to its new pool.
                        engine.on_down = functools.partial(pool.engine_down, endpoint)
        return built

    def counter(self, model_name: str, model: ModelConfig, pool: Pool) -> PromptCounter | None:
        """What counts ``pool``'s prompts (``tokenizer:``), or ``None`` for the estimate."""
        spec = model.tokenizer
        if spec is None:
            return None
        where = f"models.{model_name}.tokenizer"
        if spec == "engine":
            if not any(getattr(e.backend, "tokenizes", False) for e in pool.endpoints):
                kinds = ", ".join(sorted({ep.kind for ep in model.endpoints}))
                raise ConfigError(
                    [
                        Problem(
                            where,
                            "'engine' needs an endpoint whose engine counts tokens (vllm, tgi, or openai "
                            f"with options.tokenize_path, e.g. SGLang); this model's are: {kinds}",
                        )
                    ]
                )
            return EngineCounter(lambda: pool.endpoints)
        path = Path(spec).expanduser().resolve()
        try:
            key = (str(path), (path / "tokenizer.json" if path.is_dir() else path).stat().st_mtime_ns)
            tokenizer = self._tokenizers.get(key)
            if tokenizer is None:
                tokenizer = self._tokenizers[key] = LocalTokenizer.load(path)
        except (OSError, TokenizerError) as exc:
            raise ConfigError([Problem(where, str(exc))]) from None
        return tokenizer

    def classifier(
        self, resolved: ResolvedDeployment, model_name: str, model: ModelConfig
    ) -> Classifier | None:
        """The model's classifier (``classifier:``), or ``None``."""
        if model.classifier is None:
            return None
        reg = self.plugins.registered("classifiers")[model.classifier.kind]
        options = resolved.classifier_options.get(model_name)
        return _checked(reg.factory(options), Classifier, reg, "classifier")  # type: ignore[no-any-return]

    def capacity_model(self, resolved: ResolvedDeployment, model_name: str) -> CapacityModel:
        """The capacity model of a model with ``autoscaling:``, built for its pool's SLO."""
        model = resolved.deployment.models[model_name]
        cfg = model.autoscaling
        assert cfg is not None
        reg = self.plugins.registered("capacity_models")[cfg.capacity.kind]
        target = CapacityTarget(
            model=model_name,
            ttft_p99_s=cfg.ttft_p99_s,
            itl_p99_s=cfg.itl_p99_s,
            e2e_p99_s=cfg.e2e_p99_s,
            engines=tuple(EngineEntry(ep.kind, ep.options) for ep in model.endpoints),
            max_model_len=model.max_model_len,
        )
        options = resolved.capacity_options.get(model_name)
        return _checked(reg.factory(options, target), CapacityModel, reg, "capacity model")  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the tokenizers' worker threads (at shutdown)."""
        for tokenizer in self._tokenizers.values():
            tokenizer.close()

    def endpoint(self, model: str, cfg: EndpointConfig, options: Any, pool: Pool) -> EndpointState:
        """One endpoint for the admin API (``cfg`` without ``launch``, ``replicas: 1``,
        ``options`` validated), out of balancing until its first passing health probe."""
        spec = EndpointSpec(name=cfg.name, model=model, options=options, max_model_len=pool.max_model_len)
        endpoint = self._endpoint(self.plugins.registered("backends")[cfg.kind], spec, cfg)
        endpoint.healthy = False
        endpoint.last_health_detail = "added; waiting for its first health probe"
        return endpoint

    @staticmethod
    def _endpoint(reg: Registration, spec: EndpointSpec, cfg: EndpointConfig) -> EndpointState:
        backend = _checked(reg.factory(spec), Backend, reg, "backend")
        endpoint = EndpointState(
            spec.name,
            backend,
            weight=cfg.weight,
            version=cfg.version,
            max_concurrency=cfg.max_concurrency,
            labels=dict(cfg.labels),
        )
        if cfg.kv_events is not None:
            endpoint.kv_events = cfg.kv_events.for_replica(spec.replica)
        return endpoint

    def discovery(self, kind: str, options: Any) -> Discovery:
        """The discovery source ``kind`` (registered with ``register_discovery``) for one
        ``discovery:`` entry, checked against its contract."""
        reg = self.plugins.registered("discovery")[kind]
        return _checked(reg.factory(options), Discovery, reg, "discovery source")  # type: ignore[no-any-return]

    def balancer(self, resolved: ResolvedDeployment, model_name: str, model: ModelConfig) -> Balancer:
        """The model's balancer: a registered policy, or one composed of filters and scorers."""
        cfg = model.balancer
        policy = cfg.effective_policy
        if policy is not None:
            reg = self.plugins.registered("balancers")[policy]
            made = reg.factory(resolved.balancer_options.get(model_name))
            return _checked(made, Balancer, reg, "balancer")
        filters = self.plugins.registered("filters")
        scorers = self.plugins.registered("scorers")
        built_filters: list[Filter] = []
        for i, f in enumerate(cfg.filters):
            reg = filters[f.name]
            made = reg.factory(resolved.filter_options.get((model_name, i)))
            built_filters.append(_checked(made, Filter, reg, "filter"))
        built_scorers: list[tuple[Scorer, float]] = []
        for i, sc in enumerate(cfg.scorers):
            reg = scorers[sc.name]
            made = reg.factory(resolved.scorer_options.get((model_name, i)))
            built_scorers.append((_checked(made, Scorer, reg, "scorer"), sc.weight))
        return Composite(built_filters, built_scorers)

    # -- tenancy and the cache -------------------------------------------------------------

    def tenancy(
        self,
        resolved: ResolvedDeployment,
        pools: Mapping[str, Pool],
        store: Any = None,
        managed: Authenticator | None = None,
    ) -> Tenancy:
        """Authenticators, tiers and the rate-limit store (``store``: keep this one, a
        reload that leaves ``rate_limits`` alone); ``managed``: the table of keys managed at
        run time (their limits need a store too). The pools' schedulers adopt the tiers'
        priorities."""
        config = resolved.deployment
        registered = self.plugins.registered("authenticators")
        authenticators = []
        for i, cfg in enumerate(config.auth.authenticators):
            reg = registered[cfg.kind]
            made = reg.factory(resolved.authenticator_options.get(i))
            authenticators.append(_checked(made, Authenticator, reg, "authenticator"))
        rl = config.rate_limits
        if store is None and (
            rl is not None or managed is not None or limits_in_use(config, resolved.authenticator_options)
        ):
            reg = self.plugins.registered("rate_limiters")[rl.store if rl is not None else "memory"]
            store = _checked(
                reg.factory(resolved.rate_limit_options), RateLimitStore, reg, "rate-limit store"
            )
        tenancy = Tenancy(config, authenticators, store, managed)
        priorities = tenancy.priorities
        if priorities:
            for pool in pools.values():
                pool.scheduler.adopt_tiers(priorities)
        return tenancy

    def file_store(self, resolved: ResolvedDeployment) -> FileStore | None:
        """The Files API's store (``files.store``), or ``None`` when the API is off."""
        cfg = resolved.deployment.files
        if not cfg.enabled:
            return None
        reg = self.plugins.registered("file_stores")[cfg.store]
        return _checked(reg.factory(resolved.file_store_options), FileStore, reg, "file store")  # type: ignore[no-any-return]

    def cache(self, resolved: ResolvedDeployment) -> ResponseCache | None:
        cfg = resolved.deployment.cache
        if cfg is None:
            return None
        reg = self.plugins.registered("caches")[cfg.store]
        return ResponseCache(
            cfg, _checked(reg.factory(resolved.cache_options), CacheStore, reg, "cache store")
        )
