"""prefill-cost end to end (issue 15): a real router and a real simulator (physics engine,
time scale 1). Decisions are read from the engines' request logs and the router's
/debug/scheduler, never from wall-clock times.

prefill-cost alone (no load plugin), so that what is asserted is its own cost: cache hits
stay on the prefix's holder (their uncached blocks are few), and a cold prompt counts as
pending work where it went until its first token, so a request that would otherwise join
it there goes elsewhere."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import harness

CONFIG = """\
scheduler:
  plugins:
    Score:
      enabled:
      - {name: prefill-cost, weight: 1}
"""
# ~2.4k words: ~190 index blocks
SYSTEM = " ".join(f"rule{i % 97} applies to case{i}." for i in range(800))


DELAY_S = 8.0


def _router(tmp_path: Path, sim: harness.Simulator, interface: str) -> harness.Router:
    config = harness.write_config(tmp_path / "router.yaml", harness.engine_config(sim.ports))
    sched = tmp_path / "scheduler.yaml"
    sched.write_text(CONFIG)
    # engine TTFTs come only from finished requests (one scrape at start, then rarely)
    return harness.start_router(config, tmp_path, extra_args=[
        "--router-config", str(sched), "--scrape-interval-s", "60", "--interface", interface])


def _endpoints(router: harness.Router, sim: harness.Simulator) -> list[dict[str, Any]]:
    r = router.admin_get("/debug/scheduler")
    r.raise_for_status()
    (worker,) = r.json()["workers"]
    (eps,) = worker["servers"].values()
    return [eps[f"{harness.HOST}:{p}"] for p in sim.ports]


def _pending(router: harness.Router, sim: harness.Simulator) -> list[float]:
    return [e["pending_blocks"] for e in _endpoints(router, sim)]


def _in_flight(router: harness.Router, sim: harness.Simulator) -> list[int]:
    return [e["in_flight"] for e in _endpoints(router, sim)]


def _body(system: str, question: str, max_tokens: int, stream: bool = False) -> dict[str, object]:
    return {"model": "demo", "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}


# rust: the front decides in Rust (front/table.py) and reports the first event; rsgi:
# granian and the Python scheduler, relay_sse.py reports it
@pytest.mark.parametrize("interface", ["rust", "rsgi"])
def test_hits_stay_on_the_holder_and_a_pending_prefill_steers_the_next(tmp_path: Path, interface: str) -> None:
    sim = harness.start_simulator(tmp_path, 2, extra_args=["--time-scale", "1"])
    client = httpx.Client(timeout=120)
    pool = ThreadPoolExecutor(2)
    streams: list[httpx.Response] = []
    try:
        router = _router(tmp_path, sim, interface)
        base = router.base_url
        # 1. one cold request, then cache hits, one at a time: every one on the holder
        # (a load-blind plugin without the prefix's size would spread them by request id)
        sim.reset_requests()
        for i in range(11):
            r = client.post(base + "/v1/chat/completions", json=_body(SYSTEM, f"question {i}", 2))
            assert r.status_code == 200, r.text
            # the front reports the end after the client has the reply: settle first
            harness.wait_until(lambda: _in_flight(router, sim) == [0, 0], 30, what="the request accounted")
        got = sim.received()
        assert sorted(got) == [0, 11], got
        decided = harness.metric_value(harness.parse_metrics(router.metrics_text()),
                                       "kthena_router_front_table_decisions_total")
        assert decided == (11 if interface == "rust" else 0)
        # 2. a cold prompt held before its first token (the engines delay their first byte):
        # a second prompt with the same document and a short question goes to the other
        # engine, because the held prompt's prefill (document + its long tail) is pending on
        # the document's holder; without that pending work, the holder is the cheaper one
        doc = " ".join(f"doc-w{j}" for j in range(1500))
        tail = " ".join(f"tail-w{j}" for j in range(1500))
        sim.reset_requests()
        for i in range(2):  # held before the first token, then stalled after it
            sim.set_faults(i, first_byte_delay_s=DELAY_S, stall_after_tokens=1)

        def open_stream(question: str) -> httpx.Response:
            req = client.build_request("POST", base + "/v1/chat/completions",
                                       json=_body(doc, question, 2000, stream=True))
            resp = client.send(req, stream=True)
            streams.append(resp)
            return resp

        first = pool.submit(open_stream, tail)
        harness.wait_until(lambda: sum(sim.received()) == 1, 30, what="the held prompt received")
        holder = sim.received().index(1)
        assert _pending(router, sim)[holder] > 0
        second = pool.submit(open_stream, "summarise")
        harness.wait_until(lambda: sum(sim.received()) == 2, 30, what="the second prompt received")
        assert sim.received() == [1, 1]
        # 3. the first token releases the pending work while the request is still in flight
        assert first.result(60).status_code == 200 and second.result(60).status_code == 200
        harness.wait_until(lambda: _pending(router, sim) == [0, 0], 30, what="pending work released")
        assert _in_flight(router, sim) == [1, 1]
        router.stop()
    finally:
        for s in streams:
            s.close()
        pool.shutdown(wait=True)
        client.close()
        sim.stop()


def _held_request(router: harness.Router, body: dict[str, object]) -> socket.socket:
    """A streamed request on a raw socket, so that the client can leave before any byte."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection((harness.HOST, router.port), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


@pytest.mark.parametrize("interface", ["rust", "rsgi"])
def test_a_client_gone_before_the_first_token_releases_its_pending_work(tmp_path: Path, interface: str) -> None:
    # one engine: both held prompts' work is pending there, so the release of the one whose
    # client left is told apart from the reset when nothing of ours is in flight
    sim = harness.start_simulator(tmp_path, 1, extra_args=["--time-scale", "1"])
    socks: list[socket.socket] = []
    try:
        router = _router(tmp_path, sim, interface)
        sim.set_faults(0, first_byte_delay_s=600)  # no first token while the test runs
        pending: list[float] = []
        for n in (1500, 600):
            doc = " ".join(f"doc{n}-w{j}" for j in range(n))
            socks.append(_held_request(router, _body(doc, "summarise", 20, stream=True)))
            harness.wait_until(lambda: sim.received() == [len(socks)], 30, what="the held prompt received")
            pending.append(_pending(router, sim)[0])
        long_blocks, both = pending[0], pending[1]
        assert 0 < long_blocks < both
        socks.pop(0).close()  # the long prompt's client leaves before its first token
        harness.wait_until(lambda: _in_flight(router, sim) == [1], 30, what="the attempt ended")
        assert _pending(router, sim) == [both - long_blocks]
        socks.pop().close()
        harness.wait_until(lambda: _in_flight(router, sim) == [0], 30, what="the attempt ended")
        assert _pending(router, sim) == [0]
        router.stop()
    finally:
        for s in socks:
            s.close()
        sim.stop()
