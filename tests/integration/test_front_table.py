"""The decision in Rust (kthena_router/front/table.py, rust/py/src/front/table.rs).

Parity: two routers on the same config, one deciding plain routes in the front (the
default) and one asking Python for every completion (`--front-table off`), get the same
requests; an echo engine (a real aiohttp process) shows what each sent upstream. Header
blocks and body bytes must be equal, byte for byte, whichever side decided.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import harness
import httpx
import pytest

TABLE = "kthena_router_front_table_decisions_total"
DECISIONS = "kthena_router_front_decisions_total"

ECHO_SSE_ENGINE = r'''
import json, sys
from aiohttp import web

async def echo(request):
    raw = await request.read()
    seen = {"headers": [[k, v] for k, v in request.headers.items()], "body": raw.decode(),
            "path": request.path_qs}
    try:
        stream = json.loads(raw).get("stream") is True
    except Exception:
        stream = False
    if not stream:
        return web.json_response({"id": "e", "object": "chat.completion", "model": "echo",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}, "echo": seen})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    chunk = {"id": "e", "object": "chat.completion.chunk", "model": "echo", "echo": seen,
             "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}
    await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    usage = {"id": "e", "object": "chat.completion.chunk", "model": "echo", "choices": [],
             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
    return resp

async def health(request):
    return web.Response(text="ok")

app = web.Application()
app.router.add_get("/health", health)
app.router.add_post("/{tail:.*}", echo)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
'''


@pytest.fixture(scope="module")
def routers(simulator_session: harness.Simulator,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.Router, harness.Router]]:
    work = tmp_path_factory.mktemp("front-table")
    (work / "token").write_text("upstream-secret\n")
    with harness.script_engine("echo-sse", ECHO_SSE_ENGINE, work) as echo_port:
        labels = {"app": "echo"}
        docs = [
            harness.route_doc("echo", "echo-public", "echo"),  # renamed upstream: the body's model is rewritten
            harness.route_doc("same", "echo-served", "echo"),  # the engine's own name: no rewrite
            harness.server_doc("echo", "echo-served", labels,
                               annotations={"router.kthena.io/upstream-token-file": str(work / "token")}),
            harness.endpoints_doc("echo-engines", [echo_port], labels),
            *harness.engine_config(simulator_session.ports),
        ]
        config = harness.write_config(work / "router.yaml", docs)
        table = harness.start_router(config, work / "table")
        try:
            python = harness.start_router(config, work / "python", extra_args=["--front-table", "off"])
            try:
                yield table, python
            finally:
                python.stop()
        finally:
            table.stop()


def _post(router: harness.Router, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict | None]:
    """(status, what the engine saw) for one raw request."""
    with httpx.Client(timeout=30) as http:
        r = http.post(f"{router.openai_url}{path}", content=body,
                      headers={"content-type": "application/json", **headers})
    if r.status_code != 200:
        return r.status_code, None
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        first = next(line for line in r.text.splitlines() if line.startswith("data: "))
        return 200, json.loads(first[6:])["echo"]
    return 200, r.json()["echo"]


def _normalized(seen: dict, given_id: bool) -> dict:
    """Host carries the engine's port (equal for both); a generated request id differs."""
    headers = []
    for k, v in seen["headers"]:
        if k.lower() == "x-request-id" and not given_id:
            assert len(v) == 32 and all(c in "0123456789abcdef" for c in v), v
            v = "<generated>"
        headers.append((k.lower(), v))
    return {"headers": headers, "body": seen["body"], "path": seen["path"]}


CHAT = "/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]
CASES: list[tuple[str, str, object, dict[str, str], bool]] = [
    # (name, path, body (bytes or JSON), headers, whether the front's table can decide it)
    ("plain", CHAT, {"model": "echo-public", "messages": MSGS, "max_tokens": 4}, {}, True),
    ("no rewrite", CHAT, {"model": "echo-served", "messages": MSGS}, {}, True),
    ("stream, usage injected", CHAT, {"model": "echo-public", "messages": MSGS, "stream": True}, {}, True),
    ("stream, usage asked", CHAT,
     {"model": "echo-public", "messages": MSGS, "stream": True, "stream_options": {"include_usage": True}}, {}, True),
    ("stream, options null", CHAT,
     {"model": "echo-public", "messages": MSGS, "stream": True, "stream_options": None}, {}, True),
    ("stream, options merged", CHAT,
     {"model": "echo-public", "messages": MSGS, "stream": True, "stream_options": {"continuous_usage_stats": 1}},
     {}, False),
    ("text completion", "/completions", {"model": "echo-public", "prompt": "hi", "max_tokens": 3}, {}, True),
    ("headers", CHAT, {"model": "echo-public", "messages": MSGS},
     {"x-request-id": "client-id-7", "authorization": "Bearer client-key", "x-api-key": "k",
      "connection": "keep-alive, x-hop", "x-hop": "dropped", "accept-encoding": "gzip, br", "x-custom": "a b",
      "cookie": "s=1", "user-agent": "parity/1"}, True),
    ("bad request id", CHAT, {"model": "echo-public", "messages": MSGS}, {"x-request-id": "bad\tid"}, True),
    ("spacing kept", CHAT, b'{ "model" : "echo-public" ,\n "messages": [ {"role":"user","content":"\\u00e9"} ],'
                           b' "temperature": 1.50 }', {}, True),
    ("duplicate key", CHAT, b'{"model":"nope","messages":[],"model":"echo-public"}', {}, False),
    ("query string", CHAT + "?api-version=1", {"model": "echo-public", "messages": MSGS}, {}, False),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_front_sends_what_python_sends(routers: tuple[harness.Router, harness.Router],
                                            case: tuple[str, str, object, dict[str, str], bool]) -> None:
    table, python = routers
    _name, path, body, headers, covered = case
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    given = "x-request-id" in headers and "\t" not in headers["x-request-id"]
    before = harness.metric_value(harness.parse_metrics(table.metrics_text()), TABLE)
    status_t, seen_t = _post(table, path, raw, headers)
    status_p, seen_p = _post(python, path, raw, headers)
    assert status_t == status_p == 200
    assert seen_t is not None and seen_p is not None
    assert _normalized(seen_t, given) == _normalized(seen_p, given)
    after = harness.metrics_when(table, lambda m: harness.metric_value(m, TABLE) >= before + covered)
    assert harness.metric_value(after, TABLE) == before + covered  # decided by the table, or declined


def test_errors_are_python_s_on_both(routers: tuple[harness.Router, harness.Router]) -> None:
    table, python = routers
    for raw in (b'{"model":"echo-public","messages":[],"max_tokens":5.0}', b'{"model":"unknown","messages":[]}',
                b'{"model":"echo-public"}', b"[1]"):
        with httpx.Client(timeout=30) as http:
            a = http.post(f"{table.openai_url}{CHAT}", content=raw, headers={"content-type": "application/json"})
            b = http.post(f"{python.openai_url}{CHAT}", content=raw, headers={"content-type": "application/json"})
        assert a.status_code == b.status_code and a.status_code in (400, 404), raw
        assert a.json()["error"]["message"] == b.json()["error"]["message"]


def test_python_accounts_for_what_the_front_decided(routers: tuple[harness.Router, harness.Router]) -> None:
    table, python = routers
    fams = harness.parse_metrics(table.metrics_text())
    before = harness.metric_value(fams, "kthena_router_requests_total", model="demo")
    table_before = harness.metric_value(fams, TABLE)
    client = table.openai()
    for i in range(6):
        if i % 2:
            chunks = list(client.chat.completions.create(model="demo", messages=MSGS, max_tokens=5, stream=True))
            assert any(c.choices and c.choices[0].delta.content for c in chunks)
        else:
            r = client.chat.completions.create(model="demo", messages=MSGS, max_tokens=5)
            assert r.usage is not None and r.usage.completion_tokens > 0

    def settled(m: dict) -> bool:  # the counter and the gauge are written apart (a batch flush)
        return (harness.metric_value(m, "kthena_router_requests_total", model="demo") >= before + 6
                and harness.metric_value(m, "kthena_router_active_downstream_requests", model="demo") == 0)

    fams = harness.metrics_when(table, settled)
    assert harness.metric_value(fams, "kthena_router_requests_total", model="demo") == before + 6
    assert harness.metric_value(fams, TABLE) == table_before + 6
    assert harness.metric_value(fams, "kthena_router_active_downstream_requests", model="demo") == 0
    assert harness.metric_value(fams, "kthena_router_tokens_total", model="demo", token_type="output") > 0
    assert python.openai().chat.completions.create(model="demo", messages=MSGS, max_tokens=3).choices
    py = harness.metrics_when(python, lambda m: harness.metric_value(m, DECISIONS, decision="fast") > 0)
    assert harness.metric_value(py, TABLE) == 0
    assert harness.metric_value(py, DECISIONS, decision="fast") > 0


def test_a_server_with_a_dead_endpoint_goes_back_to_python(simulator: harness.Simulator, tmp_path: Path) -> None:
    dead = harness.free_port()  # nothing listens: connect errors until outlier detection ejects it
    config = harness.write_config(tmp_path / "router.yaml", harness.engine_config([dead, *simulator.ports]))
    with harness.start_router(config, tmp_path) as router:
        client = router.openai()
        for _ in range(20):
            assert client.chat.completions.create(model="demo", messages=MSGS, max_tokens=3).choices
        fams = harness.metrics_when(router, lambda m: harness.metric_value(
            m, "kthena_router_requests_total", model="demo", status_code="200") >= 20)
        assert harness.metric_value(fams, DECISIONS, decision="fast") == 20
        assert harness.metric_value(fams, "kthena_router_requests_total", model="demo", status_code="200") == 20
        # consecutiveFailures (5) ejected it; then Python decided, and the dead one got no more
        # attempts (one more at most: a report rides with the next wake-up)
        assert harness.metric_value(fams, TABLE) < 20
        errors = harness.metric_value(fams, "kthena_router_upstream_errors_total")
        assert 5 <= errors <= 6
