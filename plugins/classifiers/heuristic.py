"""``heuristic``: label a request ``simple`` or ``complex`` from what it asks for, so one
routing rule sends hard requests to a large model and the rest to a small one::

    models:
      assistant:
        classifier: {kind: heuristic, options: {complex_prompt_tokens: 2000}}
        routes: [{labels: [complex], to: big-model}]
        endpoints: [...]                 # the small model

A request is ``complex`` when any of these holds (each can be turned off): its prompt has at
least ``complex_prompt_tokens`` tokens, it has ``complex_turns`` messages or more, it offers
tools, it asks for a ``reasoning_effort`` in ``complex_efforts``, it wants structured output
(``response_format`` ``json_schema``), or it carries images, audio or video. Costs a few
dictionary reads per request.
"""

from __future__ import annotations

from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Classifier, RegisterClassifier
from shuniu.core.types import InferenceRequest

__all__ = ["Heuristic", "HeuristicOptions"]


class HeuristicOptions(Options):
    """Options of the ``heuristic`` classifier."""

    complex_prompt_tokens: int | None = Field(4000, ge=1)
    """Prompts of at least this many tokens are ``complex`` (``null``: length does not count)."""
    complex_turns: int | None = Field(12, ge=1)
    """Chats of at least this many messages are ``complex`` (``null``: turns do not count)."""
    tools: bool = True
    """Requests that offer tools are ``complex``."""
    complex_efforts: list[str] = Field(default_factory=lambda: ["medium", "high"])
    """``reasoning_effort`` values that make a request ``complex``."""
    structured_output: bool = True
    """Requests for a ``json_schema`` response format are ``complex``."""
    multimodal: bool = True
    """Requests carrying images, audio or video are ``complex``."""
    labels: tuple[str, str] = ("simple", "complex")
    """The two labels given (what routing rules' ``labels`` match)."""


class Heuristic(Classifier):
    """The rules above, in order of cost."""

    __slots__ = ("_efforts", "_o")

    def __init__(self, options: HeuristicOptions | None) -> None:
        self._o = options or HeuristicOptions()
        self._efforts = frozenset(self._o.complex_efforts)

    def _complex(self, req: InferenceRequest) -> bool:
        o = self._o
        if o.complex_prompt_tokens is not None and req.prompt_tokens >= o.complex_prompt_tokens:
            return True
        if o.multimodal and req.modalities:
            return True
        body = req.body
        if o.complex_turns is not None and len(body.get("messages") or ()) >= o.complex_turns:
            return True
        if o.tools and body.get("tools"):
            return True
        if body.get("reasoning_effort") in self._efforts:
            return True
        fmt = body.get("response_format")
        return o.structured_output and isinstance(fmt, dict) and fmt.get("type") == "json_schema"

    async def classify(self, req: InferenceRequest) -> str | None:
        return self._o.labels[1] if self._complex(req) else self._o.labels[0]


@hookimpl
def register_classifiers(register: RegisterClassifier) -> None:
    register(
        "heuristic",
        Heuristic,
        options=HeuristicOptions,
        description="label requests simple or complex by length, turns, tools, effort, format, modality",
    )
