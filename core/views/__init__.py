"""Read-only views of a running gateway for people and tools: readiness, the status page
and its data, and the admin API. Each reads :class:`shuniu.core.state.StateView`, never
the gateway itself."""
