"""SSE relay: forward engine bytes as they come, find the usage chunk, hide it if asked.

Only complete events are forwarded (an incomplete tail waits for the next read; the
client could not use half an event anyway), so that a chunk is never split between
"forward" and "hide". Events are parsed only when they contain `"usage"`, which in
practice is the final data event when the router injected include_usage.
"""

from __future__ import annotations

from typing import Any

import orjson

_DONE = b"data: [DONE]"
_USAGE = b'"usage"'
_FIELD_STARTS = (b"data:", b"event:", b"id:", b"retry:", b":")


class InvalidStream(Exception):
    """The engine's output is not an SSE stream."""


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
                if data != b"[DONE]":
                    try:
                        orjson.loads(data)
                    except orjson.JSONDecodeError:
                        raise InvalidStream("data event is not JSON") from None


class SseRelay:
    """Per-request state of one streamed response."""

    __slots__ = ("hide_usage", "usage", "saw_done", "started", "_pending")

    def __init__(self, hide_usage: bool) -> None:
        self.hide_usage = hide_usage
        self.usage: dict[str, Any] | None = None
        self.saw_done = False
        self.started = False  # at least one complete event seen
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to forward for this read (maybe b""); raises InvalidStream on garbage."""
        buf = self._pending + chunk if self._pending else chunk
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            cut = buf.rfind(b"\r\n\r\n")
            if cut < 0:
                self._pending = buf
                if len(buf) > 1 << 20:  # an event over 1 MiB: not SSE from an engine
                    raise InvalidStream("event exceeds 1 MiB without a terminator")
                return b""
            cut += 4
        else:
            cut += 2
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
        if _USAGE in out:
            out = self._take_usage(out)
        if not self.saw_done and _DONE in out:
            self.saw_done = True
        return out

    def _take_usage(self, out: bytes) -> bytes:
        events = out.split(b"\n\n")
        kept: list[bytes] = []
        changed = False
        for event in events:
            if _USAGE in event and event.startswith(b"data:"):
                try:
                    obj = orjson.loads(event[5:])
                except orjson.JSONDecodeError:
                    raise InvalidStream("data event is not JSON") from None
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
