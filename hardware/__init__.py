"""Device probes (NVIDIA, Ascend, CPU) and KV-cache sizing arrive with the engine issues;
probes register through the ``register_hardware`` hook."""
