"""Token buckets: the local one (in this worker) and the local side of a global one (a lease).

Semantics, the same for both and for Kthena's limiter: capacity = the limit per unit,
refilled continuously at capacity/unit per second, full at start. Admission needs `need`
tokens there and takes `want` (at least `need`): input takes its estimate, output needs one
token (Kthena's rule) and reserves the request's max_tokens in full, so concurrent requests
are not all admitted on the same last tokens. What the reservation finds missing is a debt
at once: the next admission waits until refills have paid it. (Reserving only what is there
let every refilled token admit one more request whose shortfall showed only as it
streamed.) Charges after admission (the real prompt size, output beyond its reservation)
are taken unconditionally and may drive the bucket below zero, so nothing the engines did
goes uncounted (Kthena drops an output charge the bucket cannot cover).

A global bucket lives in Redis (redis_store.py). This worker holds a lease: tokens taken
from Redis in one round trip (`chunk` more than the request needs) and spent locally, so
most requests make no round trip. Charges go against the lease; a negative lease (debt) is
paid to Redis in the background. An unused lease goes back to Redis after `lease_idle_s`.
"""

from __future__ import annotations

import math
import time


class Refusal:
    """Why a bucket refused, with what the x-ratelimit-* headers need."""

    __slots__ = ("limit", "remaining", "retry_after_s", "reset_s")

    def __init__(self, limit: float, remaining: float, retry_after_s: float, reset_s: float) -> None:
        self.limit = limit
        self.remaining = remaining
        self.retry_after_s = retry_after_s
        self.reset_s = reset_s


class LocalBucket:
    """A token bucket in this worker. `now` is time.monotonic()."""

    __slots__ = ("capacity", "rate", "tokens", "ts")

    def __init__(self, capacity: float, rate: float, now: float) -> None:
        self.capacity = capacity
        self.rate = rate  # tokens per second
        self.tokens = capacity
        self.ts = now

    def reshape(self, capacity: float, rate: float) -> None:
        """A reload changed the limit: keep what was spent, within the new capacity."""
        if capacity != self.capacity or rate != self.rate:
            self.tokens = min(capacity, self.tokens + capacity - self.capacity)
            self.capacity, self.rate = capacity, rate

    def _refill(self, now: float) -> float:
        tokens = self.tokens
        if now > self.ts:
            if tokens < self.capacity:
                tokens = self.tokens = min(self.capacity, tokens + (now - self.ts) * self.rate)
            self.ts = now
        return tokens

    def acquire(self, need: float, want: float, now: float) -> Refusal | float:
        """Admitted when `need` is there: takes `want` (what is missing: a debt) and returns it."""
        tokens = self._refill(now)
        if tokens >= need:
            took = max(need, want) if want > 0 else 0.0
            self.tokens = tokens - took
            return took
        return Refusal(self.capacity, tokens, (need - tokens) / self.rate, (self.capacity - tokens) / self.rate)

    def charge(self, n: float) -> None:
        """Unconditional (n < 0 gives back); may go below zero."""
        self.tokens = min(self.capacity, self.tokens - n)

    def full(self, now: float) -> bool:
        return self._refill(now) >= self.capacity


class LeasedBucket:
    """This worker's side of a bucket kept in Redis: the lease and the last remote reading.

    The store (redis_store.RedisStore) does the round trips; this object is pure state."""

    __slots__ = ("key", "capacity", "rate", "chunk", "lease", "remote", "used_at", "paying")

    def __init__(self, key: str, capacity: float, rate: float, lease_percent: float) -> None:
        self.key = key
        self.capacity = capacity
        self.rate = rate
        self.chunk = math.floor(capacity * lease_percent / 100.0)  # taken beyond the need per round trip
        self.lease = 0.0  # tokens held by this worker (negative: debt not yet paid to Redis)
        self.remote = capacity  # Redis' tokens at the last round trip (for headers)
        self.used_at = time.monotonic()
        self.paying = False  # a debt payment is in flight

    def reshape(self, capacity: float, rate: float, lease_percent: float) -> None:
        self.capacity, self.rate = capacity, rate
        self.chunk = math.floor(capacity * lease_percent / 100.0)

    def acquire_local(self, need: float, want: float) -> float | None:
        """From the lease alone (no round trip): what was taken, None = the lease does not
        cover the whole reservation. Then Redis decides (RedisStore.take, the lease counted
        with Redis' tokens): a lease of a few tokens must not admit a request while the
        shared bucket is in debt."""
        took = max(need, want) if want > 0 else 0.0
        if self.lease >= need and self.lease >= took:
            self.lease -= took
            self.used_at = time.monotonic()
            return took
        return None

    def charge(self, n: float) -> bool:
        """Unconditional; True when the lease is now a debt to pay to Redis."""
        self.lease -= n
        self.used_at = time.monotonic()
        return self.lease < 0 and not self.paying

    def refusal(self, need: float) -> Refusal:
        have = max(0.0, self.remote) + max(0.0, self.lease)
        return Refusal(self.capacity, have, max(0.0, need - have) / self.rate,
                       max(0.0, self.capacity - have) / self.rate)
