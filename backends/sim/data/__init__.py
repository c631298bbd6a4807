"""Shipped hardware and model profiles of the engine simulator (``hardware.yaml``, ``models.yaml``)."""
