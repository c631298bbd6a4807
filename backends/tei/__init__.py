"""The ``tei`` backend: Hugging Face text-embeddings-inference (embeddings and rerank)."""
