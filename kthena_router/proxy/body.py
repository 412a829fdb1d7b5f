"""Request body: read with a size limit, parse once, validate, rewrite changed keys only.

The body is parsed once with orjson. When nothing changes, the original bytes are
forwarded; otherwise only the changed top-level members ("model", "stream_options") are
spliced in by the Rust extension, so unknown fields and number spellings pass untouched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from kthena_router.errors import RequestError

try:  # the Rust splice; the orjson fallback only covers builds without it
    from kthena_router._core import splice_top_level as _splice
except ImportError:  # pragma: no cover - depends on the build
    _splice = None

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


class ClientDisconnected(Exception):
    """The client went away while we were reading its body."""


# Bytes past the limit read and dropped before the 413 goes out. Closing a connection with
# unread input sends a TCP reset, which can destroy the 413 before a client still sending
# reads it; draining lets the reply through and keeps the connection usable. Longer bodies
# are refused at once (Go's net/http drains 256 KiB the same way).
DRAIN_BYTES = 1 << 20


async def _drain(receive: Receive, budget: int) -> None:
    """Read and drop the rest of the body, at most about `budget` bytes."""
    while budget > 0:
        msg = await receive()
        if msg["type"] != "http.request":
            return
        budget -= len(msg.get("body", b""))
        if not msg.get("more_body", False):
            return


def _too_large(limit: int) -> RequestError:
    return RequestError(413, f"request body exceeds the limit of {limit} bytes")


async def read_body(receive: Receive, declared: int | None, limit: int) -> bytes:
    """Read the whole body, refusing (413) once it exceeds `limit` bytes (after draining
    up to DRAIN_BYTES more)."""
    if declared is not None and declared > limit:
        if declared - limit <= DRAIN_BYTES:
            await _drain(receive, declared)
        raise _too_large(limit)
    first = b""
    parts: list[bytes] | None = None
    size = 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            raise ClientDisconnected()
        chunk = msg.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                if msg.get("more_body", False):
                    await _drain(receive, limit + DRAIN_BYTES - size)
                raise _too_large(limit)
            if not first:
                first = chunk
            else:
                if parts is None:
                    parts = [first]
                parts.append(chunk)
        if not msg.get("more_body", False):
            break
    return b"".join(parts) if parts is not None else first


class ParsedBody:
    """The parsed request and what the router needs from it."""

    __slots__ = ("raw", "obj", "model", "stream", "client_wants_usage")

    def __init__(self, raw: bytes, obj: dict[str, Any], model: str, stream: bool, client_wants_usage: bool) -> None:
        self.raw = raw
        self.obj = obj
        self.model = model
        self.stream = stream
        self.client_wants_usage = client_wants_usage


def _type_name(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def parse_body(raw: bytes, path: str) -> ParsedBody:
    """Parse and validate; raises RequestError(400) naming the offending field."""
    if not raw:
        raise RequestError(400, "request body is empty; expected a JSON object")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}") from None
    if type(obj) is not dict:
        raise RequestError(400, f"request body must be a JSON object, got {_type_name(obj)}")
    model = obj.get("model")
    if model is None:
        raise RequestError(400, "missing required field 'model'", param="model")
    if type(model) is not str or not model:
        raise RequestError(400, "'model' must be a non-empty string", param="model")
    stream = obj.get("stream", False)
    if stream is None:
        stream = False
    elif type(stream) is not bool:
        raise RequestError(400, f"'stream' must be a boolean, got {_type_name(stream)}", param="stream")
    if path == CHAT_PATH:
        messages = obj.get("messages")
        if type(messages) is not list:
            what = "missing required field 'messages'" if messages is None else \
                f"'messages' must be an array, got {_type_name(messages)}"
            raise RequestError(400, what, param="messages")
    elif path == COMPLETIONS_PATH:
        prompt = obj.get("prompt")
        if type(prompt) not in (str, list):
            what = "missing required field 'prompt'" if prompt is None else \
                f"'prompt' must be a string or an array, got {_type_name(prompt)}"
            raise RequestError(400, what, param="prompt")
    for name in ("max_tokens", "max_completion_tokens"):
        value = obj.get(name)
        if value is not None and type(value) is not int:
            raise RequestError(400, f"'{name}' must be an integer, got {_type_name(value)}", param=name)
    stream_options = obj.get("stream_options")
    wants_usage = False
    if stream_options is not None:
        if type(stream_options) is not dict:
            raise RequestError(400, f"'stream_options' must be an object, got {_type_name(stream_options)}",
                               param="stream_options")
        wants_usage = stream_options.get("include_usage") is True
    return ParsedBody(raw, obj, model, stream, wants_usage)


def needs_usage_injection(body: ParsedBody) -> bool:
    """Streaming without include_usage: ask the engine for usage so output tokens count."""
    return body.stream and not body.client_wants_usage


def rewrite(body: ParsedBody, upstream_model: str | None, inject_usage: bool) -> bytes:
    """Bytes for the engine: the original ones unless "model"/"stream_options" change."""
    replacements = model_replacement(body, upstream_model)
    if inject_usage:
        options = body.obj.get("stream_options") or {}
        replacements.append((b"stream_options", orjson.dumps({**options, "include_usage": True})))
    return splice(body, replacements)


def model_replacement(body: ParsedBody, upstream_model: str | None) -> list[tuple[bytes, bytes]]:
    """The "model" member the engine needs (none when the client's name is the engine's)."""
    if upstream_model is not None and upstream_model != body.model:
        return [(b"model", orjson.dumps(upstream_model))]
    return []


def splice(body: ParsedBody, replacements: list[tuple[bytes, bytes]]) -> bytes:
    """The body with these top-level members set (raw JSON values); the rest verbatim."""
    if not replacements:
        return body.raw
    if _splice is not None:
        return _splice(body.raw, replacements)
    patched = dict(body.obj)  # fallback: re-encodes the whole body
    for key, value in replacements:
        patched[key.decode()] = orjson.loads(value)
    return orjson.dumps(patched)
