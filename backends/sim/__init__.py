"""The built-in engine simulator: the embedded default backend (``kind: sim``)."""
