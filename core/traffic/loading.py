"""Reading a workload file: YAML, ``${ENV}`` interpolation, validation, and every problem
reported with its field path and line, as deployment files are reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from shuniu.core.config import Options
from shuniu.core.config.loader import field_path, interpolate_env, line_for, parse_yaml
from shuniu.core.errors import Problem
from shuniu.core.traffic.distributions import Exponential, Fixed, LogNormal, Uniform
from shuniu.core.traffic.errors import FieldError, WorkloadError
from shuniu.core.traffic.streams import ChatStream, PlainStream, TraceStream
from shuniu.core.traffic.trace import scan_trace
from shuniu.core.traffic.workload import Workload

__all__ = ["load_workload"]


_TAGGED: dict[str, type[Options]] = {
    "plain": PlainStream,
    "chat": ChatStream,
    "trace": TraceStream,
    "fixed": Fixed,
    "uniform": Uniform,
    "lognormal": LogNormal,
    "exponential": Exponential,
}


def _model_in(annotation: Any) -> type[Options] | None:
    """The first pydantic model inside an annotation (list[X], X | None, Annotated[X, ...])."""
    if isinstance(annotation, type) and issubclass(annotation, Options):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or getattr(annotation, "__metadata__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    origin = getattr(annotation, "__origin__", None)
    return _model_in(origin) if origin is not None and origin is not annotation else None


def _model_at(loc: tuple[Any, ...]) -> type[Options] | None:
    """The model at a pydantic error location (union tags pick the member)."""
    current: type[Options] | None = Workload
    for part in loc:
        if isinstance(part, int):
            continue
        if current is not None and part in current.model_fields:
            current = _model_in(current.model_fields[part].annotation)
        elif part in _TAGGED:
            current = _TAGGED[part]
        else:
            return None
    return current


def _clean(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """An error location as a path in the data: pydantic's union tags removed, and a last
    step that is not in the data kept only where it names a missing field of a mapping."""
    out: list[Any] = []
    for i, part in enumerate(loc):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        elif i < len(loc) - 1 or part in _TAGGED or not isinstance(data, dict):
            continue
        out.append(part)
    return tuple(out)


def _problems(exc: ValidationError, data: Any, lines: dict[tuple[Any, ...], int]) -> list[Problem]:
    problems = []
    for err in exc.errors(include_url=False):
        raw = tuple(err["loc"])
        loc = _clean(raw, data)
        kind, message = err["type"], err["msg"]
        ctx = err.get("ctx") or {}
        if kind == "value_error" and isinstance(ctx.get("error"), FieldError):
            loc = _clean((*loc, *ctx["error"].loc), data)
            message = ctx["error"].message
        elif kind == "value_error":
            message = str(ctx.get("error", message))
        elif kind == "extra_forbidden":
            model = _model_at(raw[:-1])
            message = f"unknown field {raw[-1]!r}"
            if model is not None:
                message += "; expected one of: " + ", ".join(sorted(model.model_fields))
        elif kind == "missing":
            message = "required field is missing"
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            field = "dist" if "dist" in str(ctx.get("discriminator", "")) else "type"
            loc = (*loc, field)
            expected = ctx.get("expected_tags") or (
                "'fixed', 'uniform', 'lognormal', 'exponential'"
                if field == "dist"
                else "'plain', 'chat', 'trace'"
            )
            got = f"{ctx['tag']!r}" if "tag" in ctx else "nothing"
            message = f"expected one of {expected} (got {got})"
            if kind == "union_tag_not_found" and field == "dist":
                message = f"required field is missing; one of {expected}"
        elif kind in ("model_attributes_type", "model_type") and _model_at(raw) is Fixed:
            message = f"expected a number or a mapping with `dist:` (got {err.get('input')!r})"
        elif "input" in err and not isinstance(err["input"], dict | list):
            message += f" (got {err['input']!r})"
        problems.append(Problem(field_path(loc), message, line_for(lines, loc)))
    return problems


def load_workload(
    source: str | Path, *, text: str | None = None, env: dict[str, str] | None = None
) -> Workload:
    """Read and validate a workload: ``source`` is a file path, or YAML text (a ``str``
    holding a newline); ``text`` gives the YAML with ``source`` naming it. ``${VAR}`` and
    ``${VAR:-default}`` are interpolated as in deployment files. Relative trace paths are
    resolved against the file's folder (the working directory for text). Raises
    :class:`WorkloadError` (a :class:`ConfigError`) listing every problem with its line."""
    base_dir = Path.cwd()
    if text is None and isinstance(source, str) and "\n" in source:
        text, name = source, "<text>"
    elif text is None:
        name = str(source)
        try:
            text = Path(source).read_text("utf-8")
        except OSError as exc:
            raise WorkloadError([Problem("", f"cannot read file: {exc.strerror}")], name) from None
        base_dir = Path(source).parent
    else:
        name = str(source)
    data, lines = parse_yaml(text, name, WorkloadError)
    if not isinstance(data, dict):
        raise WorkloadError([Problem("", "the file must be a YAML mapping with a `streams:` list", 1)], name)
    problems: list[Problem] = []
    data = interpolate_env(data, problems, env, lines=lines)
    try:
        workload: Workload | None = Workload.model_validate(data)
    except ValidationError as exc:
        problems.extend(_problems(exc, data, lines))
        workload = None
    if workload is not None:
        for i, stream in enumerate(workload.streams):
            if isinstance(stream, TraceStream):
                loc = ("streams", i, "path")
                for message in scan_trace(base_dir / stream.path).problems:
                    problems.append(Problem(field_path(loc), message, line_for(lines, loc)))
    if workload is None or problems:
        raise WorkloadError(problems, name)
    if workload.name is None and name != "<text>":
        workload = workload.model_copy(update={"name": Path(name).stem})
    return workload.with_base_dir(base_dir)
