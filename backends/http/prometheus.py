"""Reading the few series a load view needs from an engine's Prometheus text page, without
a full parser: one regular expression over the page finds the wanted sample lines. Shared
by the load parsers of every HTTP backend (vLLM, TGI, TensorRT-LLM, Triton, MindIE)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator

__all__ = ["MetricsError", "label_dict", "samples", "series_pattern"]


class MetricsError(ValueError):
    """An engine's metrics page holds none of the series its load parser needs (not that
    kind of server, or a wrong path)."""


_LABEL = re.compile(rb'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def series_pattern(names: Iterable[str]) -> re.Pattern[bytes]:
    """A pattern for the sample lines of ``names``: NAME, optional ``{labels}`` (quoted values
    may hold any escaped character, ``}`` included), blanks, VALUE. Lines start after a
    newline, so :func:`samples` prefixes the page with one."""
    return re.compile(
        rb"\n(" + b"|".join(re.escape(n.encode()) for n in names) + rb")"
        rb"(\{(?:[^\"}]|\"(?:[^\"\\]|\\.)*\")*\})?"
        rb"[ \t]+(\S+)"
    )


def samples(text: bytes | str, pattern: re.Pattern[bytes]) -> Iterator[tuple[bytes, bytes | None, float]]:
    """``(name, raw labels or None, value)`` of every wanted sample with a finite value: a
    value that is not a number is skipped (the rest of the page still counts), and NaN or
    Inf (a broken exporter, prometheus-cpp's "Nan" for empty summaries) would poison sums."""
    raw = text.encode() if isinstance(text, str) else text
    for m in pattern.finditer(b"\n" + raw):
        name, labels, value = m.group(1, 2, 3)
        try:
            v = float(value)
        except ValueError:
            continue
        if math.isfinite(v):
            yield name, labels, v


def label_dict(labels: bytes | None) -> dict[bytes, bytes]:
    """``{name: value}`` of a sample's raw ``{...}`` labels."""
    return dict(_LABEL.findall(labels)) if labels else {}
