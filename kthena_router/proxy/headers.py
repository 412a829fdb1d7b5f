"""Header filtering between client and engine (RFC 9110 section 7.6.1).

Hop-by-hop headers, and any header a `Connection` header names, stay on their own hop in
both directions. Upstream we also drop what the router recomputes (Host, Content-Length),
the client's credentials (Authorization, x-api-key: the router's own auth reads them; a
ModelServer's upstream headers carry the engine's), and ask for an uncompressed body
(`accept-encoding: identity`): the router reads every answer (usage, errors, end of stream), and the OpenAI SDK asks for gzip.
A client's x-request-id is kept if printable and at most MAX_REQUEST_ID characters (it
goes into logs); otherwise a generated one replaces it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from kthena_router.errors import RequestError

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade",
})
_DROP_REQUEST = HOP_BY_HOP | {"host", "content-length", "authorization", "x-api-key", "x-request-id",
                              "accept-encoding"}
_DROP_RESPONSE = frozenset(n.encode() for n in HOP_BY_HOP | {"content-length", "x-request-id", "date", "server"})
_IDENTITY = b"accept-encoding: identity\r\n"
_PLAIN_CONNECTION = frozenset({"keep-alive", "close", "Keep-Alive", "Close"})
MAX_REQUEST_ID = 200


def connection_named(value: str) -> set[str]:
    """Header names listed in a Connection header value (lower case)."""
    return {token.strip().lower() for token in value.split(",") if token.strip()}


class RequestHeaders:
    """The client's headers, in one pass: all of them by name (route matching), the upstream
    lines, the few the proxy reads itself (Content-Length, Content-Type, cookies), and
    `refusal`, the error for headers the router cannot honour: a compressed body (the body
    is parsed and forwarded as plain JSON, so the engine would try to decompress plain
    bytes) and an ambiguous Content-Type (engines refuse it in their own format).

    Takes (lower-case name, value) str pairs: granian's RSGI headers as they are; ASGI's
    byte pairs through `from_asgi`."""

    __slots__ = ("by_name", "upstream", "request_id", "refusal", "content_type", "_length", "_cookies")

    @classmethod
    def from_asgi(cls, raw: list[tuple[bytes, bytes]]) -> RequestHeaders:
        return cls([(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in raw])

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        by_name: dict[str, str] = {}
        kept: list[tuple[str, str]] = []
        ctypes = 0
        encoded = ""
        cookies: list[str] | None = None
        for name, v in pairs:
            by_name[name] = v
            if name not in _DROP_REQUEST:
                kept.append((name, v))
                if name == "content-type":
                    ctypes += 1
                elif name == "cookie":
                    if cookies is None:
                        cookies = []
                    cookies.append(v)
                elif name == "content-encoding" and v.strip().lower() not in ("", "identity"):
                    encoded = v
        self.refusal: RequestError | None = None
        if encoded:
            self.refusal = RequestError(415, f"Content-Encoding {encoded!r} is not "
                                             "supported: send the request body uncompressed")
        elif ctypes > 1:
            self.refusal = RequestError(400, "more than one Content-Type header")
        conn = by_name.get("connection")
        if conn and conn not in _PLAIN_CONNECTION:  # anything it names stays on this hop
            named = connection_named(conn)
            kept = [kv for kv in kept if kv[0] not in named]
        rid = by_name.get("x-request-id", "")
        if not rid or len(rid) > MAX_REQUEST_ID or not rid.isprintable():
            rid = os.urandom(16).hex()
        self.by_name = by_name
        self.request_id = rid
        self.content_type = by_name.get("content-type", "")
        self._length = by_name.get("content-length")
        self._cookies = cookies
        # one encode for all lines; x-request-id last (tests and engines look for it there), then identity
        kept.append(("x-request-id", rid))
        self.upstream = "".join([f"{k}: {v}\r\n" for k, v in kept]).encode("latin-1") + _IDENTITY

    def content_length(self) -> int | None:
        if self._length is None:
            return None
        try:
            return int(self._length)
        except ValueError:
            raise RequestError(400, "invalid Content-Length header", param=None) from None

    def cookie_headers(self) -> list[tuple[bytes, bytes]]:
        """The Cookie headers, as raw pairs (session keys read cookies from these)."""
        return [(b"cookie", c.encode("latin-1")) for c in self._cookies or ()]


def response_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The engine's response headers that go on to the client."""
    named: set[bytes] = set()
    for k, v in raw:
        if k.lower() == b"connection":
            named |= {n.encode("latin-1") for n in connection_named(v.decode("latin-1"))}
    return [(k, v) for k, v in raw if (lk := k.lower()) not in _DROP_RESPONSE and lk not in named]


def content_encoded(raw: list[tuple[bytes, bytes]]) -> bool:
    """The engine compressed the body although we asked for identity."""
    for k, v in raw:
        if k.lower() == b"content-encoding" and v.strip().lower() not in (b"", b"identity"):
            return True
    return False
