"""The deployment file's endpoints: an engine replica's kind and options, or an engine the
gateway launches (its command, environment and restart policy)."""

from __future__ import annotations

import string
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

from shuniu.core.config.base import Strict as _Strict

__all__ = [
    "LAUNCH_PLACEHOLDERS",
    "DiscoveryConfig",
    "EndpointConfig",
    "KvEventsConfig",
    "LaunchConfig",
    "RestartConfig",
    "placeholders",
]


LAUNCH_PLACEHOLDERS = ("host", "port", "replica", "name", "model")
"""Names a launch command and its environment may use as ``{name}``: filled in per replica."""


def placeholders(text: str) -> list[str]:
    """The ``{placeholder}`` names in ``text`` (``{{`` and ``}}`` are literal braces).
    Raises ``ValueError`` naming what is wrong: an unknown name, a format spec or
    conversion, an unmatched brace."""
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"{exc} in {text!r} (write {{{{ and }}}} for literal braces)") from None
    names = []
    for _literal, field, spec, conversion in parts:
        if field is None:
            continue
        if field not in LAUNCH_PLACEHOLDERS:
            known = ", ".join(f"{{{n}}}" for n in LAUNCH_PLACEHOLDERS)
            shown = f"{{{field}}}" if field else "{}"
            raise ValueError(
                f"unknown placeholder {shown} in {text!r}; known: {known} "
                "(write {{ and }} for literal braces)"
            )
        if spec or conversion:
            raise ValueError(f"placeholder {{{field}}} in {text!r} takes no format spec or conversion")
        names.append(field)
    return names


def _checked_placeholders(value: str) -> str:
    placeholders(value)
    return value


def _env_value(value: Any) -> Any:
    # YAML reads `KVCACHE: 4` as a number; the environment only holds strings. Booleans stay
    # an error: `true` would become "True", which few programs read as true.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


_Arg = Annotated[str, AfterValidator(_checked_placeholders)]
_EnvValue = Annotated[str, BeforeValidator(_env_value), AfterValidator(_checked_placeholders)]


class RestartConfig(_Strict):
    """When and how fast a launched engine that exited (or never became ready) is restarted."""

    max_restarts: int | None = Field(10, ge=0)
    """Restarts in a row before giving up (state ``failed``; the endpoint stays out of
    balancing until the gateway restarts). ``null``: never give up. The count starts again
    once an engine has stayed ready for ``reset_after_s``."""
    backoff_s: float = Field(1.0, ge=0)
    """Wait before the first restart; each further restart in a row waits twice as long."""
    max_backoff_s: float = Field(60.0, ge=0)
    """The longest wait between restarts."""
    reset_after_s: float = Field(300.0, ge=0)
    """An engine that stayed ready this long counts as recovered: its next exit is a first
    failure again (shortest backoff, a fresh ``max_restarts`` allowance)."""

    @model_validator(mode="after")
    def _order(self) -> RestartConfig:
        if self.max_backoff_s < self.backoff_s:
            raise ValueError("max_backoff_s must be at least backoff_s")
        return self


class LaunchConfig(_Strict):
    """An engine process shuniu starts, watches and restarts for each replica of the entry.

    The command and the environment values may use the placeholders ``{port}``, ``{host}``,
    ``{replica}`` (0, 1, ...), ``{name}`` (the endpoint's name) and ``{model}`` (the model's
    name). The backend's ``base_url`` is derived from ``host`` and the replica's port when
    the entry's ``options`` leave it out. With the entry's ``kv_events:``, a command that does
    not pass ``--kv-events-config`` itself gets one (vLLM's and SGLang's JSON) telling each
    replica to publish where the gateway subscribes."""

    command: list[_Arg] = Field(json_schema_extra={"minItems": 1})
    """The program and its arguments (no shell), e.g. ``[vllm, serve, /models/x, --port,
    "{port}"]``. The program is looked up on ``PATH``."""
    env: dict[str, _EnvValue] = Field(default_factory=dict)
    """Environment variables set for the engine, on top of the gateway's own environment."""
    port: int = Field(0, ge=0, le=65535)
    """Port of the first replica; replica ``i`` gets ``port + i``. 0: pick a free port for
    each replica when the gateway starts (kept across restarts)."""
    host: str = "127.0.0.1"
    """Address the engine listens on (``{host}``). The gateway reaches it there, or on the
    loopback address when it is ``0.0.0.0`` or ``::``."""
    ready_timeout_s: float = Field(600.0, gt=0)
    """Longest wait from start until the endpoint's health probe first passes; an engine
    slower than this is stopped and counts as a failed start (restarted, or given up on)."""
    restart: RestartConfig = Field(default_factory=RestartConfig)
    """Restarts of engines that exit or never become ready."""
    stop_grace_s: float = Field(30.0, ge=0)
    """On shutdown (and after a failure): SIGTERM to the engine's process group, then
    SIGKILL to whatever is left after this long."""
    log_dir: str | None = "logs/engines"
    """Directory of the engines' logs (stdout and stderr), one file per endpoint,
    ``<endpoint name>.log``, appended to; created if missing. Relative to the gateway's
    working directory. ``null``: the engines write to the gateway's own stdout and stderr."""
    cwd: str | None = None
    """Working directory of the engine; default the gateway's."""

    @field_validator("command")
    @classmethod
    def _program(cls, command: list[str]) -> list[str]:
        if not command:
            raise ValueError("must name the program to run, e.g. [vllm, serve, MODEL, --port, '{port}']")
        if not command[0].strip():
            raise ValueError("the program (the first item) must not be empty")
        return command

    @field_validator("host")
    @classmethod
    def _host(cls, host: str) -> str:
        if not host.strip() or any(c.isspace() for c in host) or "/" in host:
            raise ValueError(f"must be an address such as 127.0.0.1 (got {host!r})")
        return host.strip("[]")

    def uses_port(self) -> bool:
        """Whether the command or the environment tells the engine its ``{port}``."""
        texts = [*self.command, *self.env.values()]
        return any("port" in placeholders(text) for text in texts)

    @model_validator(mode="after")
    def _port_placeholder(self) -> LaunchConfig:
        if self.port == 0 and not self.uses_port():
            raise ValueError(
                "port 0 picks a free port for each engine, so `command` (or `env`) must pass it on as {port}"
            )
        return self


class DiscoveryConfig(_Strict):
    """Where the entry's engines are found at run time (docs/discovery.md): every target
    the source finds becomes one endpoint built from the entry, named ``<entry name>-<key>``,
    with the backend's ``base_url`` pointed at the target's address."""

    kind: str
    """The source: ``dns`` (A/AAAA or SRV records, e.g. a headless Service),
    ``kubernetes`` (a Service's EndpointSlices), or one a plugin registers."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of the source, validated by it."""
    drain_timeout_s: float = Field(120.0, ge=0)
    """A target that went away (or stopped being ready) is drained: no new requests, those
    in flight finish. Its endpoint is removed once nothing runs on it, or after this long."""
    backoff_s: float = Field(1.0, gt=0)
    """After the source fails (the API server or the DNS server unreachable): wait before
    watching again, doubling on each failure in a row up to 30 s. The endpoints found so
    far stay meanwhile."""


class KvEventsConfig(_Strict):
    """Where the engine publishes its KV-cache events (vLLM's ``--kv-events-config``), for
    exact prefix routing (``precise_prefix``; docs/scheduling.md)."""

    endpoint: str
    """The engine's ZMQ PUB address: ``tcp://HOST:PORT`` for an engine started with
    ``"endpoint": "tcp://*:PORT"`` (it binds; the gateway connects). With ``replicas``, each
    replica's port is this one plus its number (as vLLM offsets by data-parallel rank)."""
    topic: str = ""
    """The engine's ``topic`` (messages of other topics are ignored)."""
    replay_endpoint: str | None = None
    """The engine's ``replay_endpoint`` (``tcp://HOST:PORT``), to fetch batches lost in a gap
    instead of forgetting what the engine held."""
    bind: bool = False
    """Bind ``endpoint`` instead of connecting (for engines given the gateway's address,
    which connect to it)."""

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq_address(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError("must be a ZMQ address: tcp://HOST:PORT, ipc://PATH or inproc://NAME")
        return value

    def for_replica(self, replica: int) -> KvEventsConfig:
        """The addresses of replica ``replica`` (ports offset by it)."""
        if replica == 0:
            return self
        return self.model_copy(
            update={
                "endpoint": _offset(self.endpoint, replica),
                "replay_endpoint": _offset(self.replay_endpoint, replica),
            }
        )


def _offset(address: str | None, by: int) -> str | None:
    if address is None or not address.startswith("tcp://"):
        return address
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + by}" if port.isdigit() and int(port) else address


class EndpointConfig(_Strict):
    """One engine (or ``replicas`` identical engines) serving the model."""

    kind: str
    """Backend kind: ``sim``, ``openai``, or any registered by a plugin."""
    name: str | None = None
    """Endpoint name; unnamed endpoints are numbered across the model (``<model>-0``,
    ``<model>-1``, ...). A named entry with several replicas gets ``-0``, ``-1``, ... appended."""
    replicas: int = Field(1, ge=1, le=1024)
    """How many identical endpoints to create from this entry."""
    weight: float = Field(1.0, gt=0)
    """Relative share of traffic, for balancers that weigh endpoints."""
    version: str = "v1"
    """Version label, for canary splits and rolling updates."""
    max_concurrency: int = Field(0, ge=0)
    """Requests dispatched to this endpoint at once; 0 = no gateway-side limit. Above it
    requests wait in the gateway's queue, where the scheduler orders them."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Free-form labels for policies, e.g. ``{zone: us-east-1a}`` for the ``locality`` filter."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of the backend kind, validated by it."""
    launch: LaunchConfig | None = None
    """Start the engines of this entry as processes of the gateway (one per replica),
    restart them when they exit, and stop them with the gateway. ``null``: the engines run
    elsewhere and ``options`` say where (see docs/managed-engines.md)."""
    kv_events: KvEventsConfig | None = None
    """Subscribe to the engine's KV-cache events (exact prefix routing with the
    ``precise_prefix`` balancer). The in-process ``sim`` backend needs none: its events
    reach the balancer directly."""
    discovery: DiscoveryConfig | None = None
    """Find this entry's engines at run time (DNS, Kubernetes EndpointSlices) instead of
    ``options.base_url``: one endpoint per target found, added, drained and removed as
    targets come and go. ``null``: the one address in ``options``."""

    @model_validator(mode="after")
    def _discovered(self) -> EndpointConfig:
        if self.discovery is None:
            return self
        if self.launch is not None:
            raise ValueError("an entry either launches its engines (launch) or discovers them (discovery)")
        if self.replicas != 1:
            raise ValueError("a discovered entry has one endpoint per target found: leave replicas out")
        return self

    @model_validator(mode="after")
    def _launch_ports(self) -> EndpointConfig:
        launch = self.launch
        if launch is None or launch.port == 0:
            return self
        last = launch.port + self.replicas - 1
        if last > 65535:
            raise ValueError(
                f"launch.port {launch.port} + {self.replicas} replicas runs past port 65535 (last: {last})"
            )
        if self.replicas > 1 and not launch.uses_port():
            raise ValueError(
                "launch.command (or launch.env) must pass {port} on to the engine: each of the "
                f"{self.replicas} replicas listens on its own port"
            )
        return self
