"""HitRealization's bookkeeping (pure logic; the end-to-end measurement is in
tests/integration/test_scheduling_hit_realization.py)."""

from __future__ import annotations

import math

import pytest

from kthena_router.scheduling.hit_realization import DECAY, HitRealization


def test_unmeasured_until_a_hit_is_predicted() -> None:
    h = HitRealization()
    assert math.isnan(h.scraped(1, 0.5))  # nothing dispatched
    h.dispatched(1, 0, 100)  # a cold prompt: no hit predicted
    assert math.isnan(h.scraped(1, 0.0))
    h.dispatched(1, 80, 100)
    assert h.scraped(1, 0.4) == pytest.approx(0.5)  # 40 of the 80 predicted blocks served


def test_reported_rates_weigh_by_the_blocks_dispatched_and_decay() -> None:
    h = HitRealization()
    h.dispatched(1, 90, 100)
    h.dispatched(1, 0, 100)  # the interval's predicted rate is 45%
    assert h.scraped(1, 0.45) == pytest.approx(1.0)
    h.dispatched(1, 100, 100)
    got = h.scraped(1, 0.0)  # the engine served none of it
    assert got == pytest.approx(DECAY * 90 / (DECAY * 90 + 100))
    for _ in range(40):  # the engine keeps missing what the index predicts
        h.dispatched(1, 100, 100)
        got = h.scraped(1, 0.0)
    assert got < 0.01


def test_clamped_and_a_failed_scrape_keeps_the_figure() -> None:
    h = HitRealization()
    h.dispatched(2, 10, 100)
    assert h.scraped(2, 0.9) == 1.0  # more hits than predicted: at least as credited
    h.forget(2)
    assert math.isnan(h.realization(2))
    h.dispatched(2, 50, 100)
    assert h.scraped(2, 0.2) == pytest.approx(0.4)
    h.dispatched(2, 50, 100)
    assert h.scraped(2, None) == pytest.approx(0.4)  # not reported: the interval waits
    got = h.scraped(2, 0.1)  # reported: the held interval against that rate
    assert got == pytest.approx((DECAY * 20 + 0.1 * 100) / (DECAY * 50 + 50))


def test_endpoints_are_independent() -> None:
    h = HitRealization()
    h.dispatched(1, 50, 100)
    h.dispatched(2, 50, 100)
    assert h.scraped(1, 0.25) == pytest.approx(0.5)
    assert math.isnan(h.realization(2))  # not scraped yet
    assert h.scraped(2, 0.5) == pytest.approx(1.0)
