"""Protocol correctness through a real router: the Responses API (streamed and not, routed
to the engine that stored a response), the end of a stream per API, compressed and
hop-by-hop upstream answers, the query string, the path allow-list, multipart, /debug on
the admin port only, and the access log.

Engines: the simulator (three engines, vLLM-style /v1/responses) and a tiny aiohttp
engine whose behaviour a request picks with its `x_mode` field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import httpx
import openai
import pytest

PROTO_ENGINE = r'''
import gzip, json, sys
from aiohttp import web

def chunk(text):
    return ("data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "proto",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}) + "\n\n").encode()

def echo(request, raw):
    return {"headers": [[k, v] for k, v in request.headers.items()], "path": request.path,
            "raw_path": request.raw_path, "body": raw.decode()}

async def chat(request):
    raw = await request.read()
    mode = json.loads(raw).get("x_mode", "")
    if mode in ("done_text", "done_text_cut", "gzip_stream"):
        headers = {"Content-Type": "text/event-stream"}
        if mode == "gzip_stream":
            headers["Content-Encoding"] = "gzip"
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        body = chunk("first ") + chunk("the text says\ndata: [DONE]\n\n and [DONE] ") + chunk("last")
        if mode != "done_text_cut":
            body += b"data: [DONE]\n\n"
        if mode == "gzip_stream":
            body = gzip.compress(body)
        await resp.write(body)
        await resp.write_eof()
        return resp
    payload = {"id": "p", "object": "chat.completion", "model": "proto",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
               "echo": echo(request, raw)}
    data = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "X-Kept": "yes", "X-Hop-Custom": "hop",
               "Connection": "keep-alive, X-Hop-Custom", "Keep-Alive": "timeout=5"}
    if mode == "gzip":  # compressed whatever the request asked for
        data = gzip.compress(data)
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=data, headers=headers)

async def health(request):
    return web.Response(text="ok")

app = web.Application()
app.router.add_get("/health", health)
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
'''


@pytest.fixture(scope="module")
def proto_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with harness.script_engine("proto-engine", PROTO_ENGINE, tmp_path_factory.mktemp("proto-engine")) as port:
        yield port


@pytest.fixture(scope="module")
def setup(simulator_session: harness.Simulator, proto_port: int,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.Router, Path]]:
    """One worker: the response-id table is per worker (a second worker would not know ids)."""
    work = tmp_path_factory.mktemp("proto")
    sim_labels, proto_labels = {"app": "sim"}, {"app": "proto"}
    docs = [harness.route_doc("demo", "demo", "sim"), harness.server_doc("sim", "demo", sim_labels),
            harness.endpoints_doc("sim-engines", simulator_session.ports, sim_labels),
            harness.route_doc("proto", "proto", "proto"), harness.server_doc("proto", "proto", proto_labels),
            harness.endpoints_doc("proto-engines", [proto_port], proto_labels)]
    log_path = work / "access.jsonl"
    router = harness.start_router(harness.write_config(work / "router.yaml", docs), work, workers=1,
                                  extra_args=["--access-log", str(log_path), "--access-log-flush-s", "0.1"])
    try:
        yield router, log_path
    finally:
        router.stop()


@pytest.fixture
def router(setup: tuple[harness.Router, Path], simulator: harness.Simulator) -> harness.Router:
    return setup[0]


def _engine_of(sim: harness.Simulator, request_id: str) -> int:
    hits = [i for i in range(len(sim.ports)) for e in sim.requests(i)["log"] if e["request_id"] == request_id]
    assert len(hits) == 1, hits
    return hits[0]


def _upstream_errors(router: harness.Router) -> float:
    return harness.metric_value(harness.parse_metrics(router.metrics_text()), "kthena_router_upstream_errors_total")


# --- Responses API -------------------------------------------------------------------------


def test_responses_follow_up_and_get_go_to_the_storing_engine(router: harness.Router,
                                                              simulator: harness.Simulator) -> None:
    client = router.openai()
    engines = set()
    for k in range(6):
        first = client.responses.create(model="demo", input=f"question {k}",
                                        extra_headers={"x-request-id": f"first-{k}"})
        assert first.status == "completed" and first.output_text
        follow = client.responses.create(model="demo", input="and then?", previous_response_id=first.id,
                                         extra_headers={"x-request-id": f"follow-{k}"})
        assert follow.previous_response_id == first.id
        engine = _engine_of(simulator, f"first-{k}")
        assert _engine_of(simulator, f"follow-{k}") == engine
        engines.add(engine)
        got = client.responses.retrieve(first.id)  # only that engine has it
        assert got.id == first.id and got.output_text == first.output_text
    assert len(engines) >= 2  # the pinning was not trivially one engine


def test_responses_stream_ends_with_terminal_event(router: harness.Router, simulator: harness.Simulator) -> None:
    errors_before = _upstream_errors(router)
    client = router.openai()
    for limit, terminal in ((None, "response.completed"), (3, "response.incomplete")):
        kwargs: dict[str, Any] = {} if limit is None else {"max_output_tokens": limit}
        events = list(client.responses.create(model="demo", input="hi", stream=True, **kwargs))
        assert events[0].type == "response.created" and events[-1].type == terminal
        assert all(e.type != "error" for e in events)
        # a streamed response's id is recorded from its events: follow-up and GET work
        rid = events[-1].response.id
        follow = client.responses.create(model="demo", input="more", previous_response_id=rid)
        assert follow.status == "completed"
        assert client.responses.retrieve(rid).status == events[-1].response.status
    with httpx.Client(timeout=60) as http:
        raw = http.post(router.openai_url + "/responses", json={"model": "demo", "input": "x", "stream": True})
    assert raw.status_code == 200
    assert b"[DONE]" not in raw.content and b'"error"' not in raw.content.replace(b'"error":null', b"")
    assert raw.content.rstrip().split(b"\n\n")[-1].startswith(b"event: response.completed")
    assert _upstream_errors(router) == errors_before  # no engine was blamed (or ejected)


def test_unknown_response_ids_are_404(router: harness.Router, simulator: harness.Simulator) -> None:
    client = router.openai()
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.create(model="demo", input="x", previous_response_id="resp_unknown")
    assert exc.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.retrieve("resp_unknown")
    assert exc.value.body["param"] == "response_id"
    assert sum(simulator.requests(i)["received"] for i in range(len(simulator.ports))) == 0


# --- end of stream, compression, headers, paths ----------------------------------------------


def _stream(router: harness.Router, mode: str) -> bytes:
    with httpx.Client(timeout=60) as http:
        r = http.post(router.openai_url + "/chat/completions",
                      json={"model": "proto", "messages": [], "stream": True, "x_mode": mode})
    assert r.status_code == 200
    return r.content


def test_done_inside_model_text_is_relayed_and_not_the_end(router: harness.Router) -> None:
    errors_before = _upstream_errors(router)
    whole = _stream(router, "done_text")
    assert whole.endswith(b"data: [DONE]\n\n") and b"last" in whole and b'"error"' not in whole
    assert _upstream_errors(router) == errors_before
    cut = _stream(router, "done_text_cut")  # the same text, then EOF without the [DONE] event
    assert b"last" in cut
    assert cut.rstrip().split(b"\n\n")[-1].startswith(b'data: {"error"')
    # (the counter the Responses test reads; the Rust front reports just after the reply)
    errors = harness.metrics_when(router, lambda f: harness.metric_value(f, "kthena_router_upstream_errors_total")
                                  > errors_before)
    assert harness.metric_value(errors, "kthena_router_upstream_errors_total") == errors_before + 1
    # that engine failure ejected the only proto engine for a moment: wait for it to return
    with httpx.Client(timeout=60) as http:
        harness.wait_until(lambda: http.post(router.openai_url + "/chat/completions",
                                             json={"model": "proto", "messages": []}).status_code == 200,
                           30, interval=0.2, what="proto engine back")


def test_compressed_upstream_is_relayed(router: harness.Router) -> None:
    reply = router.openai().chat.completions.with_raw_response.create(
        model="proto", messages=[{"role": "user", "content": "x"}], extra_body={"x_mode": "gzip"})
    assert reply.headers["content-encoding"] == "gzip"
    seen = {k.lower(): v for k, v in reply.parse().model_extra["echo"]["headers"]}  # decoded by the SDK
    assert seen["accept-encoding"] == "identity"  # although the SDK asked for gzip
    with httpx.Client(timeout=60) as http:
        r = http.post(router.openai_url + "/chat/completions",
                      json={"model": "proto", "messages": [], "stream": True, "x_mode": "gzip_stream"})
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
    assert r.content.endswith(b"data: [DONE]\n\n")  # httpx decoded it
    ok = router.openai().chat.completions.create(model="proto", messages=[])
    assert ok.choices[0].message.content == "ok"  # the engine was not ejected


def test_hop_by_hop_headers_and_query_string(router: harness.Router) -> None:
    with httpx.Client(timeout=60) as http:
        r = http.post(router.openai_url + "/chat/completions?api-version=2024-01&x=a%20b",
                      json={"model": "proto", "messages": []},
                      headers={"Connection": "keep-alive, X-Client-Hop", "X-Client-Hop": "secret",
                               "Keep-Alive": "timeout=9", "TE": "trailers", "X-Custom": "kept"})
    assert r.status_code == 200, r.text
    echo = r.json()["echo"]
    seen = {k.lower(): v for k, v in echo["headers"]}
    assert "x-client-hop" not in seen and "te" not in seen and seen.get("keep-alive") is None
    assert seen["x-custom"] == "kept" and seen["x-request-id"] == r.headers["x-request-id"]
    assert echo["raw_path"] == "/v1/chat/completions?api-version=2024-01&x=a%20b"
    assert r.headers["x-kept"] == "yes"
    assert "x-hop-custom" not in r.headers and "timeout=5" not in r.headers.get("keep-alive", "")


@pytest.mark.parametrize("method,path,status", [("POST", "/v1/load_lora_adapter", 404),
                                                ("POST", "/v1/unload_lora_adapter", 404),
                                                ("POST", "/v1/no_such_api", 404),
                                                ("GET", "/v1/chat/completions", 405),
                                                ("DELETE", "/v1/responses/resp_1", 405)])
def test_paths_outside_the_allow_list(router: harness.Router, method: str, path: str, status: int) -> None:
    with httpx.Client(timeout=60) as http:
        r = http.request(method, f"{router.base_url}{path}", json={"model": "demo", "lora_name": "x"})
    assert r.status_code == status
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_multipart_is_refused_clearly(router: harness.Router, simulator: harness.Simulator) -> None:
    with pytest.raises(openai.APIStatusError) as exc:
        router.openai().audio.transcriptions.create(model="demo", file=("a.wav", b"RIFF0000WAVE", "audio/wav"))
    assert exc.value.status_code == 415 and "multipart" in exc.value.body["message"]
    with httpx.Client(timeout=60) as http:
        r = http.post(router.openai_url + "/chat/completions", files={"file": ("x", b"abc")},
                      data={"model": "demo"})
    assert r.status_code == 415 and "multipart" in r.json()["error"]["message"]
    assert sum(simulator.requests(i)["received"] for i in range(len(simulator.ports))) == 0


def test_debug_views_only_on_the_admin_port(router: harness.Router) -> None:
    router.openai().responses.create(model="demo", input="x")
    with httpx.Client(timeout=60) as http:
        assert http.get(router.base_url + "/debug/response_ids").status_code == 404
        assert http.get(router.base_url + "/debug/kv_ownership").status_code == 404
    r = router.admin_get("/debug/response_ids")
    assert r.status_code == 200, r.text
    workers = r.json()["workers"]
    assert len(workers) == 1 and workers[0]["count"] >= 1 and workers[0]["pid"] in router.worker_pids()
    assert router.admin_get("/debug/kv_ownership").status_code == 404  # no kvcache-aware here
    one = router.admin_get(f"/debug/response_ids?pid={workers[0]['pid']}")
    assert one.status_code == 200 and one.json()["count"] >= 1


# --- access log --------------------------------------------------------------------------------


def test_access_log_lines(setup: tuple[harness.Router, Path], simulator: harness.Simulator) -> None:
    router, log_path = setup
    secret_prompt, secret_key = "PROMPT-TEXT-MUST-NOT-BE-LOGGED", "sk-MUST-NOT-BE-LOGGED"
    client = router.openai()
    auth = {"Authorization": f"Bearer {secret_key}"}
    client.chat.completions.create(model="demo", messages=[{"role": "user", "content": secret_prompt}],
                                   max_tokens=5, extra_headers={"x-request-id": "log-unary", **auth})
    list(client.chat.completions.create(model="demo", messages=[{"role": "user", "content": secret_prompt}],
                                        max_tokens=4, stream=True,
                                        extra_headers={"x-request-id": "log-stream", **auth}))
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[], extra_headers={"x-request-id": "log-404", **auth})

    def rows() -> dict[str, dict[str, Any]] | None:
        text = log_path.read_text() if log_path.exists() else ""
        got = {r["request_id"]: r for r in map(json.loads, text.splitlines())}
        return got if {"log-unary", "log-stream", "log-404"} <= set(got) else None

    got = harness.wait_until(rows, 30, what="access log lines")
    unary, stream, missing = got["log-unary"], got["log-stream"], got["log-404"]
    for row in (unary, stream):
        assert row["status"] == 200 and row["attempts"] == 1 and row["model"] == "demo"
        assert row["route"] == "default/demo" and row["server"] == "default/sim"
        assert row["endpoint"].endswith(tuple(f":{p}" for p in simulator.ports))
        assert row["path"] == "/v1/chat/completions" and row["method"] == "POST"
        assert 0 < row["ttft_ms"] <= row["duration_ms"]
        assert row["prompt_tokens"] > 0
    assert unary["completion_tokens"] == 5 and not unary["stream"]
    assert stream["completion_tokens"] == 4 and stream["stream"]
    assert missing["status"] == 404 and missing["attempts"] == 0 and missing["endpoint"] == ""
    text = log_path.read_text()
    assert secret_prompt not in text and secret_key not in text
    # timestamps are epoch seconds, in the order the requests completed
    assert isinstance(unary["ts"], float) and 0 < unary["ts"] <= stream["ts"] <= missing["ts"], (unary, stream, missing)
