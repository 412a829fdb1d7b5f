"""KV-event streams in the pod-state hub: one subscription per engine for the whole pod.

Hub side, `HubKvSink`: the kv_events subscribers' sink. It keeps a mirror of what every
engine holds (block hashes in store order, and whether its stream is up) and queues each
change as a KV op for the workers, one frame per loop iteration. A worker that (re)connects
gets the mirror: cleared, stored (everything), up/down, per endpoint.

Worker side, `SharedKvSubscribers`: stands in for the matcher's KvEventSubscribers. While
the worker is connected it subscribes to nothing (the hub's ops reach the matcher's sink);
when the hub is gone it subscribes itself (a fresh join per stream: cleared, then replayed
by the engine), and drops those subscriptions again when the hub is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kthena_router.kv_events.subscriber import EventSource, KvEventSubscribers, StreamState, StreamStatus

from . import wire


class HubKvSink:
    def __init__(self, broadcast: Callable[[bytes], None], on_up: Callable[[int], None] | None = None) -> None:
        self.broadcast = broadcast
        self.on_up = on_up  # streams up, after each change (the hub's gauge)
        self.blocks: dict[str, dict[int, None]] = {}  # endpoint key -> hashes (ordered set)
        self.up: dict[str, bool] = {}
        self._ops: list[wire.KvOp] = []
        self._scheduled = False

    def _queue(self, op: wire.KvOp) -> None:
        self._ops.append(op)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        ops, self._ops = self._ops, []
        if ops:
            self.broadcast(wire.frame(wire.KV, wire.encode_kv(ops)))

    # --- OwnershipSink -------------------------------------------------------------------
    def stored(self, endpoint_id: str, hashes: Sequence[int]) -> None:
        held = self.blocks.setdefault(endpoint_id, {})
        for h in hashes:
            held[h] = None
        self._queue((wire.KV_STORED, endpoint_id, list(hashes)))

    def removed(self, endpoint_id: str, hashes: Sequence[int]) -> None:
        held = self.blocks.get(endpoint_id)
        if held is not None:
            for h in hashes:
                held.pop(h, None)
        self._queue((wire.KV_REMOVED, endpoint_id, list(hashes)))

    def cleared(self, endpoint_id: str) -> None:
        self.blocks.pop(endpoint_id, None)
        self._queue((wire.KV_CLEARED, endpoint_id, []))

    def set_stream_up(self, endpoint_id: str, up: bool) -> None:
        self.up[endpoint_id] = up
        self._count_up()
        self._queue((wire.KV_UP if up else wire.KV_DOWN, endpoint_id, []))

    # --- a (re)connecting worker --------------------------------------------------------------
    def welcome(self) -> bytes | None:
        ops: list[wire.KvOp] = []
        for key in sorted(set(self.blocks) | set(self.up)):
            ops.append((wire.KV_CLEARED, key, []))
            if self.blocks.get(key):
                ops.append((wire.KV_STORED, key, list(self.blocks[key])))
            ops.append((wire.KV_UP if self.up.get(key) else wire.KV_DOWN, key, []))
        return wire.frame(wire.KV, wire.encode_kv(ops)) if ops else None

    def forget(self, keep: Iterable[str]) -> None:
        live = set(keep)
        for d in (self.blocks, self.up):
            for key in [k for k in d if k not in live]:
                del d[key]
        self._count_up()

    def _count_up(self) -> None:
        if self.on_up is not None:
            self.on_up(sum(self.up.values()))


def hub_sources(specs: Iterable[wire.KvSpec]) -> dict[str, EventSource]:
    return {s.key: EventSource(s.pub, s.replay, s.topic) for s in specs}


def apply_ops(ops: list[wire.KvOp], sink: Any, metrics: Any = None,
              up: dict[str, bool] | None = None) -> None:
    """A KV frame from the hub into a matcher's sink (kv_matcher._Sink)."""
    for op, key, hashes in ops:
        if op == wire.KV_STORED:
            sink.stored(key, hashes)
        elif op == wire.KV_REMOVED:
            sink.removed(key, hashes)
        elif op == wire.KV_CLEARED:
            sink.cleared(key)
        elif op in (wire.KV_UP, wire.KV_DOWN):
            sink.set_stream_up(key, op == wire.KV_UP)
            if up is not None:
                up[key] = op == wire.KV_UP
            if metrics is not None:
                metrics.set_kv_stream_up(key, op == wire.KV_UP)


class SharedKvSubscribers:
    """The matcher's `subscribers` in a worker of a pod with a hub (module docstring)."""

    def __init__(self, real: KvEventSubscribers, on_sources: Callable[[Mapping[str, EventSource]], None],
                 remote: bool) -> None:
        self.real = real
        self.on_sources = on_sources
        self.remote = remote
        self.sources: dict[str, EventSource] = {}
        self.hub_up: dict[str, bool] = {}  # the hub's streams, as its KV ops said

    def set_sources(self, sources: Mapping[str, EventSource]) -> None:
        self.sources = dict(sources)
        self.on_sources(self.sources)
        if not self.remote:
            self.real.set_sources(self.sources)

    def set_remote(self, remote: bool) -> None:
        if remote == self.remote:
            return
        self.remote = remote
        # synchronous, before any hub frame is read: stop (and clear) our own streams, or
        # start them again (fresh joins)
        self.real.set_sources({} if remote else self.sources)

    def status(self) -> dict[str, StreamStatus]:
        if not self.remote:
            return self.real.status()
        return {k: StreamStatus(k, StreamState.UP if self.hub_up.get(k) else StreamState.DOWN)
                for k in self.sources}

    def local_streams(self) -> int:
        """Subscriptions this worker holds itself (0 while the hub follows the streams)."""
        return len(self.real.status())

    async def close(self) -> None:
        await self.real.close()
