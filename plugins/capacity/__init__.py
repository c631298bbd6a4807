"""Built-in capacity models for the autoscaling signals: ``simulated`` and ``static``."""
