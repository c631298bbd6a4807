"""The request path as stages, in the order a request meets them (``docs/architecture.md``
draws it): intake, identity and tenancy, routing and degradation, the response cache,
admission and attempts, delivery, recording. :mod:`.path` runs them."""
