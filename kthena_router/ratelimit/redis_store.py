"""Global buckets in Redis: one atomic Lua script, leases, debt payment, outage handling.

One RedisStore per address per worker (one redis.asyncio client, a small connection pool).
The script refills and takes/charges/gives in one step with Redis' own clock, so every
router sees the same bucket. Hash fields `tokens` and `last_update` are the ones Kthena's
limiter writes under `kthena:ratelimit:<model>:<input|output>`, so Kthena's route limits
share their bucket with a Kthena router during a migration.

Outage: a failed call (error or `redisTimeout`) marks the store down for `redisRetry`;
meanwhile calls fail at once (StoreDown) and the caller applies the route's fail mode.
The first call after that tries again: recovery needs no restart. Leases held when Redis
went away are still spent locally; debts wait and are paid when it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from .bucket import LeasedBucket, Refusal

log = logging.getLogger(__name__)

__all__ = ["LUA", "RedisStore", "StoreDown"]

# ARGV: op (take|charge|give), need, want, capacity, rate (tokens/s), ttl (s), floor.
# take: if at least `need` is there, grant min(want, tokens) but no less than `floor` (the
# request's whole reservation: what is missing is a debt at once), else nothing.
# charge: subtract `need` unconditionally (may go negative). give: add back, up to capacity.
# Returns {granted, tokens after} as strings (Lua numbers returned as replies are truncated).
LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local cap = tonumber(ARGV[4])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'last_update')
local tokens = tonumber(v[1]) or cap
local last = tonumber(v[2]) or now
if now > last then tokens = math.min(cap, tokens + (now - last) * tonumber(ARGV[5])) end
local op = ARGV[1]
local need = tonumber(ARGV[2])
local grant = 0
if op == 'take' then
  if tokens >= need then
    grant = math.max(need, tonumber(ARGV[7]), math.min(tonumber(ARGV[3]), tokens))
    tokens = tokens - grant
  end
elseif op == 'charge' then
  tokens = tokens - need
  grant = need
else
  tokens = math.min(cap, tokens + need)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'last_update', tostring(now))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[6]))
return {tostring(grant), tostring(tokens)}
"""


class StoreDown(Exception):
    """Redis is unreachable (now, or recently: within redisRetry of the last failure)."""


class RedisStore:
    def __init__(self, address: str, timeout_s: float, retry_s: float, lease_idle_s: float,
                 on_error: Any = None) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self.retry_s = retry_s
        self.lease_idle_s = lease_idle_s
        self.on_error = on_error  # callable(address), counts failures in a metric
        # No client-side retries: an outage must cost one timeout, then the fail mode.
        self.client = aioredis.Redis(host=host, port=int(port), socket_timeout=timeout_s,
                                     socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0),
                                     max_connections=64)
        self.script = self.client.register_script(LUA)
        self.down_until = 0.0
        self.buckets: dict[str, LeasedBucket] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._upkeep: asyncio.Task[None] | None = None

    @property
    def up(self) -> bool:
        return time.monotonic() >= self.down_until

    def bucket(self, key: str, capacity: float, rate: float, lease_percent: float) -> LeasedBucket:
        b = self.buckets.get(key)
        if b is None:
            b = self.buckets[key] = LeasedBucket(key, capacity, rate, lease_percent)
            if self._upkeep is None:
                self._upkeep = asyncio.get_running_loop().create_task(self._upkeep_forever())
        elif b.capacity != capacity or b.rate != rate:
            b.reshape(capacity, rate, lease_percent)
        return b

    async def _call(self, op: str, b: LeasedBucket, need: float, want: float,
                    floor: float = 0.0) -> tuple[float, float]:
        if time.monotonic() < self.down_until:
            raise StoreDown(self.address)
        ttl = max(60, math.ceil(2 * b.capacity / b.rate))  # twice the time to refill from empty
        try:
            res = await self.script(keys=[b.key], args=[op, need, want, b.capacity, b.rate, ttl, floor])
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            if time.monotonic() >= self.down_until:
                log.warning("rate-limit store %s unreachable (%s); retrying in %.1fs", self.address,
                            type(exc).__name__, self.retry_s)
            self.down_until = time.monotonic() + self.retry_s
            if self.on_error is not None:
                self.on_error(self.address)
            raise StoreDown(self.address) from None
        return float(res[0]), float(res[1])

    async def take(self, b: LeasedBucket, need: float, want: float) -> Refusal | float:
        """A round trip for what the lease lacks (to `want`) plus a chunk; admitted when
        `need` is there, the lease and Redis' tokens together; the whole reservation is taken
        (what Redis lacks for it is a debt there at once): returns what was taken (as
        LeasedBucket.acquire_local)."""
        for _ in range(2):  # another request may spend the new lease during the await
            deficit = need - b.lease
            full = max(deficit, want - b.lease)
            granted, b.remote = await self._call("take", b, deficit, full + b.chunk, full)
            if granted <= 0:
                return b.refusal(need)
            b.lease += granted
            took = b.acquire_local(need, want)
            if took is not None:
                return took
        return b.refusal(need)

    def charge(self, b: LeasedBucket, n: float) -> None:
        if b.charge(n) and self.up:
            self._spawn(self._pay(b))

    async def _pay(self, b: LeasedBucket) -> None:
        if b.paying:
            return
        b.paying = True
        try:
            # Charges made during a payment's round trip are paid by the next pass at once:
            # until Redis has them, other routers can admit on tokens already spent.
            while (debt := -b.lease) > 0:
                b.lease += debt
                try:
                    _, b.remote = await self._call("charge", b, debt, 0)
                except StoreDown:
                    b.lease -= debt  # still owed; paid by the upkeep when Redis is back
                    return
        finally:
            b.paying = False

    async def _give_back(self, b: LeasedBucket) -> None:
        lease = b.lease
        if lease <= 0:
            return
        b.lease -= lease
        try:
            _, b.remote = await self._call("give", b, lease, 0)
        except StoreDown:
            b.lease += lease

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _upkeep_forever(self) -> None:
        """Pay debts left by an outage; return leases unused for lease_idle_s."""
        period = min(self.lease_idle_s, self.retry_s) / 2
        while True:
            await asyncio.sleep(period)
            if not self.up:
                continue
            now = time.monotonic()
            for b in list(self.buckets.values()):
                if b.lease < 0 and not b.paying:
                    await self._pay(b)
                elif b.lease > 0 and now - b.used_at >= self.lease_idle_s:
                    await self._give_back(b)

    async def close(self) -> None:
        """Return leases and pay debts (best effort), then close the client."""
        if self._upkeep is not None:
            self._upkeep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._upkeep
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task
        if self.up:
            for b in list(self.buckets.values()):
                with contextlib.suppress(StoreDown):
                    await (self._pay(b) if b.lease < 0 else self._give_back(b))
        with contextlib.suppress(Exception):
            await self.client.aclose()
