"""The base classes of every deployment-file schema class: strict (unknown keys are errors),
frozen, described by their field docstrings."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Options", "Strict"]


class Options(BaseModel):
    """Base class for plugin option models: unknown keys are errors, docstrings describe."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class Strict(BaseModel):
    """A part of the deployment file."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)
