"""What the gateway tells about itself: Prometheus metrics, the JSON access log,
OpenTelemetry traces, and hardware readings."""
