"""HTTP: raw-ASGI helpers for the hot path, the Litestar application (with the direct
dispatch of the inference routes), and the server that runs it."""
