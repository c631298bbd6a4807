"""Built-in request classifiers (``classifier.kind`` of a model): ``heuristic``."""
