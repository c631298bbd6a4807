"""Reading a deployment file: YAML → ``${ENV}`` interpolation → schema → plugin options.

Every problem is collected (not just the first) with its field path and, where the YAML
parser knows it, its line, so ``shuniu validate`` can print them all at once.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from shuniu.core.config import Deployment, EndpointConfig
from shuniu.core.contracts import AuthenticatorOptions
from shuniu.core.errors import ConfigError, Problem
from shuniu.core.plugin_manager import Category, PluginManager, singular
from shuniu.core.pools.launcher import base_url_template, engine_url

__all__ = [
    "QUICKSTART_NAME",
    "ResolvedDeployment",
    "expand_endpoints",
    "field_path",
    "interpolate_env",
    "line_for",
    "load_deployment",
    "parse_yaml",
    "quickstart_text",
]

QUICKSTART_NAME = "<built-in quickstart>"
_ENV = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass
class ResolvedDeployment:
    """A validated deployment with every plugin's options validated too."""

    deployment: Deployment
    source: str
    endpoint_options: dict[tuple[str, int], Any] = field(default_factory=dict)
    """(model, endpoint index) → validated backend options."""
    balancer_options: dict[str, Any] = field(default_factory=dict)
    scheduler_options: dict[str, Any] = field(default_factory=dict)
    filter_options: dict[tuple[str, int], Any] = field(default_factory=dict)
    """(model, filter index) → validated filter options."""
    scorer_options: dict[tuple[str, int], Any] = field(default_factory=dict)
    """(model, scorer index) → validated scorer options."""
    authenticator_options: dict[int, Any] = field(default_factory=dict)
    """Authenticator index in ``auth.authenticators`` → validated options."""
    rate_limit_options: Any = None
    """Validated options of the rate-limit store (``rate_limits.options``)."""
    cache_options: Any = None
    """Validated options of the cache store (``cache.options``)."""
    file_store_options: Any = None
    """Validated options of the file store (``files.options``)."""
    classifier_options: dict[str, Any] = field(default_factory=dict)
    """Model → validated options of its ``classifier``."""
    discovery_options: dict[tuple[str, int], Any] = field(default_factory=dict)
    """(model, endpoint index) → validated options of the entry's ``discovery`` source."""
    capacity_options: dict[str, Any] = field(default_factory=dict)
    """Model → validated options of its ``autoscaling.capacity`` model."""


def quickstart_text() -> str:
    """The built-in deployment ``shuniu serve`` runs without a file."""
    return resources.files("shuniu.core.data").joinpath("quickstart.yaml").read_text("utf-8")


def field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """A pydantic error location as the dotted path a user reads (``models.chat.endpoints[0]``)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _line_map(node: yaml.Node | None, prefix: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], int]:
    lines: dict[tuple[Any, ...], int] = {}
    if node is None:
        return lines
    lines[prefix] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            key_path = (*prefix, key.value)
            lines.update(_line_map(value, key_path))
            lines[key_path] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_line_map(item, (*prefix, i)))
    return lines


def line_for(lines: dict[tuple[Any, ...], int], loc: tuple[Any, ...]) -> int | None:
    """The YAML line of ``loc`` in a :func:`parse_yaml` line map, else of its nearest parent."""
    loc = tuple(loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get(())


def parse_yaml(
    text: str, source: str, error: type[ConfigError] = ConfigError
) -> tuple[Any, dict[tuple[Any, ...], int]]:
    """The data in ``text`` and a map from each path in it to its 1-based line; invalid YAML
    raises ``error`` with the line the parser stopped at."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise error([Problem("", f"not valid YAML: {problem}", line)], source) from None
    return data, _line_map(root)


def interpolate_env(
    data: Any,
    problems: list[Problem],
    env: dict[str, str] | None = None,
    loc: tuple[Any, ...] = (),
    lines: dict[tuple[Any, ...], int] | None = None,
) -> Any:
    """Replace ``${VAR}`` and ``${VAR:-default}`` in every string value; ``$$`` is a ``$``.
    An unset variable without a default is a problem (with its line, given ``lines``)."""
    environ = os.environ if env is None else env
    if isinstance(data, dict):
        return {k: interpolate_env(v, problems, environ, (*loc, k), lines) for k, v in data.items()}
    if isinstance(data, list):
        return [interpolate_env(v, problems, environ, (*loc, i), lines) for i, v in enumerate(data)]
    if isinstance(data, str) and "$" in data:

        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            name, default = m.group(1), m.group(2)
            if name in environ:
                return environ[name]
            if default is not None:
                return default
            problems.append(
                Problem(
                    field_path(loc),
                    f"environment variable {name} is not set (write ${{{name}:-default}} to give a default)",
                    line_for(lines, loc) if lines is not None else None,
                )
            )
            return ""

        return _ENV.sub(sub, data)
    return data


def pydantic_problems(
    exc: ValidationError, prefix: tuple[Any, ...], lines: dict[tuple[Any, ...], int], model: Any
) -> list[Problem]:
    problems = []
    for err in exc.errors(include_url=False):
        loc = (*prefix, *err["loc"])
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            allowed = _allowed_fields(model, err["loc"][:-1])
            message = f"unknown field {err['loc'][-1]!r}"
            if allowed:
                message += "; expected one of: " + ", ".join(allowed)
        elif err["type"] == "missing":
            message = "required field is missing"
        elif err["type"] == "value_error":
            message = message.removeprefix("Value error, ")  # our validators' own sentences
        elif (
            "input" in err
            and err["type"] not in ("value_error",)
            and not isinstance(err["input"], dict | list)
        ):
            message += f" (got {err['input']!r})"
        problems.append(Problem(field_path(loc), message, line_for(lines, loc)))
    return problems


def _allowed_fields(model: Any, loc: tuple[Any, ...]) -> list[str]:
    """Field names valid at ``loc`` inside ``model``, to suggest on an unknown field."""
    current: Any = model
    for part in loc:
        current = _descend(current, part)
        if current is None:
            return []
    current = _as_model(current)
    return sorted(current.model_fields) if current is not None else []


def _as_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, UnionType):
        for arg in get_args(annotation):
            found = _as_model(arg)
            if found is not None:
                return found
    return None


def _descend(annotation: Any, part: Any) -> Any:
    """The type found at one more step (field name, list index, dict key) of a path."""
    model = _as_model(annotation)
    if model is not None:
        info = model.model_fields.get(str(part))
        return info.annotation if info is not None else None
    for candidate in get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,):
        origin, args = get_origin(candidate), get_args(candidate)
        if origin is list and isinstance(part, int) and args:
            return args[0]
        if origin is dict and len(args) == 2:
            return args[1]
    return None


def _validate_options(
    registration_options: type | None,
    raw: dict[str, Any],
    prefix: tuple[Any, ...],
    lines: dict[tuple[Any, ...], int],
    problems: list[Problem],
) -> Any:
    if registration_options is None:
        if raw:
            problems.append(Problem(field_path(prefix), "this takes no options", line_for(lines, prefix)))
        return None
    try:
        return TypeAdapter(registration_options).validate_python(raw)
    except ValidationError as exc:
        problems.extend(pydantic_problems(exc, prefix, lines, registration_options))
        return None


def _unknown(category: Category, name: str, plugins: PluginManager) -> str:
    names = ", ".join(sorted(plugins.registered(category))) or "(none)"
    thing = {
        "discovery": "discovery source",
        "hardware": "hardware probe",
        "capacity_models": "capacity model",
    }.get(category, singular(category))
    msg = f"unknown {thing} {name!r}; registered: {names}"
    if plugins.failed:
        msg += "; plugins that failed to load: " + ", ".join(f.name for f in plugins.failed)
    return msg


def load_deployment(
    source: str | Path | None,
    plugins: PluginManager,
    *,
    text: str | None = None,
    env: dict[str, str] | None = None,
) -> ResolvedDeployment:
    """Read, interpolate and validate a deployment; raise :class:`ConfigError` listing every
    problem. ``source=None`` loads the built-in quickstart."""
    if text is None:
        if source is None:
            text, name = quickstart_text(), QUICKSTART_NAME
        else:
            name = str(source)
            try:
                text = Path(source).read_text("utf-8")
            except OSError as exc:
                raise ConfigError([Problem("", f"cannot read file: {exc.strerror}")], name) from None
    else:
        name = str(source) if source is not None else "<text>"
    data, lines = parse_yaml(text, name)
    if not isinstance(data, dict):
        raise ConfigError(
            [Problem("", "the file must be a YAML mapping with at least a `models:` section", 1)],
            name,
        )
    problems: list[Problem] = []
    data = interpolate_env(data, problems, env, lines=lines)
    env_problems = list(problems)
    try:
        deployment: Deployment | None = Deployment.model_validate(data)
    except ValidationError as exc:
        problems.extend(pydantic_problems(exc, (), lines, Deployment))
        deployment = None
    # Plugin names and options are checked on the raw data, so a file with schema problems
    # still gets its plugin problems reported in the same run.
    parts: dict[str, dict[Any, Any]] = {"filters": {}, "scorers": {}, "discovery": {}, "capacity": {}}
    endpoint_options, balancer_options, scheduler_options, classifier_options = _check_plugins(
        data, plugins, lines, problems, parts
    )
    tenancy = _check_tenancy(data, plugins, lines, problems)
    if env_problems:
        # A field whose variable is unset was left empty; its follow-on error says nothing new.
        unset = {p.path for p in env_problems}
        problems = [p for i, p in enumerate(problems) if i < len(env_problems) or p.path not in unset]
    if deployment is None or problems:
        raise ConfigError(problems, name)
    resolved = ResolvedDeployment(
        deployment,
        name,
        endpoint_options,
        balancer_options,
        scheduler_options,
        parts["filters"],
        parts["scorers"],
        *tenancy,
        classifier_options=classifier_options,
        discovery_options=parts["discovery"],
        capacity_options=parts["capacity"],
    )
    _cross_check_tenancy(resolved, lines, problems)
    seen: dict[str, tuple[Any, ...]] = {}
    # Launched engines with fixed ports: each port once, and not the gateway's own.
    ports: dict[int, str] = {}
    if deployment.gateway.port:
        ports[deployment.gateway.port] = "the gateway itself (gateway.port)"
    for model_name, model in deployment.models.items():
        for i, replica, ep_name in expand_endpoints(model_name, model.endpoints):
            loc = ("models", model_name, "endpoints", i)
            if ep_name in seen and seen[ep_name] != loc:
                problems.append(
                    Problem(
                        field_path((*loc, "name")),
                        f"endpoint name {ep_name!r} is already used at {field_path(seen[ep_name])}",
                        line_for(lines, loc),
                    )
                )
            seen.setdefault(ep_name, loc)
            launch = model.endpoints[i].launch
            if launch is not None and launch.port:
                port = launch.port + replica
                if port in ports:
                    where = (*loc, "launch", "port")
                    problems.append(
                        Problem(
                            field_path(where),
                            f"port {port} (endpoint {ep_name!r}) is also used by {ports[port]}",
                            line_for(lines, where),
                        )
                    )
                ports.setdefault(port, f"endpoint {ep_name!r}")
    if problems:
        raise ConfigError(problems, name)
    return resolved


def _check_plugins(
    data: dict[str, Any],
    plugins: PluginManager,
    lines: dict[tuple[Any, ...], int],
    problems: list[Problem],
    parts: dict[str, dict[Any, Any]],
) -> tuple[dict[tuple[str, int], Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Look up every backend kind, policy, filter, scorer and classifier name, and validate
    their options."""
    endpoint_options: dict[tuple[str, int], Any] = {}
    policy_options: dict[str, dict[str, Any]] = {"balancer": {}, "scheduler": {}, "classifier": {}}
    models = data.get("models")
    if not isinstance(models, dict):
        return (
            endpoint_options,
            policy_options["balancer"],
            policy_options["scheduler"],
            policy_options["classifier"],
        )
    defaults = {"balancer": "round_robin", "scheduler": "priority"}
    for model_name, model in models.items():
        if not isinstance(model, dict):
            continue
        base = ("models", model_name)
        for key, category in (("balancer", "balancers"), ("scheduler", "schedulers")):
            cfg = model.get(key) or {}
            if not isinstance(cfg, dict):
                continue
            if key == "balancer":
                _check_parts(model_name, cfg, plugins, lines, problems, parts)
                if cfg.get("scorers") or cfg.get("filters"):
                    continue
            policy = cfg.get("policy") or defaults[key]
            if not isinstance(policy, str):
                continue
            reg = plugins.registered(category).get(policy)  # type: ignore[arg-type]
            if reg is None:
                loc = (*base, key, "policy")
                problems.append(
                    Problem(field_path(loc), _unknown(category, policy, plugins), line_for(lines, loc))
                )  # type: ignore[arg-type]
                continue
            options = cfg.get("options") or {}
            if isinstance(options, dict):
                policy_options[key][model_name] = _validate_options(
                    reg.options, options, (*base, key, "options"), lines, problems
                )
        classifier = model.get("classifier")
        if isinstance(classifier, dict) and isinstance(classifier.get("kind"), str):
            loc = (*base, "classifier", "kind")
            reg = plugins.registered("classifiers").get(classifier["kind"])
            if reg is None:
                problems.append(
                    Problem(
                        field_path(loc),
                        _unknown("classifiers", classifier["kind"], plugins),
                        line_for(lines, loc),
                    )
                )
            elif isinstance(classifier.get("options") or {}, dict):
                policy_options["classifier"][model_name] = _validate_options(
                    reg.options,
                    classifier.get("options") or {},
                    (*base, "classifier", "options"),
                    lines,
                    problems,
                )
        autoscaling = model.get("autoscaling")
        if isinstance(autoscaling, dict):
            _check_capacity(model_name, autoscaling, plugins, lines, problems, parts)
        endpoints = model.get("endpoints")
        if not isinstance(endpoints, list):
            continue
        backends = plugins.registered("backends")
        for i, ep in enumerate(endpoints):
            if not isinstance(ep, dict) or not isinstance(ep.get("kind"), str):
                continue
            loc = (*base, "endpoints", i)
            reg = backends.get(ep["kind"])
            if reg is None:
                problems.append(
                    Problem(
                        field_path((*loc, "kind")),
                        _unknown("backends", ep["kind"], plugins),
                        line_for(lines, (*loc, "kind")),
                    )
                )
                continue
            options = ep.get("options") or {}
            discovery = ep.get("discovery")
            if isinstance(discovery, dict):
                _check_discovery(discovery, (*loc, "discovery"), plugins, lines, problems, parts)
                if isinstance(options, dict) and "base_url" not in options:
                    # Validated with a stand-in address; each target's replaces it.
                    options = _with_launch_url(reg.options, options, {"host": "127.0.0.1", "port": 1})
            if isinstance(options, dict):
                options = _with_launch_url(reg.options, options, ep.get("launch"))
                endpoint_options[(model_name, i)] = _validate_options(
                    reg.options, options, (*loc, "options"), lines, problems
                )
    return (
        endpoint_options,
        policy_options["balancer"],
        policy_options["scheduler"],
        policy_options["classifier"],
    )


def _check_capacity(
    model_name: str,
    autoscaling: dict[str, Any],
    plugins: PluginManager,
    lines: dict[tuple[Any, ...], int],
    problems: list[Problem],
    parts: dict[str, dict[Any, Any]],
) -> None:
    """Look up a model's capacity model (``autoscaling.capacity``) and validate its options."""
    capacity = autoscaling.get("capacity") or {}
    if not isinstance(capacity, dict):
        return  # the schema reports it
    kind = capacity.get("kind", "simulated")
    if not isinstance(kind, str):
        return
    loc = ("models", model_name, "autoscaling", "capacity")
    reg = plugins.registered("capacity_models").get(kind)
    if reg is None:
        where = (*loc, "kind") if "kind" in capacity else loc
        problems.append(
            Problem(field_path(where), _unknown("capacity_models", kind, plugins), line_for(lines, where))
        )
        return
    options = capacity.get("options") or {}
    if isinstance(options, dict):
        parts["capacity"][model_name] = _validate_options(
            reg.options, options, (*loc, "options"), lines, problems
        )


def _check_discovery(
    discovery: dict[str, Any],
    loc: tuple[Any, ...],
    plugins: PluginManager,
    lines: dict[tuple[Any, ...], int],
    problems: list[Problem],
    parts: dict[str, dict[Any, Any]],
) -> None:
    """Look up an entry's discovery source and validate its options."""
    kind = discovery.get("kind")
    if not isinstance(kind, str):
        return  # the schema reports it
    reg = plugins.registered("discovery").get(kind)
    if reg is None:
        where = (*loc, "kind")
        problems.append(
            Problem(field_path(where), _unknown("discovery", kind, plugins), line_for(lines, where))
        )
        return
    options = discovery.get("options") or {}
    if isinstance(options, dict):
        parts["discovery"][(loc[1], loc[3])] = _validate_options(
            reg.options, options, (*loc, "options"), lines, problems
        )


def _check_tenancy(
    data: dict[str, Any],
    plugins: PluginManager,
    lines: dict[tuple[Any, ...], int],
    problems: list[Problem],
) -> tuple[dict[int, Any], Any, Any, Any]:
    """Look up the authenticators and the rate-limit, cache and file stores; validate their
    options."""
    auth_options: dict[int, Any] = {}
    auth = data.get("auth")
    entries = auth.get("authenticators") if isinstance(auth, dict) else None
    registered = plugins.registered("authenticators")
    for i, entry in enumerate(entries if isinstance(entries, list) else ()):
        if not isinstance(entry, dict) or not isinstance(entry.get("kind"), str):
            continue  # the schema reports it
        loc = ("auth", "authenticators", i)
        reg = registered.get(entry["kind"])
        if reg is None:
            where = (*loc, "kind")
            problems.append(
                Problem(
                    field_path(where),
                    _unknown("authenticators", entry["kind"], plugins),
                    line_for(lines, where),
                )
            )
            continue
        options = entry.get("options") or {}
        if isinstance(options, dict):
            auth_options[i] = _validate_options(reg.options, options, (*loc, "options"), lines, problems)
    stores: list[Any] = []
    for section, category in (
        ("rate_limits", "rate_limiters"),
        ("cache", "caches"),
        ("files", "file_stores"),
    ):
        cfg = data.get(section)
        if not isinstance(cfg, dict):
            stores.append(None)  # absent (the memory store with its defaults), or the schema says why
            continue
        store = cfg.get("store", "local" if section == "files" else "memory")
        if not isinstance(store, str):
            stores.append(None)
            continue
        reg = plugins.registered(category).get(store)  # type: ignore[arg-type]
        if reg is None:
            where = (section, "store")
            problems.append(
                Problem(field_path(where), _unknown(category, store, plugins), line_for(lines, where))
            )  # type: ignore[arg-type]
            stores.append(None)
            continue
        options = cfg.get("options") or {}
        stores.append(
            _validate_options(reg.options, options, (section, "options"), lines, problems)
            if isinstance(options, dict)
            else None
        )
    return auth_options, stores[0], stores[1], stores[2]


def _cross_check_tenancy(
    resolved: ResolvedDeployment, lines: dict[tuple[Any, ...], int], problems: list[Problem]
) -> None:
    """Tiers and models named by credentials (API key entries) must exist."""
    deployment = resolved.deployment
    tiers = {"default", *deployment.tiers}
    names = {alias for name, m in deployment.models.items() for alias in (name, *m.aliases)}
    for i, options in resolved.authenticator_options.items():
        loc = ("auth", "authenticators", i, "options")
        if not isinstance(options, AuthenticatorOptions):
            continue
        if options.sets_budgets() and deployment.governance is None:
            problems.append(
                Problem(
                    field_path(loc),
                    "some credential has `budgets`, which need a `governance:` section (add "
                    "`governance: {}` for the SQLite ledger and counters in this process)",
                    line_for(lines, loc),
                )
            )
        for tier, where in options.referenced_tiers().items():
            if tier not in tiers:
                problems.append(
                    Problem(
                        field_path(loc),
                        f"{where} names tier {tier!r}, which `tiers:` does not define "
                        f"(tiers: {', '.join(sorted(tiers))})",
                        line_for(lines, loc),
                    )
                )
        for model, where in options.referenced_models().items():
            if model not in names:
                problems.append(
                    Problem(
                        field_path(loc),
                        f"{where} names model {model!r}, which the deployment does not serve "
                        f"(models: {', '.join(sorted(names))})",
                        line_for(lines, loc),
                    )
                )


def _with_launch_url(options_type: type | None, options: dict[str, Any], launch: Any) -> dict[str, Any]:
    """A launched entry's options with ``base_url`` filled in (from the first replica's
    address) when the backend has that field and the file leaves it out, so the options
    validate; each replica gets its own address when the gateway is built."""
    if not isinstance(launch, dict) or "base_url" in options:
        return options
    template = base_url_template(options_type)
    if template is None:
        return options
    host, port = launch.get("host", "127.0.0.1"), launch.get("port", 0)
    if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
        host, port = "127.0.0.1", 0  # the schema reports the bad value
    return {**options, "base_url": engine_url(template, host.strip("[]"), port)}


def _check_parts(
    model_name: str,
    cfg: dict[str, Any],
    plugins: PluginManager,
    lines: dict[tuple[Any, ...], int],
    problems: list[Problem],
    parts: dict[str, dict[Any, Any]],
) -> None:
    """Validate a composed balancer's filter and scorer names and options."""
    for category in ("filters", "scorers"):
        entries = cfg.get(category)
        if not isinstance(entries, list):
            continue
        registered = plugins.registered(category)  # type: ignore[arg-type]
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                continue  # the schema reports it
            loc = ("models", model_name, "balancer", category, i)
            reg = registered.get(entry["name"])
            if reg is None:
                problems.append(
                    Problem(
                        field_path((*loc, "name")),
                        _unknown(category, entry["name"], plugins),
                        line_for(lines, (*loc, "name")),
                    )
                )
                continue
            options = entry.get("options") or {}
            if isinstance(options, dict):
                parts[category][(model_name, i)] = _validate_options(
                    reg.options, options, (*loc, "options"), lines, problems
                )


def expand_endpoints(model: str, endpoints: list[EndpointConfig]) -> list[tuple[int, int, str]]:
    """(entry index, replica, endpoint name) for every endpoint a model's entries expand to.

    Unnamed endpoints are numbered across the model (``chat-0``, ``chat-1``, ...); a named
    entry with several replicas gets ``-0``, ``-1``, ... appended. Entries with
    ``discovery:`` expand to nothing here: their endpoints come and go at run time.
    """
    out: list[tuple[int, int, str]] = []
    counter = 0
    for i, ep in enumerate(endpoints):
        if ep.discovery is not None:
            continue  # its endpoints are found at run time (core/pools/discovery.py)
        for r in range(ep.replicas):
            if ep.name is None:
                name = f"{model}-{counter}"
            else:
                name = ep.name if ep.replicas == 1 else f"{ep.name}-{r}"
            counter += 1
            out.append((i, r, name))
    return out
