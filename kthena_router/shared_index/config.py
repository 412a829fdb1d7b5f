"""The router configuration's `sharedPrefixIndex` section (ours; Kthena has no such field).

    sharedPrefixIndex:
      redis: {address: "10.0.0.5:6379"}   # required: the Redis every replica shares
      key: kthena:prefix-index             # the stream key (one per router fleet)
      syncInterval: 50ms                   # own dispatches: the first at once, then batched this long
      ttl: 5m                              # entries older than this are neither merged nor kept
      maxEntries: 100000                   # stream length cap (approximate trimming)
      maxPending: 10000                    # dispatches buffered while Redis is slow/down (oldest dropped)
      redisTimeout: 250ms                  # one Redis call; after a failure Redis is skipped for redisRetry
      redisRetry: 1s

The Redis settings are spelled as `rateLimits` spells them (ratelimit/config.py). The
section needs a prefix plugin (prefix-cache or kvcache-aware) in the scheduler: without
one nothing is hashed, so nothing could be shared, and the section would be ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..config.checks import check_int, check_mapping, check_str, is_host_port, join_path, positive_duration

__all__ = ["SharedIndexSettings", "parse_shared_index"]

_KEYS = ("redis", "key", "syncInterval", "ttl", "maxEntries", "maxPending", "redisTimeout", "redisRetry")


class Collector(Protocol):
    def err(self, path: str, message: str) -> None: ...


@dataclass(frozen=True, slots=True)
class SharedIndexSettings:
    redis_address: str
    key: str = "kthena:prefix-index"
    sync_interval_s: float = 0.05
    ttl_s: float = 300.0
    max_entries: int = 100_000
    max_pending: int = 10_000
    redis_timeout_s: float = 0.25
    redis_retry_s: float = 1.0


def parse_shared_index(c: Collector, v: Any) -> SharedIndexSettings | None:
    """The section (None: absent, each replica keeps its own index only)."""
    if v is None:
        return None
    m = check_mapping(c, v, "sharedPrefixIndex", _KEYS, required=("redis",))
    if m is None:
        return None
    address = None
    if m.get("redis") is not None:
        r = check_mapping(c, m["redis"], "sharedPrefixIndex.redis", ("address",), required=("address",))
        if r is not None and r.get("address") is not None:
            address = check_str(c, r["address"], "sharedPrefixIndex.redis.address")
            if address is not None and not is_host_port(address):
                c.err("sharedPrefixIndex.redis.address", f"must be host:port, got {address!r}")
                address = None
    key = check_str(c, m.get("key"), "sharedPrefixIndex.key") or "kthena:prefix-index"
    p = "sharedPrefixIndex"
    # sub-millisecond periods would spin the event loop; hours would make the index useless
    sync = positive_duration(c, m.get("syncInterval"), join_path(p, "syncInterval"), 0.05, 0.001, 60.0)
    ttl = positive_duration(c, m.get("ttl"), join_path(p, "ttl"), 300.0, 1.0, 7 * 86400.0)
    timeout = positive_duration(c, m.get("redisTimeout"), join_path(p, "redisTimeout"), 0.25, 0.001, 60.0)
    retry = positive_duration(c, m.get("redisRetry"), join_path(p, "redisRetry"), 1.0, 0.001, 3600.0)
    if ttl <= sync:
        c.err(join_path(p, "ttl"), f"must be longer than syncInterval ({sync:g}s)")
    max_entries = check_int(c, m.get("maxEntries"), join_path(p, "maxEntries"), 100, 10**9)
    max_pending = check_int(c, m.get("maxPending"), join_path(p, "maxPending"), 1, 10**7)
    if address is None:
        return None
    return SharedIndexSettings(address, key, sync, ttl, max_entries or 100_000, max_pending or 10_000,
                               timeout, retry)
