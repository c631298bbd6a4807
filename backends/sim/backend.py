"""The ``sim`` backend: an endpoint served by an in-process :class:`SimEngine`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

from shuniu.backends.sim.engine import SimEngine
from shuniu.backends.sim.options import SimOptions
from shuniu.core.interfaces import BackendBase, EndpointSpec
from shuniu.core.types import Chunk, EndpointLoad, Health, InferenceRequest

__all__ = ["SimBackend"]


class SimBackend(BackendBase):
    kind: ClassVar[str] = "sim"

    def __init__(self, spec: EndpointSpec) -> None:
        options = spec.options if isinstance(spec.options, SimOptions) else SimOptions()
        if spec.max_model_len is not None and "max_model_len" not in options.model_fields_set:
            options = options.model_copy(update={"max_model_len": spec.max_model_len})
        self.name = spec.name
        self.engine = SimEngine(options)
        self.max_model_len = options.max_model_len

    def stream(self, req: InferenceRequest) -> AsyncIterator[Chunk]:
        return self.engine.generate(req)

    async def load(self) -> EndpointLoad:
        return self.engine.load()

    async def health(self) -> Health:
        return Health(True, "simulated")
