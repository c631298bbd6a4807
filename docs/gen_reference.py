"""Generate the field reference in docs/deployment.md from the code, so it cannot drift.

The tables come from the pydantic models in ``shuniu.core.config`` (field, type, default and
the description each field's docstring gives) and from the options model of every plugin
that ships with shuniu (``load_plugins().registered(...)``). Third-party plugins are left
out so the page does not depend on what happens to be installed; ``shuniu schema`` covers
them.

    python docs/gen_reference.py           # rewrite the generated section
    python docs/gen_reference.py --check   # exit 1 if the section is out of date
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from shuniu.core.config import model as config
from shuniu.core.plugin_manager import ALLOW_ENV, CATEGORIES, DENY_ENV, PluginManager, load_plugins

DOC = Path(__file__).resolve().parent / "deployment.md"
BEGIN = "<!-- BEGIN GENERATED -->"
END = "<!-- END GENERATED -->"
BUILTIN_DISTRIBUTION = "shuniu"

# Where each section of the deployment file lives, in reading order.
SECTIONS: list[tuple[str, type[BaseModel]]] = [
    ("(top level)", config.Deployment),
    ("gateway", config.GatewayConfig),
    ("models.<name>", config.ModelConfig),
    ("models.<name>.endpoints[]", config.EndpointConfig),
    ("models.<name>.endpoints[].launch", config.LaunchConfig),
    ("models.<name>.endpoints[].launch.restart", config.RestartConfig),
    ("models.<name>.endpoints[].discovery", config.DiscoveryConfig),
    ("models.<name>.endpoints[].kv_events", config.KvEventsConfig),
    ("models.<name>.balancer", config.BalancerConfig),
    ("models.<name>.balancer.filters[]", config.FilterConfig),
    ("models.<name>.balancer.scorers[]", config.ScorerConfig),
    ("models.<name>.scheduler", config.SchedulerConfig),
    ("models.<name>.health", config.HealthConfig),
    ("models.<name>.load", config.LoadConfig),
    ("models.<name>.routes[]", config.RouteRule),
    ("models.<name>.pooling", config.PoolingConfig),
    ("models.<name>.timeouts", config.TimeoutsConfig),
    ("models.<name>.retries", config.RetryConfig),
    ("models.<name>.outlier", config.OutlierConfig),
    ("models.<name>.autoscaling", config.AutoscalingConfig),
    ("models.<name>.autoscaling.capacity", config.CapacityConfig),
    ("fleet", config.FleetConfig),
    ("gateway.access_log", config.AccessLogConfig),
    ("gateway.tracing", config.TracingConfig),
    ("auth", config.AuthConfig),
    ("auth.authenticators[]", config.AuthenticatorConfig),
    ("tiers.<name>", config.TierConfig),
    ("tiers.<name>.degrade", config.DegradeConfig),
    ("tiers.<name>.key_limits, tiers.<name>.tenant_limits", config.LimitsConfig),
    ("rate_limits", config.RateLimitsConfig),
    ("cache", config.CacheConfig),
    ("files", config.FilesConfig),
    ("governance", config.GovernanceConfig),
    ("governance.ledger", config.LedgerConfig),
    ("governance.prices.<model>", config.PriceConfig),
    ("governance.tenants.<name>, governance.projects.<name>", config.BudgetsConfig),
    ("governance.tenants.<name>.budgets[], keys[].budgets[]", config.BudgetConfig),
    ("governance.keys", config.ManagedKeysConfig),
]

# Where the options of each plugin category go, and the key that selects the plugin.
PLUGIN_PLACES: dict[str, tuple[str, str]] = {
    "backends": ("models.<name>.endpoints[].options", "kind"),
    "balancers": ("models.<name>.balancer.options", "policy"),
    "schedulers": ("models.<name>.scheduler.options", "policy"),
    "filters": ("models.<name>.balancer.filters[].options", "name"),
    "scorers": ("models.<name>.balancer.scorers[].options", "name"),
    "authenticators": ("auth.authenticators[].options", "kind"),
    "rate_limiters": ("rate_limits.options", "store"),
    "caches": ("cache.options", "store"),
    "file_stores": ("files.options", "store"),
    "discovery": ("models.<name>.endpoints[].discovery.options", "kind"),
    "classifiers": ("models.<name>.classifier.options", "kind"),
    "capacity_models": ("models.<name>.autoscaling.capacity.options", "kind"),
}


def _text(doc: str | None) -> str:
    """A docstring as one Markdown table cell."""
    if not doc:
        return ""
    text = " ".join(doc.split())
    text = text.replace("``", "`").replace("|", "\\|")
    return text


def _type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if origin is typing.Annotated:  # validators attached to a type: the type is what readers need
        return _type(args[0])
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type(a) for a in args)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        return f"{origin.__name__}[{', '.join(_type(a) for a in args)}]"
    if origin is dict:
        return f"dict[{_type(args[0])}, {_type(args[1])}]"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "mapping"
        if annotation.__name__ == "SecretStr":
            return "str (secret)"
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _constraints(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
        min_length = getattr(meta, "min_length", None)
        if min_length is not None:
            if info.annotation is str:
                parts.append(f"at least {min_length} character{'s' if min_length != 1 else ''}")
            else:
                parts.append(f"at least {min_length} item{'s' if min_length != 1 else ''}")
        max_length = getattr(meta, "max_length", None)
        if max_length is not None:
            parts.append(f"at most {max_length} items")
        pattern = getattr(meta, "pattern", None)
        if pattern is not None:
            parts.append(f"matches `{pattern}`")
    return ", ".join(parts)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "(all defaults)"
        return f"`{value!r}`"
    if info.default is PydanticUndefined:  # pragma: no cover
        return ""
    if info.default is None:
        return "`null`"
    if isinstance(info.default, bool):
        return f"`{str(info.default).lower()}`"
    if isinstance(info.default, str):
        return f"`{info.default}`"
    return f"`{info.default!r}`"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _description(info: FieldInfo) -> str:
    nested = _models_in(info.annotation)
    text = _text(info.description)
    if not text and nested:
        text = _text(nested[0].__doc__)
    places = {model: where for where, model in SECTIONS}
    for model in nested:
        if model in places:
            text += f" See `{places[model]}`."
    return text.strip()


def field_table(model: type[BaseModel]) -> list[str]:
    lines = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for name, info in model.model_fields.items():
        kind = f"`{_type(info.annotation)}`"
        constraints = _constraints(info)
        if constraints:
            kind += f", {constraints}"
        lines.append(f"| `{name}` | {kind} | {_default(info)} | {_description(info)} |")
    return lines


def _builtin_plugins() -> PluginManager:
    """Load the plugins with the environment's allow/deny lists set aside, so the output
    does not depend on ``SHUNIU_PLUGINS`` / ``SHUNIU_DISABLE_PLUGINS``."""
    saved = {name: os.environ.pop(name, None) for name in (ALLOW_ENV, DENY_ENV)}
    try:
        os.environ[ALLOW_ENV] = BUILTIN_DISTRIBUTION
        return load_plugins()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def generate() -> str:
    """The Markdown between the markers."""
    out: list[str] = [
        "<!-- This section is written by docs/gen_reference.py from the code; edit the",
        "     docstrings in core/config/model.py and in the plugins' options models instead. -->",
        "",
        "### Deployment file",
        "",
    ]
    for where, model in SECTIONS:
        out += [f"#### `{where}`", "", _text(model.__doc__), "", *field_table(model), ""]

    plugins = _builtin_plugins()
    builtin = {info.name for info in plugins.plugins() if info.distribution == BUILTIN_DISTRIBUTION}
    out += ["### Options of the built-in plugins", ""]
    for category in CATEGORIES:
        if category == "hardware":
            continue  # probes are not selected in a deployment; docs/hardware.md lists them
        regs = {n: r for n, r in plugins.registered(category).items() if r.plugin in builtin}
        if not regs:
            continue
        place, key = PLUGIN_PLACES.get(category, (f"{category} options", "name"))
        for name, reg in sorted(regs.items()):
            title = category[:-1] if category.endswith("s") else category
            out += [f"#### {title} `{name}`", ""]
            if reg.description:
                out += [_text(reg.description), ""]
            fields = getattr(reg.options, "model_fields", None) if reg.options is not None else None
            if not fields:
                out += [f"Selected with `{key}: {name}`. Takes no options.", ""]
            else:
                assert isinstance(reg.options, type) and issubclass(reg.options, BaseModel)
                out += [f"Selected with `{key}: {name}`; options go in `{place}`.", ""]
                out += [*field_table(reg.options), ""]
    return "\n".join(out).rstrip() + "\n"


def splice(document: str, generated: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.DOTALL)
    if not pattern.search(document):
        raise SystemExit(f"{DOC}: markers {BEGIN} / {END} not found")
    return pattern.sub(lambda _: f"{BEGIN}\n{generated}\n{END}", document, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/deployment.md is stale")
    args = parser.parse_args(argv)
    current = DOC.read_text("utf-8")
    wanted = splice(current, generate())
    if args.check:
        if current != wanted:
            diff = difflib.unified_diff(
                current.splitlines(keepends=True),
                wanted.splitlines(keepends=True),
                "docs/deployment.md",
                "docs/deployment.md (generated)",
            )
            sys.stderr.writelines(diff)
            print("\ndocs/deployment.md is out of date: run python docs/gen_reference.py", file=sys.stderr)
            return 1
        return 0
    if current != wanted:
        DOC.write_text(wanted, "utf-8")
        print("docs/deployment.md: reference updated")
    else:
        print("docs/deployment.md: reference already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
