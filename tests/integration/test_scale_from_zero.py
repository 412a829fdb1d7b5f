"""Scale from zero: requests for a ModelServer with zero endpoints are held (the router
configuration's scaleFromZero), counted in kthena_router_pending_requests, and released by
a config reload that gives the server an endpoint; timeout, disconnect, maxPending and
holding off. Real router and simulator processes, the openai SDK as the client."""

from __future__ import annotations

import concurrent.futures
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import harness

PENDING = "kthena_router_pending_requests"
SERVERS = ("held", "short", "full", "nohold", "gone", "idle")  # idle: never requested
ROUTER_CONFIG = """\
scaleFromZero:
  holdTimeout: 120s
  modelServers:
    short: {holdTimeout: 1s}
    full: {maxPending: 1}
    nohold: {holdTimeout: 0s}
"""


def _docs(ports: list[int], with_endpoints: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for name in SERVERS:
        docs.append(harness.route_doc(name, name, name))
        docs.append(harness.server_doc(name, "demo", {"app": name}))
        if name in with_endpoints:
            docs.append(harness.endpoints_doc(f"{name}-engines", ports, {"app": name}))
    return docs


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Simulator]:
    with harness.start_simulator(tmp_path_factory.mktemp("sfz-sim"), engines=1, fast=True) as s:
        yield s


@pytest.fixture(scope="module")
def router(sim: harness.Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Router]:
    tmp = tmp_path_factory.mktemp("sfz-router")
    config = harness.write_config(tmp / "cfg" / "routes.yaml", _docs(sim.ports))
    rc = tmp / "rc" / "router-config.yaml"
    rc.parent.mkdir()
    rc.write_text(ROUTER_CONFIG)
    with harness.start_router(config, tmp, extra_args=["--router-config", str(rc)]) as r:
        yield r


@pytest.fixture
def zero(router: harness.Router, sim: harness.Simulator) -> Iterator[harness.Router]:
    """Every server at zero endpoints before and after the test."""
    harness.write_config(router.config_path, _docs(sim.ports))
    assert router.reload().status_code == 200
    yield router
    harness.write_config(router.config_path, _docs(sim.ports))
    router.reload()


def _pending(router: harness.Router, server: str) -> float:
    fams = harness.parse_metrics(router.metrics_text())
    return harness.metric_value(fams, PENDING, model=server, model_server=f"default/{server}")


def _raw_request(router: harness.Router, model: str) -> socket.socket:
    """A request sent on a raw socket (the test closes it: a client disconnect)."""
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}' % model.encode()
    sock = socket.create_connection((harness.HOST, router.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n" % len(body) + body)
    return sock


def test_held_requests_complete_when_an_endpoint_appears(zero: harness.Router, sim: harness.Simulator) -> None:
    router = zero
    client = router.openai(timeout=120.0)

    def plain() -> str:
        r = client.chat.completions.create(model="held", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        return r.choices[0].message.content or ""

    def streamed() -> str:
        stream = client.chat.completions.create(model="held", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=4, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(plain), pool.submit(streamed)]
        harness.wait_until(lambda: _pending(router, "held") == 2, 30, what="both requests held")
        assert not any(f.done() for f in futures)
        # the autoscaler brought a replica back: the config now gives the server an endpoint
        harness.write_config(router.config_path, _docs(sim.ports, ("held",)))
        assert router.reload().status_code == 200
        assert all(f.result(timeout=60) for f in futures)
    assert _pending(router, "held") == 0


def test_hold_times_out_with_503_naming_the_cause(zero: harness.Router) -> None:
    with pytest.raises(openai.APIStatusError) as exc:
        zero.openai().chat.completions.create(model="short", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=2)
    assert exc.value.status_code == 503
    err = exc.value.response.json()["error"]
    assert err["code"] == "no_replicas" and err["type"] == "ServiceUnavailableError"
    assert "no replicas" in err["message"] and "hold timeout" in err["message"]
    assert _pending(zero, "short") == 0


def test_client_disconnect_ends_the_hold(zero: harness.Router) -> None:
    sock = _raw_request(zero, "held")
    try:
        harness.wait_until(lambda: _pending(zero, "held") == 1, 30, what="the request held")
    finally:
        sock.close()
    harness.wait_until(lambda: _pending(zero, "held") == 0, 30, what="the pending gauge back to 0")


def test_beyond_max_pending_answers_503_at_once(zero: harness.Router) -> None:
    sock = _raw_request(zero, "full")
    try:
        harness.wait_until(lambda: _pending(zero, "full") == 1, 30, what="the first request held")
        r = httpx.post(f"{zero.openai_url}/chat/completions", timeout=60,
                       json={"model": "full", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "too_many_pending"
        assert _pending(zero, "full") == 1  # the first one is still held
    finally:
        sock.close()
    harness.wait_until(lambda: _pending(zero, "full") == 0, 30, what="the pending gauge back to 0")


def test_holding_off_answers_503_at_once_as_before(zero: harness.Router) -> None:
    r = httpx.post(f"{zero.openai_url}/chat/completions", timeout=60,
                   json={"model": "nohold", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 503
    assert "no healthy endpoint" in r.json()["error"]["message"]
    assert _pending(zero, "nohold") == 0


def test_a_removed_route_ends_the_hold_with_404(zero: harness.Router, sim: harness.Simulator) -> None:
    sock = _raw_request(zero, "gone")
    try:
        harness.wait_until(lambda: _pending(zero, "gone") == 1, 30, what="the request held")
        docs = [d for d in _docs(sim.ports) if d["metadata"]["name"] != "gone"]
        harness.write_config(zero.config_path, docs)
        assert zero.reload().status_code == 200
        sock.settimeout(30)
        head = sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 404"), head[:200]
    finally:
        sock.close()
    assert _pending(zero, "gone") == 0


def test_invalid_scale_from_zero_keeps_the_old_configuration(zero: harness.Router, tmp_path: Path) -> None:
    rc = Path(str(zero.process.argv[zero.process.argv.index("--router-config") + 1]))
    good = rc.read_text()
    try:
        rc.write_text(good.replace("holdTimeout: 1s", "holdTimeout: soon"))
        r = zero.reload()
        assert r.status_code == 400
        assert "scaleFromZero.modelServers.short.holdTimeout" in r.text and str(rc) in r.text
    finally:
        rc.write_text(good)
    # the old section still holds (and times out) as before
    r = httpx.post(f"{zero.openai_url}/chat/completions", timeout=60,
                   json={"model": "short", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_replicas"


def test_pending_series_reads_zero_for_servers_that_hold(zero: harness.Router) -> None:
    """A reader (the autoscaler's wake signal) sees 0, not "no data", before anything is held;
    servers with holding off get no series."""
    fams = harness.parse_metrics(zero.metrics_text())
    series = {(s.labels["model"], s.labels["model_server"]): s.value
              for fam in fams.values() for s in fam.samples if s.name == PENDING}
    assert series.get(("idle", "default/idle")) == 0, series
    assert ("nohold", "default/nohold") not in series
