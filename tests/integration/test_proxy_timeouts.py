"""Timeouts and bounded resources of the request path (router configuration `traffic`).

One simulator (4 engines) and one router (1 worker) with a router configuration: model
`short` -> ModelServer `short` (engines 0, 1) with a per-server override of short
timeouts and a small buffered-reply cap; model `long` -> ModelServer `long` (engines 2,
3) with the long defaults. The same fault on both servers shows the override honoured.
Model `capped` -> ModelServer `capped` (engines 0, 1 again) with only a total timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import harness
import httpx
import openai
import orjson
import pytest

ADMISSION = 6
RETRY_AFTER = "2"
# A scheduler without filters: every endpoint is a candidate, so that retries are predictable.
ROUTER_CONFIG = f"""
scheduler:
  plugins:
    Filter: {{enabled: []}}
    Score: {{enabled: [{{name: least-request, weight: 1}}]}}
traffic:
  timeouts: {{response: 30s, firstToken: 30s, idle: 30s, poolWait: 1s}}
  outlierDetection: {{baseEjectionTime: 200ms, maxEjectionTime: 500ms}}
  admission: {{maxInFlightPerWorker: {ADMISSION}, retryAfter: {RETRY_AFTER}s}}
  modelServers:
    short: {{timeouts: {{response: 2s, firstToken: 1s, idle: 1s}}, maxBufferedResponseBytes: 3000}}
    capped: {{timeouts: {{total: 1500ms}}}}
"""
SHORT = (0, 1)
LONG = (2, 3)
MSGS = [{"role": "user", "content": "hello"}]


def _config(ports: list[int]) -> list[dict]:
    docs: list[dict] = []
    for name, engines in (("short", SHORT), ("long", LONG), ("capped", SHORT)):
        labels = {"app": name}
        docs.append(harness.route_doc(name, name, name))
        docs.append(harness.server_doc(name, "demo", labels, retry_attempts=1, retry_interval="50ms"))
        docs.append(harness.endpoints_doc(f"{name}-engines", [ports[i] for i in engines], labels))
    return docs


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("timeouts")


@pytest.fixture(scope="module")
def sim(work: Path) -> Iterator[harness.Simulator]:
    with harness.start_simulator(work, engines=4, model="demo", fast=True) as s:
        yield s


def _start(work: Path, sim: harness.Simulator, name: str, *extra: str, interface: str = "rsgi") -> harness.Router:
    config = harness.write_config(work / f"{name}.yaml", _config(sim.ports))
    rc = work / f"{name}-router-config.yaml"
    rc.write_text(ROUTER_CONFIG)
    return harness.start_router(config, work, workers=1, extra_args=[
        "--router-config", str(rc), "--health-probe-interval-s", "0.2", "--interface", interface, *extra])


@pytest.fixture(scope="module", params=["rsgi", "rust"])
def interface(request: pytest.FixtureRequest) -> str:
    """rsgi: the Python pipeline; rust: the same limits enforced by the Rust front's fast
    path (docs/rust-front.md)."""
    return str(request.param)


@pytest.fixture(scope="module")
def router_proc(work: Path, sim: harness.Simulator, interface: str) -> Iterator[harness.Router]:
    r = _start(work, sim, f"main-{interface}", interface=interface)
    try:
        yield r
    finally:
        r.stop()


def _all_healthy(router: harness.Router, n: int) -> bool:
    fam = harness.parse_metrics(router.metrics_text()).get("kthena_router_endpoint_healthy")
    values = [s.value for s in fam.samples] if fam is not None else []
    return len(values) == n and all(v == 1 for v in values)


@pytest.fixture
def router(router_proc: harness.Router, sim: harness.Simulator) -> Iterator[harness.Router]:
    sim.reset_faults()
    harness.wait_until(lambda: _all_healthy(router_proc, 6), 60, interval=0.1, what="all endpoints healthy")
    sim.reset_requests()
    yield router_proc
    sim.reset_faults()


def _faults(sim: harness.Simulator, engines: tuple[int, ...], **faults: object) -> None:
    for i in engines:
        sim.set_faults(i, **faults)


def _received(sim: harness.Simulator, engines: tuple[int, ...]) -> list[int]:
    return [sim.requests(i)["received"] for i in engines]


def _sse_events(router: harness.Router, model: str, max_tokens: int) -> tuple[int, list[bytes]]:
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{router.openai_url}/chat/completions",
                         json={"model": model, "messages": MSGS, "max_tokens": max_tokens, "stream": True}) as r:
            body = b"".join(r.iter_bytes())
    return r.status_code, [e for e in body.split(b"\n\n") if e.strip()]


def test_first_token_timeout_retries_then_504_and_the_override_is_per_server(
        router: harness.Router, sim: harness.Simulator) -> None:
    _faults(sim, SHORT + LONG, stall_after_tokens=0)  # headers, then no event
    with pytest.raises(openai.APIStatusError) as info:
        router.openai(timeout=60).chat.completions.create(model="short", messages=MSGS, max_tokens=4, stream=True)
    assert info.value.status_code == 504
    assert "first token" in info.value.message and "2 attempt(s)" in info.value.message
    assert _received(sim, SHORT) == [1, 1], "the second attempt went to the other endpoint"
    # the same stall under `long` (firstToken 30s) is still waited for: the client gives up first
    with pytest.raises(openai.APITimeoutError):
        router.openai(timeout=3, max_retries=0).chat.completions.create(
            model="long", messages=MSGS, max_tokens=4, stream=True)
    assert sum(_received(sim, LONG)) == 1, "a request within its firstToken was retried"


def test_slow_first_token_fails_short_and_passes_long(router: harness.Router, sim: harness.Simulator) -> None:
    _faults(sim, SHORT + LONG, token_delay_s=1.5)  # every token 1.5 s late, the first one too
    with pytest.raises(openai.APIStatusError) as info:
        router.openai(timeout=60).chat.completions.create(model="short", messages=MSGS, max_tokens=2, stream=True)
    assert info.value.status_code == 504
    chunks = list(router.openai(timeout=60).chat.completions.create(model="long", messages=MSGS, max_tokens=2,
                                                                     stream=True))
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 2


def test_idle_timeout_mid_stream_ends_with_an_error_event_and_no_done(
        router: harness.Router, sim: harness.Simulator) -> None:
    _faults(sim, SHORT, stall_after_tokens=3)
    status, events = _sse_events(router, "short", 20)
    assert status == 200
    assert b"[DONE]" not in b"".join(events)
    contents = [e for e in events[:-1] if b'"content"' in e]
    assert len(contents) >= 3, events  # the tokens before the stall reached the client
    err = orjson.loads(events[-1].removeprefix(b"data: "))["error"]
    assert "idle timeout" in err["message"] and err["code"] == 502, err
    assert sum(_received(sim, SHORT)) == 1, "retried after bytes reached the client"


def test_slow_but_progressing_stream_outlives_first_token_plus_idle(
        router: harness.Router, sim: harness.Simulator) -> None:
    # 6 tokens 0.45 s apart: each gap is under `idle` (1 s), the first token under
    # `firstToken` (1 s), the whole stream longer than both together.
    _faults(sim, SHORT, token_delay_s=0.45)
    t0 = time.monotonic()
    status, events = _sse_events(router, "short", 6)
    elapsed = time.monotonic() - t0
    assert status == 200 and events[-1] == b"data: [DONE]", events[-3:]
    assert not any(b'"error"' in e for e in events)
    assert sum(1 for e in events if b'"content"' in e) >= 6
    assert elapsed > 2.0  # premise: longer than firstToken + idle (sleeps guarantee it)


def test_non_streamed_reply_slower_than_response_is_504_under_short_only(
        router: harness.Router, sim: harness.Simulator) -> None:
    _faults(sim, SHORT + LONG, first_byte_delay_s=2.5)  # `short` response: 2 s, `long`: 30 s
    with httpx.Client(timeout=60) as http:
        r = http.post(f"{router.openai_url}/chat/completions",
                      json={"model": "short", "messages": MSGS, "max_tokens": 2})
        assert r.status_code == 504, r.text
        err = r.json()["error"]
        assert "response timeout" in err["message"] and err["code"] == 504
        r = http.post(f"{router.openai_url}/chat/completions",
                      json={"model": "long", "messages": MSGS, "max_tokens": 2})
        assert r.status_code == 200, r.text


def test_buffered_reply_over_the_cap_is_502_and_not_an_endpoint_failure(
        router: harness.Router, sim: harness.Simulator) -> None:
    with httpx.Client(timeout=60) as http:
        r = http.post(f"{router.openai_url}/chat/completions",
                      json={"model": "short", "messages": MSGS, "max_tokens": 1000})
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert err["code"] == "response_too_large" and "maxBufferedResponseBytes" in err["message"], err
        assert sum(_received(sim, SHORT)) == 1, "a reply too large to buffer was retried"
        assert _all_healthy(router, 6), "the engine was counted as failing"
        # the same reply streamed is not buffered, so not capped
        status, events = _sse_events(router, "short", 1000)
        assert status == 200 and events[-1] == b"data: [DONE]"
        # and a small reply still passes
        r = http.post(f"{router.openai_url}/chat/completions",
                      json={"model": "short", "messages": MSGS, "max_tokens": 2})
        assert r.status_code == 200, r.text


async def _hold(router: harness.Router, model: str, n: int) -> list[asyncio.Task]:
    client = httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=n + 4))

    async def one() -> httpx.Response:
        return await client.post(f"{router.openai_url}/chat/completions",
                                 json={"model": model, "messages": MSGS, "max_tokens": 2, "stream": True})

    return [asyncio.ensure_future(one()) for _ in range(n)] + [asyncio.ensure_future(_never(client))]


async def _never(client: httpx.AsyncClient) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        await client.aclose()


async def _wait_received(sim: harness.Simulator, engines: tuple[int, ...], n: int,
                         held: list[asyncio.Task]) -> None:
    deadline = time.monotonic() + 30
    while sum(_received(sim, engines)) < n:
        done = [t for t in held if t.done()]
        assert not done, f"a held request ended: {done[0].result() if not done[0].exception() else done[0]}"
        assert time.monotonic() < deadline, f"engines saw {_received(sim, engines)}, want {n}"
        await asyncio.sleep(0.05)


def _post_while_held(router: harness.Router, sim: harness.Simulator, n: int) -> httpx.Response:
    """Hold `n` streamed requests on the stalled `long` engines, meanwhile POST to `short`."""

    async def main() -> httpx.Response:
        held = await _hold(router, "long", n)
        try:
            await _wait_received(sim, LONG, n, held)
            async with httpx.AsyncClient(timeout=30) as http:
                return await http.post(f"{router.openai_url}/chat/completions",
                                       json={"model": "short", "messages": MSGS, "max_tokens": 2})
        finally:
            for t in held:
                t.cancel()
            await asyncio.gather(*held, return_exceptions=True)

    return asyncio.run(main())


def _short_ok(router: harness.Router) -> None:
    with httpx.Client(timeout=30) as http:
        r = http.post(f"{router.openai_url}/chat/completions",
                      json={"model": "short", "messages": MSGS, "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_admission_limit_sheds_with_503_and_retry_after(router: harness.Router, sim: harness.Simulator) -> None:
    _faults(sim, LONG, stall=True)
    r = _post_while_held(router, sim, ADMISSION)
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == RETRY_AFTER
    err = r.json()["error"]
    assert err["code"] == "overloaded" and err["type"] == "ServiceUnavailableError", err
    assert sum(_received(sim, SHORT)) == 0, "a shed request reached an engine"
    # the held requests went away: the limit frees up
    harness.wait_until(lambda: sum(sim.requests(i)["aborted"] for i in LONG) == ADMISSION, 30,
                       what="held requests aborted upstream")
    sim.reset_faults()
    _short_ok(router)


def test_pool_wait_deadline_gives_503(work: Path, sim: harness.Simulator, interface: str) -> None:
    sim.reset_faults()
    sim.reset_requests()
    _faults(sim, LONG, stall=True)
    r2 = _start(work, sim, f"pool1-{interface}", "--upstream-pool-size", "1", interface=interface)
    try:
        r = _post_while_held(r2, sim, 1)  # the held request has the worker's only connection
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "pool_exhausted" and "1s" in err["message"], err
        assert sum(_received(sim, SHORT)) == 0
        sim.reset_faults()
        _short_ok(r2)  # the slot is free again
    finally:
        r2.stop()
        sim.reset_faults()


def test_total_timeout_bounds_the_whole_request(router: harness.Router, sim: harness.Simulator) -> None:
    _faults(sim, SHORT, token_delay_s=0.4)  # every gap well under idle (30 s)
    status, events = _sse_events(router, "capped", 20)  # 20 x 0.4 s > total 1.5 s
    assert status == 200 and b"[DONE]" not in b"".join(events)
    assert any(b'"content"' in e for e in events[:-1])
    err = orjson.loads(events[-1].removeprefix(b"data: "))["error"]
    assert "total timeout" in err["message"], err
    sim.reset_requests()
    _faults(sim, SHORT, token_delay_s=0.0, first_byte_delay_s=3)
    with httpx.Client(timeout=60) as http:
        r = http.post(f"{router.openai_url}/chat/completions",
                      json={"model": "capped", "messages": MSGS, "max_tokens": 2})
    assert r.status_code == 504, r.text
    assert "total timeout" in r.json()["error"]["message"] and "1 attempt(s)" in r.json()["error"]["message"]
    assert sum(_received(sim, SHORT)) == 1, "retried after the total timeout had passed"
