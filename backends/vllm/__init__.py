"""The ``vllm`` backend: remote ``vllm serve`` endpoints, with their load read from
``/metrics`` and ``priority`` / per-tenant ``cache_salt`` forwarded (docs/backends/vllm.md)."""
