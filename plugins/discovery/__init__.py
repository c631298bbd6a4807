"""Built-in discovery sources: ``dns`` and ``kubernetes``."""
