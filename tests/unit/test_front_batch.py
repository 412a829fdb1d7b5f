"""front/batch.py: merged prometheus writes give the exact samples of direct writes."""

from __future__ import annotations

import asyncio
import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kthena_router.front.batch import MetricBatch


def _families(reg: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in reg.collect() for s in fam.samples if not s.name.endswith("_created")}


def _metrics(reg: CollectorRegistry) -> tuple[Counter, Gauge, Histogram]:
    return (Counter("c_total", "c", ["k"], registry=reg), Gauge("g", "g", ["k"], registry=reg),
            Histogram("h_seconds", "h", ["k"], buckets=(0.01, 0.1, 1.0), registry=reg))


def test_batched_writes_equal_direct_writes() -> None:
    direct, merged = CollectorRegistry(), CollectorRegistry()
    c1, g1, h1 = _metrics(direct)
    c2, g2, h2 = _metrics(merged)
    batch = MetricBatch()
    values = [0.005, 0.01, 0.05, 0.5, 2.0, 0.1, 1.0, 0.0, -1.0, 7.5]

    async def run() -> None:  # in a loop: nothing is written before the flush
        for i, v in enumerate(values):
            k = "a" if i % 3 else "b"
            c1.labels(k).inc(i)
            g1.labels(k).inc(1 if i % 2 else -1)
            h1.labels(k).observe(v)
            batch.add(c2.labels(k), i)
            batch.add(g2.labels(k), 1 if i % 2 else -1)
            batch.observe(h2.labels(k), v)
        assert _families(merged) != _families(direct)
        batch.flush()
        assert _families(merged) == _families(direct)
        assert not batch.deltas and not batch.observed

    asyncio.run(run())


def test_nan_lands_in_no_bucket_like_observe() -> None:
    direct, merged = CollectorRegistry(), CollectorRegistry()
    _, _, h1 = _metrics(direct)
    _, _, h2 = _metrics(merged)
    batch = MetricBatch()

    async def run() -> None:  # merged in one flush (not written one by one)
        for v in (math.nan, 0.5, math.nan):
            h1.labels("x").observe(v)
            batch.observe(h2.labels("x"), v)
        assert len(batch.observed[h2.labels("x")]) == 3
        batch.flush()

    asyncio.run(run())
    d, m = _families(direct), _families(merged)
    assert {k: v for k, v in d.items() if "sum" not in k[0]} == {k: v for k, v in m.items() if "sum" not in k[0]}


def test_flush_is_scheduled_once_per_loop_iteration() -> None:
    reg = CollectorRegistry()
    c, _, h = _metrics(reg)
    batch = MetricBatch()

    async def run() -> tuple[float, float]:
        batch.add(c.labels("a"), 2)
        batch.observe(h.labels("a"), 0.2)
        batch.add(c.labels("a"), 3)
        before = reg.get_sample_value("c_total", {"k": "a"}) or 0.0
        await asyncio.sleep(0)  # the loop runs the scheduled flush
        return before, reg.get_sample_value("c_total", {"k": "a"}) or 0.0

    before, after = asyncio.run(run())
    assert (before, after) == (0.0, 5.0)
    assert reg.get_sample_value("h_seconds_count", {"k": "a"}) == 1.0
    assert not batch.scheduled


def test_without_a_loop_writes_at_once() -> None:
    reg = CollectorRegistry()
    c, _, _ = _metrics(reg)
    MetricBatch().add(c.labels("a"), 4)
    assert reg.get_sample_value("c_total", {"k": "a"}) == 4.0
