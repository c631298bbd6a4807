"""A :class:`Workload`: named streams of requests merged by arrival time, and an optional SLO."""

from __future__ import annotations

from collections.abc import Iterator
from heapq import merge
from operator import attrgetter
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, model_validator

from shuniu.core.config import Options
from shuniu.core.traffic.errors import FieldError
from shuniu.core.traffic.generators import generate
from shuniu.core.traffic.request import SimRequest
from shuniu.core.traffic.slo import Slo
from shuniu.core.traffic.streams import Stream, TraceStream

__all__ = ["Workload"]


class Workload(Options):
    """A workload: streams of requests merged by arrival time, and an optional SLO."""

    name: str | None = None
    """Name shown in reports (default: the file name without extension)."""
    description: str = ""
    """What the workload models."""
    duration_s: float = Field(600.0, gt=0)
    """Default length of a run, seconds (``--duration`` overrides)."""
    slo: Slo | None = None
    """Service-level objective, for goodput and capacity planning."""
    streams: list[Stream] = Field(min_length=1)
    """The traffic: ``plain``, ``chat`` and ``trace`` streams, merged by arrival time."""

    _base_dir: Path | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _unique_names(self) -> Workload:
        seen: dict[str, int] = {}
        for i, name in enumerate(self.stream_names):
            if name in seen:
                raise FieldError(
                    ("streams", i, "name"), f"stream name {name!r} is used by streams[{seen[name]}]"
                )
            seen[name] = i
        return self

    @property
    def stream_names(self) -> list[str]:
        """Each stream's name (its ``name``, or its type, numbered if the type repeats)."""
        types = [s.type for s in self.streams]
        return [
            s.name if s.name is not None else (s.type if types.count(s.type) == 1 else f"{s.type}-{i}")
            for i, s in enumerate(self.streams)
        ]

    @property
    def base_dir(self) -> Path:
        """Where relative trace paths are looked up (the workload file's folder)."""
        return self._base_dir if self._base_dir is not None else Path.cwd()

    def with_base_dir(self, base_dir: str | Path) -> Workload:
        copy = self.model_copy()
        copy._base_dir = Path(base_dir)
        return copy

    def scaled(self, factor: float) -> Workload:
        """The same workload with every arrival rate multiplied by ``factor`` (conversation
        starts for chat streams; replay speed for traces)."""
        if not factor > 0:
            raise ValueError("the scale factor must be positive")
        streams: list[Any] = []
        for s in self.streams:
            if isinstance(s, TraceStream):
                streams.append(s.model_copy(update={"rate_multiplier": s.rate_multiplier * factor}))
            else:
                streams.append(s.model_copy(update={"arrival": s.arrival.scaled(factor)}))
        copy = self.model_copy(update={"streams": streams})
        copy._base_dir = self._base_dir
        return copy

    def requests(
        self, seed: int = 0, duration: float | None = None, *, prompts: bool = True
    ) -> Iterator[SimRequest]:
        """The requests arriving before ``duration`` (default ``duration_s``; ``math.inf``
        for no end), lazily, in arrival order, with ids 0, 1, 2, ... With ``prompts=False``
        prompts are left empty (``prompt_tokens`` still set): much faster, for statistics."""
        end = self.duration_s if duration is None else duration
        gens = [
            generate(stream, name, seed, end, prompts, self.base_dir)
            for stream, name in zip(self.streams, self.stream_names, strict=True)
        ]
        merged = gens[0] if len(gens) == 1 else merge(*gens, key=attrgetter("arrival"))
        for i, req in enumerate(merged):
            req.id = i
            yield req
