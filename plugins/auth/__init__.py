"""Built-in auth plugins."""
