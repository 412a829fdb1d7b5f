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
    lines, and `refusal`, the error for headers the router cannot honour: a compressed body
    (the body is parsed and forwarded as plain JSON, so the engine would try to decompress
    plain bytes) and an ambiguous Content-Type (engines refuse it in their own format)."""

    __slots__ = ("by_name", "upstream", "request_id", "refusal")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        by_name: dict[str, str] = {}
        kept: list[tuple[str, bytes]] = []
        ctypes = 0
        encoded = b""
        for k, v in raw:
            name = k.decode("latin-1").lower()
            by_name[name] = v.decode("latin-1")
            if name not in _DROP_REQUEST:
                kept.append((name, name.encode("latin-1") + b": " + v + b"\r\n"))
                if name == "content-type":
                    ctypes += 1
                elif name == "content-encoding" and v.strip().lower() not in (b"", b"identity"):
                    encoded = v
        self.refusal: RequestError | None = None
        if encoded:
            self.refusal = RequestError(415, f"Content-Encoding {encoded.decode('latin-1')!r} is not "
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
        # x-request-id last (tests and engines look for it there), then identity
        lines = [line for _, line in kept]
        lines.append(b"x-request-id: " + rid.encode("latin-1") + b"\r\n")
        lines.append(_IDENTITY)
        self.upstream = b"".join(lines)


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
