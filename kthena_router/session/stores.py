"""Where pins live: MemoryStore (the router's shared table) or RedisStore (several routers).

Both map a session digest (route + key, hashed: no raw session material is stored) to an
endpoint token, refresh the expiry on every read (sliding), and write the new endpoint
when a key moves. A store that cannot answer raises StoreUnavailable: the request is
then scheduled as if it had no session key.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from pathlib import Path
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from .config import RedisStoreSettings
from .shared_table import SharedTable

__all__ = ["MemoryStore", "RedisStore", "Store", "StoreUnavailable", "TABLE_FILE"]

log = logging.getLogger(__name__)

TABLE_FILE = "session-sticky-{capacity}.tbl"  # in the runtime dir; the size is part of the name


class StoreUnavailable(Exception):
    pass


class Store(Protocol):
    backend: str

    def token(self, endpoint_key: str) -> Any: ...

    async def get(self, digest: bytes, ttl_s: int) -> Any | None: ...

    async def put(self, digest: bytes, token: Any, ttl_s: int) -> None: ...

    async def close(self) -> None: ...


def _u64(data: bytes) -> int:
    return int.from_bytes(data[:8], "little") | 1  # never 0: 0 marks an empty slot


class MemoryStore:
    backend = "memory"

    def __init__(self, capacity: int, runtime_dir: str = "") -> None:
        path = Path(runtime_dir) / TABLE_FILE.format(capacity=capacity) if runtime_dir else None
        self.table = SharedTable(capacity, path)
        self._tokens: dict[str, int] = {}

    def token(self, endpoint_key: str) -> int:
        tok = self._tokens.get(endpoint_key)
        if tok is None:
            if len(self._tokens) > 4096:  # pod churn must not grow it
                self._tokens.clear()
            tok = self._tokens[endpoint_key] = _u64(hashlib.blake2b(endpoint_key.encode(), digest_size=8).digest())
        return tok

    async def get(self, digest: bytes, ttl_s: int) -> int | None:
        return self.table.get(_u64(digest), int(time.time() * 1000), ttl_s * 1000)

    async def put(self, digest: bytes, token: int, ttl_s: int) -> None:
        self.put_now(digest, token, ttl_s)

    def put_now(self, digest: bytes, token: int, ttl_s: int) -> None:
        self.table.put(_u64(digest), token, int(time.time() * 1000), ttl_s * 1000)

    async def close(self) -> None:
        self.table.close()


class RedisStore:
    """One client (connection pool) per worker. GETEX reads and refreshes in one round trip;
    every wait (a pooled connection, connect, the reply) is bounded by `timeout_s` and
    nothing is retried.
    After a failure Redis is left alone for `retry_after_s`, so that an outage costs the
    requests nothing but the lost affinity (no timeout per request)."""

    backend = "redis"

    def __init__(self, cfg: RedisStoreSettings) -> None:
        self.cfg = cfg
        self.prefix = cfg.key_prefix.encode()
        pool = aioredis.BlockingConnectionPool(
            host=cfg.host, port=cfg.port, db=cfg.db, password=cfg.password, max_connections=64,
            timeout=cfg.timeout_s, socket_timeout=cfg.timeout_s, socket_connect_timeout=cfg.timeout_s,
            retry=Retry(NoBackoff(), 0))
        self.client = aioredis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))
        self.down_until = 0.0
        self.on_error: Any = None  # (backend, op) -> None: the error metric

    def token(self, endpoint_key: str) -> bytes:
        return endpoint_key.encode()

    def _key(self, digest: bytes) -> bytes:
        return self.prefix + digest.hex().encode()

    async def get(self, digest: bytes, ttl_s: int) -> bytes | None:
        self._check_up()
        try:
            value = await self.client.getex(self._key(digest), ex=ttl_s)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            raise self._failed("get", exc) from None
        if self.down_until:
            self._recovered()
        return value  # type: ignore[no-any-return]

    async def put(self, digest: bytes, token: bytes, ttl_s: int) -> None:
        self._check_up()
        try:
            await self.client.set(self._key(digest), token, ex=ttl_s)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            raise self._failed("put", exc) from None
        if self.down_until:
            self._recovered()

    def _check_up(self) -> None:
        if self.down_until and time.monotonic() < self.down_until:
            raise StoreUnavailable(f"redis {self.cfg.address} failed recently")

    def _failed(self, op: str, exc: BaseException) -> StoreUnavailable:
        first = not self.down_until
        self.down_until = time.monotonic() + self.cfg.retry_after_s
        if self.on_error is not None:
            self.on_error(self.backend, op)
        if first:  # once per outage, not per request
            log.warning("session stickiness: redis %s unavailable (%s: %s); scheduling without affinity, "
                        "retrying every %gs", self.cfg.address, type(exc).__name__, exc, self.cfg.retry_after_s)
        return StoreUnavailable(str(exc))

    def _recovered(self) -> None:
        log.info("session stickiness: redis %s reachable again", self.cfg.address)
        self.down_until = 0.0

    async def close(self) -> None:
        await self.client.aclose()
