"""The ``tgi`` backend: Hugging Face Text Generation Inference servers, remote or launched
with ``text-generation-launcher`` (docs/backends/tgi.md)."""
