"""A work queue of object keys with client-go's semantics, on asyncio.

- Deduplicated: a key waiting in the queue is there once, however often it is added.
- Per-key serialization: a key being processed is not handed out again; an add while it is
  processed marks it dirty and it is queued again when `done(key)` is called. So one
  reconcile per key runs at a time, and no change seen meanwhile is lost.
- Delayed adds (`add_after`): a heap of due times; a key waiting twice keeps the earlier.
- Rate-limited requeue (`add_rate_limited`): per-key exponential backoff with jitter,
  reset by `forget(key)` after a success.
- The clock is injectable, so tests drive delays without waiting on the wall clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, Protocol, TypeVar

__all__ = ["Clock", "FakeClock", "LoopClock", "QueueShutDown", "RateLimiter", "RetryableError", "WorkQueue", "run_worker"]

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class QueueShutDown(Exception):
    pass


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class LoopClock:
    """The event loop's monotonic clock."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class FakeClock:
    """A clock that moves only when `advance` is called (tests)."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.t + max(0.0, seconds), next(self._seq), fut))
        self._wake_due()
        await fut

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self._wake_due()

    def _wake_due(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self.t:
            fut = heapq.heappop(self._sleepers)[2]
            if not fut.done():
                fut.set_result(None)


class RateLimiter(Generic[K]):
    """Per-key exponential backoff: base * 2**failures, capped, with "equal jitter" (between
    half and all of it) so keys failing together do not retry in lockstep."""

    def __init__(self, base: float = 0.1, cap: float = 60.0, rng: random.Random | None = None) -> None:
        self.base, self.cap = base, cap
        self._failures: dict[K, int] = {}
        self._rng = rng or random.Random()

    def when(self, key: K) -> float:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        delay = min(self.cap, self.base * (2 ** min(n, 40)))
        return delay / 2 + self._rng.uniform(0, delay / 2)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)


class WorkQueue(Generic[K]):
    def __init__(self, clock: Clock | None = None, limiter: RateLimiter[K] | None = None) -> None:
        self.clock: Clock = clock or LoopClock()
        self.limiter: RateLimiter[K] = limiter or RateLimiter()
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()  # wants processing (queued, or queued again after done)
        self._processing: set[K] = set()
        self._ready = asyncio.Event()
        self._delayed: list[tuple[float, int, K]] = []
        self._due: dict[K, float] = {}  # key -> its earliest pending due time
        self._seq = itertools.count()
        self._delay_changed = asyncio.Event()
        self._delay_task: asyncio.Task[None] | None = None
        self._shutdown = False

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def processing(self) -> frozenset[K]:
        return frozenset(self._processing)

    def waiting_delayed(self) -> dict[K, float]:
        """Keys waiting for a delayed add, with their due times (tests, debug)."""
        return dict(self._due)

    def add(self, key: K) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # queued again by done()
        self._queue.append(key)
        self._ready.set()

    def add_after(self, key: K, delay: float) -> None:
        if self._shutdown:
            return
        if delay <= 0:
            self.add(key)
            return
        due = self.clock.now() + delay
        if key in self._due and self._due[key] <= due:
            return
        self._due[key] = due
        heapq.heappush(self._delayed, (due, next(self._seq), key))
        self._delay_changed.set()
        if self._delay_task is None:
            self._delay_task = asyncio.get_running_loop().create_task(self._delay_loop(), name="workqueue delays")

    def add_rate_limited(self, key: K) -> None:
        self.add_after(key, self.limiter.when(key))

    def forget(self, key: K) -> None:
        self.limiter.forget(key)

    async def get(self) -> K:
        while True:
            if self._shutdown:
                raise QueueShutDown()
            if self._queue:
                key = self._queue.popleft()
                self._processing.add(key)
                self._dirty.discard(key)
                return key
            self._ready.clear()
            await self._ready.wait()

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._ready.set()

    def shut_down(self) -> None:
        self._shutdown = True
        self._ready.set()
        if self._delay_task is not None:
            self._delay_task.cancel()

    async def _delay_loop(self) -> None:
        while not self._shutdown:
            now = self.clock.now()
            while self._delayed and self._delayed[0][0] <= now:
                due, _, key = heapq.heappop(self._delayed)
                if self._due.get(key) == due:
                    del self._due[key]
                    self.add(key)
            self._delay_changed.clear()
            waits: list[asyncio.Task[None]] = [asyncio.ensure_future(self._delay_changed.wait())]
            if self._delayed:
                waits.append(asyncio.ensure_future(self.clock.sleep(self._delayed[0][0] - now)))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()


Handler = Callable[[K], Awaitable[float | None]]


async def run_worker(queue: WorkQueue[K], handler: Handler[K]) -> None:
    """Process keys until the queue shuts down. The handler returns None (done: the key's
    backoff is reset), a delay in seconds (look again then), or raises (rate-limited retry)."""
    while True:
        try:
            key = await queue.get()
        except QueueShutDown:
            return
        try:
            again = await handler(key)
        except asyncio.CancelledError:
            queue.done(key)
            raise
        except Exception as exc:
            expected = isinstance(exc, RetryableError)
            log.log(logging.INFO if expected else logging.WARNING, "reconcile of %s failed (retry %d): %s", key,
                    queue.limiter.failures(key) + 1, exc, exc_info=not expected)
            queue.add_rate_limited(key)
        else:
            queue.forget(key)
            if again is not None:
                queue.add_after(key, again)
        queue.done(key)


class RetryableError(Exception):
    """An expected transient failure (a conflict, a stale cache): retried without a traceback."""
