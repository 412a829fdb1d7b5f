"""SSE relay: complete events only, usage chunk found and hidden, garbage detected."""

from __future__ import annotations

import orjson
import pytest

from kthena_router.proxy.sse import InvalidStream, SseRelay, StreamEnd


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
    assert relay.ended


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
    assert not relay.ended
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


# --- end of stream per API ---------------------------------------------------------------

def _resp_event(kind: str, **fields: object) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **fields}) + b"\n\n"


def test_done_inside_model_text_is_not_the_end() -> None:
    text = _event({"id": "c", "choices": [{"index": 0, "delta": {"content": "x\ndata: [DONE]\n\n [DONE]"}}]})
    relay = SseRelay(hide_usage=False)
    assert relay.feed(text) == text
    assert not relay.ended and not relay.clean_eof()
    assert relay.feed(DONE) == DONE
    assert relay.ended and relay.clean_eof()


@pytest.mark.parametrize("spelling", [b"data: [DONE]\n\n", b"data:[DONE]\n\n", b"data: [DONE]\r\n\r\n"])
def test_done_field_spellings(spelling: bytes) -> None:
    relay = SseRelay(hide_usage=False)
    relay.feed(CONTENT[0] + spelling)
    assert relay.ended


RESP = {"id": "resp_1", "status": "in_progress", "usage": None}
RESP_STREAM = [
    _resp_event("response.created", sequence_number=0, response=RESP),
    _resp_event("response.output_text.delta", sequence_number=1, delta="see response.completed [DONE]"),
    _resp_event("response.output_text.delta", sequence_number=2, delta="more"),
]


@pytest.mark.parametrize("terminal", ["response.completed", "response.incomplete", "response.failed"])
@pytest.mark.parametrize("size", [1, 13, 1000])
def test_responses_end_with_terminal_event(terminal: str, size: int) -> None:
    final = {"id": "resp_1", "status": terminal.split(".")[1],
             "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}}
    stream = b"".join(RESP_STREAM) + _resp_event(terminal, sequence_number=3, response=final)
    relay = SseRelay(hide_usage=False, end=StreamEnd.RESPONSES)
    pieces = [stream[i:i + size] for i in range(0, len(stream), size)]
    out = b""
    for piece in pieces:
        out += relay.feed(piece)
        if relay.response_id is None:
            assert not relay.ended
    assert out == stream  # nothing hidden, nothing added
    assert relay.ended and relay.clean_eof()
    assert relay.response_id == "resp_1"
    assert relay.output_tokens == 2 and relay.usage["prompt_tokens"] == 5


def test_responses_text_naming_a_terminal_is_not_the_end() -> None:
    relay = SseRelay(hide_usage=False, end=StreamEnd.RESPONSES)
    relay.feed(b"".join(RESP_STREAM))
    assert relay.response_id == "resp_1"
    assert not relay.ended and not relay.clean_eof()


def test_responses_terminal_without_event_field() -> None:
    relay = SseRelay(hide_usage=False, end=StreamEnd.RESPONSES)
    relay.feed(_event({"type": "response.completed", "response": {"id": "resp_9", "usage": None}}))
    assert relay.ended and relay.response_id == "resp_9"


def test_eof_api_ends_cleanly_only_between_events() -> None:
    relay = SseRelay(hide_usage=False, end=StreamEnd.EOF)
    relay.feed(CONTENT[0])
    assert not relay.ended
    assert relay.clean_eof()
    cut = SseRelay(hide_usage=False, end=StreamEnd.EOF)
    cut.feed(CONTENT[0] + CONTENT[1][:5])
    assert not cut.clean_eof()
