"""Built-in policies (balancers, schedulers, ...), registered through the ``shuniu.plugins``
entry points exactly like third-party plugins."""
