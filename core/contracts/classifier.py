"""The classifier contract: a label for each request, before routing.

Where it runs: once the request is authenticated, its model looked up and its prompt counted
(and checked against the tier), the gateway awaits :meth:`Classifier.classify` of the
model's ``classifier:`` and stores the label on the request; the model's routing rules then
match on it (``routes[].labels``), so "simple requests to the small model, hard ones to the
large" is a classifier plus one rule. One instance per model. The call is on every request
of the model: keep it quick (a heuristic, a small local model on a worker thread), and never
raise for a request's content (return ``None``: no label, no ``labels`` rule matches).
"""

from __future__ import annotations

from typing import Protocol

from shuniu.core.types import InferenceRequest

__all__ = ["Classifier"]


class Classifier(Protocol):
    """Labels a model's requests for its routing rules."""

    async def classify(self, req: InferenceRequest) -> str | None:
        """The request's label (``None``: none). ``req.body`` is the OpenAI chat or
        completions body, ``req.prompt_tokens`` the count, ``req.modalities`` what beyond
        text it carries, ``req.principal`` who sent it."""
        ...
