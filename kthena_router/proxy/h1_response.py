"""HTTP/1.1 responses of the hot-path upstream client (upstream.py): head parsing, body
framing (content-length, chunked, until EOF), the buffered-body cap, and the errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kthena_router.proxy.upstream import H1Conn


class UpstreamError(Exception):
    pass


class UpstreamConnectError(UpstreamError):
    pass


class UpstreamTimeout(UpstreamError):
    def __init__(self, message: str, at_deadline: bool) -> None:
        super().__init__(message)
        self.at_deadline = at_deadline  # False: the idle bound fired


class PoolExhausted(Exception):
    """Every connection slot of the worker's pool stayed busy for the whole pool wait."""


class BodyTooLarge(Exception):
    """A response body to be buffered exceeds its cap."""


class UpstreamClosed(UpstreamError):
    pass


class UpstreamProtocolError(UpstreamError):
    pass


class Response:
    """A response whose head has been read; the body is read with read_some()/read_all()."""

    __slots__ = ("conn", "status", "raw_headers", "content_type", "_length", "_chunked", "_chunk_left",
                 "done", "_keep_alive")

    def __init__(self, conn: H1Conn, status: int, raw_headers: list[tuple[bytes, bytes]], content_type: str,
                 length: int | None, chunked: bool, keep_alive: bool) -> None:
        self.conn = conn
        self.status = status
        self.raw_headers = raw_headers
        self.content_type = content_type
        self._length = length  # remaining bytes when framed by content-length
        self._chunked = chunked
        self._chunk_left = 0  # bytes of the current chunk still to come (+2 for its CRLF)
        self.done = False
        self._keep_alive = keep_alive
        if not chunked and length == 0:
            self._finish()

    def _finish(self) -> None:
        self.done = True
        conn = self.conn
        if self._keep_alive and not conn.eof and not conn.buf:
            conn.pool._release(conn)
        else:
            conn.close()

    def _take(self) -> bytes:
        """Body bytes decodable from the buffer now (b"" if none)."""
        conn = self.conn
        buf = conn.buf
        if not buf:
            return b""
        if not self._chunked:
            if self._length is None:  # until EOF
                out = bytes(buf)
                buf.clear()
                return out
            n = min(self._length, len(buf))
            out = bytes(buf[:n])
            del buf[:n]
            self._length -= n
            if self._length == 0:
                self._finish()
            return out
        parts: list[bytes] = []
        pos = 0
        size = len(buf)
        while pos < size:
            left = self._chunk_left
            if left > 2:  # inside chunk data
                n = min(left - 2, size - pos)
                parts.append(bytes(buf[pos:pos + n]))
                pos += n
                self._chunk_left -= n
                continue
            if left:  # the CRLF after the chunk data
                if size - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise UpstreamProtocolError("bad chunk terminator")
                pos += 2
                self._chunk_left = 0
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if size - pos > 4096:
                    raise UpstreamProtocolError("bad chunk size line")
                break
            line = bytes(buf[pos:eol])
            semi = line.find(b";")
            try:
                n = int(line if semi < 0 else line[:semi], 16)
            except ValueError:
                raise UpstreamProtocolError("bad chunk size") from None
            if n < 0:
                raise UpstreamProtocolError("bad chunk size")
            if n == 0:  # last chunk; optional trailers, then an empty line
                if buf[eol + 2:eol + 4] == b"\r\n":
                    end = eol + 4
                else:
                    end = buf.find(b"\r\n\r\n", eol + 2)
                    if end < 0:
                        break
                    end += 4
                del buf[:end]
                self._finish()
                return b"".join(parts)
            pos = eol + 2
            self._chunk_left = n + 2
        if pos:
            del buf[:pos]
        if not parts:
            return b""
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def read_some(self) -> bytes:
        """The next body bytes (all that are decodable now); b"" at the end of the body."""
        conn = self.conn
        while not self.done:
            out = self._take()
            if out:
                return out
            if self.done:
                break
            if conn.eof:
                if not self._chunked and self._length is None:
                    self.done = True
                    conn.close()
                    break
                raise UpstreamClosed("upstream closed the connection mid-body") from conn.exc
            await conn.wait_data()
        return b""

    async def read_all(self, limit: int | None = None) -> bytes:
        """The whole body; BodyTooLarge (connection dropped) once it exceeds `limit` bytes."""
        if limit is not None and self._length is not None and self._length > limit:
            self.close()
            raise BodyTooLarge(f"{self._length} bytes")
        parts = []
        size = 0
        while True:
            chunk = await self.read_some()
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                self.close()
                raise BodyTooLarge(f"over {limit} bytes")
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        """Done with this response: an unfinished body drops the connection."""
        if not self.done:
            self.done = True
            self.conn.close()

    def set_timeouts(self, idle_s: float | None, deadline: float | None) -> None:
        """Bound the following reads: `idle_s` per wait and the loop time `deadline`."""
        conn = self.conn
        conn.timeout_s = idle_s
        conn.deadline = deadline

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.raw_headers:
            if k.lower() == name:
                return v
        return None


def parse_head(head: bytes, conn: H1Conn) -> Response:
    lines = head.split(b"\r\n")
    status_line = lines[0]
    if not status_line.startswith(b"HTTP/1."):
        raise UpstreamProtocolError("response is not HTTP/1.x")
    parts = status_line.split(b" ", 2)
    try:
        status = int(parts[1])
    except (IndexError, ValueError):
        raise UpstreamProtocolError("bad status line") from None
    http10 = status_line.startswith(b"HTTP/1.0")
    raw: list[tuple[bytes, bytes]] = []
    ctype = ""
    length: int | None = None
    chunked = False
    keep_alive = not http10
    for line in lines[1:]:
        colon = line.find(b":")
        if colon <= 0:
            if not line:
                continue
            raise UpstreamProtocolError("bad header line")
        name = line[:colon].strip()
        value = line[colon + 1:].strip()
        raw.append((name, value))
        lname = name.lower()
        if lname == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise UpstreamProtocolError("bad content-length") from None
            if length < 0:
                raise UpstreamProtocolError("bad content-length")
        elif lname == b"transfer-encoding":
            chunked = value.lower().endswith(b"chunked")
        elif lname == b"content-type":
            ctype = value.decode("latin-1")
        elif lname == b"connection":
            v = value.lower()
            if b"close" in v:
                keep_alive = False
            elif b"keep-alive" in v:
                keep_alive = True
    if chunked:
        length = None
    elif length is None and status not in (204, 304):
        keep_alive = False  # framed by EOF
    if status in (204, 304):
        length, chunked = 0, False
    return Response(conn, status, raw, ctype, length, chunked, keep_alive)
