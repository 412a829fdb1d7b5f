"""Subscribe to each engine's KV-cache event stream (vLLM's ZMQ publisher).

One asyncio task per endpoint: a SUB socket on the engine's PUB address, decoding each
`(topic, seq, payload)` message (wire.py) and applying it to an `OwnershipSink`.

Consistency rules (the sink must never claim a block the engine has dropped, because a
false hit sends requests to the wrong place; a missed block only costs a miss):
- Every (re)connection is a fresh join: the endpoint's blocks are cleared, then the
  history is fetched from the engine's replay socket (vLLM's ROUTER: request = start seq as
  8 bytes big-endian; replies `(seq, payload)`, then seq -1) from seq 0. A restarted engine
  starts again at seq 0 with an empty cache, so clearing is always right, and whatever
  contiguous history the replay buffer still has is exact from its first batch on.
- A sequence gap mid-stream is filled from the replay socket; if it cannot be (no replay
  socket, or the buffer has moved on), the endpoint gets a fresh join (without a replay
  socket: cleared, then the stream continues): from then on the table may miss blocks
  cached before, never keeps dropped ones.
- While idle, the replay socket is polled every `idle_replay_s` for batches after the last
  one seen (an empty answer is cheap), so a batch lost just before a quiet period (e.g.
  published before the subscription reached the publisher) is not lost for long.
  A gap that the replay cannot fill leads to a fresh join.
- Stream state: DOWN until the ZMQ handshake and after a disconnect (seen through a socket
  monitor, so an idle engine is not "down"); SYNCING while clearing/replaying; UP otherwise.
  The sink's `set_stream_up(endpoint, state is UP)`; callers fall back to approximate
  prefix matching for endpoints that are not up.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from .wire import Batch, Cleared, DecodeError, Removed, Stored, decode_batch, on_device

log = logging.getLogger("kthena_router.kv_events")


class OwnershipSink(Protocol):
    def stored(self, endpoint_id: str, hashes: Sequence[int]) -> None: ...

    def removed(self, endpoint_id: str, hashes: Sequence[int]) -> None: ...

    def cleared(self, endpoint_id: str) -> None: ...

    def set_stream_up(self, endpoint_id: str, up: bool) -> None: ...


class StreamState(enum.Enum):
    DOWN = "down"
    SYNCING = "syncing"
    UP = "up"


@dataclass
class StreamStatus:
    endpoint_id: str
    state: StreamState = StreamState.DOWN
    last_seq: int | None = None  # last batch applied
    batches: int = 0
    gaps: int = 0  # sequence gaps seen
    gaps_unrecovered: int = 0  # gaps the replay could not fill (endpoint cleared)
    replays: int = 0
    decode_errors: int = 0
    connects: int = 0


StatusHook = Callable[[StreamStatus], None]


@dataclass(frozen=True)
class EventSource:
    """Where an engine publishes: vLLM's `--kv-events-config` endpoint/replay_endpoint."""

    pub: str  # e.g. tcp://10.0.0.5:5557
    replay: str | None = None  # e.g. tcp://10.0.0.5:5558
    topic: str = ""  # prefix filter; vLLM's default topic is ""


_MON_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
_SEQ_END = -1


class EndpointSubscriber:
    def __init__(
        self,
        endpoint_id: str,
        source: EventSource,
        sink: OwnershipSink,
        *,
        ctx: zmq.asyncio.Context | None = None,
        on_status: StatusHook | None = None,
        replay_timeout_s: float = 2.0,
        idle_replay_s: float = 2.0,
        rcvhwm: int = 100_000,
    ) -> None:
        self.endpoint_id = endpoint_id
        self.source = source
        self.sink = sink
        self.status = StreamStatus(endpoint_id)
        self._ctx = ctx
        self._on_status = on_status
        self._replay_timeout_s = replay_timeout_s
        self._idle_replay_s = idle_replay_s
        self._rcvhwm = rcvhwm
        self._dealer: zmq.asyncio.Socket | None = None  # replay requests

    # --- state ----------------------------------------------------------------------
    def _set_state(self, state: StreamState) -> None:
        if state is self.status.state:
            return
        self.status.state = state
        self.sink.set_stream_up(self.endpoint_id, state is StreamState.UP)
        self._notify()

    def _notify(self) -> None:
        if self._on_status is not None:
            try:
                self._on_status(self.status)
            except Exception:  # a metrics hook must not stop the stream
                log.exception("kv events status hook failed")

    # --- main loop ------------------------------------------------------------------
    async def run(self) -> None:
        ctx = self._ctx or zmq.asyncio.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, self._rcvhwm)
        sub.setsockopt(zmq.RECONNECT_IVL, 100)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        mon = sub.get_monitor_socket(_MON_EVENTS)
        sub.connect(self.source.pub)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(mon, zmq.POLLIN)
        idle_ms = int(self._idle_replay_s * 1000)
        try:
            self.sink.set_stream_up(self.endpoint_id, False)
            self._notify()
            while True:
                ready = dict(await poller.poll(idle_ms if self.source.replay else None))
                if mon in ready:
                    await self._on_monitor(parse_monitor_message(await mon.recv_multipart()))
                if sub in ready:
                    for _ in range(256):  # drain, but let other tasks run now and then
                        try:
                            frames = await sub.recv_multipart(flags=zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        await self._on_message(frames)
                elif not ready and self.status.state is StreamState.UP:
                    await self._catch_up()
        finally:
            self.status.state = StreamState.DOWN
            with contextlib.suppress(Exception):
                self.sink.set_stream_up(self.endpoint_id, False)
            self._notify()
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            mon.close(linger=0)
            sub.close(linger=0)
            self._close_dealer()

    async def _on_monitor(self, ev: Mapping[str, Any]) -> None:
        kind = ev.get("event")
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.status.connects += 1
            await self._fresh_join()
        elif kind == zmq.EVENT_DISCONNECTED:
            log.info("kv events: %s disconnected", self.endpoint_id)
            self._set_state(StreamState.DOWN)

    async def _fresh_join(self) -> None:
        self._set_state(StreamState.SYNCING)
        self.sink.cleared(self.endpoint_id)
        self.status.last_seq = None
        if self.source.replay is not None:
            await self._replay_from(0)
        self._set_state(StreamState.UP)

    async def _on_message(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            self.status.decode_errors += 1
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        st = self.status
        if st.state is StreamState.DOWN:
            return  # queued before a disconnect, or before the handshake event was read
        last = st.last_seq
        if last is not None:
            if seq <= last:
                return  # already applied from a replay
            if seq > last + 1:
                st.gaps += 1
                filled = self.source.replay is not None and await self._replay_from(last + 1) is True
                if not filled:
                    st.gaps_unrecovered += 1
                    log.warning("kv events: %s lost batches from %d on; resyncing",
                                self.endpoint_id, last + 1)
                    await self._fresh_join()
                if st.last_seq is not None and seq <= st.last_seq:
                    return
        self._apply(seq, frames[2])

    async def _catch_up(self) -> None:
        """Idle poll of the replay socket for batches after the last one seen."""
        last = self.status.last_seq
        if await self._replay_from(0 if last is None else last + 1, quiet=True) is False:
            self.status.gaps_unrecovered += 1
            await self._fresh_join()

    # --- replay ---------------------------------------------------------------------
    async def _replay_from(self, start: int, quiet: bool = False) -> bool | None:
        """Fetch and apply the batches the engine still buffers from `start` on.

        True: every batch after the last applied one was there (or nothing was missed);
        False: the buffer no longer reaches back that far (a hole); None: no answer."""
        assert self.source.replay is not None
        if not quiet:
            self.status.replays += 1
        if self._dealer is None:
            ctx = self._ctx or zmq.asyncio.Context.instance()
            self._dealer = ctx.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.LINGER, 0)
            self._dealer.connect(self.source.replay)
        dealer = self._dealer
        got: list[tuple[int, bytes]] = []
        try:
            await dealer.send_multipart((b"", start.to_bytes(8, "big")))
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), self._replay_timeout_s)
                if len(frames) != 3:
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                if seq == _SEQ_END:
                    break
                got.append((seq, frames[2]))
        except (asyncio.TimeoutError, zmq.ZMQError) as e:
            if not quiet:
                log.warning("kv events: replay from %s failed: %r", self.endpoint_id, e)
            self._close_dealer()  # late answers must not be taken for the next request's
            return None
        st = self.status
        fresh = st.last_seq is None  # fresh join: start wherever the buffer starts
        for seq, payload in got:
            last = st.last_seq
            if last is not None and seq <= last:
                continue
            if last is not None and seq != last + 1:
                if not fresh:
                    return False
                self.sink.cleared(self.endpoint_id)  # keep only the contiguous tail
            self._apply(seq, payload)
        return True

    def _close_dealer(self) -> None:
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None

    # --- applying -------------------------------------------------------------------
    def _apply(self, seq: int, payload: bytes) -> None:
        st = self.status
        st.last_seq = seq
        try:
            batch = decode_batch(payload)
        except DecodeError as e:
            # the batch is lost: its removals may be missing, so forget this endpoint's blocks
            st.decode_errors += 1
            log.warning("kv events: bad batch %d from %s: %s", seq, self.endpoint_id, e)
            self.sink.cleared(self.endpoint_id)
            return
        st.batches += 1
        self._apply_batch(batch)

    def _apply_batch(self, batch: Batch) -> None:
        ep, sink = self.endpoint_id, self.sink
        for ev in batch.events:
            if isinstance(ev, Stored):
                if on_device(ev.medium):
                    sink.stored(ep, ev.hashes)
            elif isinstance(ev, Removed):
                if on_device(ev.medium):
                    sink.removed(ep, ev.hashes)
            elif isinstance(ev, Cleared):
                sink.cleared(ep)


@dataclass
class KvEventSubscribers:
    """One EndpointSubscriber task per endpoint; `set_sources` adds and removes them."""

    sink: OwnershipSink
    on_status: StatusHook | None = None
    ctx: zmq.asyncio.Context | None = None
    options: dict[str, Any] = field(default_factory=dict)  # EndpointSubscriber keywords
    _subs: dict[str, tuple[EndpointSubscriber, asyncio.Task[None]]] = field(default_factory=dict)

    def set_sources(self, sources: Mapping[str, EventSource]) -> None:
        for ep in list(self._subs):
            sub, _ = self._subs[ep]
            if ep not in sources or sources[ep] != sub.source:
                self._stop(ep)
        for ep, src in sources.items():
            if ep not in self._subs:
                sub = EndpointSubscriber(ep, src, self.sink, ctx=self.ctx,
                                         on_status=self.on_status, **self.options)
                task = asyncio.create_task(sub.run(), name=f"kv-events-{ep}")
                self._subs[ep] = (sub, task)

    def status(self) -> dict[str, StreamStatus]:
        return {ep: sub.status for ep, (sub, _) in self._subs.items()}

    def _stop(self, ep: str) -> None:
        _, task = self._subs.pop(ep)
        task.cancel()
        self.sink.cleared(ep)

    async def close(self) -> None:
        tasks = [t for _, t in self._subs.values()]
        for ep in list(self._subs):
            self._stop(ep)
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


def gauge_status_hook(gauge: Any) -> StatusHook:
    """Status hook for a prometheus Gauge labelled by `endpoint`: 1 up, 0 otherwise."""

    def hook(st: StreamStatus) -> None:
        gauge.labels(endpoint=st.endpoint_id).set(1.0 if st.state is StreamState.UP else 0.0)

    return hook
