"""Open-loop streaming client: per request, TTFT, every inter-token gap, E2E.

loadgen's raw HTTP/1.1 protocol (cheap per streamed chunk: on a small machine the
client's CPU is taken from the engines and the router), extended to timestamp every SSE
event that carries non-empty `content`. TTFT = first such event - send; ITL = the gaps
between consecutive ones (as vLLM's bench_serving measures them: per chunk as the
client receives it; chunks that arrive in one read share a timestamp). Requests are sent
at their arrival offsets whatever is in flight (open loop); a safety cap on concurrency
is recorded when it delays a send.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from loadtest.loadgen import Target, _expire, _HttpError, _judge, _raw_request, _RawConn
from .workload import Request

CHAT_PATH = "/v1/chat/completions"
# non-empty content; the lookahead needs the next byte, so a match is never counted on a
# read that ends right after the opening quote (it is found on the next read instead)
_CONTENT = re.compile(rb'"content":\s?"(?=[^"])')


@dataclass
class Result:
    index: int
    ok: bool
    sent_at: float  # wall seconds since the phase's start
    ttft_s: float  # wall seconds; nan without content
    e2e_s: float
    itl_s: list[float] = field(repr=False, default_factory=list)  # wall seconds
    tokens: int = 0  # content events received
    error: str | None = None


@dataclass
class PhaseRun:
    results: list[Result] = field(default_factory=list)
    wall_s: float = 0.0  # first send to last completion
    max_send_late_s: float = 0.0  # how far sends fell behind the schedule (wall)
    capped_sends: int = 0  # sends delayed by the concurrency cap


class _Conn(_RawConn):
    __slots__ = ("times", "_scan")

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []
        self._scan = 0

    def request(self, raw: bytes) -> asyncio.Future:
        self.times = []
        self._scan = 0
        return super().request(raw)

    def _body_data(self, data) -> None:  # type: ignore[no-untyped-def]
        now = time.perf_counter()
        body = self._body
        body += data
        pos = self._scan
        for m in _CONTENT.finditer(body, pos):
            self.times.append(now)
            pos = m.end()
        # resume after the last match, or just before the end (a match cut by this read)
        self._scan = max(pos, len(body) - 16)
        if self._t_first != self._t_first and self.times:
            self._t_first = self.times[0]


async def drive(requests: list[Request], time_scale: float, url: str, model: str,
                timeout_s: float, max_concurrency: int,
                on_result: Callable[[Result], None] | None = None) -> PhaseRun:
    """Send each request at offset_s x time_scale wall seconds after the start."""
    target = Target.parse(url)
    idle: list[_Conn] = []
    sem = asyncio.Semaphore(max_concurrency)
    run = PhaseRun()
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    last_end = t0

    async def one(req: Request) -> None:
        nonlocal last_end
        raw = _raw_request(target, CHAT_PATH, orjson.dumps(req.chat_body(model)))
        conn: _Conn | None = None
        ts = time.perf_counter()
        try:
            while idle and conn is None:
                c = idle.pop()
                conn = None if c.closed else c
            if conn is None:
                _, conn = await loop.create_connection(_Conn, target.host, target.port)
            fut = conn.request(raw)
            timer = loop.call_later(timeout_s, _expire, fut, conn)
            try:
                status, _, reply = await fut
            finally:
                timer.cancel()
            ok, _, err = _judge(status, reply)
            times = conn.times
            if not conn.closed:
                idle.append(conn)
        except (OSError, _HttpError, asyncio.TimeoutError) as e:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
            ok, err, times = False, repr(e)[:300], conn.times if conn is not None else []
        te = time.perf_counter()
        last_end = max(last_end, te)
        if ok and not times:
            ok, err = False, "no content in the stream"
        res = Result(req.index, ok, ts - t0, times[0] - ts if times else float("nan"), te - ts,
                     [b - a for a, b in zip(times, times[1:])], len(times), err)
        run.results.append(res)
        if on_result is not None:
            on_result(res)

    async def guarded(req: Request) -> None:
        try:
            await one(req)
        finally:
            sem.release()

    tasks: set[asyncio.Task[None]] = set()
    try:
        for req in requests:
            due = t0 + req.offset_s * time_scale
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if sem.locked():
                run.capped_sends += 1
            await sem.acquire()
            run.max_send_late_s = max(run.max_send_late_s, time.perf_counter() - due)
            t = asyncio.create_task(guarded(req))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*list(tasks))
    finally:
        for t in tasks:
            t.cancel()
        for c in idle:
            if c.transport is not None:
                c.transport.close()
    run.wall_s = last_end - t0
    return run
