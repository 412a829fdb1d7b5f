"""The proxy's behaviours hold on both server interfaces (`--interface rsgi`, the CLI's
default, and `--interface asgi`, the plain ASGI app): the other suites run the default;
this one runs the parts where the two paths differ (proxy/downstream.py, serving.py) on
each: streaming event by event, disconnect cancels the engine's work, retry before the
first byte, the error event after it, refusals before the body, the admission limit, the
non-proxied paths (starlette through the RSGI bridge) and the access log."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import harness
import httpx
import pytest

MSGS = [{"role": "user", "content": "hello"}]
ADMISSION = 2
# No filters: every endpoint is a candidate, so that a retry reaches the healthy one.
ROUTER_CONFIG = f"""
scheduler:
  plugins:
    Filter: {{enabled: []}}
    Score: {{enabled: [{{name: least-request, weight: 1}}]}}
traffic:
  admission: {{maxInFlightPerWorker: {ADMISSION}, retryAfter: 3s}}
"""


@pytest.fixture(scope="module", params=["rsgi", "asgi", "rust"])
def setup(request: pytest.FixtureRequest, simulator_session: harness.Simulator,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.Router, Path]]:
    work = tmp_path_factory.mktemp(f"iface-{request.param}")
    config = harness.write_config(work / "router.yaml", harness.engine_config(simulator_session.ports))
    rc = work / "router-config.yaml"
    rc.write_text(ROUTER_CONFIG)
    log_path = work / "access.log"
    router = harness.start_router(config, work, extra_args=[
        "--interface", request.param, "--router-config", str(rc),
        "--access-log", str(log_path), "--access-log-flush-s", "0.1"])
    try:
        yield router, log_path
    finally:
        router.stop()


def _entry(sim: harness.Simulator, rid: str) -> dict | None:
    for i in range(len(sim.ports)):
        for e in sim.requests(i)["log"]:
            if e["request_id"] == rid:
                return e
    return None


def _chat(stream: bool, max_tokens: int = 8) -> dict:
    return {"model": "demo", "messages": MSGS, "max_tokens": max_tokens, "stream": stream}


def test_stream_goes_out_event_by_event(setup: tuple[harness.Router, Path], simulator: harness.Simulator) -> None:
    router, _ = setup
    for i in range(len(simulator.ports)):
        simulator.set_faults(i, token_delay_s=0.3)
    rid = uuid.uuid4().hex
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{router.openai_url}/chat/completions", json=_chat(True, 20),
                         headers={"X-Request-ID": rid}) as resp:
            assert resp.status_code == 200
            assert resp.headers["x-request-id"] == rid
            lines = resp.iter_lines()  # one iterator: dropping one closes the response
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["choices"]
            # the first event is here while the engine is still generating the rest
            entries = [e for i in range(len(simulator.ports)) for e in simulator.requests(i)["log"]
                       if e["request_id"] == rid]
            assert [e["status"] for e in entries] == ["running"], json.dumps(entries)
            rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"


def test_plain_reply_and_request_id(setup: tuple[harness.Router, Path], simulator: harness.Simulator) -> None:
    router, _ = setup
    resp = httpx.post(f"{router.openai_url}/chat/completions", json=_chat(False), headers={"X-Request-ID": "r-1"},
                      timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-request-id"] == "r-1"
    assert int(resp.headers["content-length"]) == len(resp.content)
    assert resp.json()["usage"]["completion_tokens"] == 8


def test_retry_before_the_first_byte(setup: tuple[harness.Router, Path], simulator: harness.Simulator) -> None:
    router, _ = setup
    simulator.set_faults(0, die_after_tokens=0)  # dies before its first token; /health stays fine
    for _ in range(20):  # until engine 0 got an attempt: the client still gets a whole stream
        resp = httpx.post(f"{router.openai_url}/chat/completions", json=_chat(True), timeout=30)
        assert resp.status_code == 200 and "data: [DONE]" in resp.text, resp.text
        if simulator.received()[0]:
            break
    assert simulator.received()[0] >= 1


def test_error_event_after_the_first_byte(setup: tuple[harness.Router, Path],
                                          simulator: harness.Simulator) -> None:
    router, _ = setup
    lines = harness.stream_with_dying_engines(router, simulator, _chat(True, 10))
    assert "data: [DONE]" not in lines
    assert "error" in json.loads(lines[-1][6:])


def test_disconnect_cancels_stream(setup: tuple[harness.Router, Path], simulator: harness.Simulator) -> None:
    router, _ = setup
    rid = uuid.uuid4().hex
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{router.openai_url}/chat/completions", json=_chat(True, 4000),
                         headers={"X-Request-ID": rid}) as resp:
            assert resp.status_code == 200
            next(line for line in resp.iter_lines() if line.startswith("data: "))
    entry = harness.wait_until(lambda: (e := _entry(simulator, rid)) is not None and e["status"] == "aborted" and e,
                               30, interval=0.1, what="engine saw the abort")
    assert entry["tokens_out"] < 4000


def test_disconnect_before_the_response_cancels(setup: tuple[harness.Router, Path],
                                                simulator: harness.Simulator) -> None:
    router, _ = setup
    for i in range(len(simulator.ports)):
        simulator.set_faults(i, stall=True)
    rid = uuid.uuid4().hex
    with httpx.Client(timeout=httpx.Timeout(60, read=1.0)) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post(f"{router.openai_url}/chat/completions", json=_chat(False), headers={"X-Request-ID": rid})
    harness.wait_until(lambda: (e := _entry(simulator, rid)) is not None and e["status"] == "aborted",
                       30, interval=0.1, what="engine saw the abort")
    assert sum(simulator.received()) == 1


def test_refusals(setup: tuple[harness.Router, Path], simulator: harness.Simulator) -> None:
    router, _ = setup
    url = f"{router.openai_url}/chat/completions"
    big = httpx.post(url, content=b"x" * (33 * 1024 * 1024), headers={"content-type": "application/json"},
                     timeout=60)
    assert big.status_code == 413 and big.json()["error"]["code"] == 413
    gz = httpx.post(url, content=b"{}", headers={"content-type": "application/json", "content-encoding": "gzip"},
                    timeout=30)
    assert gz.status_code == 415
    multi = httpx.post(url, content=b"--x--", headers={"content-type": "multipart/form-data; boundary=x"},
                       timeout=30)
    assert multi.status_code == 415
    bad = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["type"]
    assert sum(simulator.received()) == 0


def test_chunked_body_over_the_limit(setup: tuple[harness.Router, Path], simulator: harness.Simulator) -> None:
    router, _ = setup

    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b"x" * (1024 * 1024)

    resp = httpx.post(f"{router.openai_url}/chat/completions", content=chunks(),
                      headers={"content-type": "application/json"}, timeout=60)
    assert resp.status_code == 413


def _reply(sock: socket.socket) -> tuple[bytes, bytes]:
    """One response (head, body) with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        assert got, f"connection closed before the reply; got {data[:200]!r}"
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        got = sock.recv(65536)
        assert got, "connection closed inside the reply"
        body += got
    return head, body


def test_a_body_just_over_the_limit_gets_its_413(setup: tuple[harness.Router, Path],
                                                  simulator: harness.Simulator) -> None:
    """The router reads on past the limit (up to 1 MiB) before answering 413: closing with
    unread input would send a reset that can destroy the 413 before the client reads it.
    Past the drain the connection is done with; on the Rust front it then stays usable."""
    router, _ = setup
    iface = router.process.argv[router.process.argv.index("--interface") + 1]
    chunk = b"x" * (1 << 20)
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(32))
    body += b"%x\r\n%s\r\n0\r\n\r\n" % (256 << 10, b"y" * (256 << 10))  # 32 MiB + 256 KiB
    with socket.create_connection((harness.HOST, router.port), timeout=30) as sock:
        for _ in range(3):
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         b"transfer-encoding: chunked\r\n\r\n" + body)
            head, reply = _reply(sock)
            assert head.startswith(b"HTTP/1.1 413"), head[:200]
            assert json.loads(reply)["error"]["code"] == 413
            if iface != "rust":
                break  # granian closes the connection after a refused body
    assert sum(simulator.received()) == 0


def test_non_proxied_paths(setup: tuple[harness.Router, Path], simulator: harness.Simulator) -> None:
    router, _ = setup
    models = httpx.get(f"{router.openai_url}/models", timeout=30)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "demo"
    assert int(models.headers["content-length"]) == len(models.content)
    missing = httpx.get(f"{router.base_url}/nope", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404
    wrong = httpx.post(f"{router.openai_url}/models", timeout=30)
    assert wrong.status_code == 405 and wrong.headers["content-type"].startswith("application/json")
    with socket.create_connection((harness.HOST, router.port), timeout=10) as sock:
        sock.sendall(b"BREW /v1/models HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 405"), head[:200]


def test_admission_limit(setup: tuple[harness.Router, Path], simulator: harness.Simulator) -> None:
    router, _ = setup
    for i in range(len(simulator.ports)):
        simulator.set_faults(i, token_delay_s=0.2)
    with httpx.Client(timeout=60) as http:
        held = [http.stream("POST", f"{router.openai_url}/chat/completions", json=_chat(True, 20))
                for _ in range(ADMISSION)]
        opened = [h.__enter__() for h in held]
        try:
            assert all(r.status_code == 200 for r in opened)
            shed = httpx.post(f"{router.openai_url}/chat/completions", json=_chat(False), timeout=30)
            assert shed.status_code == 503 and shed.headers["retry-after"] == "3"
            assert shed.json()["error"]["code"] == "overloaded"
            fams = harness.metrics_when(router, lambda f: harness.metric_value(
                f, "kthena_router_requests_total", path="/v1/chat/completions", error_type="overloaded"))
            assert harness.metric_value(fams, "kthena_router_requests_total", path="/v1/chat/completions",
                                        status_code="503", error_type="overloaded") == 1
        finally:
            for h in held:
                h.__exit__(None, None, None)


def test_access_log(setup: tuple[harness.Router, Path], simulator: harness.Simulator) -> None:
    router, log_path = setup
    rid = uuid.uuid4().hex
    resp = httpx.post(f"{router.openai_url}/chat/completions", json=_chat(True), headers={"X-Request-ID": rid},
                      timeout=30)
    assert resp.status_code == 200

    def line() -> dict | None:
        for raw in log_path.read_text().splitlines() if log_path.exists() else ():
            rec = json.loads(raw)
            if rec.get("request_id") == rid:
                return rec
        return None

    rec = harness.wait_until(line, 10, interval=0.1, what="access log line")
    assert rec["status"] == 200 and rec["stream"] is True and rec["completion_tokens"] == 8


def test_completions_take_the_rust_fast_path_only_there(setup: tuple[harness.Router, Path],
                                                        simulator: harness.Simulator,
                                                        request: pytest.FixtureRequest) -> None:
    """With a scheduler configuration (it needs the request's info; its prepare() has
    nothing to await here, so the decision is made at once: test_kv_exact_default.py
    covers the awaited one), `rust` still relays completions itself
    (docs/rust-front.md); the granian interfaces have no front end."""
    router, _ = setup
    resp = httpx.post(f"{router.openai_url}/chat/completions", json=_chat(False), timeout=30)
    assert resp.status_code == 200, resp.text
    fams = harness.parse_metrics(router.metrics_text())
    fast = harness.metric_value(fams, "kthena_router_front_decisions_total", decision="fast")
    assert (fast >= 1) == (request.node.callspec.params["setup"] == "rust"), fast
