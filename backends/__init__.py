"""Engine adapters: ``sim`` (built-in simulator) and ``openai`` (any OpenAI-compatible server)."""
