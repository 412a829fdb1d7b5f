"""Bytes-per-token learning for the approximate prefix index (pure arithmetic)."""

from __future__ import annotations

import pytest

from kthena_router.scheduling.index_sizing import HEADROOM, MAX_BYTES_PER_TOKEN, MIN_BYTES_PER_TOKEN, \
    PRIOR_BYTES_PER_TOKEN, RESIZE_STEP, IndexSizer


def test_prior_until_traffic_moves_the_estimate():
    s = IndexSizer(64)
    assert s.bytes_per_token == PRIOR_BYTES_PER_TOKEN
    assert s.capacity(64_000) == 64_000 * 4 * HEADROOM / 64
    # traffic at the prior's own ratio never asks for a resize
    assert not any(s.observe(4000, 1000) for _ in range(100))


def test_converges_and_asks_for_a_resize_once_per_step():
    s = IndexSizer(64)
    asks = 0
    for _ in range(3000):
        if s.observe(11_000, 1000):  # 11 B/token
            s.apply()
            asks += 1
    assert s.bytes_per_token == pytest.approx(11.0, rel=0.01)
    assert s.applied == pytest.approx(11.0, rel=RESIZE_STEP)
    # 4 -> 11 in >10% steps: a handful of resizes, not one per request
    assert 3 <= asks <= 12
    assert s.capacity(64_000) == pytest.approx(64_000 * 11 * HEADROOM / 64, rel=RESIZE_STEP)


def test_follows_a_change_of_traffic_and_ignores_empty_reports():
    s = IndexSizer(64)
    for _ in range(3000):
        s.observe(11_000, 1000)
    for _ in range(5000):
        s.observe(3000, 1000)
    assert s.bytes_per_token == pytest.approx(3.0, rel=0.05)
    before = s.bytes_per_token
    assert not s.observe(0, 10) and not s.observe(10, 0)
    assert s.bytes_per_token == before
    assert s.capacity(0) == 1


def test_a_misreporting_engine_cannot_collapse_or_explode_the_index():
    low, high = IndexSizer(64), IndexSizer(64)
    for _ in range(3000):
        for s, (b, t) in ((low, (10, 1_000_000)), (high, (1_000_000, 1))):
            if s.observe(b, t):
                s.apply()
    assert low.applied == MIN_BYTES_PER_TOKEN and high.applied == MAX_BYTES_PER_TOKEN
    assert low.capacity(64_000) == 64_000 * HEADROOM / 64
