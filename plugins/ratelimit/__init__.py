"""Built-in ratelimit plugins."""
