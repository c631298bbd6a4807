"""Pools of endpoints and what keeps them serving: the endpoint state policies read, the
load view, composed balancers, prefix hashing, resilience (ejection, retry budget,
timeouts), building pools from a deployment, the health and load loops, and engines the
gateway launches itself.

Plugin authors use :func:`load_score`, :class:`LoadWeights` and :func:`prefix_hashes`
from here; everything else is the gateway's own.
"""

from __future__ import annotations

from shuniu.core.pools.load import LoadWeights, load_score
from shuniu.core.pools.pool import DEFAULT_OUTPUT_TOKENS, EndpointState, Pool
from shuniu.core.pools.prefix import prefix_hashes

__all__ = ["DEFAULT_OUTPUT_TOKENS", "EndpointState", "LoadWeights", "Pool", "load_score", "prefix_hashes"]
