"""Closed-loop load generator for streamed OpenAI-style requests.

C workers each send one request, read the whole SSE reply, and send the next one, over
keep-alive connections with TCP_NODELAY. Two clients:

- ``raw`` (default): a minimal HTTP/1.1 client on an asyncio Protocol. It costs a fraction
  of aiohttp's client CPU per streamed request (``--client`` lets you compare: the result
  carries ``client_cpu_ms_per_req``); on a 2-core machine, CPU spent here is CPU taken
  from the router and the engines, so the cheaper client disturbs the measurement less.
- ``aiohttp``: the well-known client, for cross-checking the raw one.

Every request is timed with perf_counter: end to end (until the HTTP response is
complete) and to the first SSE event that carries non-empty ``content`` (TTFT).

CLI: ``python -m loadtest.loadgen --url http://127.0.0.1:8080 -c 8 -n 1000``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

perf_counter = time.perf_counter

# First SSE event with non-empty content: `"content":"x` (orjson) or `"content": "x` (json).
_CONTENT_RE = re.compile(rb'"content":\s?"(?!")')
_DONE = b"data: [DONE]"


def chat_body(model: str = "demo", max_tokens: int = 16, prompt: str = "Say hello.",
              stream: bool = True) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "stream": stream,
            "max_tokens": max_tokens,
        },
        separators=(",", ":"),
    ).encode()


@dataclass(frozen=True)
class Target:
    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> "Target":
        u = urlsplit(url if "//" in url else f"http://{url}")
        return cls(u.hostname or "127.0.0.1", u.port or 80)


@dataclass
class Sample:
    ok: bool
    latency_s: float
    ttft_s: float  # nan when no content arrived
    events: int  # SSE `data:` events in the reply (content chunks + role + [DONE])
    status: int
    error: str | None = None
    target: int = 0  # index of the url it went to (LoadGen's urls)


@dataclass
class PhaseResult:
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    client_cpu_s: float = 0.0


# --------------------------------------------------------------------------- raw client


class _HttpError(Exception):
    pass


class _RawConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    __slots__ = (
        "transport", "_buf", "_body", "_state", "_remaining", "_fut", "_t_first",
        "_status", "_close_after", "closed",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._body = bytearray()
        self._state = 0  # 0 head, 1 chunk size, 2 chunk data, 6 its CRLF, 3 length, 4 EOF, 5 trailer
        self._remaining = 0
        self._fut: asyncio.Future | None = None
        self._t_first = float("nan")
        self._status = 0
        self._close_after = False
        self.closed = False

    # Protocol callbacks
    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc) -> None:  # type: ignore[override]
        self.closed = True
        fut = self._fut
        if fut is not None and not fut.done():
            if self._state == 4:  # body delimited by EOF: that is a complete reply
                self._finish()
            else:
                fut.set_exception(_HttpError(f"connection lost: {exc!r}"))

    def data_received(self, data: bytes) -> None:  # type: ignore[override]
        if self._fut is None or self._fut.done():
            return  # unsolicited bytes: ignore (the reply is already finished)
        self._buf += data
        try:
            self._parse()
        except Exception as e:  # malformed reply: fail this request, drop the connection
            if not self._fut.done():
                self._fut.set_exception(_HttpError(f"bad reply: {e}"))
            self.transport.close()  # type: ignore[union-attr]

    # request
    def request(self, raw: bytes) -> asyncio.Future:
        self._fut = asyncio.get_running_loop().create_future()
        self._buf.clear()
        self._body = bytearray()
        self._state = 0
        self._t_first = float("nan")
        self._status = 0
        self._close_after = False
        self.transport.write(raw)  # type: ignore[union-attr]
        return self._fut

    def _body_data(self, data) -> None:
        self._body += data
        if self._t_first != self._t_first and _CONTENT_RE.search(self._body):  # nan check
            self._t_first = perf_counter()

    def _parse(self) -> None:
        buf = self._buf
        while True:
            st = self._state
            if st == 0:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(buf[:end]).decode("latin-1").split("\r\n")
                del buf[: end + 4]
                parts = head[0].split(" ", 2)
                self._status = int(parts[1])
                chunked = False
                length = -1
                conn_hdr = ""
                for line in head[1:]:
                    name, _, value = line.partition(":")
                    name = name.strip().lower()
                    if name == "transfer-encoding":
                        chunked = "chunked" in value.lower()
                    elif name == "content-length":
                        length = int(value)
                    elif name == "connection":
                        conn_hdr = value.strip().lower()
                self._close_after = conn_hdr == "close" or parts[0] == "HTTP/1.0"
                if chunked:
                    self._state = 1
                elif length >= 0:
                    self._state, self._remaining = 3, length
                    if length == 0:
                        self._finish()
                        return
                else:
                    self._state, self._close_after = 4, True
            elif st == 1:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buf[:end]).split(b";", 1)[0], 16)
                del buf[: end + 2]
                if size == 0:
                    self._state = 5
                else:
                    self._state, self._remaining = 2, size
            elif st == 2:
                if not buf:
                    return
                n = min(len(buf), self._remaining)
                self._body_data(buf[:n])
                del buf[:n]
                self._remaining -= n
                if self._remaining:
                    return
                self._state = 6
            elif st == 6:  # CRLF after chunk data
                if len(buf) < 2:
                    return
                del buf[:2]
                self._state = 1
            elif st == 3:
                if not buf:
                    return
                n = min(len(buf), self._remaining)
                self._body_data(buf[:n])
                del buf[:n]
                self._remaining -= n
                if self._remaining == 0:
                    self._finish()
                return
            elif st == 4:
                if buf:
                    self._body_data(bytes(buf))
                    buf.clear()
                return
            elif st == 5:  # trailers end with an empty line
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                line_empty = end == 0
                del buf[: end + 2]
                if line_empty:
                    self._finish()
                    return

    def _finish(self) -> None:
        self._state = 0
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result((self._status, self._t_first, self._body))
        if self._close_after and self.transport is not None:
            self.transport.close()


def _raw_request(target: Target, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return (
        f"POST {path} HTTP/1.1\r\nHost: {target.host}:{target.port}\r\n"
        f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _judge(status: int, body: bytes | bytearray, sse: bool = True) -> tuple[bool, int, str | None]:
    events = body.count(b"data:")
    if status != 200:
        return False, events, f"HTTP {status}: {bytes(body[:200])!r}"
    if not sse:  # a whole JSON reply
        if not body.startswith(b"{") or b'"choices"' not in body:
            return False, events, f"not a completion: {bytes(body[:200])!r}"
        return True, events, None
    if not body.rstrip().endswith(_DONE):
        return False, events, f"no [DONE]: {bytes(body[-200:])!r}"
    return True, events, None


class _RawClient:
    def __init__(self, targets: list[Target], path: str, body: bytes, timeout_s: float,
                 headers: dict[str, str] | None = None):
        self.targets = targets
        self.sse = _wants_sse(body)
        self.reqs = [_raw_request(t, path, body, headers) for t in targets]
        self.timeout_s = timeout_s

    def new_worker_state(self) -> dict:
        return {}

    async def one(self, state: dict, idx: int) -> Sample:
        loop = asyncio.get_running_loop()
        conn: _RawConn | None = state.get(idx)
        t0 = perf_counter()
        try:
            if conn is None or conn.closed:
                t = self.targets[idx]
                _, conn = await loop.create_connection(_RawConn, t.host, t.port)
                state[idx] = conn
            fut = conn.request(self.reqs[idx])
            timer = loop.call_later(self.timeout_s, _expire, fut, conn)
            try:
                status, t_first, body = await fut
            finally:
                timer.cancel()
        except (OSError, _HttpError, asyncio.TimeoutError) as e:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
            state.pop(idx, None)
            return Sample(False, perf_counter() - t0, float("nan"), 0, 0, repr(e)[:300])
        t1 = perf_counter()
        ok, events, err = _judge(status, body, self.sse)
        return Sample(ok, t1 - t0, t_first - t0, events, status, err)

    async def close(self, states: list[dict]) -> None:
        for st in states:
            for conn in st.values():
                if conn.transport is not None:
                    conn.transport.close()


def _wants_sse(body: bytes) -> bool:
    try:
        return bool(json.loads(body).get("stream"))
    except (ValueError, AttributeError):
        return True


def _expire(fut: asyncio.Future, conn: _RawConn) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError("request timed out"))
    if conn.transport is not None:
        conn.transport.close()


# ----------------------------------------------------------------------- aiohttp client


class _AiohttpClient:
    def __init__(self, targets: list[Target], path: str, body: bytes, timeout_s: float,
                 headers: dict[str, str] | None = None):
        import aiohttp

        self._aiohttp = aiohttp
        self.urls = [f"http://{t.host}:{t.port}{path}" for t in targets]
        self.body = body
        self.sse = _wants_sse(body)
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **(headers or {})}
        # limit=0: one pooled keep-alive connection per busy worker, no queueing in the pool.
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            auto_decompress=False,
        )

    def new_worker_state(self) -> dict:
        return {}

    async def one(self, state: dict, idx: int) -> Sample:
        t0 = perf_counter()
        t_first = float("nan")
        body = bytearray()
        try:
            async with self.session.post(self.urls[idx], data=self.body, headers=self.headers) as r:
                status = r.status
                async for chunk in r.content.iter_any():
                    body += chunk
                    if t_first != t_first and _CONTENT_RE.search(body):
                        t_first = perf_counter()
        except (OSError, self._aiohttp.ClientError, asyncio.TimeoutError) as e:
            return Sample(False, perf_counter() - t0, float("nan"), 0, 0, repr(e)[:300])
        t1 = perf_counter()
        ok, events, err = _judge(status, body, self.sse)
        return Sample(ok, t1 - t0, t_first - t0, events, status, err)

    async def close(self, states: list[dict]) -> None:
        await self.session.close()


# ------------------------------------------------------------------------------ driver


class LoadGen:
    """Keeps C workers' connections open across phases (warm-up, then measured)."""

    def __init__(
        self,
        urls: list[str],
        concurrency: int,
        *,
        path: str = "/v1/chat/completions",
        body: bytes | None = None,
        client: str = "raw",
        timeout_s: float = 30.0,
        headers: dict[str, str] | None = None,  # extra request headers (e.g. credentials)
    ):
        self.targets = [Target.parse(u) for u in urls]
        self.concurrency = concurrency
        body = body if body is not None else chat_body()
        cls = {"raw": _RawClient, "aiohttp": _AiohttpClient}[client]
        self._client = cls(self.targets, path, body, timeout_s, headers)
        self._states = [self._client.new_worker_state() for _ in range(concurrency)]

    async def run(self, requests: int | None = None, duration_s: float | None = None) -> PhaseResult:
        """One phase: `requests` in total, or as many as fit in `duration_s`.

        Targets are used round-robin by a global counter, so direct-to-engine runs spread
        the load exactly as a round-robin router would.
        """
        if requests is None and duration_s is None:
            raise ValueError("give requests or duration_s")
        n_targets = len(self.targets)
        tickets = itertools.count()
        res = PhaseResult()
        samples = res.samples
        client = self._client
        t_start = perf_counter()
        deadline = t_start + duration_s if duration_s is not None else float("inf")
        limit = requests if requests is not None else sys.maxsize

        async def worker(state: dict) -> None:
            while True:
                i = next(tickets)
                if i >= limit or perf_counter() >= deadline:
                    return
                idx = i % n_targets
                s = await client.one(state, idx)
                s.target = idx
                samples.append(s)

        cpu0 = time.process_time()
        await asyncio.gather(*(worker(s) for s in self._states))
        res.wall_s = perf_counter() - t_start
        res.client_cpu_s = time.process_time() - cpu0
        return res

    async def close(self) -> None:
        await self._client.close(self._states)


# ------------------------------------------------------------------------------- stats


def percentile(sorted_vals: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_vals:
        return float("nan")
    pos = (len(sorted_vals) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def dist_ms(values_s: list[float]) -> dict:
    vals = sorted(v * 1000.0 for v in values_s if v == v)
    if not vals:
        return {"p50": None, "p90": None, "p99": None, "p999": None, "mean": None, "max": None}
    return {
        "p50": percentile(vals, 0.50),
        "p90": percentile(vals, 0.90),
        "p99": percentile(vals, 0.99),
        "p999": percentile(vals, 0.999),
        "mean": sum(vals) / len(vals),
        "max": vals[-1],
    }


def summarize(res: PhaseResult) -> dict:
    ok = [s for s in res.samples if s.ok]
    errors: dict[str, int] = {}
    for s in res.samples:
        if not s.ok:
            key = (s.error or "?")[:120]
            errors[key] = errors.get(key, 0) + 1
    events = sorted({s.events for s in ok})
    return {
        "requests": len(res.samples),
        "ok": len(ok),
        "errors": len(res.samples) - len(ok),
        "error_kinds": errors,
        "wall_s": res.wall_s,
        "rps": len(ok) / res.wall_s if res.wall_s > 0 else 0.0,
        "latency_ms": dist_ms([s.latency_s for s in ok]),
        "ttft_ms": dist_ms([s.ttft_s for s in ok]),
        "events_per_reply": events,  # one value when every reply had the same shape
        "client_cpu_ms_per_req": 1000.0 * res.client_cpu_s / max(1, len(res.samples)),
    }


def install_uvloop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass


async def _cli_main(a: argparse.Namespace) -> dict:
    gen = LoadGen(
        a.url, a.concurrency, path=a.path,
        body=chat_body(a.model, a.max_tokens), client=a.client, timeout_s=a.timeout,
    )
    try:
        if a.warmup:
            await gen.run(requests=a.warmup)
        res = await gen.run(requests=a.requests, duration_s=a.duration)
    finally:
        await gen.close()
    return summarize(res)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", action="append", required=True, help="repeat to round-robin")
    p.add_argument("-c", "--concurrency", type=int, default=1)
    p.add_argument("-n", "--requests", type=int)
    p.add_argument("-d", "--duration", type=float)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--path", default="/v1/chat/completions")
    p.add_argument("--model", default="demo")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--client", choices=["raw", "aiohttp"], default="raw")
    p.add_argument("--timeout", type=float, default=30.0)
    a = p.parse_args(argv)
    if a.requests is None and a.duration is None:
        a.requests = 1000
    install_uvloop()
    print(json.dumps(asyncio.run(_cli_main(a)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
