"""The ``trtllm`` backend: NVIDIA TensorRT-LLM behind ``trtllm-serve``'s OpenAI-compatible
API, or behind Triton Inference Server's generate extension (docs/backends/trtllm.md)."""
