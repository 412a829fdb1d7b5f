"""SSE relay: complete events only, usage chunk found and hidden, garbage detected."""

from __future__ import annotations

import orjson
import pytest

from kthena_router.proxy.sse import InvalidStream, SseRelay


def _event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


CONTENT = [_event({"id": "c", "choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}) for i in range(3)]
USAGE = _event({"id": "c", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
DONE = b"data: [DONE]\n\n"
STREAM = b"".join(CONTENT) + USAGE + DONE


def _relay_all(relay: SseRelay, pieces: list[bytes]) -> bytes:
    return b"".join(relay.feed(p) for p in pieces)


@pytest.mark.parametrize("size", [1, 3, 7, 50, len(STREAM)])
def test_hidden_usage_any_split(size: int) -> None:
    relay = SseRelay(hide_usage=True)
    out = _relay_all(relay, [STREAM[i:i + size] for i in range(0, len(STREAM), size)])
    assert out == b"".join(CONTENT) + DONE
    assert relay.usage == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert relay.output_tokens == 3
    assert relay.saw_done


@pytest.mark.parametrize("size", [5, len(STREAM)])
def test_usage_shown_when_client_asked(size: int) -> None:
    relay = SseRelay(hide_usage=False)
    out = _relay_all(relay, [STREAM[i:i + size] for i in range(0, len(STREAM), size)])
    assert out == STREAM
    assert relay.output_tokens == 3


def test_whole_events_pass_through_as_the_same_object() -> None:
    relay = SseRelay(hide_usage=True)
    assert relay.feed(CONTENT[0]) is CONTENT[0]


def test_incomplete_event_is_held_until_complete() -> None:
    relay = SseRelay(hide_usage=True)
    assert relay.feed(CONTENT[0][:10]) == b""
    assert relay.feed(CONTENT[0][10:]) == CONTENT[0]


def test_continuous_usage_chunks_with_choices_are_kept() -> None:
    ev = _event({"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"completion_tokens": 1}})
    relay = SseRelay(hide_usage=True)
    assert relay.feed(ev) == ev
    assert relay.output_tokens == 1


def test_garbage_first_event_is_invalid() -> None:
    relay = SseRelay(hide_usage=False)
    with pytest.raises(InvalidStream):
        relay.feed(b"this is not sse\n\n")


def test_broken_json_in_usage_event_is_invalid() -> None:
    relay = SseRelay(hide_usage=True)
    relay.feed(CONTENT[0])
    with pytest.raises(InvalidStream):
        relay.feed(b'data: {"usage": {oops\n\n')


def test_stream_without_done() -> None:
    relay = SseRelay(hide_usage=True)
    relay.feed(CONTENT[0] + CONTENT[1][:5])
    assert not relay.saw_done
    assert relay.leftover() == CONTENT[1][:5]


def test_comment_first_is_valid_sse() -> None:
    relay = SseRelay(hide_usage=False)
    assert relay.feed(b": ping\n\n") == b": ping\n\n"


def test_truncated_json_in_first_block_is_invalid() -> None:
    relay = SseRelay(hide_usage=False)
    with pytest.raises(InvalidStream):
        relay.feed(b'data: {"id": "x", "choices": [{"delta": {"con\n\n')


def test_binary_garbage_after_first_event_is_invalid() -> None:
    relay = SseRelay(hide_usage=False)
    relay.feed(CONTENT[0])
    with pytest.raises(InvalidStream):
        relay.feed(b"\x00\xffgarbage without an SSE field\n\n")
