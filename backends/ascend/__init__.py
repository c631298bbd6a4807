"""The ``ascend`` backend: Ascend NPU engines, either vllm-ascend (through the ``vllm``
adapter) or MindIE Service, with the NPU readings of each endpoint (docs/backends/ascend.md)."""
