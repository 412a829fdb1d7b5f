"""Starts a worker's Rust front end (`--interface rust`) and wires it to the asyncio loop.

Rust wakes the loop by writing a byte to its end of a socket pair; the loop's reader
drains every queued event in one call (batched under load) and answers decisions through
the thread-safe `_core.Front` methods. No Python runs on the front's tokio threads.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from typing import Any

from kthena_router.front.decide import FastPath
from kthena_router.front.table import SYNC_INTERVAL_S
from kthena_router.proxy.forward import Forwarder
from kthena_router.settings import RouterSettings

log = logging.getLogger(__name__)


class RustFront:
    """One per worker: built in the lifespan, closed at its end."""

    def __init__(self, settings: RouterSettings, forwarder: Forwarder) -> None:
        from kthena_router._core import Front

        self.core: Any = Front(settings.host, settings.port, settings.front_socket_path, settings.front_threads,
                               settings.max_body_bytes, settings.upstream_pool_size)
        self.fast = FastPath(forwarder, self.core)
        self.wake = socket.socket(fileno=self.core.wake_fd)
        self.wake.setblocking(False)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ticker: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(self.wake.fileno(), self._on_wake)
        self._tick()

    def _tick(self) -> None:
        """The front's table follows time-driven health changes (front/table.py)."""
        fast = self.fast
        try:
            fast.table.dirty = True
            fast.table.sync(len(fast.live))
        except Exception:
            log.exception("rust front: table sync failed")
        assert self.loop is not None
        self.ticker = self.loop.call_later(SYNC_INTERVAL_S, self._tick)

    def _on_wake(self) -> None:
        try:
            self.wake.recv(4096)
        except (BlockingIOError, InterruptedError):
            pass
        fast = self.fast
        fast.batch.scheduled = True  # the flush below writes this wake-up's changes: no call_soon
        try:
            for ev in self._events():
                try:
                    kind = ev[0]
                    if kind == 0:
                        fast.decide(ev[1], ev[2], ev[3], ev[4], ev[5])
                    elif kind == 4:
                        fast.decided(*ev[1:])
                    elif kind == 1:
                        fast.done(*ev[1:])
                    elif kind == 2:
                        fast.first_byte(ev[1], ev[2])
                    elif kind == 5:
                        fast.first_token(ev[1])
                    else:
                        fast.progress(ev[1], ev[2], ev[3])
                except Exception:
                    log.exception("rust front: event %d of request %d failed", ev[0], ev[1])
                    if ev[0] == 0:
                        self.core.slow(ev[1])
            fast.table.sync(len(fast.live))
        finally:
            fast.flush()

    def _events(self) -> Iterator[tuple[Any, ...]]:
        """Queued events; what arrives while these are handled is handled in the same wake."""
        drain = self.core.drain
        for _ in range(4):
            events = drain()
            if not events:
                return
            yield from events

    def stop_accepting(self) -> None:
        self.core.stop_accepting()

    async def wait_idle(self, idle: asyncio.Event, grace_s: float) -> None:
        """Until no request is in flight, including those the front decided and has not
        reported yet (front/table.py), at most `grace_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(idle.wait(), timeout=left)
            except asyncio.TimeoutError:
                return
            if self.core.live() == 0:
                return
            await asyncio.sleep(0.005)

    def close(self) -> None:
        if self.ticker is not None:
            self.ticker.cancel()
        if self.loop is not None:
            self.loop.remove_reader(self.wake.fileno())
        self.core.close()
        self._on_wake_final()
        self.wake.close()

    def _on_wake_final(self) -> None:
        """Events queued before the runtime stopped, then what it never reported."""
        fast = self.fast
        for ev in self.core.drain():
            if ev[0] == 4:
                fast.decided(*ev[1:])
            elif ev[0] == 1:
                fast.done(*ev[1:])
        fast.abandon_all()
        fast.close()
