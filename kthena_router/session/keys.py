"""The session key of a request: the first non-empty source of the route's sessionSticky.

Header names are matched case-insensitively, query keys and cookie names exactly
(Kthena's proposal). A JWTClaim reads the verified claims of the request's identity;
without JWT authentication (no claims) it is empty, and the next source is tried. A
claim that is not a string (a number, a list) is used as its JSON text, so that a
numeric user id still makes a key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs

from ..config.model import SessionKeySource

__all__ = ["MAX_KEY_CHARS", "session_key"]

MAX_KEY_CHARS = 4096  # longer values are still keys (they are hashed), but no more is read


def session_key(sources: Sequence[SessionKeySource], headers: Mapping[str, str],
                raw_headers: Sequence[tuple[bytes, bytes]], query_string: bytes,
                claims: Mapping[str, Any]) -> str:
    """"" when no source gives a value."""
    query: dict[str, list[str]] | None = None
    for src in sources:
        kind = src.type
        if kind == "Header":
            value = headers.get(src.name, "").strip()
        elif kind == "Query":
            if query is None:
                query = parse_qs(query_string.decode("latin-1"), keep_blank_values=False) if query_string else {}
            values = query.get(src.name)
            value = values[0].strip() if values else ""
        elif kind == "Cookie":
            value = _cookie(raw_headers, src.name)
        else:  # JWTClaim
            value = _claim(claims.get(src.name))
        if value:
            return value[:MAX_KEY_CHARS]
    return ""


def _cookie(raw_headers: Sequence[tuple[bytes, bytes]], name: str) -> str:
    """The first cookie called `name` in the request's Cookie header(s) (HTTP/2 may split them)."""
    for k, v in raw_headers:
        if k.lower() != b"cookie":
            continue
        for part in v.decode("latin-1").split(";"):
            cname, sep, value = part.strip().partition("=")
            if sep and cname == name:
                value = value.strip()
                if len(value) >= 2 and value[0] == value[-1] == '"':
                    value = value[1:-1]
                if value:
                    return value
    return ""


def _claim(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return ""
