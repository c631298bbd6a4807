"""The ``vllm`` backend: remote ``vllm serve`` endpoints, with their load read from
``/metrics`` and ``priority`` / per-tenant ``cache_salt`` forwarded (docs/backends/vllm.md).

Its public API (``VllmBackend``, which the ``ascend`` backend's vllm-ascend mode reuses,
``VllmOptions`` and the helpers) is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shuniu.core.lazy import lazy_exports

if TYPE_CHECKING:
    from shuniu.backends.vllm.backend import VllmBackend, choose_model, tenant_salt
    from shuniu.backends.vllm.metrics import WANTED, parse_vllm_metrics
    from shuniu.backends.vllm.options import VllmOptions

__all__ = ["WANTED", "VllmBackend", "VllmOptions", "choose_model", "parse_vllm_metrics", "tenant_salt"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "VllmBackend": "shuniu.backends.vllm.backend",
        "choose_model": "shuniu.backends.vllm.backend",
        "tenant_salt": "shuniu.backends.vllm.backend",
        "WANTED": "shuniu.backends.vllm.metrics",
        "parse_vllm_metrics": "shuniu.backends.vllm.metrics",
        "VllmOptions": "shuniu.backends.vllm.options",
    },
)
