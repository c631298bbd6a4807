"""Built-in request schedulers."""
