"""SharedIndexSync against a real redis-server: a dispatch after a quiet spell reaches the
other replica without waiting for syncInterval (published at once, read by a blocking
XREAD); dispatches during the interval are batched, not lost; a Redis outage requeues the
batch, which is published once Redis is back, with no further dispatch to wake it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

import redis_harness
from kthena_router._core import BlockHashes
from kthena_router.shared_index.config import SharedIndexSettings
from kthena_router.shared_index.sync import SharedIndexMetrics, SharedIndexSync

LONG = 30.0  # syncInterval: far longer than any wait below


class Recorder:
    def __init__(self) -> None:
        self.got: list[tuple[str, bytes]] = []

    def insert(self, key: str, hashes: BlockHashes) -> bool:
        self.got.append((key, hashes.to_bytes()))
        return True


def chain(*words: int) -> BlockHashes:
    return BlockHashes.from_bytes(b"".join(w.to_bytes(8, "little") for w in words))


async def until(cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def make(address: str, sync: float = LONG, **kw: float) -> tuple[SharedIndexSync, Recorder]:
    settings = SharedIndexSettings(redis_address=address, key="t:push", sync_interval_s=sync, **kw)
    target = Recorder()
    return SharedIndexSync(settings, target, SharedIndexMetrics(CollectorRegistry())), target


def run_with(redis: redis_harness.RedisServer, scenario) -> None:  # type: ignore[no-untyped-def]
    try:
        asyncio.run(scenario())
    finally:
        redis.stop()


def test_a_dispatch_reaches_the_other_replica_within_a_round_trip(tmp_path: Path) -> None:
    redis = redis_harness.start_redis(tmp_path)

    async def scenario() -> None:
        a, _ = make(redis.address)
        b, seen = make(redis.address)
        a.start()
        b.start()
        try:
            await until(lambda: a.first_round_done and b.first_round_done)
            a.record("10.0.0.1:8000", chain(1, 2, 3))
            await until(lambda: len(seen.got) == 1)  # not after syncInterval (30 s)
            assert seen.got == [("10.0.0.1:8000", chain(1, 2, 3).to_bytes())]
            # within the interval: batched, published when it ends (close publishes the rest)
            a.record("10.0.0.2:8000", chain(4, 5))
            a.record("10.0.0.2:8000", chain(4, 5))  # repeats of one chain collapse
            await asyncio.sleep(0.3)
            assert len(seen.got) == 1
            await a.close()
            await until(lambda: len(seen.got) == 2)
            assert seen.got[1] == ("10.0.0.2:8000", chain(4, 5).to_bytes())
            assert a.metrics.published._value.get() == 2
        finally:
            await a.close()
            await b.close()

    run_with(redis, scenario)


def test_a_batch_that_failed_is_published_once_redis_is_back(tmp_path: Path) -> None:
    redis = redis_harness.start_redis(tmp_path)

    async def scenario() -> None:
        # a short interval, so that the publisher's pause after the failed try ends soon
        a, _ = make(redis.address, sync=0.05, redis_timeout_s=0.2, redis_retry_s=0.2)
        b, seen = make(redis.address)
        a.start()
        b.start()
        try:
            await until(lambda: a.first_round_done and b.first_round_done)
            redis.kill()
            a.record("10.0.0.1:8000", chain(7))
            await until(lambda: a.down_until > 0)
            assert a.pending  # requeued, not dropped
            redis.start()
            await until(lambda: len(seen.got) == 1, timeout=20)  # no new dispatch needed
            assert seen.got == [("10.0.0.1:8000", chain(7).to_bytes())]
        finally:
            await a.close()
            await b.close()

    run_with(redis, scenario)

