"""Built-in file stores (``files.store``)."""
