"""Built-in cache plugins."""
