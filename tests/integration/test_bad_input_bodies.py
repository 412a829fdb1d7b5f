"""Adversarial request bodies, methods and paths against the real router (property-based).

Every answer must be either a success (the request was in fact valid and an engine
served it) or a router-made OpenAI-style error {"error": {"message", "type", "param",
"code"}} with the right status, no traceback and no backend address; malformed requests
must never reach an engine; after each test the router's workers are the same processes
and still serve a normal request. Hypothesis runs derandomized (deterministic) with
moderate example counts. Raw-socket (wire-level) cases: test_bad_input_wire.py.
"""

from __future__ import annotations

import json
import socket
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kthena_router.proxy import paths

from loadtest.fuzz_strategies import (
    CHAT,
    COMPL,
    garbage_bodies,
    json_values,
    odd_messages,
    odd_prompts,
    odd_text,
    odd_unknown_fields,
    unknown_models,
    wrong_field,
)

MSGS = [{"role": "user", "content": "hi"}]
TIMEOUT = httpx.Timeout(30.0)

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])
FUZZ_SMALL = settings(FUZZ, max_examples=20)


# --- checks ------------------------------------------------------------------------------


def assert_no_leak(text: str, sim: harness.Simulator) -> None:
    assert "Traceback" not in text and 'File "/' not in text, f"traceback in a response: {text[:500]}"
    for port in sim.ports:
        for host in ("127.0.0.1", "localhost"):
            assert f"{host}:{port}" not in text, f"backend address {host}:{port} leaked: {text[:500]}"


def assert_openai_error(r: httpx.Response, sim: harness.Simulator, status: int | set[int],
                        param: Any = ...) -> dict[str, Any]:
    """r is a router-made OpenAI-style error with the given status (and param, if given)."""
    statuses = {status} if isinstance(status, int) else status
    assert r.status_code in statuses, f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:300]}"
    assert_no_leak(r.text, sim)
    assert r.headers.get("content-type", "").startswith("application/json"), (r.status_code, r.headers, r.text[:200])
    obj = r.json()
    assert isinstance(obj, dict) and set(obj) == {"error"}, obj
    err = obj["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    if param is not ...:
        assert err["param"] == param, (param, err)
    return err


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=TIMEOUT) as client:
        yield client


@pytest.fixture
def guard(router: harness.Router, simulator: harness.Simulator, http: httpx.Client) -> Iterator[harness.Router]:
    """Same worker processes before and after; the router still answers at the end."""
    pids = sorted(router.worker_pids())
    assert len(pids) == router.workers, pids
    yield router
    assert router.process.alive(), router.process.tail()
    assert router.readyz().status_code == 200
    for _ in range(2 * router.workers):  # both workers (round robin of connections is not
        harness.chat_ok(router, http)    # guaranteed, so several fresh requests)
    with httpx.Client(timeout=TIMEOUT) as fresh:
        harness.chat_ok(router, fresh)
    assert sorted(router.worker_pids()) == pids, "a router worker was restarted"


def post(http: httpx.Client, router: harness.Router, path: str, content: bytes,
         ctype: str | None = "application/json", headers: dict[str, str] | None = None) -> httpx.Response:
    h = dict(headers or {})
    if ctype is not None:
        h["content-type"] = ctype
    return http.post(f"{router.base_url}{path}", content=content, headers=h)


def _surrogate_free(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


# --- bad JSON / not an object / empty -------------------------------------------------------


@FUZZ
@given(raw=garbage_bodies, path=st.sampled_from([CHAT, COMPL, "/v1/embeddings"]))
def test_invalid_json_or_not_an_object_is_400(guard: harness.Router, simulator: harness.Simulator,
                                               http: httpx.Client, raw: bytes, path: str) -> None:
    r = post(http, guard, path, raw)
    assert_openai_error(r, simulator, 400, param=None)
    assert harness.engine_total(simulator) == 0


@FUZZ
@given(value=json_values.filter(lambda v: not isinstance(v, dict)))
def test_json_that_is_not_an_object_is_400(guard: harness.Router, simulator: harness.Simulator,
                                           http: httpx.Client, value: Any) -> None:
    r = post(http, guard, CHAT, json.dumps(value).encode())
    assert_openai_error(r, simulator, 400, param=None)
    assert harness.engine_total(simulator) == 0


@pytest.mark.parametrize("ctype", ["application/json", None, "text/plain"])
def test_empty_body_is_400(guard: harness.Router, simulator: harness.Simulator, http: httpx.Client,
                           ctype: str | None) -> None:
    for path in (CHAT, COMPL):
        assert_openai_error(post(http, guard, path, b"", ctype), simulator, 400)
    assert harness.engine_total(simulator) == 0


# --- wrong types, one field at a time -------------------------------------------------


def _valid(path: str) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "demo", "max_tokens": 1}
    if path == CHAT:
        base["messages"] = MSGS
    else:
        base["prompt"] = "hello"
    return base


@FUZZ
@given(case=wrong_field)
def test_wrong_type_for_one_field_is_400_naming_it(guard: harness.Router, simulator: harness.Simulator,
                                                   http: httpx.Client, case: tuple[str, Any, str]) -> None:
    field, value, path = case
    body = _valid(path)
    body[field] = value
    r = post(http, guard, path, json.dumps(body).encode())
    assert_openai_error(r, simulator, 400, param=field)
    assert harness.engine_total(simulator) == 0


@pytest.mark.parametrize(("path", "missing"), [(CHAT, "model"), (COMPL, "model"), (CHAT, "messages"),
                                               (COMPL, "prompt"), ("/v1/embeddings", "model")])
def test_missing_required_field_is_400(guard: harness.Router, simulator: harness.Simulator,
                                       http: httpx.Client, path: str, missing: str) -> None:
    body = _valid(path) if path in (CHAT, COMPL) else {"model": "demo", "input": "x"}
    body.pop(missing)
    assert_openai_error(post(http, guard, path, json.dumps(body).encode()), simulator, 400, param=missing)
    assert harness.engine_total(simulator) == 0


@FUZZ
@given(model=unknown_models, path=st.sampled_from([CHAT, COMPL]), stream=st.booleans())
def test_unknown_model_is_404(guard: harness.Router, simulator: harness.Simulator, http: httpx.Client,
                              model: str, path: str, stream: bool) -> None:
    body = _valid(path)
    body.update(model=model, stream=stream)
    raw = json.dumps(body, ensure_ascii=not _surrogate_free(model)).encode()
    err = assert_openai_error(post(http, guard, path, raw), simulator, 404, param="model")
    assert err["code"] in (404, "model_not_found"), err
    assert harness.engine_total(simulator) == 0


# --- odd but valid requests reach an engine, unchanged -----------------------------------

@FUZZ_SMALL
@given(extra=odd_unknown_fields, path=st.sampled_from([CHAT, COMPL]),
       text=odd_text)
def test_odd_valid_requests_are_served(guard: harness.Router, simulator: harness.Simulator,
                                       http: httpx.Client, extra: dict[str, Any], path: str, text: str) -> None:
    """Unicode/NUL text, huge integers and nested values in unknown fields: the engine serves them."""
    before = harness.engine_total(simulator)
    body = _valid(path)
    if path == CHAT:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    body.update(extra)
    r = post(http, guard, path, json.dumps(body, ensure_ascii=False).encode())
    assert r.status_code == 200, r.text[:300]
    assert r.json()["usage"]["completion_tokens"] == 1
    assert harness.engine_total(simulator) == before + 1


@pytest.mark.parametrize(
    ("raw", "status", "engine_model", "streamed"),
    [
        # duplicate keys: the last occurrence wins, for the router as for the engine
        (b'{"model": "nope", "model": "demo", "prompt": "x", "max_tokens": 1}', 200, "demo", False),
        (b'{"model": "demo", "model": "nope", "prompt": "x", "max_tokens": 1}', 404, None, False),
        (b'{"model": "demo", "model": 7, "prompt": "x", "max_tokens": 1}', 400, None, False),
        # escaped key spellings are the same key
        (b'{"mod\\u0065l": "demo", "prompt": "x", "max_tokens": 1}', 200, "demo", False),
        (b'{"mod\\u0065l": "demo-lora-a", "prompt": "x", "max_tokens": 1}', 200, "demo-lora-a", False),
        (b'{"mod\\u0065l": 5, "prompt": "x", "max_tokens": 1}', 400, None, False),
        (b'{"model": "demo", "pr\\u006fmpt": 5, "max_tokens": 1}', 400, None, False),
        (b'{"model": "demo", "prompt": "x", "max_t\\u006fkens": "2"}', 400, None, False),
        # escaped "stream": the router must see a streamed request (and hide the injected usage)
        (b'{"model": "demo", "prompt": "x", "max_tokens": 2, "stre\\u0061m": true}', 200, "demo", True),
        (b'{"model": "demo", "prompt": "x", "max_tokens": 2, "stream": false, "stream": true}', 200, "demo", True),
        # odd-but-valid spellings
        (b'{"model":"demo","prompt":"x","max_tokens":1,"stream":null,"stream_options":null}', 200, "demo", False),
        (b'\n\t {"model" :"demo" , "prompt":"\\u0000\\ud83d\\ude00", "max_tokens" : 1 }\r\n', 200, "demo", False),
        (b'{"model": "demo", "prompt": [1, 2, 3], "max_tokens": 1, "x_big": 123456789012345678901234567890}',
         200, "demo", False),
        (b'{"model": "demo", "prompt": "x", "max_tokens": 1, "x_deep": ' + b"[" * 500 + b"]" * 500 + b"}",
         200, "demo", False),
        # beyond orjson's nesting limit: not JSON we accept
        (b'{"model": "demo", "prompt": "x", "x_deep": ' + b"[" * 1100 + b"]" * 1100 + b"}", 400, None, False),
        # validated fields: a 100-bit integer is a double to the parser -> not an integer
        (b'{"model": "demo", "prompt": "x", "max_tokens": 123456789012345678901234567890}', 400, None, False),
        (b'{"model": "demo", "prompt": "x", "max_tokens": 1.0}', 400, None, False),
        (b'{"model": "demo", "prompt": "x", "max_tokens": true}', 400, None, False),
    ],
)
def test_duplicate_escaped_and_odd_spellings(guard: harness.Router, simulator: harness.Simulator,
                                             http: httpx.Client, raw: bytes, status: int,
                                             engine_model: str | None, streamed: bool) -> None:
    r = post(http, guard, COMPL, raw)
    if status != 200:
        assert_openai_error(r, simulator, status)
        assert harness.engine_total(simulator) == 0
        return
    assert r.status_code == 200, r.text[:300]
    assert_no_leak(r.text, simulator)
    log = [e for i in range(len(simulator.ports)) for e in simulator.requests(i)["log"]]
    assert [(e["model"], e["stream"]) for e in log] == [(engine_model, streamed)]
    if streamed:
        assert r.headers["content-type"].startswith("text/event-stream"), r.headers
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events[-3:]
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks and all(c.get("usage") is None for c in chunks), "injected usage chunk leaked"
    else:
        assert r.json()["model"] == engine_model


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded",
                                   "application/json; charset=latin-1",
                                   "application/xml"])
def test_wrong_content_type(guard: harness.Router, simulator: harness.Simulator, http: httpx.Client,
                            ctype: str | None) -> None:
    """The router does not judge Content-Type on the inference paths: it parses the body as
    JSON whatever the header says and the engine applies its own rule. A valid JSON body is
    therefore served, with exactly one engine request."""
    r = post(http, guard, COMPL, json.dumps(_valid(COMPL)).encode(), ctype)
    assert r.status_code == 200, (ctype, r.status_code, r.text[:300])
    assert r.json()["object"] == "text_completion"
    assert harness.engine_total(simulator) == 1


def test_multipart_content_type_on_a_json_path_is_415(guard: harness.Router, simulator: harness.Simulator,
                                                      http: httpx.Client) -> None:
    """A JSON body labelled multipart is refused, not guessed at: the engine would parse a form."""
    r = post(http, guard, COMPL, json.dumps(_valid(COMPL)).encode(), "multipart/form-data; boundary=x")
    assert_openai_error(r, simulator, 415)
    assert harness.engine_total(simulator) == 0


# --- methods and paths ---------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "FOO"])
@pytest.mark.parametrize("path", [CHAT, COMPL, "/v1/embeddings"])
def test_wrong_method_on_post_only_path_is_405(guard: harness.Router, simulator: harness.Simulator,
                                               http: httpx.Client, method: str, path: str) -> None:
    r = http.request(method, f"{guard.base_url}{path}", content=json.dumps(_valid(CHAT)).encode())
    if method == "HEAD":
        assert r.status_code == 405 and r.content == b"", (r.status_code, r.content[:100])
    else:
        assert_openai_error(r, simulator, 405)
    assert harness.engine_total(simulator) == 0


@pytest.mark.parametrize(("method", "path"), [
    ("OPTIONS", "/v1/models"),
    ("OPTIONS", "/nothing"),
    ("POST", "/v1/models"),
    ("PUT", "/v1/models"),
    ("DELETE", "/v1/models"),
])
def test_wrong_method_on_get_only_path_is_405(guard: harness.Router, simulator: harness.Simulator,
                                              http: httpx.Client, method: str, path: str) -> None:
    r = http.request(method, f"{guard.base_url}{path}")
    expected = {405} if path == "/v1/models" and method != "PUT" and method != "DELETE" else {404, 405}
    assert_openai_error(r, simulator, expected)
    assert harness.engine_total(simulator) == 0


@FUZZ_SMALL
@given(seg=st.text(st.characters(blacklist_categories=["Cs", "Cc"], blacklist_characters="/?#"),
                   min_size=1, max_size=40),
       method=st.sampled_from(["GET", "POST", "DELETE"]))
def test_paths_outside_v1_are_404(guard: harness.Router, simulator: harness.Simulator, http: httpx.Client,
                                  seg: str, method: str) -> None:
    url = httpx.URL(guard.base_url).copy_with(path=f"/{seg}")
    r = http.request(method, url, content=b'{"model": "demo"}')
    assert_openai_error(r, simulator, 404)
    assert harness.engine_total(simulator) == 0


@FUZZ_SMALL
@given(seg=st.text(string.ascii_letters + string.digits + "-_.~%", min_size=1, max_size=40)
       .filter(lambda s: s not in (".", "..") and not s.startswith("models")
               and f"/v1/{s}" not in paths.LABELS))
def test_v1_paths_outside_the_allow_list_are_404_with_or_without_model(
        guard: harness.Router, simulator: harness.Simulator, http: httpx.Client, seg: str) -> None:
    url = f"{guard.base_url}/v1/{seg}"
    before = harness.engine_total(simulator)
    for body in (b'{"input": "x"}', b'{"model": "demo", "input": "x"}'):
        r = http.post(url, content=body)
        assert_openai_error(r, simulator, 404)
    assert harness.engine_total(simulator) == before


def test_long_url_and_header_values(guard: harness.Router, simulator: harness.Simulator,
                                    http: httpx.Client) -> None:
    body = json.dumps(_valid(COMPL)).encode()
    r = post(http, guard, "/v1/" + "a" * 7000, b'{"x": 1}')
    assert_openai_error(r, simulator, 404)
    r = post(http, guard, COMPL, body, headers={"x-long": "v" * 6000, "x-request-id": "r" * 4000})
    assert r.status_code == 200, r.text[:200]
    # an over-long request id is replaced by a generated one (it goes into logs)
    assert r.headers["x-request-id"] != "r" * 4000 and len(r.headers["x-request-id"]) == 32
    r = post(http, guard, COMPL, body, headers={"x-request-id": "r" * 200})
    assert r.status_code == 200 and r.headers["x-request-id"] == "r" * 200
    r = post(http, guard, "/x" + "b" * 30_000, body)
    assert_openai_error(r, simulator, 404)  # a 30 KB path is under the 414 limit
    assert harness.engine_total(simulator) == 2


# --- body size limit (413) on a router with a small limit -------------------------------

LIMIT = 4096


@pytest.fixture(scope="module")
def small_limit_router(router_workers: int, simulator_session: harness.Simulator,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Router]:
    work = tmp_path_factory.mktemp(f"bad-input-limit-w{router_workers}")
    cfg = harness.write_config(work / "router.yaml", harness.engine_config(simulator_session.ports))
    with harness.start_router(cfg, work, workers=router_workers, extra_args=["--max-body-bytes", str(LIMIT)]) as r:
        yield r


def _padded(size: int) -> bytes:
    raw = json.dumps(_valid(COMPL)).encode()
    return raw[:-1] + b" " * (size - len(raw)) + b"}"


def test_body_over_limit_is_413(small_limit_router: harness.Router, simulator: harness.Simulator,
                                http: httpx.Client) -> None:
    r = small_limit_router
    pids = sorted(r.worker_pids())
    ok = post(http, r, COMPL, _padded(LIMIT))
    assert ok.status_code == 200, ok.text[:200]
    assert harness.engine_total(simulator) == 1
    # declared length over the limit
    assert_openai_error(post(http, r, COMPL, _padded(LIMIT + 1)), simulator, 413)
    assert_openai_error(post(http, r, CHAT, b"x" * (LIMIT * 50)), simulator, 413)

    # chunked (no Content-Length), over the limit only after several chunks. Raw socket: the
    # router answers early and closes, which httpx (writes all, then reads) reports as a
    # disconnect.
    chunk = b"3e8\r\n" + b" " * 1000 + b"\r\n"
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           b"Content-Type: application/json\r\n\r\n" + chunk * 8 + b"0\r\n\r\n")
    with socket.create_connection((harness.HOST, r.port), timeout=30) as s:
        s.sendall(req)
        data = b""
        while b"}}" not in data:
            got = s.recv(65536)
            assert got, f"connection closed before a full answer: {data!r}"
            data += got
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), data[:300]
    err = json.loads(payload)["error"]
    assert err["code"] == 413 and set(err) == {"message", "type", "param", "code"}, err
    assert harness.engine_total(simulator) == 1
    assert sorted(r.worker_pids()) == pids
    harness.chat_ok(r, http)


# --- the scheduling path (prefix-cache renders the prompt of every request) -------------


@pytest.fixture(scope="module")
def sched_router(router_workers: int, simulator_session: harness.Simulator,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Router]:
    work = tmp_path_factory.mktemp(f"bad-input-sched-w{router_workers}")
    cfg = harness.write_config(work / "router.yaml", harness.engine_config(simulator_session.ports))
    sched = Path(harness.REPO) / "configs" / "scheduling" / "prefix-cache.yaml"
    with harness.start_router(cfg, work, workers=router_workers, extra_args=["--router-config", str(sched)]) as r:
        yield r


@FUZZ
@given(chat=st.booleans(), messages=odd_messages, prompt=odd_prompts, tools=json_values)
def test_scheduler_survives_odd_prompts(sched_router: harness.Router, simulator: harness.Simulator,
                                        http: httpx.Client, chat: bool, messages: Any, prompt: Any,
                                        tools: Any) -> None:
    """Well-typed bodies whose messages/prompt/tools are nonsense: the router renders them for
    the prefix index; the answer is the engine's (200 or its 4xx), never a router 5xx."""
    path = CHAT if chat else COMPL
    body: dict[str, Any] = {"model": "demo", "max_tokens": 1}
    if chat:
        body["messages"] = messages
        if tools is not None:
            body["tools"] = tools
    else:
        body["prompt"] = prompt if isinstance(prompt, (str, list)) else [prompt]
    r = post(http, sched_router, path, json.dumps(body).encode())
    assert r.status_code < 500, r.text[:300]
    assert_no_leak(r.text, simulator)


@pytest.mark.parametrize("where", [
    "tools",
    "content",
    "depth_ok",
])
def test_scheduler_deeply_nested_prompt_parts(sched_router: harness.Router, simulator: harness.Simulator,
                                              http: httpx.Client, where: str) -> None:
    """Nesting allowed by the JSON parser (< 1024 levels) must not break prompt rendering."""
    nest = "[" * 1000 + "]" * 1000
    if where == "tools":
        raw = f'{{"model": "demo", "max_tokens": 1, "messages": [{{"role": "user", "content": "hi"}}], ' \
              f'"tools": [{nest}]}}'
    elif where == "content":
        raw = f'{{"model": "demo", "max_tokens": 1, "messages": [{{"role": "user", "content": [{nest}]}}]}}'
    else:
        raw = f'{{"model": "demo", "max_tokens": 1, "messages": [{{"role": "user", "content": "hi"}}], ' \
              f'"tools": [{"[" * 200 + "]" * 200}]}}'
    r = post(http, sched_router, CHAT, raw.encode())
    assert r.status_code < 500, r.text[:300]
    assert_no_leak(r.text, simulator)
    harness.chat_ok(sched_router, http)
