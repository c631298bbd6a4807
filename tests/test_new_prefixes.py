"""The window of new prompt tokens each endpoint took (both prefix balancers place a new
prefix by it): counted, expired after the window, forgotten when an engine loses its cache."""

from __future__ import annotations

from shuniu.plugins.balancers.new_prefixes import NewPrefixes


def test_new_tokens_count_within_the_window_and_expire_after_it() -> None:
    new = NewPrefixes(window_s=10.0)
    assert new.tokens(0, now=0.0) == 0.0
    new.placed(0, 2000, now=1.0)
    new.placed(0, 1500, now=6.0)
    new.placed(1, 800, now=2.0)
    assert new.tokens(0, now=6.0) == 3500 and new.tokens(1, now=6.0) == 800
    assert new.tokens(0, now=11.5) == 1500  # the first placement is over 10 s old
    assert new.tokens(1, now=12.5) == 0.0
    assert new.tokens(0, now=16.5) == 0.0


def test_an_engine_that_lost_its_cache_starts_from_nothing() -> None:
    new = NewPrefixes(window_s=10.0)
    new.placed(0, 2000, now=1.0)
    new.placed(1, 2000, now=1.0)
    new.forget(0)
    assert new.tokens(0, now=2.0) == 0.0 and new.tokens(1, now=2.0) == 2000
    new.placed(0, 300, now=3.0)
    assert new.tokens(0, now=3.0) == 300
