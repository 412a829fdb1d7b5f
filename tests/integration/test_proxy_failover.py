"""Retry before the first byte (per simulator fault knob), no retry after it, health recovery.

One router per worker count, in front of the shared simulator, with a retry policy (2
retries, 50 ms apart), a 2 s first-byte timeout and fast active probing, so that an
engine ejected by one test is re-admitted before the next one starts.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import harness
import httpx
import openai
import pytest

MSGS = [{"role": "user", "content": "hello"}]
FIRST_BYTE_TIMEOUT = "2s"


@pytest.fixture(scope="module")
def failover_router(router_workers: int, simulator_session: harness.Simulator,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Router]:
    work = tmp_path_factory.mktemp(f"failover-w{router_workers}")
    docs = harness.engine_config(simulator_session.ports, timeout=FIRST_BYTE_TIMEOUT, retry_attempts=2,
                                 retry_interval="50ms")
    config = harness.write_config(work / "router.yaml", docs)
    with harness.start_router(config, work, workers=router_workers,
                              extra_args=["--health-probe-interval-s", "0.3"]) as router:
        yield router


def _all_healthy(router: harness.Router, n: int) -> bool:
    fams = harness.parse_metrics(router.metrics_text())
    fam = fams.get("kthena_router_endpoint_healthy")
    if fam is None:
        return False
    values = [s.value for s in fam.samples]
    return len(values) == n and all(v == 1 for v in values)


def _heal(router: harness.Router, sim: harness.Simulator) -> None:
    """Wait until every engine is healthy in every worker, then send successful requests
    (new connections, so both workers get some): a success resets an endpoint's ejection
    backoff, so the next test does not inherit this one's (tests eject the same engines
    over and over, which the router rightly treats as flapping)."""
    harness.wait_until(lambda: _all_healthy(router, len(sim.ports)), 90, interval=0.2,
                       what="all endpoints healthy")
    for _ in range(4 * len(sim.ports) * router.workers):
        with httpx.Client(timeout=60) as http:
            r = http.post(f"{router.openai_url}/completions", json={"model": "demo", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 200, r.text
    sim.reset_requests()


@pytest.fixture
def fo(failover_router: harness.Router, simulator: harness.Simulator) -> Iterator[harness.Router]:
    """Start every test with every engine healthy (and not flapping) in every worker."""
    _heal(failover_router, simulator)
    yield failover_router
    simulator.reset_faults()


def _log(sim: harness.Simulator, engine: int) -> list[dict]:
    return sim.requests(engine)["log"]


def _send_until_engine_hit(router: harness.Router, sim: harness.Simulator, engine: int, stream: bool,
                           max_requests: int = 30) -> tuple[list[str], bool]:
    """Send requests (each must succeed) until `engine` saw one; returns (request ids, hit)."""
    ids: list[str] = []
    client = router.openai()
    for _ in range(max_requests):
        rid = uuid.uuid4().hex
        ids.append(rid)
        headers = {"X-Request-ID": rid}
        if stream:
            chunks = list(client.chat.completions.create(model="demo", messages=MSGS, max_tokens=4, stream=True,
                                                         extra_headers=headers))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            resp = client.chat.completions.create(model="demo", messages=MSGS, max_tokens=4, extra_headers=headers)
            assert resp.choices[0].message.content
        if sim.requests(engine)["received"] >= 1:
            return ids, True
    return ids, False


def _assert_failed_over(sim: harness.Simulator, bad: int, ids: list[str]) -> None:
    bad_log = _log(sim, bad)
    assert bad_log, "the faulty engine saw no attempt"
    completed_elsewhere = {e["request_id"] for i in range(len(sim.ports)) if i != bad
                           for e in _log(sim, i) if e["status"] == "completed"}
    for entry in bad_log:
        assert entry["status"] != "completed", entry
        assert entry["request_id"] in completed_elsewhere, (entry, completed_elsewhere)
    assert set(ids) <= completed_elsewhere | {e["request_id"] for e in _log(sim, bad)}


FAULTS = {
    "error_rate": {"error_rate": 1.0, "error_status": 500},
    "error_503": {"error_rate": 1.0, "error_status": 503},
    "stall": {"stall": True},
    "first_byte_delay": {"first_byte_delay_s": 6.0},
    "garbage": {"garbage": True},
    "die_before_first_token": {"die_after_tokens": 0},
    "slow_start": {"slow_start_s": 600.0},
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("knob", list(FAULTS))
def test_failover_before_first_byte(fo: harness.Router, simulator: harness.Simulator, knob: str,
                                    stream: bool) -> None:
    simulator.set_faults(0, **FAULTS[knob])
    ids, hit = _send_until_engine_hit(fo, simulator, 0, stream)
    if hit:
        _assert_failed_over(simulator, 0, ids)
    else:  # knobs that also fail /health: the active probe ejected it before any request
        assert not _all_healthy(fo, len(simulator.ports)), "engine 0 got no request yet counts as healthy"


def test_failover_on_refused_connections(fo: harness.Router, simulator: harness.Simulator) -> None:
    simulator.set_faults(0, refuse_connections=True)
    client = fo.openai()
    before = harness.parse_metrics(fo.metrics_text())
    errs0 = harness.metric_value(before, "kthena_router_upstream_errors_total", reason="connect_error")
    for _ in range(6 * fo.workers):
        assert client.completions.create(model="demo", prompt="x", max_tokens=2).choices
    assert simulator.requests(0)["received"] == 0
    others = simulator.requests(1)["received"] + simulator.requests(2)["received"]
    assert others == 6 * fo.workers
    after = harness.parse_metrics(fo.metrics_text())
    # Active probes may eject it before any request tries it; requests never fail either way.
    assert harness.metric_value(after, "kthena_router_upstream_errors_total", reason="connect_error") >= errs0


def test_every_engine_failing_gives_502_also_in_panic(fo: harness.Router, simulator: harness.Simulator) -> None:
    """Every engine failing: 502. Once every endpoint is ejected (failed probes), the panic
    threshold still routes to them (a 502 again, not a 503: a recovered engine would answer)."""
    for i in range(len(simulator.ports)):
        simulator.set_faults(i, error_rate=1.0, error_status=500)
    with httpx.Client(timeout=60) as http:
        r = http.post(f"{fo.openai_url}/completions", json={"model": "demo", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert err["code"] == 502 and "127.0.0.1" not in r.text
        assert sum(simulator.received()) == 3  # 1 + 2 retries, one per engine
        for i in range(len(simulator.ports)):
            simulator.set_faults(i, refuse_connections=True)
        harness.wait_until(lambda: _none_healthy(fo), 30, interval=0.2, what="every endpoint ejected")
        panics0 = _panics(fo)

        def panic_502() -> bool:
            resp = http.post(f"{fo.openai_url}/completions", json={"model": "demo", "prompt": "x", "max_tokens": 1})
            assert resp.status_code == 502 and resp.json()["error"]["code"] == 502, resp.text
            assert "127.0.0.1" not in resp.text
            return _panics(fo) > panics0

        harness.wait_until(panic_502, 30, interval=0.1, what="a request routed in panic")


def _panics(router: harness.Router) -> float:
    return harness.metric_value(harness.parse_metrics(router.metrics_text()), "kthena_router_panic_routing_total")


def _none_healthy(router: harness.Router) -> bool:
    fam = harness.parse_metrics(router.metrics_text()).get("kthena_router_endpoint_healthy")
    return fam is not None and bool(fam.samples) and all(s.value == 0 for s in fam.samples)


def test_every_engine_stalling_gives_504(fo: harness.Router, simulator: harness.Simulator) -> None:
    for i in range(len(simulator.ports)):
        simulator.set_faults(i, stall=True)
    with pytest.raises(openai.APIStatusError) as info:
        fo.openai(timeout=120).completions.create(model="demo", prompt="x", max_tokens=1)
    assert info.value.status_code == 504
    assert sum(simulator.received()) == 3


def test_engine_4xx_passes_through_without_retry(fo: harness.Router, simulator: harness.Simulator) -> None:
    for i in range(len(simulator.ports)):
        simulator.set_faults(i, error_rate=1.0, error_status=429)
    with httpx.Client(timeout=60) as http:
        r = http.post(f"{fo.openai_url}/completions", json={"model": "demo", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 429
    assert sum(simulator.received()) == 1
    with pytest.raises(openai.RateLimitError):
        fo.openai().completions.create(model="demo", prompt="x", max_tokens=1)
    assert sum(simulator.received()) == 2


def test_no_retry_after_first_byte(fo: harness.Router, simulator: harness.Simulator) -> None:
    for i in range(len(simulator.ports)):
        simulator.set_faults(i, die_after_tokens=3)
    got: list[str] = []
    with pytest.raises(openai.APIError) as info:
        for chunk in fo.openai().chat.completions.create(model="demo", messages=MSGS, max_tokens=50, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                got.append(chunk.choices[0].delta.content)
    assert got, "the client got no token before the failure"
    assert "upstream" in str(info.value)
    assert sum(simulator.received()) == 1, "retried after bytes reached the client"


def test_ejected_engine_recovers(fo: harness.Router, simulator: harness.Simulator) -> None:
    simulator.set_faults(0, refuse_connections=True)
    harness.wait_until(lambda: not _all_healthy(fo, 3), 30, interval=0.1, what="engine 0 ejected")
    simulator.reset_faults(0)
    harness.wait_until(lambda: _all_healthy(fo, 3), 60, interval=0.2, what="engine 0 re-admitted")
    simulator.reset_requests()
    client = fo.openai()
    deadline = time.monotonic() + 60
    while simulator.requests(0)["received"] == 0:
        assert time.monotonic() < deadline, "engine 0 never got traffic again"
        client.completions.create(model="demo", prompt="x", max_tokens=1)
