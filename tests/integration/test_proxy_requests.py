"""Happy paths and client errors through the real router in front of the simulator.

Client: the openai SDK (and httpx for malformed requests the SDK cannot send).
"""

from __future__ import annotations

import functools
import uuid

import harness
import httpx
import openai
import pytest

MSGS = [{"role": "user", "content": "Say something about routers."}]


def _log(sim: harness.Simulator) -> list[dict]:
    return [entry for i in range(len(sim.ports)) for entry in sim.requests(i)["log"]]


def test_chat_non_streaming(router: harness.Router, simulator: harness.Simulator) -> None:
    client = router.openai()
    resp = client.chat.completions.create(model="demo", messages=MSGS, max_tokens=8)
    assert resp.choices[0].message.content
    assert resp.usage is not None and resp.usage.completion_tokens == 8
    log = _log(simulator)
    assert [(e["path"], e["model"], e["stream"], e["status"]) for e in log] == [
        ("/v1/chat/completions", "demo", False, "completed")]


def test_chat_streaming_hides_injected_usage(router: harness.Router, simulator: harness.Simulator) -> None:
    client = router.openai()
    chunks = list(client.chat.completions.create(model="demo", messages=MSGS, max_tokens=6, stream=True))
    assert chunks, "no chunks"
    assert all(c.usage is None for c in chunks), "usage chunk leaked to a client that did not ask"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    log = _log(simulator)
    assert len(log) == 1 and log[0]["status"] == "completed" and log[0]["tokens_out"] == 6


def test_chat_streaming_usage_shown_when_asked(router: harness.Router) -> None:
    client = router.openai()
    chunks = list(client.chat.completions.create(model="demo", messages=MSGS, max_tokens=5, stream=True,
                                                 stream_options={"include_usage": True}))
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 5
    assert chunks[-1].usage is not None and chunks[-1].choices == []


def test_completions_both_modes(router: harness.Router, simulator: harness.Simulator) -> None:
    client = router.openai()
    resp = client.completions.create(model="demo", prompt="Once upon a time", max_tokens=4)
    assert resp.choices[0].text and resp.usage.completion_tokens == 4
    streamed = list(client.completions.create(model="demo", prompt=["a", "b"][0], max_tokens=4, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices)
    assert all(c.usage is None for c in streamed)
    paths = sorted(e["path"] for e in _log(simulator))
    assert paths == ["/v1/completions", "/v1/completions"]


def test_lora_adapter_keeps_its_name(router: harness.Router, simulator: harness.Simulator) -> None:
    client = router.openai()
    client.chat.completions.create(model="demo-lora-a", messages=MSGS, max_tokens=2)
    assert [e["model"] for e in _log(simulator)] == ["demo-lora-a"]


def test_models_lists_routes_and_adapters(router: harness.Router) -> None:
    ids = sorted(m.id for m in router.openai().models.list())
    assert ids == ["demo", "demo-lora-a", "demo-lora-b"]
    owners = {m.owned_by for m in router.openai().models.list()}
    assert owners == {"kthena"}


def _endpoint_view(router: harness.Router, sim: harness.Simulator) -> dict[str, tuple[float, float]]:
    """{endpoint: (healthy, metrics_stale)} as the router's metrics show them."""
    fams = harness.parse_metrics(router.metrics_text())
    keys = [f"{harness.HOST}:{p}" for p in sim.ports]
    return {k: (harness.metric_value(fams, "kthena_router_endpoint_healthy", endpoint=k),
                harness.metric_value(fams, "kthena_router_endpoint_metrics_stale", endpoint=k))
            for k in keys}


def test_requests_spread_over_the_engines(router: harness.Router, simulator: harness.Simulator) -> None:
    # An earlier test on this shared router may have left an engine ejected or its last
    # scrape failed (load unknown = worst, by design it then gets nothing while the others
    # are idle): the spread is only owed once every engine is a fresh, healthy candidate.
    harness.wait_until(lambda: all(v == (1.0, 0.0) for v in _endpoint_view(router, simulator).values()),
                       30, what="every engine healthy and freshly scraped")
    client = router.openai()
    n = 6 * router.workers
    for _ in range(n):
        client.completions.create(model="demo", prompt="x", max_tokens=1)
    received = simulator.received()
    assert sum(received) == n
    assert all(r >= 1 for r in received), (received, _endpoint_view(router, simulator))


def test_request_id_passed_through_and_generated(router: harness.Router, simulator: harness.Simulator) -> None:
    rid = f"test-{uuid.uuid4().hex}"
    body = {"model": "demo", "prompt": "hi", "max_tokens": 1}
    with httpx.Client(timeout=60) as http:
        r1 = http.post(f"{router.openai_url}/completions", json=body, headers={"X-Request-ID": rid})
        r2 = http.post(f"{router.openai_url}/completions", json=body)
    assert r1.status_code == 200 and r2.status_code == 200
    assert r1.headers["x-request-id"] == rid
    generated = r2.headers["x-request-id"]
    assert generated and generated != rid
    assert sorted(e["request_id"] for e in _log(simulator)) == sorted([rid, generated])


def test_unknown_fields_pass_through(router: harness.Router, simulator: harness.Simulator) -> None:
    # vLLM-specific sampling fields are not known to the router; the engine must get them.
    resp = router.openai().completions.create(model="demo", prompt="x", max_tokens=3,
                                              extra_body={"top_k": 5, "ignore_eos": True})
    assert resp.usage.completion_tokens == 3
    assert len(_log(simulator)) == 1


@pytest.mark.parametrize(
    ("path", "content", "status", "param"),
    [
        ("/completions", b"{not json", 400, None),
        ("/completions", b"[1, 2]", 400, None),
        ("/completions", b'{"prompt": "x"}', 400, "model"),
        ("/completions", b'{"model": 42, "prompt": "x"}', 400, "model"),
        ("/completions", b'{"model": "demo", "prompt": "x", "stream": "yes"}', 400, "stream"),
        ("/completions", b'{"model": "demo", "prompt": "x", "max_tokens": "many"}', 400, "max_tokens"),
        ("/chat/completions", b'{"model": "demo", "messages": "hi"}', 400, "messages"),
        ("/completions", b'{"model": "demo"}', 400, "prompt"),
        ("/completions", b'{"model": "no-such-model", "prompt": "x"}', 404, "model"),
    ],
)
def test_client_errors_are_openai_style(router: harness.Router, simulator: harness.Simulator, path: str,
                                        content: bytes, status: int, param: str | None) -> None:
    with httpx.Client(timeout=60) as http:
        r = http.post(f"{router.openai_url}{path}", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["message"]
    assert "127.0.0.1" not in r.text and "Traceback" not in r.text
    assert r.headers.get("x-request-id")
    assert simulator.received() == [0] * len(simulator.ports)


def test_sdk_raises_not_found_for_unknown_model(router: harness.Router) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        router.openai().chat.completions.create(model="nope", messages=MSGS)
    assert "nope" in str(info.value)


def test_wrong_method_and_unknown_path(router: harness.Router) -> None:
    with httpx.Client(timeout=60) as http:
        r1 = http.get(f"{router.openai_url}/chat/completions")
        r2 = http.get(f"{router.base_url}/nothing-here")
    assert r1.status_code == 405 and r1.json()["error"]["type"]
    assert r2.status_code == 404 and r2.json()["error"]["code"] == 404


def test_router_survives_garbage_requests(router: harness.Router) -> None:
    """Truncated bodies and lying Content-Length must not stall or crash a worker."""
    import socket

    for raw in (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\"",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
        b"\x00\x01\x02 garbage\r\n\r\n",
    ):
        with socket.create_connection((harness.HOST, router.port), timeout=10) as s:
            s.sendall(raw)
            s.shutdown(socket.SHUT_WR)
            try:
                s.recv(4096)
            except OSError:
                pass
    resp = router.openai().completions.create(model="demo", prompt="still alive?", max_tokens=1)
    assert resp.choices


def test_metrics_count_requests_and_tokens(router: harness.Router) -> None:
    before = harness.parse_metrics(router.metrics_text())
    out0 = harness.metric_value(before, "kthena_router_tokens_total", model="demo", token_type="output")
    ok0 = harness.metric_value(before, "kthena_router_requests_total", model="demo", status_code="200")
    client = router.openai()
    list(client.chat.completions.create(model="demo", messages=MSGS, max_tokens=7, stream=True))
    client.chat.completions.create(model="demo", messages=MSGS, max_tokens=3)

    # A scrape reads each worker's metric file while that worker may be writing a request's
    # counters one after another, so wait for every figure, then check the tokens exactly.
    def updated() -> dict | None:
        fams = harness.parse_metrics(router.metrics_text())
        value = functools.partial(harness.metric_value, fams, model="demo")
        if (value("kthena_router_requests_total", status_code="200") >= ok0 + 2
                and value("kthena_router_tokens_total", token_type="output") >= out0 + 10
                and value("kthena_router_time_to_first_token_seconds_count") >= 2
                and value("kthena_router_time_per_output_token_seconds_count") >= 1
                and value("kthena_router_request_duration_seconds_count") >= 2):
            return fams
        return None

    try:
        after = harness.wait_until(updated, 30, what="request metrics")
    except TimeoutError:
        raise AssertionError(router.metrics_text()[-3000:]) from None
    assert harness.metric_value(after, "kthena_router_tokens_total", model="demo", token_type="output") - out0 == 10
    assert "kthena_router_active_upstream_requests" in after
    assert "kthena_router_endpoint_healthy" in after


@pytest.mark.parametrize("path", ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"])
def test_engine_management_paths_are_not_proxied(router: harness.Router, simulator: harness.Simulator,
                                                 path: str) -> None:
    r = httpx.post(f"{router.base_url}{path}", json={"model": "demo", "lora_name": "x", "lora_path": "/x"},
                   timeout=30)
    assert r.status_code == 404, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert simulator.received() == [0, 0, 0]
