from __future__ import annotations

import sys

import pytest

from shuniu.core.extras import MissingExtraError, require


def test_missing_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # as if it were not installed
    with pytest.raises(MissingExtraError) as info:
        require("redis", "redis", "The Redis rate-limit store")
    assert "pip install 'shuniu[redis]'" in str(info.value)
    assert "The Redis rate-limit store" in str(info.value)


def test_present_module_is_returned() -> None:
    assert require("json", "none", "JSON").dumps([1]) == "[1]"
