"""Worker side of the pod-state hub: one unix-socket connection, read in the background.

Requests never wait on it: hub frames are applied by a background task on the worker's
loop, and this worker's inserts and in-flight changes are queued and written once per loop
iteration (a frame of each for everything dispatched in that iteration), fire and forget.

Hub down (refused, EOF, bad frame): `on_mode(False)` at once, so the worker scrapes and
probes by itself again (the state it has stays), and a retry every RETRY_S; on reconnect
it sends its endpoint sets, gets the hub's state and `on_mode(True)` stops its own polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

from kthena_router.engine_state.snapshot import EndpointSnapshot

from . import wire

log = logging.getLogger(__name__)

RETRY_S = 1.0
SEND_BUFFER_LIMIT = 4 * 1024 * 1024  # queued bytes to a hub that does not read: drop inserts


class PodStateClient:
    def __init__(self, path: str, *, on_snapshot: Callable[[EndpointSnapshot], None],
                 on_probes: Callable[[list[tuple[str, bool]]], None],
                 on_inserts: Callable[[bytes], None],
                 on_mode: Callable[[bool], None],
                 on_kv: Callable[[list[wire.KvOp]], None] = lambda ops: None,
                 on_flight: Callable[[list[tuple[str, int]]], None] = lambda deltas: None) -> None:
        self.path = path
        self.on_snapshot = on_snapshot
        self.on_probes = on_probes
        self.on_inserts = on_inserts
        self.on_mode = on_mode
        self.on_kv = on_kv
        self.on_flight = on_flight
        self.targets = wire.Targets()
        self.connected = False
        self.inserts_sent = 0
        self.inserts_dropped = 0
        self._writer: asyncio.StreamWriter | None = None
        self._reader: asyncio.StreamReader | None = None
        self._buf = bytearray()
        self._flight: dict[str, int] = {}  # endpoint key -> attempts started - ended, unsent
        self._flush_scheduled = False
        self._task: asyncio.Task[None] | None = None

    # --- outgoing -------------------------------------------------------------------------
    def set_targets(self, targets: wire.Targets) -> None:
        if targets == self.targets:
            return
        self.targets = targets
        if self._writer is not None:
            self._writer.write(wire.frame(wire.TARGETS, wire.encode_targets(targets)))

    def send_insert(self, key: str, hashes: bytes) -> None:
        """Queue one dispatch-time insert (endpoint key, `BlockHashes.to_bytes()`) for the hub."""
        if self._writer is None:
            return
        self._buf += wire.encode_insert(key, hashes)
        self._schedule_flush()

    def send_flight(self, key: str, delta: int, lora: str = "") -> None:
        """Queue an attempt's start (+1) or end (-1) on endpoint `key` (for adapter `lora`:
        counted for it too) for the hub."""
        if self._writer is None:
            return
        flight = self._flight
        flight[key] = flight.get(key, 0) + delta
        if lora:
            k = wire.flight_key(key, lora)
            flight[k] = flight.get(k, 0) + delta
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        writer, buf, flight = self._writer, self._buf, self._flight
        if buf:
            self._buf = bytearray()
        if flight:
            self._flight = {}
        if writer is None or writer.transport.is_closing():
            return
        if writer.transport.get_write_buffer_size() > SEND_BUFFER_LIMIT:
            if buf:
                self.inserts_dropped += 1
            return
        if buf:
            writer.write(wire.frame(wire.INSERTS, bytes(buf)))
            self.inserts_sent += 1
        deltas = [(k, d) for k, d in flight.items() if d]
        if deltas:
            writer.write(wire.frame(wire.FLIGHT, wire.encode_flight(deltas)))

    # --- connection -----------------------------------------------------------------------
    async def connect(self) -> bool:
        """One attempt; True when connected (then `run()` reads in the background)."""
        try:
            reader, writer = await asyncio.open_unix_connection(self.path)
        except OSError:
            return False
        writer.write(wire.frame(wire.HELLO, wire.encode_hello(os.getpid())))
        writer.write(wire.frame(wire.TARGETS, wire.encode_targets(self.targets)))
        self._reader, self._writer = reader, writer
        self._set_mode(True)
        return True

    async def connect_first(self, attempts: int = 10, delay_s: float = 0.2) -> bool:
        """At worker start the hub may still be binding: a few quick attempts (bounded)."""
        for _ in range(attempts):
            if await self.connect():
                return True
            await asyncio.sleep(delay_s)
        self._set_mode(False)
        return False

    def _set_mode(self, connected: bool) -> None:
        changed = connected != self.connected
        self.connected = connected
        if changed or not connected:
            try:
                self.on_mode(connected)
            except Exception:
                log.exception("pod-state mode listener failed")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="pod-state client")

    async def _run(self) -> None:
        while True:
            if self._reader is None and not await self.connect():
                await asyncio.sleep(RETRY_S)
                continue
            try:
                await self._read(self._reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                log.warning("pod-state hub connection lost; this worker scrapes and probes by itself until it is back")
            except wire.decode_error() as exc:
                log.warning("pod-state hub sent a bad frame (%s); reconnecting", exc)
            finally:
                self._drop()
            self._set_mode(False)
            await asyncio.sleep(RETRY_S)

    async def _read(self, reader: asyncio.StreamReader | None) -> None:
        assert reader is not None
        while True:
            size, kind = wire.parse_header(await reader.readexactly(wire.HEADER.size))
            payload = await reader.readexactly(size)
            try:
                if kind == wire.INSERTS:
                    self.on_inserts(payload)
                elif kind == wire.SNAPSHOT:
                    self.on_snapshot(wire.decode_snapshot(payload))
                elif kind == wire.PROBES:
                    self.on_probes(wire.decode_probes(payload))
                elif kind == wire.KV:
                    self.on_kv(wire.decode_kv(payload))
                elif kind == wire.FLIGHT:
                    self.on_flight(wire.decode_flight(payload))
            except wire.decode_error():
                raise
            except Exception:  # a consumer bug must not cut the worker off the hub
                log.exception("pod-state frame %d: consumer failed", kind)

    def _drop(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        self._buf = bytearray()
        self._flight = {}
        if writer is not None:
            writer.close()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._drop()
