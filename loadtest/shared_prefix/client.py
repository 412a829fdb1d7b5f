"""Streaming drivers: open loop (`drive`: Poisson arrivals, a concurrency cap) and closed-loop
sessions (`drive_sessions`: multi-turn chat, issue 15), with per-request timings.

Uses loadgen's raw HTTP/1.1 protocol (cheap per streamed chunk: on 2 cores the client's
CPU is taken from the engines and the router). Each request is timed at the client with
perf_counter from the moment it is sent (after waiting for a concurrency slot, as
bench_serving does) to the first SSE event with content (TTFT) and to the end (E2E).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from loadtest.loadgen import Target, _expire, _HttpError, _judge, _raw_request, _RawConn
from .placement import request_id
from .workload import Request

CHAT_PATH = "/v1/chat/completions"


@dataclass
class Result:
    index: int
    group: int
    target: int  # index into the driver's targets (the engine for greedy-reference/direct)
    ok: bool
    ttft_s: float  # wall seconds; nan if no content came
    e2e_s: float
    sent_at: float  # wall seconds since the run's start
    error: str | None = None


@dataclass
class RunStats:
    results: list[Result] = field(default_factory=list)
    wall_s: float = 0.0
    max_send_late_s: float = 0.0  # how far the sender fell behind its arrival schedule
    in_flight: int = 0


class Chooser:
    """Picks the target of each request; the greedy reference overrides the hooks."""

    def choose(self, req: Request) -> int:
        return 0

    def on_first_token(self, req: Request, target: int) -> None:
        pass

    def on_done(self, req: Request, target: int) -> None:
        pass


class RoundRobin(Chooser):
    def __init__(self, n: int) -> None:
        self.n, self.i = n, -1

    def choose(self, req: Request) -> int:
        self.i = (self.i + 1) % self.n
        return self.i


class _Conn(_RawConn):
    """Calls `on_first` as soon as the first content event arrives (the greedy
    reference's queue model needs it then, not at the end of the stream)."""

    __slots__ = ("on_first",)

    def __init__(self) -> None:
        super().__init__()
        self.on_first: Callable[[], None] | None = None

    def _body_data(self, data) -> None:  # type: ignore[no-untyped-def]
        had = self._t_first == self._t_first  # not nan
        super()._body_data(data)
        if not had and self._t_first == self._t_first and self.on_first is not None:
            cb, self.on_first = self.on_first, None
            cb()


class _Pool:
    """Idle keep-alive connections per target."""

    def __init__(self, targets: list[Target]) -> None:
        self.targets = targets
        self.idle: list[list[_Conn]] = [[] for _ in targets]

    async def get(self, i: int) -> _Conn:
        idle = self.idle[i]
        while idle:
            c = idle.pop()
            if not c.closed:
                return c
        t = self.targets[i]
        _, conn = await asyncio.get_running_loop().create_connection(_Conn, t.host, t.port)
        return conn

    def put(self, i: int, c: _Conn) -> None:
        if not c.closed:
            self.idle[i].append(c)

    def close(self) -> None:
        for idle in self.idle:
            for c in idle:
                if c.transport is not None:
                    c.transport.close()
            idle.clear()


class _Sender:
    """Sends one request and records its Result (shared by both drivers)."""

    def __init__(self, targets: list[Target], chooser: Chooser, model: str, timeout_s: float,
                 stats: RunStats, on_result: Callable[[Result], None] | None) -> None:
        self.targets, self.chooser, self.model = targets, chooser, model
        self.timeout_s, self.stats, self.on_result = timeout_s, stats, on_result
        self.pool = _Pool(targets)
        self.t0 = time.perf_counter()

    async def send(self, req: Request) -> Result:
        chooser, loop = self.chooser, asyncio.get_running_loop()
        i = chooser.choose(req)
        body = orjson.dumps(req.chat_body(self.model))
        # the request's index as its id: the engines' logs then say which engine served it
        raw = _raw_request(self.targets[i], CHAT_PATH, body, {"X-Request-Id": request_id(req.index)})
        ts = time.perf_counter()
        conn: _Conn | None = None
        first_seen = False

        def first() -> None:
            nonlocal first_seen
            first_seen = True
            chooser.on_first_token(req, i)

        try:
            conn = await self.pool.get(i)
            conn.on_first = first
            fut = conn.request(raw)
            timer = loop.call_later(self.timeout_s, _expire, fut, conn)
            try:
                status, t_first, reply = await fut
            finally:
                timer.cancel()
            ok, _, err = _judge(status, reply)
            conn.on_first = None
            self.pool.put(i, conn)
        except (OSError, _HttpError, asyncio.TimeoutError) as e:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
            ok, t_first, err = False, float("nan"), repr(e)[:300]
        te = time.perf_counter()
        if not first_seen:
            chooser.on_first_token(req, i)
        chooser.on_done(req, i)
        r = Result(req.index, req.group, i, ok, t_first - ts, te - ts, ts - self.t0, err)
        self.stats.results.append(r)
        if self.on_result is not None:
            self.on_result(r)
        return r


async def drive(requests: list[Request], offsets_wall: list[float], urls: list[str],
                chooser: Chooser, model: str, max_concurrency: int, timeout_s: float,
                on_result: Callable[[Result], None] | None = None,
                stats: RunStats | None = None) -> RunStats:
    """Send every request at its offset (wall seconds), at most max_concurrency at once.
    `stats` (optional) is filled in as it goes, for progress lines."""
    sem = asyncio.Semaphore(max_concurrency)
    stats = stats if stats is not None else RunStats()
    sender = _Sender([Target.parse(u) for u in urls], chooser, model, timeout_s, stats,
                     on_result)
    t0 = sender.t0

    async def one(req: Request) -> None:
        try:
            await sender.send(req)
        finally:
            stats.in_flight -= 1
            sem.release()

    tasks: set[asyncio.Task[None]] = set()
    try:
        for req, off in zip(requests, offsets_wall):
            delay = t0 + off - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
                # oversleep = a busy event loop (waiting for a slot is by design: not counted)
                late = time.perf_counter() - (t0 + off)
                stats.max_send_late_s = max(stats.max_send_late_s, late)
            await sem.acquire()
            stats.in_flight += 1
            t = asyncio.create_task(one(req))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*list(tasks))
    finally:
        for t in tasks:
            t.cancel()
        sender.pool.close()
    stats.wall_s = time.perf_counter() - t0
    return stats


async def drive_sessions(sessions: Sequence[Sequence[Any]], starts_wall: Sequence[float],
                         thinks_wall: Sequence[Sequence[float]], urls: list[str],
                         chooser: Chooser, model: str, max_concurrency: int, timeout_s: float,
                         on_result: Callable[[Result], None] | None = None,
                         stats: RunStats | None = None) -> RunStats:
    """Closed-loop sessions: a session starts at its offset (wall seconds); each later
    turn is sent `think` seconds after the previous turn's reply has ended (a user reads,
    then types), so a slow cluster also slows the offered load, as real chat does. A
    one-turn session is an open-loop request. Lateness counts the start and think
    timers' oversleep only (waiting for a concurrency slot is by design)."""
    sem = asyncio.Semaphore(max_concurrency)
    stats = stats if stats is not None else RunStats()
    sender = _Sender([Target.parse(u) for u in urls], chooser, model, timeout_s, stats,
                     on_result)
    t0 = sender.t0

    async def sleep_until(at: float) -> None:
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
            stats.max_send_late_s = max(stats.max_send_late_s, time.perf_counter() - at)

    async def session(turns: Sequence[Any], start: float, thinks: Sequence[float]) -> None:
        await sleep_until(t0 + start)
        for k, (req, think) in enumerate(zip(turns, thinks)):
            if k:
                await sleep_until(time.perf_counter() + think)
            async with sem:
                stats.in_flight += 1
                try:
                    await sender.send(req)
                finally:
                    stats.in_flight -= 1

    tasks = [asyncio.create_task(session(t, s, th))
             for t, s, th in zip(sessions, starts_wall, thinks_wall)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        sender.pool.close()
    stats.wall_s = time.perf_counter() - t0
    return stats
