"""The hot-path HTTP/1.1 client: framing, keep-alive reuse, timeouts, early close, limits."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest

from kthena_router.proxy.upstream import BodyTooLarge, H1Conn, H1Pool, PoolExhausted, UpstreamClosed, UpstreamConnectError, \
    UpstreamProtocolError, UpstreamTimeout

Handler = Callable[[bytes, asyncio.StreamWriter], "asyncio.Future[None] | None"]


class Server:
    """A scripted HTTP/1.1 server: `responses` are written one per request, in order."""

    def __init__(self, responses: list[bytes | None], close_after: bool = False) -> None:
        self.responses = list(responses)
        self.requests: list[bytes] = []
        self.connections = 0
        self.close_after = close_after
        self.closed = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                resp = self.responses.pop(0) if self.responses else None
                if resp is None:  # stall until the client goes away
                    await reader.read()
                    self.closed.set()
                    return
                writer.write(resp)
                await writer.drain()
                if self.close_after:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


def _chunked(*pieces: bytes) -> bytes:
    out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    for p in pieces:
        out += f"{len(p):x}\r\n".encode() + p + b"\r\n"
    return out + b"0\r\n\r\n"


def _fixed(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: " + \
        str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body


async def _request(pool: H1Pool, port: int, body: bytes = b"{}", timeout_s: float | None = 5.0):
    d = pool.dest("127.0.0.1", port, None, None, "127.0.0.1")
    conn = await pool.acquire(d, 1.0, 1.0)
    conn.timeout_s = timeout_s
    conn.send(b"POST /v1/x HTTP/1.1\r\n" + d.host_line + b"content-length: " + str(len(body)).encode()
              + b"\r\n\r\n", body)
    return conn, await conn.read_head()


async def _sent(pool: H1Pool, port: int, timeout_s: float | None, deadline: float | None = None) -> H1Conn:
    """A connection with a bodyless request sent, its response not read yet."""
    d = pool.dest("127.0.0.1", port, None, None, "127.0.0.1")
    conn = await pool.acquire(d, 1.0, 1.0)
    conn.timeout_s = timeout_s
    conn.deadline = deadline
    conn.send(b"POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n", b"")
    return conn


def test_chunked_and_content_length_bodies_reuse_one_connection() -> None:
    async def main() -> None:
        srv = Server([_chunked(b"data: 1\n\n", b"data: 2\n\n"), _fixed(b'{"a": 1}'), _chunked()])
        await srv.start()
        pool = H1Pool(8)
        _, resp = await _request(pool, srv.port)
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        assert await resp.read_all() == b"data: 1\n\ndata: 2\n\n"
        _, resp = await _request(pool, srv.port)
        assert resp.header(b"content-type") == b"application/json"
        assert await resp.read_all() == b'{"a": 1}'
        _, resp = await _request(pool, srv.port)
        assert await resp.read_all() == b""
        assert srv.connections == 1
        assert srv.requests[0].startswith(b"POST /v1/x HTTP/1.1\r\nhost: 127.0.0.1:")
        await pool.close()
        await srv.stop()

    asyncio.run(main())


def test_chunked_body_split_at_every_byte() -> None:
    async def main() -> None:
        raw = _chunked(b"data: hello\n\n", b"x" * 300, b"data: [DONE]\n\n")

        class Slow(Server):
            async def _conn(self, reader, writer) -> None:  # type: ignore[override]
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)
                for i in range(len(raw)):
                    writer.write(raw[i:i + 1])
                    await writer.drain()
                    await asyncio.sleep(0)
                await reader.read()
                writer.close()

        srv = Slow([])
        await srv.start()
        pool = H1Pool(8)
        _, resp = await _request(pool, srv.port)
        assert await resp.read_all() == b"data: hello\n\n" + b"x" * 300 + b"data: [DONE]\n\n"
        await pool.close()
        await srv.stop()

    asyncio.run(main())


def test_connection_close_and_eof_framed_bodies() -> None:
    async def main() -> None:
        srv = Server([b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil eof"], close_after=True)
        await srv.start()
        pool = H1Pool(8)
        conn, resp = await _request(pool, srv.port)
        assert await resp.read_all() == b"until eof"
        assert conn.closed
        await pool.close()
        await srv.stop()

    asyncio.run(main())


def test_read_timeout_then_close_reaches_the_server() -> None:
    async def main() -> None:
        srv = Server([None])
        await srv.start()
        pool = H1Pool(8)
        conn = await _sent(pool, srv.port, timeout_s=0.05)
        with pytest.raises(UpstreamTimeout):
            await conn.read_head()
        conn.close()
        await asyncio.wait_for(srv.closed.wait(), 2)
        await pool.close()
        await srv.stop()

    asyncio.run(main())


def test_cancel_while_waiting_leaves_no_waiter() -> None:
    async def main() -> None:
        srv = Server([None])
        await srv.start()
        pool = H1Pool(8)
        conn = await _sent(pool, srv.port, timeout_s=None)
        task = asyncio.ensure_future(conn.read_head())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        conn.close()
        await asyncio.wait_for(srv.closed.wait(), 2)
        await pool.close()
        await srv.stop()

    asyncio.run(main())


def test_server_closing_mid_body_is_an_error() -> None:
    async def main() -> None:
        srv = Server([b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort"], close_after=True)
        await srv.start()
        pool = H1Pool(8)
        _, resp = await _request(pool, srv.port)
        with pytest.raises(UpstreamClosed):
            await resp.read_all()
        await pool.close()
        await srv.stop()

    asyncio.run(main())


def test_not_http_is_a_protocol_error() -> None:
    async def main() -> None:
        srv = Server([b"SSH-2.0-OpenSSH\r\n\r\n"])
        await srv.start()
        pool = H1Pool(8)
        with pytest.raises(UpstreamProtocolError):
            await _request(pool, srv.port)
        await pool.close()
        await srv.stop()

    asyncio.run(main())


def test_refused_connection_is_a_connect_error() -> None:
    async def main() -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        pool = H1Pool(8)
        with pytest.raises(UpstreamConnectError):
            await _request(pool, port)
        assert pool._open == 0
        await pool.close()

    asyncio.run(main())


def test_pool_limit_waits_for_a_free_connection() -> None:
    async def main() -> None:
        srv = Server([_fixed(b"1"), _fixed(b"2")])
        await srv.start()
        pool = H1Pool(1)
        _, first = await _request(pool, srv.port)
        second = asyncio.ensure_future(_request(pool, srv.port))
        await asyncio.sleep(0.05)
        assert not second.done()  # the only slot is taken
        assert await first.read_all() == b"1"  # back to the pool: the waiter gets it
        _, resp = await asyncio.wait_for(second, 2)
        assert await resp.read_all() == b"2"
        assert srv.connections == 1
        await pool.close()
        await srv.stop()

    asyncio.run(main())


def test_interim_100_response_is_skipped_and_tcp_nodelay_set() -> None:
    async def main() -> None:
        srv = Server([b"HTTP/1.1 100 Continue\r\n\r\n" + _fixed(b"ok")])
        await srv.start()
        pool = H1Pool(8)
        conn, resp = await _request(pool, srv.port)
        assert resp.status == 200 and await resp.read_all() == b"ok"
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        await pool.close()
        await srv.stop()

    asyncio.run(main())


def test_https_verifies_the_configured_name(tmp_path) -> None:
    import shutil
    import ssl
    import subprocess

    assert shutil.which("openssl") is not None, "the openssl CLI (Debian's openssl) is needed to make the test cert"
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=engine.test", "-addext",
                    "subjectAltName=DNS:engine.test"], check=True, capture_output=True)

    async def main() -> None:
        sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        sctx.load_cert_chain(str(cert), str(key))
        heads: list[bytes] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                heads.append(await reader.readuntil(b"\r\n\r\n"))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
                await reader.read()
            except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
                pass
            finally:
                writer.close()

        srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=sctx)
        port = srv.sockets[0].getsockname()[1]
        pool = H1Pool(4)
        trusted = ssl.create_default_context(cafile=str(cert))
        d = pool.dest("127.0.0.1", port, trusted, "engine.test", "engine.test")
        conn = await pool.acquire(d, 1.0, 1.0)
        conn.timeout_s = 2.0
        conn.send(b"POST / HTTP/1.1\r\n" + d.host_line + b"content-length: 0\r\n\r\n", b"")
        resp = await conn.read_head()
        assert await resp.read_all() == b"ok"
        assert heads[0].split(b"\r\n")[1] == f"host: engine.test:{port}".encode()
        # the system trust store (ssl=True) refuses the self-signed certificate
        with pytest.raises(UpstreamConnectError):
            await pool.acquire(pool.dest("127.0.0.1", port, True, "engine.test", "engine.test"), 2.0, 1.0)
        await pool.close()
        srv.close()

    asyncio.run(main())


def test_pool_wait_gives_up_at_its_deadline_and_the_slot_stays_usable() -> None:
    async def main() -> None:
        srv = Server([_fixed(b"1"), _fixed(b"2")])
        await srv.start()
        pool = H1Pool(1)
        _, first = await _request(pool, srv.port)
        d = pool.dest("127.0.0.1", srv.port, None, None, "127.0.0.1")
        with pytest.raises(PoolExhausted):
            await pool.acquire(d, 1.0, 0.05)
        assert await first.read_all() == b"1"
        _, second = await _request(pool, srv.port)  # the expired waiter took no slot
        assert await second.read_all() == b"2"
        await pool.close()
        await srv.stop()

    asyncio.run(main())


def test_deadline_bounds_reads_that_each_stay_under_the_idle_bound() -> None:
    async def main() -> None:
        srv = Server([None])
        await srv.start()
        pool = H1Pool(8)
        conn = await _sent(pool, srv.port, timeout_s=5.0, deadline=pool.loop.time() + 0.05)
        with pytest.raises(UpstreamTimeout) as info:
            await conn.read_head()
        assert info.value.at_deadline
        conn.deadline = None
        conn.timeout_s = 0.05
        with pytest.raises(UpstreamTimeout) as info:
            await conn.wait_data()
        assert not info.value.at_deadline
        conn.close()
        await pool.close()
        await srv.stop()

    asyncio.run(main())


def test_buffered_body_over_the_cap_drops_the_connection() -> None:
    async def main() -> None:
        srv = Server([_fixed(b"x" * 100), _chunked(b"y" * 60, b"y" * 60), _fixed(b"ok")])
        await srv.start()
        pool = H1Pool(8)
        conn, resp = await _request(pool, srv.port)
        with pytest.raises(BodyTooLarge):  # known from content-length
            await resp.read_all(50)
        assert conn.closed
        conn, resp = await _request(pool, srv.port)
        with pytest.raises(BodyTooLarge):  # counted while reading (the body may be complete)
            await resp.read_all(100)
        _, resp = await _request(pool, srv.port)
        assert await resp.read_all(100) == b"ok"
        await pool.close()
        await srv.stop()

    asyncio.run(main())


def test_retain_drops_gone_destinations_and_closes_their_connections() -> None:
    async def main() -> None:
        a, b = Server([_fixed(b"a"), _fixed(b"a2")]), Server([_fixed(b"b"), None])
        await a.start()
        await b.start()
        pool = H1Pool(8)
        conn_a, resp = await _request(pool, a.port)
        assert await resp.read_all() == b"a"  # idle in the pool now
        _, resp_b = await _request(pool, b.port)
        assert await resp_b.read_all() == b"b"
        d_b = pool.dest("127.0.0.1", b.port, None, None, "127.0.0.1")
        conn_b = await pool.acquire(d_b, 1.0, 1.0)  # in use while its destination goes away
        assert pool.destinations == 2
        assert pool.retain({("127.0.0.1", b.port)}) == 1
        assert pool.destinations == 1
        assert conn_a.closed  # the idle connection of the removed destination
        assert pool.retain(set()) == 1
        assert not conn_b.closed
        conn_b.send(b"POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n", b"")
        conn_b.close()  # what an abandoned request does; a finished one is released ...
        assert pool.destinations == 0 and pool._open == 0
        await pool.close()
        await a.stop()
        await b.stop()

    asyncio.run(main())


def test_a_connection_released_to_a_pruned_destination_is_closed() -> None:
    async def main() -> None:
        srv = Server([_fixed(b"1")])
        await srv.start()
        pool = H1Pool(8)
        conn, resp = await _request(pool, srv.port)
        pool.retain(set())
        assert await resp.read_all() == b"1"  # body complete: released ... and closed
        assert conn.closed and pool._open == 0 and pool.destinations == 0
        await pool.close()
        await srv.stop()

    asyncio.run(main())
