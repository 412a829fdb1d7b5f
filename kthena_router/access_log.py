"""Access log: one JSON line per proxied request, off by default.

Fields are metadata only (ids, route, model, endpoint, status, attempts, timings, token
counts): never prompt text, headers or credentials. Lines are buffered in memory and
written by a periodic flush (and when the buffer grows past `_FLUSH_BYTES`) in a thread,
so a request never waits for the disk. Every worker appends to the same file with
O_APPEND, one write per flush, so lines of different workers do not interleave (on
stdout, a pipe, only writes up to PIPE_BUF are atomic).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass

import orjson

log = logging.getLogger(__name__)

_FLUSH_BYTES = 64 * 1024
STDOUT = "-"


@dataclass(slots=True)
class AccessRecord:
    request_id: str
    method: str
    path: str
    ts: float = 0.0  # unix time when the request ended
    stream: bool = False
    route: str = ""
    server: str = ""
    model: str = ""
    endpoint: str = ""
    status: int = 0
    error_type: str = ""
    attempts: int = 0
    ttft_ms: float | None = None
    duration_ms: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class AccessLog:
    """Buffered JSON-lines writer owned by one worker's event loop."""

    def __init__(self, dest: str, flush_interval_s: float) -> None:
        self.dest = dest
        self.flush_interval_s = flush_interval_s
        self._buf: list[bytes] = []
        self._size = 0
        self._fd = -1
        self._task: asyncio.Task[None] | None = None
        self._flushing: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.dest == STDOUT:
            self._fd = 1
        else:
            self._fd = os.open(self.dest, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        self._task = asyncio.get_running_loop().create_task(self._flush_forever())

    def write(self, rec: AccessRecord) -> None:
        rec.ts = round(time.time(), 3)
        line = orjson.dumps(rec) + b"\n"
        self._buf.append(line)
        self._size += len(line)
        if self._size >= _FLUSH_BYTES and (self._flushing is None or self._flushing.done()):
            self._flushing = asyncio.get_running_loop().create_task(self.flush())

    async def flush(self) -> None:
        if not self._buf or self._fd < 0:
            return
        data = b"".join(self._buf)
        self._buf.clear()
        self._size = 0
        try:
            await asyncio.to_thread(_write_all, self._fd, data)
        except OSError as exc:
            log.warning("access log write failed (%s): %d bytes dropped", exc, len(data))

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()
        if self._fd > 2:
            os.close(self._fd)
        self._fd = -1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
