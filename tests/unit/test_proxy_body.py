"""Request body: size limit, validation errors (status + param), minimal rewrite."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from kthena_router.errors import RequestError
from kthena_router.proxy import body as body_mod
from kthena_router.proxy.body import (
    DRAIN_BYTES,
    ClientDisconnected,
    needs_usage_injection,
    parse_body,
    read_body,
    rewrite,
)

CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"


def _receiver(chunks: list[bytes], then: str | None = None) -> Any:
    msgs: list[dict[str, Any]] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]
    if then:
        msgs[-1]["more_body"] = True
        msgs.append({"type": then})
    it = iter(msgs)

    async def receive() -> dict[str, Any]:
        return next(it)

    return receive


async def test_read_body_joins_chunks() -> None:
    assert await read_body(_receiver([b"ab", b"", b"cd"]), None, 100) == b"abcd"


async def test_read_body_refuses_past_the_limit_after_a_bounded_drain() -> None:
    read = 0

    async def receive() -> dict[str, Any]:  # an endless body
        nonlocal read
        read += 10_000
        return {"type": "http.request", "body": b"x" * 10_000, "more_body": True}

    with pytest.raises(RequestError) as info:
        await read_body(receive, None, 25_000)
    assert info.value.status == 413
    # the rest was read and dropped (so that the 413 reaches a client still sending), but
    # only up to DRAIN_BYTES past the limit
    assert 25_000 + DRAIN_BYTES <= read <= 25_000 + DRAIN_BYTES + 10_000


async def test_declared_length_over_limit_is_drained_then_refused() -> None:
    chunks = [b"x" * 600, b"x" * 400]
    msgs = iter([{"type": "http.request", "body": c, "more_body": i == 0} for i, c in enumerate(chunks)])

    async def receive() -> dict[str, Any]:
        return next(msgs)

    with pytest.raises(RequestError) as info:
        await read_body(receive, 1000, 999)
    assert info.value.status == 413
    assert next(msgs, None) is None  # all of it was read


async def test_declared_length_far_over_limit_is_refused_before_reading() -> None:
    async def receive() -> dict[str, Any]:
        raise AssertionError("must not read")

    with pytest.raises(RequestError) as info:
        await read_body(receive, 1000 + DRAIN_BYTES + 1, 999)
    assert info.value.status == 413


async def test_disconnect_while_reading() -> None:
    with pytest.raises(ClientDisconnected):
        await read_body(_receiver([b"{"], then="http.disconnect"), None, 100)


@pytest.mark.parametrize(
    ("raw", "path", "param", "fragment"),
    [
        (b"", CHAT, None, "empty"),
        (b"{bad", CHAT, None, "not valid JSON"),
        (b"[1,2]", CHAT, None, "got array"),
        (b'"s"', CHAT, None, "got string"),
        (b'{"messages": []}', CHAT, "model", "missing"),
        (b'{"model": 3, "messages": []}', CHAT, "model", "non-empty string"),
        (b'{"model": "", "messages": []}', CHAT, "model", "non-empty string"),
        (b'{"model": "m", "stream": "yes", "messages": []}', CHAT, "stream", "boolean"),
        (b'{"model": "m"}', CHAT, "messages", "missing"),
        (b'{"model": "m", "messages": "hi"}', CHAT, "messages", "array"),
        (b'{"model": "m"}', COMPL, "prompt", "missing"),
        (b'{"model": "m", "prompt": 5}', COMPL, "prompt", "string or an array"),
        (b'{"model": "m", "prompt": "p", "max_tokens": "5"}', COMPL, "max_tokens", "integer"),
        (b'{"model": "m", "prompt": "p", "max_tokens": 1.5}', COMPL, "max_tokens", "integer"),
        (b'{"model": "m", "prompt": "p", "stream": true, "stream_options": 1}', COMPL, "stream_options", "object"),
    ],
)
def test_validation_errors(raw: bytes, path: str, param: str | None, fragment: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_body(raw, path)
    assert info.value.status == 400
    assert info.value.param == param
    assert fragment in info.value.message


def test_other_paths_need_only_a_model() -> None:
    parsed = parse_body(b'{"model": "m", "input": "x"}', "/v1/embeddings")
    assert parsed.model == "m" and parsed.stream is False


def test_unchanged_body_is_forwarded_as_the_same_bytes() -> None:
    raw = b'{"model":"m","messages":[],"x":1.50}'
    parsed = parse_body(raw, CHAT)
    assert rewrite(parsed, "m", False) is raw
    assert rewrite(parsed, None, False) is raw


def test_model_rewrite_keeps_other_bytes() -> None:
    raw = b'{"model": "public", "messages": [], "temperature": 1.50, "unknown_field": {"a": [1, 2]}}'
    out = rewrite(parse_body(raw, CHAT), "served/name", False)
    assert out == raw.replace(b'"public"', b'"served/name"')


def test_usage_injection_merges_stream_options() -> None:
    raw = b'{"model":"m","messages":[],"stream":true,"stream_options":{"continuous_usage_stats":false}}'
    parsed = parse_body(raw, CHAT)
    assert needs_usage_injection(parsed)
    out = orjson.loads(rewrite(parsed, "m", True))
    assert out["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert out["model"] == "m"


def test_usage_injection_appends_when_absent() -> None:
    parsed = parse_body(b'{"model":"m","prompt":"p","stream":true}', COMPL)
    out = orjson.loads(rewrite(parsed, "n", True))
    assert out == {"model": "n", "prompt": "p", "stream": True, "stream_options": {"include_usage": True}}


def test_no_injection_when_client_asked_or_not_streaming() -> None:
    asked = parse_body(b'{"model":"m","prompt":"p","stream":true,"stream_options":{"include_usage":true}}', COMPL)
    assert asked.client_wants_usage and not needs_usage_injection(asked)
    plain = parse_body(b'{"model":"m","prompt":"p"}', COMPL)
    assert not needs_usage_injection(plain)


def test_orjson_fallback_gives_the_same_document(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = b'{"model":"a","prompt":"p","stream":true}'
    spliced = orjson.loads(rewrite(parse_body(raw, COMPL), "b", True))
    monkeypatch.setattr(body_mod, "_splice", None)
    fallback = orjson.loads(rewrite(parse_body(raw, COMPL), "b", True))
    assert spliced == fallback


def test_rust_splice_is_used() -> None:
    assert body_mod._splice is not None, "kthena_router._core.splice_top_level missing from the build"


def test_duplicate_model_keys_are_all_rewritten() -> None:
    raw = b'{"model":"a","prompt":"p","model":"a"}'
    out = rewrite(parse_body(raw, COMPL), "b", False)
    assert b'"a"' not in out and orjson.loads(out)["model"] == "b"


