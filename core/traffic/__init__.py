"""The traffic model: what a simulation, a capacity plan or a load test is run against.

A workload file (YAML) names one or more *streams* of requests, merged by arrival time:

- ``type: plain`` — requests from an arrival process with input/output length distributions,
  optionally a weighted mix of request ``classes`` (long/short) and optionally shared system
  prompts;
- ``type: chat`` — multi-turn conversations of ``users`` spread over ``tenants``, each user
  bound to one of K shared system prompts; every turn's prompt is the system prompt, the
  whole history so far (earlier user messages and the earlier answers' token ids) and a new
  user message, so a prefix cache can hit across users (system prompt) and across turns;
- ``type: trace`` — replay of a JSONL trace (arrival, prompt and output tokens, prefix group).

:meth:`Workload.requests` yields :class:`SimRequest` lazily in arrival order. Everything is
deterministic under the ``seed`` argument. Token ids come from :func:`synthetic_ids`; the
simulated engine generates an answer as ``synthetic_ids(output_seed, output_tokens)``, which is
how the next turn can carry it in its history. ``load_workload`` validates a file with pydantic
and reports every problem with its field path and YAML line (:class:`WorkloadError` is a
:class:`~shuniu.core.errors.ConfigError`).

Pure data and generators, no engine and no gateway: ``shuniu simulate``, ``shuniu plan`` and
``shuniu bench`` share it. The modules, from the bottom up: ``synthetic`` (token ids and
seeds), ``errors``, ``distributions``, ``arrivals``, ``streams``, ``slo``, ``request``,
``trace`` (trace files), ``generators`` (plain and chat streams), ``workload``, ``loading``
and ``describe``.
"""

from __future__ import annotations

from shuniu.core.traffic.arrivals import Arrival, RatePoint
from shuniu.core.traffic.describe import describe
from shuniu.core.traffic.distributions import Exponential, Fixed, LogNormal, Uniform
from shuniu.core.traffic.errors import WorkloadError
from shuniu.core.traffic.loading import load_workload
from shuniu.core.traffic.request import SimRequest
from shuniu.core.traffic.slo import Slo
from shuniu.core.traffic.streams import (
    ChatStream,
    PlainStream,
    RequestClass,
    SystemPrompts,
    TenantShare,
    TraceStream,
)
from shuniu.core.traffic.synthetic import VOCAB_SIZE, synthetic_array, synthetic_ids
from shuniu.core.traffic.trace import TraceLine
from shuniu.core.traffic.workload import Workload

__all__ = [
    "VOCAB_SIZE",
    "Arrival",
    "ChatStream",
    "Exponential",
    "Fixed",
    "LogNormal",
    "PlainStream",
    "RatePoint",
    "RequestClass",
    "SimRequest",
    "Slo",
    "SystemPrompts",
    "TenantShare",
    "TraceLine",
    "TraceStream",
    "Uniform",
    "Workload",
    "WorkloadError",
    "describe",
    "load_workload",
    "synthetic_array",
    "synthetic_ids",
]
