"""The wire formats the gateway speaks: parsing client requests into
:class:`~shuniu.core.types.InferenceRequest` and encoding answers (JSON and SSE), one module
per API."""
