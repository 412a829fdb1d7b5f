"""The fuzz driver's oracle (loadtest/fuzz_router.py) and case generation: violations are
detected, and generation is deterministic and covers every family."""

from __future__ import annotations

import collections

from loadtest.fuzz_cases import Case, generate
from loadtest.fuzz_router import Reply, check, openai_error_problem, stream_problem

JSON = {b"content-type": b"application/json"}
ERR = b'{"error": {"message": "bad", "type": "invalid_request_error", "param": null, "code": 400}}'
STRICT = Case("valid", b"POST /v1/completions HTTP/1.1\r\n\r\n", "POST", True)
LOOSE = Case("wire", b"\x00garbage", "GET", False)
PORTS = {8001}


def kinds(case: Case, reply: Reply, follow: Reply | None = None) -> list[str]:
    return [k for k, _ in check(case, reply, follow, PORTS)]


def test_openai_error_shape():
    assert openai_error_problem(Reply(400, JSON, ERR, True)) is None
    assert "content-type" in openai_error_problem(Reply(400, {b"content-type": b"text/plain"}, ERR, True))
    assert openai_error_problem(Reply(400, JSON, b"oops", True)) == "body is not JSON"
    assert openai_error_problem(Reply(400, JSON, b'{"detail": "x"}', True)) == "not {'error': {...}}"
    assert "fields" in openai_error_problem(Reply(400, JSON, b'{"error": {"message": "x"}}', True))


def test_stream_end():
    assert stream_problem(b"data: {}\n\ndata: [DONE]\n\n") is None
    assert "error event" in stream_problem(b'data: {}\n\ndata: {"error": {"message": "x"}}\n\n')
    assert "[DONE]" in stream_problem(b"data: {}\n\n")


def test_violations_of_one_exchange():
    assert kinds(STRICT, Reply(200, JSON, b"{}", True)) == []
    assert kinds(STRICT, Reply(502, {b"content-type": b"text/html"}, b"<h1>bad</h1>", True)) == ["non_openai_error"]
    assert kinds(STRICT, Reply(error="closed")) == ["no_response"]
    assert kinds(LOOSE, Reply(error="closed")) == []
    assert kinds(LOOSE, Reply(400, {}, b"", True)) == []  # the HTTP layer's own refusal
    assert kinds(STRICT, Reply(400, JSON, ERR.replace(b"bad", b"at 127.0.0.1:8001"), True)) == ["leak"]
    assert kinds(STRICT, Reply(500, JSON, b"Traceback (most recent call last)", True)) == \
        ["leak", "non_openai_error"]
    sse = {b"content-type": b"text/event-stream"}
    assert kinds(STRICT, Reply(200, sse, b"data: {}\n\n", True)) == ["stream_error"]
    assert kinds(STRICT, Reply(200, sse, b"data: {}\n\n", False, "closed")) == ["stream_error"]
    ok = Reply(200, JSON, b"{}", True)
    assert kinds(STRICT, ok, Reply(400, JSON, ERR, True)) == ["follow_up"]
    assert kinds(STRICT, ok, Reply(error="closed")) == []  # the router may close after a reply
    assert kinds(STRICT, ok, Reply(error="malformed: x")) == ["malformed_response"]


def test_generation_is_deterministic_and_covers_every_family():
    a = generate(300, 5)
    assert len(a) == 300 and a == generate(300, 5)
    assert a != generate(300, 6)
    families = collections.Counter(c.kind for c in a)
    assert set(families) >= {"valid", "stream", "wrong_field", "garbage_json", "unknown_model", "odd_prompt",
                             "method", "headers", "chunked", "truncated", "wire", "abort"}, families
    assert all(c.strict == (c.kind not in {"truncated", "bad_chunked", "bad_framing", "wire", "abort"}) for c in a)
    assert all(b"x-request-id: r1\r\n" in c.wire("r1") for c in a if c.strict)
