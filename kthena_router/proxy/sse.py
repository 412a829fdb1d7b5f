"""SSE relay: forward engine bytes as they come, find the usage and the end of the stream.

Only complete events are forwarded (an incomplete tail waits for the next read; the
client could not use half an event anyway), so that a chunk is never split between
"forward" and "hide". Events are parsed only when a cheap substring test says they may
matter (`"usage"`, `[DONE]`, a terminal event name), so plain token events pass as bytes.

How a stream ends depends on the API (`StreamEnd`): chat and text completions with a
`data: [DONE]` event; the Responses API (vLLM, OpenAI) with a `response.completed`,
`response.incomplete` or `response.failed` event and no [DONE]; the Anthropic Messages
API (/v1/messages) with a `message_stop` (or its `error`) event and no [DONE]; anything
else with a clean end of the chunked body. `ended` says the terminator has been seen; `clean_eof()`
whether the body ending now is a complete stream.
"""

from __future__ import annotations

import enum
from typing import Any

import orjson

_DONE = b"[DONE]"
_USAGE = b'"usage"'
_FIELD_STARTS = (b"data:", b"event:", b"id:", b"retry:", b":")
_RESPONSE_TERMINALS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_TERMINAL_HINTS = (b"response.completed", b"response.incomplete", b"response.failed")
_CREATED_HINT = b"response.created"
_MESSAGES_HINTS = (b"message_start", b"message_delta", b"message_stop", b"error")
_MESSAGES_TERMINALS = frozenset({"message_stop", "error"})


class StreamEnd(enum.Enum):
    DONE = "done"            # data: [DONE]
    RESPONSES = "responses"  # a terminal response.* event
    EOF = "eof"              # no terminator: the end of the body
    MESSAGES = "messages"    # Anthropic Messages API: a message_stop (or error) event


class InvalidStream(Exception):
    """The engine's output is not an SSE stream."""


def _fields(event: bytes) -> tuple[bytes | None, bytes | None]:
    """(event name, data payload) of one event; None where the field is absent."""
    name = None
    data: list[bytes] = []
    for line in event.splitlines():
        if line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
        elif line.startswith(b"event:"):
            name = line[6:].strip()
    return name, (b"\n".join(data) if data else None)


def _has_done(block: bytes) -> bool:
    """Whether an event of the block is `data: [DONE]` (the field, not model text: JSON
    strings cannot hold a raw newline, so a data line that is just [DONE] is the marker)."""
    if _DONE not in block:
        return False
    for line in block.splitlines():
        if line.startswith(b"data:") and line[5:].strip() == _DONE:
            return True
    return False


def _check_events(block: bytes) -> None:
    """Every event has an SSE field and every data payload is JSON (or [DONE])."""
    for event in block.split(b"\n\n"):
        event = event.strip(b"\r\n")
        if not event:
            continue
        if not event.startswith(_FIELD_STARTS):
            raise InvalidStream("response is not an event stream")
        for line in event.splitlines():
            if line.startswith(b"data:"):
                data = line[5:].strip()
                if data != _DONE:
                    try:
                        orjson.loads(data)
                    except orjson.JSONDecodeError:
                        raise InvalidStream("data event is not JSON") from None


def _json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        raise InvalidStream("data event is not JSON") from None


class SseRelay:
    """Per-request state of one streamed response."""

    __slots__ = ("hide_usage", "end", "usage", "ended", "started", "response_id", "_pending", "_responses",
                 "_done", "_messages")

    def __init__(self, hide_usage: bool, end: StreamEnd = StreamEnd.DONE) -> None:
        self.hide_usage = hide_usage
        self.end = end
        self.usage: dict[str, Any] | None = None  # prompt_tokens/completion_tokens (any API)
        self.ended = False  # the API's terminator has been seen
        self.started = False  # at least one complete event seen
        self.response_id: str | None = None  # Responses API: the id the engine stored it under
        self._pending = b""
        self._responses = end is StreamEnd.RESPONSES  # (enum member lookups cost on every read)
        self._done = end is StreamEnd.DONE
        self._messages = end is StreamEnd.MESSAGES

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to forward for this read (maybe b""); raises InvalidStream on garbage."""
        buf = self._pending + chunk if self._pending else chunk
        if buf.endswith(b"\n\n"):  # the usual read: whole events
            cut = len(buf)
        else:
            lf, crlf = buf.rfind(b"\n\n"), buf.rfind(b"\r\n\r\n")
            cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if not cut:
            self._pending = buf
            if len(buf) > 1 << 20:  # an event over 1 MiB: not SSE from an engine
                raise InvalidStream("event exceeds 1 MiB without a terminator")
            return b""
        if cut == len(buf):
            self._pending = b""
            out = buf
        else:
            self._pending = buf[cut:]
            out = buf[:cut]
        if not self.started:
            _check_events(out)  # fully, once: garbage found here is retried elsewhere
            self.started = True
        elif not out.lstrip(b"\r\n").startswith(_FIELD_STARTS):  # later reads: a cheap check
            raise InvalidStream("response is not an event stream")
        if self._responses:
            self._responses_events(out)
            return out
        if self._messages:
            if any(h in out for h in _MESSAGES_HINTS):
                self._messages_events(out)
            return out
        if _USAGE in out:
            out = self._take_usage(out)
        if self._done and not self.ended and _has_done(out):
            self.ended = True
        return out

    def _take_usage(self, out: bytes) -> bytes:
        events = out.split(b"\n\n")
        kept: list[bytes] = []
        changed = False
        for event in events:
            if _USAGE in event:
                _name, data = _fields(event)
                obj = _json(data) if data is not None and data != _DONE else None
                usage = obj.get("usage") if type(obj) is dict else None
                if type(usage) is dict:
                    self.usage = usage
                    # The usage-only chunk (no choices) exists because we asked for it.
                    if self.hide_usage and not obj.get("choices"):
                        changed = True
                        continue
            kept.append(event)
        if not changed:
            return out
        return b"\n\n".join(kept)

    def _responses_events(self, out: bytes) -> None:
        """Responses API: the stored id (response.created) and the terminal event's usage."""
        created = self.response_id is None and _CREATED_HINT in out
        if not created and not any(h in out for h in _TERMINAL_HINTS):
            return
        for event in out.split(b"\n\n"):
            name, data = _fields(event)
            if data is None:
                continue
            kind = name.decode("latin-1") if name is not None else None
            if kind is not None and kind != "response.created" and kind not in _RESPONSE_TERMINALS:
                continue  # e.g. a text delta that mentions an event name
            obj = _json(data)
            if type(obj) is not dict:
                continue
            kind = kind or obj.get("type")
            response = obj.get("response")
            if type(response) is not dict:
                continue
            if kind == "response.created" or kind in _RESPONSE_TERMINALS:
                rid = response.get("id")
                if type(rid) is str and rid:
                    self.response_id = rid
            if kind in _RESPONSE_TERMINALS:
                self.ended = True
                usage = response.get("usage")
                if type(usage) is dict:
                    self.usage = {"prompt_tokens": usage.get("input_tokens"),
                                  "completion_tokens": usage.get("output_tokens"),
                                  "total_tokens": usage.get("total_tokens")}

    def _messages_events(self, out: bytes) -> None:
        """Anthropic: input tokens in message_start, output tokens (cumulative) in
        message_delta; message_stop, or an error event, ends the stream."""
        for event in out.split(b"\n\n"):
            name, data = _fields(event)
            if data is None or name is None:
                continue
            kind = name.decode("latin-1")
            if kind not in ("message_start", "message_delta") and kind not in _MESSAGES_TERMINALS:
                continue
            if kind in _MESSAGES_TERMINALS:
                self.ended = True
                continue
            obj = _json(data)
            if type(obj) is not dict:
                continue
            if kind == "message_start":
                msg = obj.get("message")
                usage = msg.get("usage") if type(msg) is dict else None
            else:
                usage = obj.get("usage")
            if type(usage) is not dict:
                continue
            current = self.usage or {}
            prompt = current.get("prompt_tokens")
            if kind == "message_start":
                parts = [usage.get(k) for k in ("input_tokens", "cache_creation_input_tokens",
                                                "cache_read_input_tokens")]
                prompt = sum(p for p in parts if type(p) is int)
            completion = usage.get("output_tokens")
            self.usage = {"prompt_tokens": prompt,
                          "completion_tokens": completion if type(completion) is int
                          else current.get("completion_tokens")}

    def clean_eof(self) -> bool:
        """The engine's body ended now: was the stream complete?"""
        if self.ended:
            return True
        if self.end is StreamEnd.EOF and not self._pending.strip(b"\r\n"):
            self.ended = True
        return self.ended

    def leftover(self) -> bytes:
        """An incomplete final event (the engine closed mid-event)."""
        return self._pending

    @property
    def output_tokens(self) -> int | None:
        usage = self.usage
        if usage is None:
            return None
        value = usage.get("completion_tokens")
        return value if type(value) is int else None
