"""Background sync of dispatch-time prefix ownership between router replicas via Redis.

Why a background sync and not a lookup per request: the request path must never wait on
Redis. `record()` (called at dispatch) only appends to a bounded buffer; one pipelined
round trip publishes the buffer (at most one per `syncInterval`), and a reader merges what
the other replicas published into this worker's local Rust PrefixIndex. Decisions read
only the local index (one Rust call, as without sharing), so a slow or dead Redis costs
affinity freshness, never request latency. The price is
staleness: a dispatch after a quiet spell is published at once, under load within
syncInterval (batched), and the other replicas read it as soon as Redis has it (a
blocking XREAD on a second connection): about one round trip when quiet.
Measurements against a per-request MGET: docs/scale-out.md.

Layout in Redis: one stream (`key`). An entry is a batch of one replica's dispatches:
fields `r` (the publishing worker's id, to skip its own), `p` (its router process' id,
with several workers: the pod-state hub relays a pod's records among its workers, so a
worker connected to the hub skips its own pod's, which it would otherwise count twice in
balanceMisses' traffic) and `d` (records, each
`u8 len | endpoint "ip:port" | u32 n | n x u64 chain hashes`, little-endian: the bytes of
`BlockHashes.to_bytes()`, no Python int per block). The chain hashes are the router's prefix hashes (seeded by model and LoRA: replicas agree without
coordination) and endpoints are named by address, the same in every replica. Bounded and
approximate: XADD trims entries older than `ttl` (MINID, approximate), XTRIM caps the
length at `maxEntries`, the key expires `ttl` after the last publish, readers skip entries
older than `ttl`, and every local index keeps its own LRU capacity per endpoint.
A new replica reads the last `ttl` of the stream at start (warm start). PD side
schedulers share through the same stream: their records' endpoint names carry their
side (scheduling/insert_scopes.py).

Outage: a failed or timed-out round trip marks Redis down for `redisRetry` (errors
counted, `kthena_router_shared_index_redis_up` 0); routing goes on with the local index;
dispatches wait in the buffer (oldest dropped past `maxPending`) and are published when
Redis answers again. Reading resumes from the last id seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from kthena_router._core import BlockHashes

from .config import SharedIndexSettings

log = logging.getLogger(__name__)

__all__ = ["SharedIndexMetrics", "SharedIndexSync", "decode", "encode"]

READ_COUNT = 64  # stream entries per read; a full read is followed by another at once
RECORDS_PER_ENTRY = 256  # dispatch records per stream entry
_HDR = struct.Struct("<B")
_N = struct.Struct("<I")
Record = tuple[str, bytes]  # (endpoint "ip:port", chain as little-endian u64 words)


class IndexTarget(Protocol):
    """What the sync merges into: the worker's live indexes, the plain scheduler's and the
    PD sides' (scheduling/insert_scopes.InsertTargets: records name their index)."""

    def insert(self, key: str, hashes: BlockHashes) -> bool: ...


class SharedIndexMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.published = Counter("kthena_router_shared_index_published_total",
                                 "Dispatch records (endpoint, prefix chain) published to the shared index",
                                 registry=registry)
        self.merged = Counter("kthena_router_shared_index_merged_total",
                              "Records of other replicas merged into the local prefix index", registry=registry)
        self.same_pod = Counter("kthena_router_shared_index_same_pod_total",
                                "Stream entries of this router's other workers skipped: the pod-state hub relays their records",
                                registry=registry)
        self.dropped = Counter("kthena_router_shared_index_dropped_total",
                               "Dispatch records dropped unpublished (buffer full while Redis was slow or down)",
                               registry=registry)
        self.errors = Counter("kthena_router_shared_index_redis_errors_total",
                              "Failed shared-index round trips (each marks Redis down for redisRetry)",
                              ["address"], registry=registry)
        self.up = Gauge("kthena_router_shared_index_redis_up",
                        "1 if the last shared-index round trip succeeded (0: routing on the local index only)",
                        multiprocess_mode="livemin", registry=registry)
        self.round_trip = Histogram("kthena_router_shared_index_round_trip_seconds",
                                    "One publish + read pipeline to Redis (off the request path)",
                                    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                                    registry=registry)


def encode(records: list[Record]) -> bytes:
    out = bytearray()
    for ep_key, chain in records:
        ep = ep_key.encode()
        if len(ep) > 255:  # not an ip:port
            continue
        out += _HDR.pack(len(ep)) + ep + _N.pack(len(chain) // 8) + chain
    return bytes(out)


def decode(blob: bytes) -> list[Record]:
    """Records of one entry; a truncated tail (a corrupt entry) ends the list."""
    out: list[Record] = []
    view = memoryview(blob)
    i = 0
    while i < len(view):
        n_ep = view[i]
        j = i + 1 + n_ep
        if j + 4 > len(view):
            break
        ep = bytes(view[i + 1:j]).decode(errors="replace")
        (n,) = _N.unpack_from(view, j)
        k = j + 4 + 8 * n
        if k > len(view):
            break
        out.append((ep, bytes(view[j + 4:k])))
        i = k
    return out


class SharedIndexSync:
    def __init__(self, settings: SharedIndexSettings, target: IndexTarget,
                 metrics: SharedIndexMetrics, pod: bytes = b"",
                 hub_relays: Callable[[], bool] = lambda: False) -> None:
        """`pod`: the router process' id (RouterSettings.pod_id, empty with one worker);
        `hub_relays`: whether the pod-state hub delivers this pod's other workers' inserts to this
        worker (PodStateLink.relays_inserts)."""
        self.settings = settings
        self.target = target
        self.metrics = metrics
        self.replica = uuid.uuid4().hex[:16].encode()  # this worker; its own entries are skipped
        self.pod = pod
        self.hub_relays = hub_relays
        host, _, port = settings.redis_address.rpartition(":")
        # No client-side retries: an outage costs one timeout per redisRetry, in the background.
        # Two connections: the blocking read holds one, publishing uses the other.
        self.client = aioredis.Redis(host=host, port=int(port), socket_timeout=settings.redis_timeout_s,
                                     socket_connect_timeout=settings.redis_timeout_s,
                                     retry=Retry(NoBackoff(), 0), max_connections=2)
        self.pending: deque[tuple[str, BlockHashes]] = deque(maxlen=settings.max_pending)
        self.last_id = f"{max(0, int((time.time() - settings.ttl_s) * 1000))}-0"  # warm start
        self.down_until = 0.0
        self.first_round_done = False  # the first read answered or failed (warmup.py)
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._errors = metrics.errors.labels(settings.redis_address)
        metrics.up.set(1)

    # --- request path ----------------------------------------------------------------------
    def record(self, ep_key: str, hashes: BlockHashes) -> None:
        """A dispatch (the local index already has it): O(1), no I/O."""
        if len(self.pending) == self.pending.maxlen:
            self.metrics.dropped.inc()
        self.pending.append((ep_key, hashes))
        if self._wake is not None:
            self._wake.set()

    # --- background ----------------------------------------------------------------------
    def start(self) -> None:
        """Publishing and reading run apart: a dispatch after a quiet spell is published at
        once, later ones are batched for at most syncInterval (one round trip per interval
        under load); other replicas' entries are read as Redis gets them (a blocking XREAD),
        so a replica sees another's dispatch about one round trip after it is published."""
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self.pending:
            self._wake.set()
        self._tasks = [loop.create_task(self._publish_loop()), loop.create_task(self._read_loop())]

    async def _until_up(self) -> None:
        while (wait := self.down_until - time.monotonic()) > 0:
            await asyncio.sleep(wait)

    async def _publish_loop(self) -> None:
        assert self._wake is not None
        period = self.settings.sync_interval_s
        while True:
            await self._wake.wait()
            await self._until_up()
            self._wake.clear()
            t0 = time.monotonic()
            try:
                await self.publish()
            except Exception:  # a bug must not end sharing silently for the process' life
                log.exception("shared prefix index: publish failed")
            if self.pending:  # requeued after a failure: retried once Redis is up again
                self._wake.set()
            rest = period - (time.monotonic() - t0)
            if rest > 0:
                await asyncio.sleep(rest)

    async def _read_loop(self) -> None:
        # the socket timeout (redisTimeout) must outlast the block
        block_ms = max(1, int(min(self.settings.redis_timeout_s / 2, 1.0) * 1000))
        while True:
            await self._until_up()
            try:
                full = await self.read(block_ms)
            except Exception:
                log.exception("shared prefix index: read failed")
                full = False
                await asyncio.sleep(self.settings.sync_interval_s)
            self.first_round_done = self.first_round_done or not full  # caught up (or Redis down)

    async def publish(self) -> bool:
        """Publish the buffer in one pipelined round trip. False if Redis failed (marked
        down; the batch goes back into the buffer)."""
        batch = self._take()
        if not batch:
            return True
        s = self.settings
        pipe = self.client.pipeline(transaction=False)
        min_id = f"{max(0, int(time.time() * 1000) - int(s.ttl_s * 1000))}-0"
        for i in range(0, len(batch), RECORDS_PER_ENTRY):
            fields = {"r": self.replica, "d": encode(batch[i:i + RECORDS_PER_ENTRY])}
            if self.pod:
                fields["p"] = self.pod
            pipe.xadd(s.key, fields, minid=min_id, approximate=True)
        pipe.xtrim(s.key, maxlen=s.max_entries, approximate=True)
        pipe.pexpire(s.key, int(s.ttl_s * 1000))
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(pipe.execute(), s.redis_timeout_s)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            self._failed(exc)
            self._requeue(batch)
            return False
        self.metrics.round_trip.observe(time.perf_counter() - t0)
        self._ok()
        self.metrics.published.inc(len(batch))
        return True

    async def read(self, block_ms: int | None = None) -> bool:
        """Merge what the other replicas published since the last read (waiting up to
        `block_ms` for something new). True if the read was full (more to read at once);
        a Redis error marks it down."""
        s = self.settings
        timeout = s.redis_timeout_s + (block_ms or 0) / 1000
        t0 = time.perf_counter()
        try:
            res = await asyncio.wait_for(
                self.client.xread({s.key: self.last_id}, count=READ_COUNT, block=block_ms), timeout)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            self._failed(exc)
            return False
        if block_ms is None:
            self.metrics.round_trip.observe(time.perf_counter() - t0)
        self._ok()
        entries = res[0][1] if res else []
        self._merge(entries, int(time.time() * 1000))
        return len(entries) >= READ_COUNT

    def _take(self) -> list[Record]:
        # collapse repeats of one chain on one endpoint within the batch (same group's
        # requests): the other replicas' LRU needs it once per round. A chain is known by
        # its length and last hash (the hash of the whole prefix).
        seen: dict[tuple[str, int, bytes], Record] = {}
        while self.pending:
            ep_key, hashes = self.pending.popleft()
            chain = hashes.to_bytes()
            seen[(ep_key, len(chain), chain[-8:])] = (ep_key, chain)
        return list(seen.values())

    def _merge(self, entries: list[Any], now_ms: int) -> None:
        if not entries:
            return
        oldest = now_ms - int(self.settings.ttl_s * 1000)
        insert = self.target.insert
        merged = same_pod = 0
        skip_pod = self.pod if self.pod and self.hub_relays() else None
        for entry_id, fields in entries:
            eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            self.last_id = eid
            if fields.get(b"r") == self.replica or int(eid.split("-", 1)[0]) < oldest:
                continue
            if skip_pod is not None and fields.get(b"p") == skip_pod:
                same_pod += 1
                continue
            for ep_key, chain in decode(fields.get(b"d", b"")):
                # endpoints (or PD sides) this replica does not route to are skipped
                if chain and insert(ep_key, BlockHashes.from_bytes(chain)):
                    merged += 1
        if merged:
            self.metrics.merged.inc(merged)
        if same_pod:
            self.metrics.same_pod.inc(same_pod)

    def _ok(self) -> None:
        if self.down_until:
            log.warning("shared prefix index: Redis %s reachable again", self.settings.redis_address)
            self.down_until = 0.0
        self.metrics.up.set(1)

    def _failed(self, exc: BaseException) -> None:
        if self.down_until <= time.monotonic():  # one error per outage spell, from either loop
            if not self.down_until:
                log.warning("shared prefix index: Redis %s unreachable (%s); routing on the local index, "
                            "retrying every %.1fs", self.settings.redis_address, type(exc).__name__,
                            self.settings.redis_retry_s)
            self._errors.inc()
        self.down_until = time.monotonic() + self.settings.redis_retry_s
        self.metrics.up.set(0)
        self.first_round_done = True

    def _requeue(self, batch: list[Record]) -> None:
        # put the batch back in front (older than what arrived meanwhile), within maxPending
        room = self.pending.maxlen - len(self.pending) if self.pending.maxlen else len(batch)
        keep = batch[-room:] if room > 0 else []
        if len(keep) < len(batch):
            self.metrics.dropped.inc(len(batch) - len(keep))
        self.pending.extendleft((ep, BlockHashes.from_bytes(chain)) for ep, chain in reversed(keep))

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.pending and time.monotonic() >= self.down_until:
            with contextlib.suppress(Exception):
                await self.publish()  # the last dispatches (best effort)
        with contextlib.suppress(Exception):
            await self.client.aclose()
