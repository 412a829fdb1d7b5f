"""Header filtering, the inference-path allow-list, the response-id store, the access log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from kthena_router.access_log import AccessLog, AccessRecord
from kthena_router.errors import RequestError
from kthena_router.proxy.headers import RequestHeaders, content_encoded, response_headers
from kthena_router.proxy.paths import LABELS, request_line, resolve
from kthena_router.proxy.response_ids import ResponseIds, StoredAt
from kthena_router.proxy.sse import StreamEnd


def _lines(upstream: bytes) -> list[str]:
    return [line.decode().lower() for line in upstream.split(b"\r\n") if line]


def test_request_headers_drop_hop_by_hop_and_connection_named() -> None:
    h = RequestHeaders.from_asgi([(b"Connection", b"keep-alive, X-Secret-Hop"), (b"x-secret-hop", b"1"),
                        (b"keep-alive", b"timeout=5"), (b"TE", b"trailers"), (b"authorization", b"Bearer k"),
                        (b"X-Api-Key", b"sk"), (b"accept-encoding", b"gzip, br"), (b"x-kept", b"yes"),
                        (b"host", b"router"), (b"content-length", b"10")])
    lines = _lines(h.upstream)
    assert lines[:1] == ["x-kept: yes"]
    assert lines[-2:] == [f"x-request-id: {h.request_id}", "accept-encoding: identity"]
    assert len(lines) == 3
    assert h.by_name["x-secret-hop"] == "1"  # still visible to header-based route matching


def test_request_id_kept_or_generated() -> None:
    assert RequestHeaders.from_asgi([(b"x-request-id", b"abc-1")]).request_id == "abc-1"
    generated = RequestHeaders.from_asgi([]).request_id
    assert len(generated) == 32 and generated != RequestHeaders.from_asgi([]).request_id
    assert RequestHeaders.from_asgi([(b"x-request-id", b"x" * 500)]).request_id != "x" * 500


def test_response_headers_filtered() -> None:
    raw = [(b"Connection", b"close, X-Hop"), (b"X-Hop", b"1"), (b"Transfer-Encoding", b"chunked"),
           (b"Content-Length", b"5"), (b"X-Engine", b"kept"), (b"Content-Type", b"application/json"),
           (b"Server", b"uvicorn"), (b"x-request-id", b"upstream")]
    assert response_headers(raw) == [(b"X-Engine", b"kept"), (b"Content-Type", b"application/json")]


def test_content_encoded() -> None:
    assert content_encoded([(b"Content-Encoding", b"gzip")])
    assert not content_encoded([(b"content-encoding", b"identity")])
    assert not content_encoded([])


@pytest.mark.parametrize("path,end", [("/v1/chat/completions", StreamEnd.DONE), ("/v1/completions", StreamEnd.DONE),
                                      ("/v1/responses", StreamEnd.RESPONSES), ("/v1/embeddings", StreamEnd.EOF),
                                      ("/v1/rerank", StreamEnd.EOF), ("/v1/score", StreamEnd.EOF)])
def test_allowed_paths(path: str, end: StreamEnd) -> None:
    api = resolve("POST", path)
    assert api.stream_end is end and api.label == path and api.label in LABELS


@pytest.mark.parametrize("path", ["/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/flush_cache",
                                  "/v1/nope", "/v1/responses/", "/v1/responses/a/b", "/v1/chat/completions/x"])
def test_other_paths_are_404(path: str) -> None:
    with pytest.raises(RequestError) as exc:
        resolve("POST", path)
    assert exc.value.status == 404


def test_method_and_multipart() -> None:
    with pytest.raises(RequestError) as exc:
        resolve("GET", "/v1/chat/completions")
    assert exc.value.status == 405
    with pytest.raises(RequestError) as exc:
        resolve("POST", "/v1/audio/transcriptions")
    assert exc.value.status == 415 and "multipart" in exc.value.message


def test_responses_by_id() -> None:
    api = resolve("GET", "/v1/responses/resp_1")
    assert api.response_id == "resp_1" and api.label in LABELS
    assert resolve("POST", "/v1/responses/resp_1/cancel").response_id == "resp_1"
    with pytest.raises(RequestError) as exc:
        resolve("POST", "/v1/responses/resp_1")
    assert exc.value.status == 405


def test_request_line_keeps_query() -> None:
    assert request_line("POST", "/v1/chat/completions", b"") == b"POST /v1/chat/completions HTTP/1.1\r\n"
    assert request_line("GET", "/v1/responses/r 1", b"a=1&b=%20x") == \
        b"GET /v1/responses/r%201?a=1&b=%20x HTTP/1.1\r\n"
    assert b" " not in request_line("POST", "/v1/score", b"a b\r\nx")[5:-11]


def test_response_ids_lru() -> None:
    ids = ResponseIds(2)
    ids.put("a", StoredAt("e1", "m"))
    ids.put("b", StoredAt("e2", "m"))
    assert ids.get("a") == StoredAt("e1", "m")  # a is now the most recent
    ids.put("c", StoredAt("e3", "m"))
    assert ids.get("b") is None and ids.get("a") is not None and len(ids) == 2


def test_access_log_buffers_and_flushes(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"

    async def run() -> list[int]:
        log = AccessLog(str(path), flush_interval_s=3600)
        log.start()
        sizes = []
        for i in range(3):
            log.write(AccessRecord(f"r{i}", "POST", "/v1/chat/completions", status=200, attempts=1))
        sizes.append(path.stat().st_size)  # nothing written per request
        await log.close()
        sizes.append(path.stat().st_size)
        return sizes

    before, after = asyncio.run(run())
    assert before == 0 and after > 0
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [r["request_id"] for r in rows] == ["r0", "r1", "r2"]
    assert rows[0]["status"] == 200 and rows[0]["ts"] > 0


def test_request_headers_refusal_in_the_same_pass() -> None:
    ok = RequestHeaders.from_asgi([(b"content-type", b"application/json"), (b"content-encoding", b"identity")])
    assert ok.refusal is None
    gz = RequestHeaders.from_asgi([(b"content-encoding", b"identity"), (b"content-encoding", b"gzip")])
    assert gz.refusal is not None and gz.refusal.status == 415 and "gzip" in gz.refusal.message
    two = RequestHeaders.from_asgi([(b"content-type", b"application/json"), (b"content-type", b"text/plain")])
    assert two.refusal is not None and two.refusal.status == 400
    assert b"content-encoding: identity\r\n" in ok.upstream


def test_request_headers_same_from_rsgi_pairs_and_asgi_bytes() -> None:
    """granian's RSGI headers come as lower-case str pairs; ASGI's as bytes: one result."""
    raw = [(b"content-type", b"application/json"), (b"cookie", b"a=1"), (b"Cookie", b"b=2"),
           (b"x-request-id", b"rid-7"), (b"content-length", b"12"), (b"connection", b"x-hop"), (b"x-hop", b"1"),
           (b"x-kept", b"v")]
    a = RequestHeaders.from_asgi(raw)
    r = RequestHeaders([(k.decode().lower(), v.decode()) for k, v in raw])
    for h in (a, r):
        assert h.upstream == (b"content-type: application/json\r\ncookie: a=1\r\ncookie: b=2\r\nx-kept: v\r\n"
                              b"x-request-id: rid-7\r\naccept-encoding: identity\r\n")
        assert h.content_length() == 12 and h.content_type == "application/json"
        assert h.cookie_headers() == [(b"cookie", b"a=1"), (b"cookie", b"b=2")]
        assert h.request_id == "rid-7" and h.refusal is None
    with pytest.raises(RequestError) as err:
        RequestHeaders([("content-length", "x")]).content_length()
    assert err.value.status == 400
