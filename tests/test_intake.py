"""The request path's intake checks, at their boundaries."""

from __future__ import annotations

import pytest

from shuniu.core.config import GatewayConfig
from shuniu.core.errors import GatewayError
from shuniu.core.pipeline.intake import Intake


def _headers(total: int) -> list[tuple[bytes, bytes]]:
    """Headers whose names, values and 4 bytes each (": " and CRLF) add up to ``total``."""
    fixed = [(b"host", b"127.0.0.1"), (b"authorization", b"Bearer sk-0123"), (b"x-empty", b"")]
    used = sum(len(k) + len(v) + 4 for k, v in fixed)
    pad = total - used - len(b"x-padding") - 4
    assert pad >= 0
    return [*fixed, (b"x-padding", b"p" * pad)]


@pytest.mark.parametrize("limit", [1024, 4096])
def test_headers_up_to_the_limit_pass_and_one_byte_more_is_431(limit: int) -> None:
    intake = Intake(GatewayConfig(max_header_bytes=limit), pass_trace=False)
    intake.check_headers(_headers(limit))
    with pytest.raises(GatewayError) as err:
        intake.check_headers(_headers(limit + 1))
    assert err.value.status == 431 and err.value.code == "headers_too_large"
    intake.check_headers([])  # no headers at all
