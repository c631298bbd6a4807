"""The streams of a workload file, as data: ``plain`` (independent requests), ``chat``
(multi-turn conversations) and ``trace`` (a JSONL replay), and the options they share
(tenants, system prompts, request classes)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from shuniu.core.config import Options
from shuniu.core.traffic.arrivals import Arrival
from shuniu.core.traffic.distributions import Count, Seconds
from shuniu.core.traffic.errors import FieldError

__all__ = [
    "ChatStream",
    "PlainStream",
    "RequestClass",
    "Stream",
    "StreamBase",
    "SystemPrompts",
    "TenantShare",
    "TraceStream",
]


class TenantShare(Options):
    """A tenant's share of a stream's traffic (of its users, for ``chat`` streams)."""

    name: str
    """Tenant name."""
    weight: float = Field(1.0, gt=0)
    """Relative share."""
    tier: str | None = None
    """Tier of this tenant's requests (default: the stream's ``tier``)."""
    priority: int | None = None
    """Priority of this tenant's requests (default: the stream's ``priority``)."""


class SystemPrompts(Options):
    """K shared system prompts, each a prefix group ``<stream>/system-<k>``."""

    count: int = Field(ge=1, le=1_000_000)
    """How many distinct system prompts (K)."""
    tokens: Count
    """Length of each (drawn once per prompt)."""


class RequestClass(Options):
    """One class of a mix (e.g. short and long requests), chosen with probability
    proportional to ``weight``."""

    name: str
    """Class name; requests carry ``stream: <stream>/<class>``."""
    weight: float = Field(gt=0)
    """Relative frequency."""
    input_tokens: Count
    """Prompt length (after the system prompt, if the stream has any)."""
    output_tokens: Count
    """Tokens generated."""
    tenant: str | None = None
    """Overrides the stream's (and its tenants') tenant."""
    tier: str | None = None
    """Overrides the stream's (and its tenants') tier."""
    priority: int | None = None
    """Overrides the stream's (and its tenants') priority."""


class StreamBase(Options):
    """What every stream has: a name, who sends its requests and to which API."""

    name: str | None = None
    """Stream name, unique in the workload (default: its type, numbered if repeated); part
    of every request's ``stream`` label and of the seeds, so renaming changes the draws."""
    tenant: str = "default"
    """Tenant of the requests (when ``tenants`` is not given)."""
    tier: str = "default"
    """Tier of the requests, unless a tenant or class says otherwise."""
    priority: int = 0
    """Priority of the requests (smaller runs first), unless a tenant or class says otherwise."""
    tenants: list[TenantShare] | None = Field(None, min_length=1)
    """Spread the traffic over several tenants by weight."""
    api: Literal["chat", "completions"] = "chat"
    """API the requests are sent to (``SimRequest.kind``)."""


class PlainStream(StreamBase):
    """Independent requests: an arrival process and length distributions (or a mix of
    classes); with ``system_prompts``, each prompt starts with one of them, chosen at random."""

    type: Literal["plain"] = "plain"
    """Stream type (``plain`` is the default)."""
    arrival: Arrival
    """When requests arrive."""
    input_tokens: Count | None = None
    """Prompt length (after the system prompt, if any). Or give ``classes``."""
    output_tokens: Count | None = None
    """Tokens generated. Or give ``classes``."""
    classes: list[RequestClass] | None = Field(None, min_length=1)
    """A weighted mix of request classes, instead of ``input_tokens``/``output_tokens``."""
    system_prompts: SystemPrompts | None = None
    """Shared prefixes, one picked uniformly at random per request."""

    @model_validator(mode="after")
    def _lengths(self) -> PlainStream:
        if self.classes is None:
            for name in ("input_tokens", "output_tokens"):
                if getattr(self, name) is None:
                    raise FieldError((name,), "required field is missing (or give `classes`)")
        else:
            for name in ("input_tokens", "output_tokens"):
                if getattr(self, name) is not None:
                    raise FieldError((name,), "give either `classes` or input_tokens/output_tokens")
        return self


class ChatStream(StreamBase):
    """Multi-turn conversations. A conversation starts at each arrival, for a user drawn
    uniformly from ``users``; user ``u`` belongs to a tenant (``tenants`` split the users in
    contiguous blocks by weight) and uses system prompt ``u mod K``. Turn ``j``'s prompt is the
    system prompt, then every earlier turn's user message and answer, then a new user message;
    turn ``j+1`` arrives ``think_time_s`` after turn ``j`` arrived (open loop: choose think
    times longer than an answer takes). A conversation ends after its ``turns``, or before a
    turn whose prompt plus answer would exceed ``max_prompt_tokens``."""

    type: Literal["chat"]
    """Stream type."""
    arrival: Arrival
    """When conversations start."""
    users: int = Field(100, ge=1)
    """Number of distinct users (M)."""
    system_prompts: SystemPrompts | None = None
    """Shared system prompts (none: conversations share no prefix)."""
    turns: Count
    """Turns per conversation."""
    think_time_s: Seconds
    """Seconds from one turn's arrival to the next."""
    user_tokens: Count
    """Length of each new user message."""
    output_tokens: Count
    """Length of each answer."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """End a conversation before a turn whose prompt + answer would exceed this (the
    model's context window)."""


class TraceStream(StreamBase):
    """Replay of a JSONL trace: one request per line, ``arrival`` non-decreasing. Required
    keys: ``arrival`` (s), ``prompt_tokens``, ``output_tokens``; optional: ``prefix_group`` with
    ``prefix_tokens`` (the prompt starts with that group's first ``prefix_tokens`` ids, shared
    by every line, and every trace stream, naming the group), ``tenant``, ``tier``,
    ``priority``, ``session``, ``api``. Other keys are errors."""

    type: Literal["trace"]
    """Stream type."""
    path: str
    """The JSONL file, relative to the workload file."""
    rate_multiplier: float = Field(1.0, gt=0)
    """Replay this many times faster (arrival times are divided by it)."""
    loop: bool = False
    """Start again at the end (each pass offset by the trace's span plus one mean gap)."""


def _stream_type(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("type", "plain")
    return getattr(value, "type", None)


Stream = Annotated[
    Annotated[PlainStream, Tag("plain")]
    | Annotated[ChatStream, Tag("chat")]
    | Annotated[TraceStream, Tag("trace")],
    Discriminator(_stream_type),
]
