"""Wire-level abuse of the real router over raw sockets: truncated bodies, clients that close
or reset mid-body, slow (slowloris-style) clients, pipelining, HTTP/1.0, bad chunked
framing, bodies that look like requests, huge header values and URLs, random request bytes.

Each test ends with the same check (fixture `guard`): the router's workers are the same
processes as before, /readyz is 200, and normal chat completions are served. Malformed
requests must not reach an engine. Request-body cases: test_bad_input_bodies.py.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import harness
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest.fuzz_strategies import wire_header_lines, wire_methods, wire_paths, wire_versions

MSGS = [{"role": "user", "content": "hi"}]
IO_TIMEOUT = 30.0  # generous: only there so that a stalled router fails the test instead of hanging
VALID = b'{"model": "demo", "prompt": "hello", "max_tokens": 1}'

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


# --- helpers -------------------------------------------------------------------------------


def assert_no_leak(text: bytes | str, sim: harness.Simulator) -> None:
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    assert "Traceback" not in text and 'File "/' not in text, f"traceback in a response: {text[:500]}"
    for port in sim.ports:
        for host in ("127.0.0.1", "localhost"):
            assert f"{host}:{port}" not in text, f"backend address {host}:{port} leaked: {text[:500]}"


class Reply:
    def __init__(self, version: bytes, status: int, headers: dict[bytes, bytes], body: bytes) -> None:
        self.version, self.status, self.headers, self.body = version, status, headers, body

    def json_error(self) -> dict[str, Any]:
        assert self.headers.get(b"content-type", b"").startswith(b"application/json"), (self.status, self.headers)
        obj = json.loads(self.body)
        assert set(obj) == {"error"} and set(obj["error"]) == {"message", "type", "param", "code"}, obj
        assert obj["error"]["message"], obj
        return obj["error"]

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.body[:120]!r})"


def parse_replies(data: bytes) -> list[Reply]:
    """HTTP/1.x responses back to back (Content-Length bodies, or a body up to EOF)."""
    out: list[Reply] = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, f"incomplete response head: {data[:300]!r}"
        lines = head.split(b"\r\n")
        version, status = lines[0].split(b" ", 2)[:2]
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            headers[k.strip().lower()] = v.strip()
        code = int(status)
        if 100 <= code < 200:
            data = rest
            continue
        if b"content-length" in headers:
            n = int(headers[b"content-length"])
            body, data = rest[:n], rest[n:]
        else:
            body, data = rest, b""
        out.append(Reply(version, code, headers, body))
    return out


def connect(router: harness.Router) -> socket.socket:
    s = socket.create_connection((harness.HOST, router.port), timeout=IO_TIMEOUT)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_until_close(s: socket.socket, expect: int | None = None) -> bytes:
    """Read until EOF (or until `expect` complete replies have arrived)."""
    data = b""
    while True:
        if expect is not None:
            try:
                if len(parse_replies(data)) >= expect and _complete(data):
                    return data
            except (AssertionError, ValueError, IndexError):
                pass
        try:
            got = s.recv(65536)
        except ConnectionResetError:
            return data
        except socket.timeout:
            raise AssertionError(f"router did not answer/close within {IO_TIMEOUT}s; got {data[:300]!r}") from None
        if not got:
            return data
        data += got


def _complete(data: bytes) -> bool:
    """Every Content-Length body in `data` is complete."""
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            return False
        n = 0
        for line in head.split(b"\r\n")[1:]:
            if line.lower().startswith(b"content-length:"):
                n = int(line.split(b":", 1)[1])
        if len(rest) < n:
            return False
        data = rest[n:]
    return True


def exchange(router: harness.Router, raw: bytes, expect: int | None = None) -> list[Reply]:
    with connect(router) as s:
        s.sendall(raw)
        return parse_replies(read_until_close(s, expect))


def request(path: bytes, body: bytes, *, method: bytes = b"POST", version: bytes = b"HTTP/1.1",
            extra: bytes = b"", close: bool = False) -> bytes:
    head = method + b" " + path + b" " + version + b"\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += extra
    if close:
        head += b"Connection: close\r\n"
    return head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body


@pytest.fixture
def guard(router: harness.Router, simulator: harness.Simulator) -> Iterator[harness.Router]:
    pids = sorted(router.worker_pids())
    assert len(pids) == router.workers, pids
    yield router
    assert router.process.alive(), router.process.tail()
    assert router.readyz().status_code == 200
    for _ in range(2 * router.workers):
        with httpx.Client(timeout=IO_TIMEOUT) as http:  # fresh connections: any worker may take them
            harness.chat_ok(router, http)
    assert sorted(router.worker_pids()) == pids, "a router worker was restarted"


# --- clients that go away -------------------------------------------------------------------


def _rst(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.mark.parametrize("how", ["close", "reset", "half_close"])
@pytest.mark.parametrize("what", ["headers_only", "body_part", "chunked_part", "header_part"])
def test_client_goes_away_mid_request(guard: harness.Router, simulator: harness.Simulator,
                                      how: str, what: str) -> None:
    """Content-Length 1000 with 10 bytes sent (and friends), then close / RST / half-close."""
    raws = {
        "headers_only": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n",
        "body_part": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + VALID[:10],
        "chunked_part": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"a\r\n" + VALID[:10] + b"\r\n",
        "header_part": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le",
    }
    for _ in range(3 * guard.workers):
        s = connect(guard)
        try:
            s.sendall(raws[what])
            time.sleep(0.02)  # let the router start reading
            if how == "reset":
                _rst(s)
            elif how == "half_close":
                s.shutdown(socket.SHUT_WR)
                data = read_until_close(s)
                # nothing, or a clean HTTP error; never a traceback, never a success
                assert_no_leak(data, simulator)
                for reply in parse_replies(data):
                    assert reply.status >= 400, reply
        finally:
            s.close()
    assert harness.engine_total(simulator) == 0


def test_slow_clients_do_not_block_others(guard: harness.Router, simulator: harness.Simulator) -> None:
    """Slowloris-style: many connections holding half-sent headers or bodies (bounded in
    number and time) do not keep the worker(s) from serving other clients."""
    held: list[socket.socket] = []
    try:
        for i in range(12 * guard.workers):
            s = connect(guard)
            if i % 3 == 0:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            elif i % 3 == 1:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + VALID[:10])
            else:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"mod")
            held.append(s)
        for rnd in range(3):
            for s in held:  # drip one more byte into each slow header / body
                try:
                    s.sendall(b"a")
                except OSError:
                    pass
            with httpx.Client(timeout=IO_TIMEOUT) as http:
                r = http.post(f"{guard.openai_url}/completions", content=VALID)
                assert r.status_code == 200, (rnd, r.text[:200])
        assert guard.readyz().status_code == 200
    finally:
        for s in held:
            _rst(s)
            s.close()
    assert harness.engine_total(simulator) == 3


# --- framing ---------------------------------------------------------------------------------


def test_pipelined_requests_answered_in_order(guard: harness.Router, simulator: harness.Simulator) -> None:
    raw = (request(b"/v1/completions", b"{not json")
           + request(b"/v1/completions", VALID)
           + request(b"/v1/completions", b'{"model": "nope", "prompt": "x"}')
           + request(b"/v1/chat/completions", b'{"model": "demo", "messages": "x"}')
           + request(b"/v1/completions", VALID, method=b"GET")
           + b"GET /nothing-here HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    replies = exchange(guard, raw)
    assert [r.status for r in replies] == [400, 200, 404, 400, 405, 404], replies
    assert replies[3].json_error()["param"] == "messages"
    assert replies[2].json_error()["param"] == "model"
    for r in replies:
        assert_no_leak(r.body, simulator)
    assert json.loads(replies[1].body)["usage"]["completion_tokens"] == 1
    assert harness.engine_total(simulator) == 1


@pytest.mark.parametrize(("first", "status"), [
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{", 400),   # body read, bad JSON
    (b"GET /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 405),     # body never read
    (b"POST /nothing HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 404),
])
def test_body_that_looks_like_a_request_is_not_one(guard: harness.Router, simulator: harness.Simulator,
                                                    first: bytes, status: int) -> None:
    """Whether or not the router reads a body, its bytes never become a second request."""
    inner = request(b"/v1/completions", VALID)
    prefix = b"{" if first.endswith(b"{") else b""
    raw = (first % (len(prefix) + len(inner))) + inner + \
        b"GET /other-path HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    replies = exchange(guard, raw)
    assert [r.status for r in replies] == [status, 404], replies
    assert b"/other-path" in replies[1].body
    assert harness.engine_total(simulator) == 0


def test_http10_requests(guard: harness.Router, simulator: harness.Simulator) -> None:
    ok = exchange(guard, request(b"/v1/completions", VALID, version=b"HTTP/1.0"))
    assert [r.status for r in ok] == [200], ok
    bad = exchange(guard, request(b"/v1/completions", b"[]", version=b"HTTP/1.0"))
    assert [r.status for r in bad] == [400], bad
    bad[0].json_error()
    missing = exchange(guard, request(b"/v1/chat/completions", b'{"model": "demo"}', version=b"HTTP/1.0"))
    assert missing[0].status == 400 and missing[0].json_error()["param"] == "messages"
    assert harness.engine_total(simulator) == 1


def test_chunked_body_is_accepted(guard: harness.Router, simulator: harness.Simulator) -> None:
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(VALID[i:i + 7]), VALID[i:i + 7]) for i in range(0, len(VALID), 7))
    raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
           + chunks + b"0\r\n\r\n")
    replies = exchange(guard, raw)
    assert [r.status for r in replies] == [200], replies
    bad = b"{\"model\": 1}"
    raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
           + b"%x\r\n%s\r\n0\r\n\r\n" % (len(bad), bad))
    replies = exchange(guard, raw)
    assert [r.status for r in replies] == [400] and replies[0].json_error()["param"] == "model", replies
    assert harness.engine_total(simulator) == 1


def test_invalid_chunked_framing_is_a_client_error(guard: harness.Router, simulator: harness.Simulator) -> None:
    raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
           b"zz\r\nabc\r\n0\r\n\r\n")
    replies = exchange(guard, raw)
    assert harness.engine_total(simulator) == 0
    for r in replies:
        assert_no_leak(r.body, simulator)
    assert [r.status for r in replies] == [400], replies


# (raw request, the status the router answers with; None: it closes without a reply)
_PROTOCOL_ERRORS = {
    "two-cl": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n{x}}", 400),
    "negative-cl": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}", 400),
    "huge-cl": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n{}",
                400),
    "float-cl": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1e3\r\n\r\n{}", 400),
    "nul-in-header": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\n{}", 400),
    "300-headers": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                    + b"".join(b"X-H%d: v\r\n" % i for i in range(300)) + b"\r\n", 431),
    "200k-url": (b"POST /v1/" + b"a" * 200_000 + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 414),
    "http09": (b"GET /v1/models\r\n\r\n", 400),
    "binary": (b"\x00\x01\x02\x03 garbage\r\n\r\n", 400),
    "h2-preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", None),
    "http-9.9": (b"POST /v1/completions HTTP/9.9\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 400),
}


@pytest.mark.parametrize("case", list(_PROTOCOL_ERRORS))
def test_protocol_errors(guard: harness.Router, simulator: harness.Simulator, case: str) -> None:
    """Requests the HTTP layer refuses, each with its own outcome: the status in the table
    (or a closed connection for an HTTP/2 preface), never a traceback or an engine request."""
    raw, status = _PROTOCOL_ERRORS[case]
    with connect(guard) as s:
        s.sendall(raw)
        try:
            s.shutdown(socket.SHUT_WR)  # EOF after the bytes: the answer must come now
        except OSError:
            pass
        data = read_until_close(s)
    assert_no_leak(data, simulator)
    if status is None:
        assert data == b"", data[:300]
    else:
        assert [r.status for r in parse_replies(data)] == [status], data[:300]
    assert harness.engine_total(simulator) == 0


def test_content_length_with_transfer_encoding_is_refused(guard: harness.Router,
                                                           simulator: harness.Simulator) -> None:
    """Both framings at once (request smuggling): 400, and the connection is closed."""
    raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    with connect(guard) as s:
        s.sendall(raw)  # no half-close here: the reply must not race our EOF
        data = read_until_close(s)
    assert_no_leak(data, simulator)
    assert [r.status for r in parse_replies(data)] == [400], data[:300]
    assert harness.engine_total(simulator) == 0


def test_huge_header_value(guard: harness.Router, simulator: harness.Simulator) -> None:
    """A 200 KB header value: the router's HTTP layer refuses it (400: a header line over
    its 8190-byte limit), never a 5xx, a leak or an engine request."""
    raw = request(b"/v1/completions", VALID, extra=b"X-Big: " + b"a" * 200_000 + b"\r\n", close=True)
    replies = exchange(guard, raw)
    assert len(replies) == 1, replies
    assert replies[0].status == 400, replies
    assert_no_leak(replies[0].body, simulator)
    assert harness.engine_total(simulator) == 0


# --- random request bytes -------------------------------------------------------------

@FUZZ
@given(method=wire_methods, path=wire_paths, version=wire_versions,
       headers=wire_header_lines, body=st.binary(max_size=80) | st.just(VALID))
def test_random_request_bytes(guard: harness.Router, simulator: harness.Simulator, method: bytes, path: bytes,
                              version: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    head = method + b" " + path + b" " + version + b"\r\nHost: x\r\n"
    head += b"".join(k + b": " + v + b"\r\n" for k, v in headers)
    raw = head + b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
    with connect(guard) as s:
        s.sendall(raw)
        data = read_until_close(s)
    assert_no_leak(data, simulator)
    if data.startswith(b"HTTP/"):
        for reply in parse_replies(data):
            assert reply.status < 500 or reply.status in (502, 503, 504), reply
            if reply.status >= 400 and reply.body:
                assert_no_leak(reply.body, simulator)


@pytest.mark.parametrize(("raw", "status"), [
    (b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404),
    (b"DELETE PUT HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404),  # starlette redirected this
    (b"FOO /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405),
    (b"M-SEARCH /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404),
    # a compressed body would be forwarded as plain JSON with the client's Content-Encoding
    (request(b"/v1/completions", VALID, extra=b"Content-Encoding: gzip\r\n", close=True), 415),
    (request(b"/v1/completions", VALID, extra=b"Content-Type: text/plain\r\n", close=True), 400),
], ids=["options-star", "bare-word-target", "unknown-method-models", "unknown-method-elsewhere",
        "content-encoding", "two-content-types"])
def test_odd_targets_methods_and_body_headers_get_openai_errors(guard: harness.Router,
                                                                 simulator: harness.Simulator,
                                                                 raw: bytes, status: int) -> None:
    """Found by the fuzz run (docs/fuzzing.md): each got plain text, a redirect or an engine error."""
    replies = exchange(guard, raw)
    assert [r.status for r in replies] == [status], replies
    replies[0].json_error()
    assert harness.engine_total(simulator) == 0
