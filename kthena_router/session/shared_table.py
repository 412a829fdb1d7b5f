"""The memory backend: a fixed-size hash table in shared memory, one per router.

granian runs N worker processes and the kernel spreads connections over them, so a table
per worker would send one key to up to N endpoints. This table is an mmap of one file
in the router's runtime directory, opened by every worker of the router, so they share
the pins (and a restarted worker finds them again).

Layout: slots of four little-endian u64 (session hash, endpoint hash, expiry in
milliseconds since the epoch, check), in buckets of 8; a key lives in the bucket its hash
names. A write is not atomic across processes, so each slot carries a check word mixed
from the other three: a slot torn by a concurrent writer fails the check and reads as
empty (that request is scheduled normally and writes the pin again). A full bucket
evicts the entry that expires first: the table is bounded by construction.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

__all__ = ["SharedTable"]

_BUCKET = 8
_SLOT = struct.Struct("<4Q")
_BUCKET_S = struct.Struct(f"<{4 * _BUCKET}Q")
_MASK = (1 << 64) - 1
_K1, _K2 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F


def _check(key: int, ep: int, expires: int) -> int:
    return (key ^ (ep * _K1) ^ (expires * _K2) ^ 0x5BD1E995) & _MASK


class SharedTable:
    """`path` None: an anonymous map (one process; in-process tests)."""

    def __init__(self, capacity: int, path: str | os.PathLike[str] | None = None) -> None:
        self.buckets = max(1, -(-capacity // _BUCKET))
        self.size = self.buckets * _BUCKET * _SLOT.size
        self.path = None if path is None else Path(path)
        if self.path is None:
            self._map = mmap.mmap(-1, self.size)
        else:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size != self.size:
                    os.ftruncate(fd, self.size)  # new (zero-filled) or a table of another size
                self._map = mmap.mmap(fd, self.size)
            finally:
                os.close(fd)

    @property
    def capacity(self) -> int:
        return self.buckets * _BUCKET

    def get(self, key: int, now_ms: int, ttl_ms: int) -> int | None:
        """The endpoint hash pinned for `key`, its expiry moved to now + ttl (sliding);
        None when absent, expired, torn, or further away than ttl (a clock jump, a stale file)."""
        base = (key % self.buckets) * _BUCKET * _SLOT.size
        end = base + _BUCKET * _SLOT.size
        needle = key.to_bytes(8, "little")
        at = self._map.find(needle, base, end)  # a C scan; only slot-aligned hits are keys
        while at >= 0 and (at - base) % _SLOT.size:
            at = self._map.find(needle, at + 1, end)
        if at < 0:
            return None
        _, ep, expires, check = _SLOT.unpack_from(self._map, at)
        if check != _check(key, ep, expires) or not now_ms < expires <= now_ms + ttl_ms:
            return None
        expires = now_ms + ttl_ms
        _SLOT.pack_into(self._map, at, key, ep, expires, _check(key, ep, expires))
        return ep  # type: ignore[no-any-return]

    def put(self, key: int, ep: int, now_ms: int, ttl_ms: int) -> None:
        base = (key % self.buckets) * _BUCKET * _SLOT.size
        words = _BUCKET_S.unpack_from(self._map, base)
        victim, victim_expiry = 0, _MASK + 1
        for i in range(0, 4 * _BUCKET, 4):
            k, expires = words[i], words[i + 2]
            if k == key:
                victim = i
                break
            if k == 0 or expires <= now_ms:
                expires = 0  # free: take the first one
            if expires < victim_expiry:
                victim, victim_expiry = i, expires
        expires = now_ms + ttl_ms
        _SLOT.pack_into(self._map, base + victim * 8, key, ep, expires, _check(key, ep, expires))

    def count(self, now_ms: int) -> int:
        """Live entries (a debug view; O(capacity))."""
        n = 0
        for b in range(self.buckets):
            words = _BUCKET_S.unpack_from(self._map, b * _BUCKET * _SLOT.size)
            for i in range(0, 4 * _BUCKET, 4):
                k, ep, expires, check = words[i:i + 4]
                n += k != 0 and expires > now_ms and check == _check(k, ep, expires)
        return n

    def close(self) -> None:
        self._map.close()
