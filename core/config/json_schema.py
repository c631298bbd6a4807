"""The JSON Schema of a deployment file, including every registered plugin's options."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from shuniu.core.config import Deployment
from shuniu.core.plugin_manager import PluginManager

__all__ = ["deployment_schema"]


def _options_schema(options: type | None, defs: dict[str, Any]) -> dict[str, Any]:
    if options is None:
        return {"type": "object", "maxProperties": 0}
    schema = TypeAdapter(options).json_schema(ref_template="#/$defs/{model}")
    defs.update(schema.pop("$defs", {}))
    return schema


def _conditional(key: str, registrations: dict[str, Any], defs: dict[str, Any]) -> list[dict[str, Any]]:
    """``if key == name then options: <schema>`` for each registered name."""
    out = []
    for name, reg in sorted(registrations.items()):
        out.append(
            {
                "if": {"properties": {key: {"const": name}}, "required": [key]},
                "then": {"properties": {"options": _options_schema(reg.options, defs)}},
            }
        )
    return out


def _base_url_from_launch(then: dict[str, Any]) -> None:
    """A launched entry (``launch:``) may leave out ``options.base_url``: shuniu derives it.
    So the backend's ``base_url`` is only required without ``launch``."""
    options = then["properties"]["options"]
    required = options.get("required")
    if not isinstance(required, list) or "base_url" not in required:
        return
    required.remove("base_url")
    if not required:
        del options["required"]
    then["if"] = {"not": {"required": ["launch"]}}
    then["then"] = {"required": ["options"], "properties": {"options": {"required": ["base_url"]}}}


def deployment_schema(plugins: PluginManager) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) editors can use to check and complete deployment files."""
    schema = Deployment.model_json_schema(ref_template="#/$defs/{model}")
    defs: dict[str, Any] = schema.setdefault("$defs", {})
    backends = plugins.registered("backends")
    endpoint = defs["EndpointConfig"]
    endpoint["properties"]["kind"]["enum"] = sorted(backends)
    endpoint["allOf"] = _conditional("kind", backends, defs)
    for condition in endpoint["allOf"]:
        _base_url_from_launch(condition["then"])
    for def_name, category in (("BalancerConfig", "balancers"), ("SchedulerConfig", "schedulers")):
        regs = plugins.registered(category)  # type: ignore[arg-type]
        defs[def_name]["properties"]["policy"]["enum"] = sorted(regs)
        defs[def_name]["allOf"] = _conditional("policy", regs, defs)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "shuniu deployment"
    return schema
