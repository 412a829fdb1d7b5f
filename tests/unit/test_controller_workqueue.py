"""The controller's work queue: deduplication, one reconcile per key at a time (adds while a
key is processed are not lost), delayed and rate-limited requeue on an injected clock."""

from __future__ import annotations

import asyncio
import random

import pytest

from controller.workqueue import FakeClock, QueueShutDown, RateLimiter, WorkQueue, run_worker


async def settle(n: int = 20) -> None:
    """Let ready callbacks run (no wall-clock wait)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_dedup_and_fifo() -> None:
    q: WorkQueue[str] = WorkQueue(FakeClock())
    for k in ("a", "b", "a", "c", "b"):
        q.add(k)
    assert len(q) == 3
    assert [await q.get() for _ in range(3)] == ["a", "b", "c"]


async def test_add_while_processing_requeues_once_on_done() -> None:
    q: WorkQueue[str] = WorkQueue(FakeClock())
    q.add("a")
    key = await q.get()
    q.add("a")
    q.add("a")
    assert len(q) == 0, "a key being processed is not handed out again"
    getter = asyncio.ensure_future(q.get())
    await settle()
    assert not getter.done()
    q.done(key)
    assert await asyncio.wait_for(getter, 1) == "a"
    q.done("a")
    assert len(q) == 0


async def test_per_key_serialization_with_many_workers() -> None:
    """Four workers, keys added over and over: never two reconciles of one key at once, and
    every key is processed after its last add."""
    q: WorkQueue[str] = WorkQueue(FakeClock())
    running: set[str] = set()
    overlaps: list[str] = []
    last_seen_version: dict[str, int] = {}
    version = {"a": 0, "b": 0}

    async def handler(key: str) -> None:
        if key in running:
            overlaps.append(key)
        running.add(key)
        seen = version[key]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        last_seen_version[key] = seen
        running.discard(key)

    workers = [asyncio.ensure_future(run_worker(q, handler)) for _ in range(4)]
    for i in range(50):
        k = "a" if i % 3 else "b"
        version[k] += 1
        q.add(k)
        await asyncio.sleep(0)
    await settle(100)
    q.shut_down()
    await asyncio.gather(*workers)
    assert not overlaps
    assert last_seen_version == version, "the last change of every key was reconciled"


async def test_add_after_keeps_the_earliest_and_waits_for_the_clock() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock)
    q.add_after("a", 10)
    q.add_after("a", 5)   # earlier: wins
    q.add_after("a", 20)  # later: ignored
    q.add_after("b", 7)
    await settle()
    assert len(q) == 0
    clock.advance(4.9)
    await settle()
    assert len(q) == 0
    clock.advance(0.2)
    await settle()
    assert await q.get() == "a"
    clock.advance(2)
    await settle()
    assert await q.get() == "b"
    clock.advance(100)
    await settle()
    assert len(q) == 0, "the superseded due times add nothing"
    q.shut_down()


async def test_rate_limited_backoff_grows_with_jitter_and_forget_resets() -> None:
    lim: RateLimiter[str] = RateLimiter(base=1.0, cap=8.0, rng=random.Random(1))
    delays = [lim.when("k") for _ in range(6)]
    for n, d in enumerate(delays):
        top = min(8.0, 2.0 ** n)
        assert top / 2 <= d <= top
    assert delays[3] > delays[0]
    assert lim.failures("k") == 6
    lim.forget("k")
    assert lim.failures("k") == 0 and lim.when("k") <= 1.0


async def test_worker_retries_failures_with_backoff_and_honours_requested_delay() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock, RateLimiter(base=1.0, cap=60.0, rng=random.Random(0)))
    calls: list[float] = []
    outcomes = [RuntimeError("boom"), RuntimeError("boom"), 30.0, None]

    async def handler(key: str) -> float | None:
        calls.append(clock.now())
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    worker = asyncio.ensure_future(run_worker(q, handler))
    q.add("k")
    await settle()
    assert calls == [0.0]
    # first retry within [0.5, 1], second within [1, 2] after that
    for _ in range(40):
        clock.advance(0.25)
        await settle()
    assert len(calls) == 3
    assert 0.5 <= calls[1] <= 1.25 and 1.0 <= calls[2] - calls[1] <= 2.25
    assert q.limiter.failures("k") == 0, "a success forgets the failures"
    t = calls[2]
    clock.advance(t + 29.9 - clock.now())
    await settle()
    assert len(calls) == 3
    clock.advance(0.2)
    await settle()
    assert len(calls) == 4 and calls[3] - t >= 30
    q.shut_down()
    await worker


async def test_shut_down_wakes_getters() -> None:
    q: WorkQueue[str] = WorkQueue(FakeClock())
    getter = asyncio.ensure_future(q.get())
    await settle()
    q.shut_down()
    with pytest.raises(QueueShutDown):
        await getter
