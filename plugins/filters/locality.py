"""``locality``: keep the endpoints in the gateway's own zone (or any other label value),
spilling over to the rest when none of them can take the request."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import EndpointView, Filter, RegisterFilter
from shuniu.core.pools.load import load_score
from shuniu.core.types import InferenceRequest

__all__ = ["Locality", "LocalityOptions"]


class LocalityOptions(Options):
    """Options of the ``locality`` filter."""

    label: str = Field("zone", min_length=1)
    """The endpoint label compared with ``value`` (endpoints' ``labels:`` in the config)."""
    value: str = Field(min_length=1)
    """This gateway's own value of ``label``, e.g. its zone; usually set per deployment
    with interpolation: ``value: ${ZONE}``."""
    spill_load: float | None = Field(None, ge=0)
    """Also spill over to the other endpoints when every local candidate's load score
    (requests in flight plus the engine's backlog, in request units) is above this. Unset:
    spill over only when no local endpoint has a free slot."""


class Locality(Filter):
    """Returns the candidates whose ``labels[label]`` equals ``value``. When there are none
    (every local endpoint is saturated or unhealthy, hence not a candidate, or all of them
    are above ``spill_load``) it returns an empty list, which a composed balancer reads as
    "no preference" and so keeps every candidate. O(n).
    """

    __slots__ = ("_label", "_spill", "_value")

    def __init__(self, options: LocalityOptions | None = None) -> None:
        if options is None:
            raise ValueError("the locality filter needs options.value (this gateway's zone)")
        self._label = options.label
        self._value = options.value
        self._spill = options.spill_load

    def filter(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        label = self._label
        value = self._value
        local = [e for e in endpoints if e.labels.get(label) == value]
        spill = self._spill
        if spill is not None and local:
            for e in local:
                if load_score(e) <= spill:
                    return local
            return []
        return local


@hookimpl
def register_filters(register: RegisterFilter) -> None:
    register(
        "locality",
        Locality,
        options=LocalityOptions,
        description="Keep endpoints in this gateway's zone (a label); spill over when none can serve.",
    )
