"""The Rust front end (docs/rust-front.md), which `--interface auto` (the default, not
passed here) chooses for this configuration: it relays plain completions itself (fast
path) and hands everything else to the full app on granian's unix socket (slow path).
Two workers (the front ends share the port with SO_REUSEPORT). The
interface-specific behaviours (disconnects, refusals, admission, access log) also run on
`rust` in test_proxy_interfaces.py."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness
import httpx
import openai
import pytest

MSGS = [{"role": "user", "content": "hello"}]
DECISIONS = "kthena_router_front_decisions_total"


@pytest.fixture(scope="module")
def setup(simulator_session: harness.Simulator,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.Router, int]]:
    work = tmp_path_factory.mktemp("rust-front")
    dead = harness.free_port()  # nothing listens: every attempt there is a connect error
    docs = harness.engine_config([dead, *simulator_session.ports])
    limited = harness.route_doc("limited", "limited", "demo")
    limited["spec"]["rateLimit"] = {"inputTokensPerUnit": 60, "unit": "hour"}
    docs.insert(1, limited)
    governed = harness.route_doc("governed", "governed", "demo")  # a limit never reached: always slow path
    governed["spec"]["rateLimit"] = {"inputTokensPerUnit": 10 ** 9, "unit": "hour"}
    docs.insert(1, governed)
    config = harness.write_config(work / "router.yaml", docs)
    router = harness.start_router(config, work, workers=2)  # auto: rate limits do not keep it off the front
    try:
        yield router, dead
    finally:
        router.stop()


def _metrics(router: harness.Router) -> dict:
    return harness.parse_metrics(router.metrics_text())


def _fast(router: harness.Router) -> float:
    return harness.metric_value(_metrics(router), DECISIONS, decision="fast")


def test_openai_sdk_stream_and_plain_take_the_fast_path(setup: tuple[harness.Router, int],
                                                        simulator: harness.Simulator) -> None:
    router, _ = setup
    before = _fast(router)
    client = router.openai()
    stream = client.chat.completions.create(model="demo", messages=MSGS, max_tokens=6, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert all(c.usage is None for c in chunks)  # the usage chunk the router asked for stays hidden
    with_usage = list(client.chat.completions.create(model="demo", messages=MSGS, max_tokens=6, stream=True,
                                                     stream_options={"include_usage": True}))
    assert with_usage[-1].usage is not None and with_usage[-1].usage.completion_tokens == 6
    plain = client.chat.completions.create(model="demo", messages=MSGS, max_tokens=5)
    assert plain.choices[0].message.content and plain.usage.completion_tokens == 5
    text = client.completions.create(model="demo", prompt="once upon", max_tokens=4)
    assert text.choices[0].text and text.usage.completion_tokens == 4
    text_stream = list(client.completions.create(model="demo", prompt="once upon", max_tokens=4, stream=True))
    assert "".join(c.choices[0].text for c in text_stream if c.choices)
    assert _fast(router) >= before + 5
    # the request metrics Grafana and the tests use count fast-path requests (reported just
    # after the reply: wait for the last one)
    fams = harness.wait_until(lambda: (f := _metrics(router)) and harness.metric_value(
        f, "kthena_router_tokens_total", path="/v1/completions", token_type="output") >= 8 and f, 10,
        what="the last request's tokens counted")
    assert harness.metric_value(fams, "kthena_router_requests_total", path="/v1/chat/completions",
                                status_code="200", model_route="default/demo") >= 3
    assert harness.metric_value(fams, "kthena_router_time_to_first_token_seconds_count") >= 5


def test_batched_metric_writes_count_every_request_exactly(setup: tuple[harness.Router, int],
                                                          simulator: harness.Simulator) -> None:
    """The fast path's metric writes are merged per loop iteration (front/batch.py):
    concurrent streams still add exactly one request, duration, TTFT and TPOT observation
    and their tokens each, under the same names and labels."""
    router, _ = setup
    chat = {"path": "/v1/chat/completions"}
    names = [("kthena_router_requests_total", {**chat, "status_code": "200", "model_route": "default/demo"}),
             ("kthena_router_request_duration_seconds_count", {**chat, "status_code": "200"}),
             ("kthena_router_request_duration_seconds_bucket", {**chat, "status_code": "200", "le": "+Inf"}),
             ("kthena_router_time_to_first_token_seconds_count", chat),
             ("kthena_router_time_per_output_token_seconds_count", chat),
             ("kthena_router_tokens_total", {**chat, "token_type": "output"}),
             ("kthena_router_endpoint_tokens_total", {"token_type": "output"})]

    def values() -> list[float]:
        fams = _metrics(router)
        return [harness.metric_value(fams, n, **labels) for n, labels in names]

    before = values()
    fast_before = _fast(router)
    threads, per_thread, tokens = 4, 4, 5
    client = router.openai()

    def run(_: int) -> None:
        for _ in range(per_thread):
            chunks = list(client.chat.completions.create(model="demo", messages=MSGS, max_tokens=tokens, stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, range(threads)))
    n = threads * per_thread
    want = [n, n, n, n, n, n * tokens, n * tokens]
    # a scrape can fall between the writes of one flush: wait for every series
    after = harness.metrics_when(router, lambda _: all(a - b >= w for a, b, w in zip(values(), before, want)))
    after = values()
    assert _fast(router) >= fast_before + n
    delta = [a - b for a, b in zip(after, before)]
    assert delta == want, dict(zip([x for x, _ in names], delta))


def test_retry_before_the_first_byte(setup: tuple[harness.Router, int], simulator: harness.Simulator) -> None:
    router, _ = setup
    # engine 1 accepts and drops every request before its first byte (its /health stays
    # fine, so it remains a candidate); its neighbours in the round robin are healthy (two
    # attempts per request by default: two failing candidates in a row would be a 502)
    simulator.set_faults(1, die_after_tokens=0)
    with httpx.Client(timeout=30) as http:
        for i in range(12):  # round robin: engine 1 gets attempts; every client still gets its answer
            body = {"model": "demo", "messages": MSGS, "max_tokens": 3, "stream": bool(i % 2)}
            r = http.post(f"{router.openai_url}/chat/completions", json=body)
            assert r.status_code == 200, r.text
            if i % 2:
                assert r.text.rstrip().endswith("data: [DONE]")
    assert simulator.received()[1] >= 1
    fams = harness.wait_until(lambda: (f := _metrics(router)) and harness.metric_value(
        f, "kthena_router_retries_total") >= 1 and f, 10, what="retries counted")
    assert harness.metric_value(fams, "kthena_router_upstream_errors_total",
                                endpoint=f"{harness.HOST}:{simulator.ports[1]}") >= 1


def test_error_event_after_the_first_byte(setup: tuple[harness.Router, int],
                                          simulator: harness.Simulator) -> None:
    router, _ = setup
    lines = harness.stream_with_dying_engines(
        router, simulator, {"model": "demo", "messages": MSGS, "max_tokens": 10, "stream": True})
    assert "data: [DONE]" not in lines
    err = json.loads(lines[-1][6:])["error"]
    assert err["code"] == 502 and "incomplete" in err["message"]
    fams = harness.wait_until(lambda: (f := _metrics(router)) and harness.metric_value(
        f, "kthena_router_requests_total", error_type="upstream_error_after_first_byte") >= 1 and f, 10,
        what="the failed stream counted")
    assert harness.metric_value(fams, "kthena_router_requests_total", status_code="502",
                                error_type="upstream_error_after_first_byte") >= 1


@pytest.mark.parametrize("model", ["demo", "governed"])  # fast path; slow path (via granian's socket)
def test_disconnect_cancels_the_engine(setup: tuple[harness.Router, int], simulator: harness.Simulator,
                                       model: str) -> None:
    router, _ = setup
    rid = uuid.uuid4().hex
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{router.openai_url}/chat/completions", headers={"X-Request-ID": rid},
                         json={"model": model, "messages": MSGS, "max_tokens": 4000, "stream": True}) as resp:
            assert resp.status_code == 200 and resp.headers["x-request-id"] == rid
            next(line for line in resp.iter_lines() if line.startswith("data: "))

    def aborted() -> dict | None:
        for i in range(len(simulator.ports)):
            for e in simulator.requests(i)["log"]:
                if e["request_id"] == rid and e["status"] == "aborted":
                    return e
        return None

    entry = harness.wait_until(aborted, 30, interval=0.1, what="engine saw the abort")
    assert entry["tokens_out"] < 4000
    harness.wait_until(lambda: harness.metric_value(_metrics(router), "kthena_router_requests_total", model=model,
                                                    status_code="499", error_type="client_disconnect") >= 1,
                       10, what="the disconnect counted")


def test_slow_path_errors_and_features(setup: tuple[harness.Router, int], simulator: harness.Simulator) -> None:
    router, _ = setup
    slow_before = harness.metric_value(_metrics(router), DECISIONS, decision="slow")
    client = router.openai(max_retries=0)
    with pytest.raises(openai.NotFoundError) as nf:  # unknown model: the full pipeline's 404
        client.chat.completions.create(model="no-such-model", messages=MSGS, max_tokens=2)
    assert nf.value.body["code"] == 404
    with httpx.Client(timeout=30) as http:
        url = f"{router.openai_url}/chat/completions"
        bad = http.post(url, content=b"{not json", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and set(bad.json()["error"]) == {"message", "type", "param", "code"}
        no_model = http.post(url, json={"messages": MSGS})
        assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"
        models = http.get(f"{router.openai_url}/models")  # not a completion: straight to granian
        assert models.status_code == 200 and {m["id"] for m in models.json()["data"]} >= {"demo", "limited"}
        # a rate-limited route: admission and its 429 are the full pipeline's
        statuses = [http.post(url, json={"model": "limited", "messages": MSGS, "max_tokens": 2}).status_code
                    for _ in range(12)]
    assert statuses[0] == 200 and 429 in statuses, statuses
    fams = _metrics(router)
    assert harness.metric_value(fams, DECISIONS, decision="slow") >= slow_before + 3 + 12
    assert harness.metric_value(fams, "kthena_router_rate_limit_exceeded_total") >= 1


def test_5xx_and_garbage_are_retried_4xx_passed_through(setup: tuple[harness.Router, int],
                                                        simulator: harness.Simulator) -> None:
    router, _ = setup
    # one faulty engine at a time (two attempts per request by default: a request whose two
    # candidates both fail gets the 502, as on the Python path); its neighbours in the
    # round robin are healthy. Outlier detection may eject it for a while: requests go on
    # until its failure is counted.
    with httpx.Client(timeout=30) as http:
        for fault, reason in (({"error_rate": 1.0, "error_status": 500}, "http_5xx"), ({"garbage": True},
                                                                                     "invalid_output")):
            simulator.reset_faults()
            e1 = f"{harness.HOST}:{simulator.ports[1]}"  # back from any ejection by the previous phase
            harness.wait_until(lambda: harness.metric_value(_metrics(router), "kthena_router_endpoint_healthy",
                                                            endpoint=e1) == 1, 60, interval=0.2, what="engine 1 healthy")
            simulator.set_faults(1, **fault)
            for i in range(60):  # every client still gets a whole answer
                body = {"model": "demo", "messages": MSGS, "max_tokens": 3, "stream": bool(i % 2)}
                r = http.post(f"{router.openai_url}/chat/completions", json=body)
                assert r.status_code == 200, (fault, r.text)
                if i % 2:
                    assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text
                else:
                    assert r.json()["choices"][0]["message"]["content"]
                if i % 4 == 3 and harness.metric_value(_metrics(router), "kthena_router_upstream_errors_total",
                                                       reason=reason) >= 1:
                    break
            else:
                pytest.fail(f"no {reason} attempt counted in 60 requests")
        # the engine's own 4xx is its answer: passed through, not retried
        simulator.reset_faults()
        simulator.reset_requests()
        bad = http.post(f"{router.openai_url}/chat/completions",
                        json={"model": "demo", "messages": MSGS, "max_tokens": -5})
    assert 400 <= bad.status_code < 500 and "error" in bad.json(), bad.text
    assert sum(simulator.received()) == 1
    harness.wait_until(lambda: harness.metric_value(_metrics(router), "kthena_router_requests_total",
                                                    error_type="upstream_4xx") >= 1, 10, what="the 4xx counted")


def test_bodies_far_over_the_limit_get_their_413_under_load(setup: tuple[harness.Router, int],
                                                            simulator: harness.Simulator) -> None:
    """Twice the default limit, declared or chunked, on the fast paths and on the full app's
    (embeddings), eight at a time: every one gets its 413, and the upload is read on so that
    the client, which sends it all before reading, sees it. The front once relayed declared
    ones to a worker that refused them mid-upload, and answered some with a 503."""
    router, _ = setup
    big = b"x" * (64 << 20)

    def chunked() -> Iterator[bytes]:
        for _ in range(64):
            yield b"x" * (1 << 20)

    def post(i: int) -> int | str:
        path = ("/v1/chat/completions", "/v1/embeddings", "/v1/completions")[i % 3]
        content = chunked() if i % 4 == 3 else big
        try:
            return httpx.post(router.base_url + path, content=content,
                              headers={"content-type": "application/json"}, timeout=60).status_code
        except httpx.HTTPError as exc:
            return type(exc).__name__

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(post, range(40)))
    assert got == [413] * len(got), Counter(got)
    assert sum(simulator.received()) == 0
    with httpx.Client(timeout=30) as http:
        harness.chat_ok(router, http)


def test_a_client_waiting_for_100_continue_gets_the_413_instead(setup: tuple[harness.Router, int]) -> None:
    """An oversized declared body with `Expect: 100-continue` (curl's default past 1 MB): the
    413 comes instead of the go-ahead (reading the body first would ask for the upload), and
    the connection closes without it."""
    router, _ = setup
    with socket.create_connection((harness.HOST, router.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % (64 << 20))
        data = b""
        while got := sock.recv(65536):
            data += got
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), data[:300]
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == 413


def test_auto_keeps_granian_on_the_port_when_fair_queuing_would_send_everything_slow(
        simulator: harness.Simulator, tmp_path: Path) -> None:
    config = harness.write_config(tmp_path / "router.yaml", harness.engine_config(simulator.ports))
    rc = tmp_path / "router-config.yaml"
    rc.write_text("fairness:\n  saturation: {maxInFlightPerEndpoint: 64}\n")
    router = harness.start_router(config, tmp_path, extra_args=["--router-config", str(rc)])
    try:
        reply = router.openai().chat.completions.create(model="demo", messages=MSGS, max_tokens=3)
        assert reply.usage.completion_tokens == 3
        text = router.metrics_text()
        assert "kthena_router_fairness_admitted_total" in text  # the gate saw it
        assert DECISIONS not in text, "auto chose the Rust front although fair queuing is on"
        assert not (router.runtime_dir / "granian.sock").exists()
    finally:
        router.stop()


def test_a_queue_before_the_first_token_is_not_a_stall(simulator: harness.Simulator, tmp_path: Path) -> None:
    """An engine sends a stream's head when it takes the request; the first token may wait
    in its queue. Stall tracking ends at the head (as in proxy/executor.py), so a busy
    engine is not judged stalled and ejected (under load that scattered prefix groups)."""
    config = harness.write_config(tmp_path / "router.yaml", harness.engine_config(simulator.ports[:1]))
    rc = tmp_path / "router-config.yaml"
    rc.write_text("traffic:\n  outlierDetection: {stallFactor: 2, stallMinimum: 0.3s}\n")
    router = harness.start_router(config, tmp_path, extra_args=["--router-config", str(rc)])
    try:
        client = router.openai(timeout=60.0)
        for _ in range(5):  # the endpoint's recent TTFT: milliseconds
            list(client.chat.completions.create(model="demo", messages=MSGS, max_tokens=2, stream=True))
        simulator.set_faults(0, token_delay_s=1.5)  # head at once, the first token after ~1.5 s

        def slow_stream(_: int) -> str:
            chunks = list(client.chat.completions.create(model="demo", messages=MSGS, max_tokens=1, stream=True))
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(3) as pool:
            waiting = [pool.submit(slow_stream, i) for i in range(2)]
            time.sleep(0.8)  # past stallMinimum: the next decision judges the two in flight
            texts = [pool.submit(slow_stream, 2).result(), *(f.result() for f in waiting)]
        assert all(texts)
        fams = harness.metrics_when(router, lambda f: harness.metric_value(
            f, DECISIONS, decision="fast") >= 8 and harness.metric_value(
            f, "kthena_router_active_downstream_requests") == 0)
        assert harness.metric_value(fams, DECISIONS, decision="fast") >= 8  # the front relayed them
        assert harness.metric_value(fams, "kthena_router_stalled_attempts_total") == 0
        assert harness.metric_value(fams, "kthena_router_endpoint_healthy") == 1
    finally:
        simulator.reset_faults()
        router.stop()
