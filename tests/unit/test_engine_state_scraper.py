"""EngineStateScraper against in-process fake engines on 127.0.0.1 (aiohttp servers)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from kthena_router.engine_state import EngineStateScraper, ObservedLoad

PAGE = """\
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.5
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {ttft_sum}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {ttft_count}
"""


@dataclass
class FakeEngine:
    running: int = 0
    waiting: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0
    status: int = 200
    models_status: int = 200
    delay_s: float = 0.0
    body: str | None = None
    adapters: list[str] = field(default_factory=list)
    metrics_hits: int = 0
    models_hits: int = 0
    concurrent: int = 0
    max_concurrent: int = 0
    url: str = ""
    runner: web.AppRunner | None = None

    async def metrics(self, request: web.Request) -> web.Response:
        self.metrics_hits += 1
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.status != 200:
                return web.Response(status=self.status, text="boom")
            text = self.body if self.body is not None else PAGE.format(**vars(self))
            return web.Response(text=text, content_type="text/plain")
        finally:
            self.concurrent -= 1

    async def models(self, request: web.Request) -> web.Response:
        self.models_hits += 1
        if self.models_status != 200:
            return web.Response(status=self.models_status)
        data = [{"id": "m", "parent": None}] + [{"id": a, "parent": "m"} for a in self.adapters]
        return web.json_response({"object": "list", "data": data})


async def start_engine(engine: FakeEngine) -> FakeEngine:
    app = web.Application()
    app.router.add_get("/metrics", engine.metrics)
    app.router.add_get("/v1/models", engine.models)
    engine.runner = web.AppRunner(app, access_log=None)
    await engine.runner.setup()
    site = web.TCPSite(engine.runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    engine.url = f"http://127.0.0.1:{port}"
    return engine


@pytest_asyncio.fixture(loop_scope="function")  # the loop the tests run on
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest_asyncio.fixture(loop_scope="function")  # the loop the tests run on
async def engines() -> AsyncIterator[list[FakeEngine]]:
    started: list[FakeEngine] = []
    yield started
    for e in started:
        if e.runner is not None:
            await e.runner.cleanup()


async def wait_for(pred, timeout: float = 20.0) -> None:  # noqa: ANN001
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.01)


async def test_scrape_once_reads_metrics_and_models(session: aiohttp.ClientSession,
                                                    engines: list[FakeEngine]) -> None:
    e = await start_engine(FakeEngine(running=3, waiting=2, ttft_sum=1.0, ttft_count=4,
                                      adapters=["sql"]))
    engines.append(e)
    sc = EngineStateScraper(session, interval_s=1.0)
    sc.set_endpoints([("a", e.url + "/", "vLLM")])
    assert sc.get("a") is None  # never scraped: no snapshot, not an idle one
    await sc.scrape_once()
    s = sc.get("a")
    assert s is not None and not s.stale
    assert (s.running, s.waiting, s.kv_usage, s.ttft_mean_s) == (3, 2, 0.5, 0.25)
    assert s.loaded_loras == ("sql",)
    assert list(sc.all()) == ["a"]


async def test_http_error_and_unknown_page_make_it_stale(session: aiohttp.ClientSession,
                                                         engines: list[FakeEngine]) -> None:
    e = await start_engine(FakeEngine(running=9))
    engines.append(e)
    sc = EngineStateScraper(session, interval_s=1.0)
    sc.set_endpoints([("a", e.url, "vllm")])
    await sc.scrape_once()
    e.status = 500
    await sc.scrape_once()
    s = sc.get("a")
    assert s is not None and s.stale and s.running is None and s.last_running == 9
    assert s.last_error is not None and "500" in s.last_error
    e.status, e.body = 200, "# nothing an engine would say\nup 1\n"
    await sc.scrape_once()
    s = sc.get("a")
    assert s is not None and s.stale and s.consecutive_failures == 2
    e.body = None
    await sc.scrape_once()
    s = sc.get("a")
    assert s is not None and not s.stale and s.running == 9


async def test_models_failure_alone_keeps_metrics_fresh(session: aiohttp.ClientSession,
                                                        engines: list[FakeEngine]) -> None:
    e = await start_engine(FakeEngine(running=1, adapters=["x"], models_status=404))
    engines.append(e)
    sc = EngineStateScraper(session)
    sc.set_endpoints([("a", e.url, "vllm")])
    await sc.scrape_once()
    s = sc.get("a")
    assert s is not None and not s.stale and s.running == 1 and s.loaded_loras is None


async def test_timeout_marks_stale(session: aiohttp.ClientSession, engines: list[FakeEngine]) -> None:
    e = await start_engine(FakeEngine(running=4))
    engines.append(e)
    sc = EngineStateScraper(session, interval_s=1.0, timeout_s=0.2)
    sc.set_endpoints([("a", e.url, "vllm")])
    await sc.scrape_once()
    e.delay_s = 1.0
    await sc.scrape_once()
    s = sc.get("a")
    assert s is not None and s.stale and s.queue is None
    assert s.last_error is not None and s.last_error.startswith("timeout")


async def test_connection_refused_marks_stale(session: aiohttp.ClientSession,
                                              engines: list[FakeEngine]) -> None:
    e = await start_engine(FakeEngine(running=2))
    sc = EngineStateScraper(session)
    sc.set_endpoints([("a", e.url, "vllm")])
    await sc.scrape_once()
    assert e.runner is not None
    await e.runner.cleanup()  # the engine goes away
    await sc.scrape_once()
    s = sc.get("a")
    assert s is not None and s.stale and s.running is None


async def test_concurrency_is_bounded(session: aiohttp.ClientSession, engines: list[FakeEngine]) -> None:
    fleet = [await start_engine(FakeEngine(delay_s=0.05)) for _ in range(8)]
    engines.extend(fleet)
    in_flight = 0
    peak = 0

    async def on_start(*_: object) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)

    async def on_end(*_: object) -> None:
        nonlocal in_flight
        in_flight -= 1

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    trace.on_request_end.append(on_end)
    trace.on_request_exception.append(on_end)
    async with aiohttp.ClientSession(trace_configs=[trace]) as traced:
        sc = EngineStateScraper(traced, interval_s=5.0, max_concurrency=2, scrape_models=False)
        sc.set_endpoints([(str(i), e.url, "vllm") for i, e in enumerate(fleet)])
        await sc.scrape_once()
    assert all(e.metrics_hits == 1 for e in fleet)
    assert peak == 2  # reached, never exceeded


async def test_run_loop_add_remove_and_purge(session: aiohttp.ClientSession,
                                             engines: list[FakeEngine]) -> None:
    a = await start_engine(FakeEngine(running=1))
    b = await start_engine(FakeEngine(running=2))
    engines += [a, b]
    obs = ObservedLoad()
    sc = EngineStateScraper(session, interval_s=0.05, observed=obs, rng=random.Random(7))
    sc.set_endpoints([("a", a.url, "vllm")])
    task = asyncio.create_task(sc.run())
    try:
        await wait_for(lambda: a.metrics_hits >= 3)  # periodic, not once
        sc.set_endpoints([("a", a.url, "vllm"), ("b", b.url, "vllm")])
        await wait_for(lambda: (sb := sc.get("b")) is not None and sb.running == 2)
        obs.start("a")
        sc.set_endpoints([("b", b.url, "vllm")])
        assert sc.get("a") is None and "a" not in sc.all()
        assert obs.in_flight("a") == 0  # purged with the endpoint
        hits = a.metrics_hits
        hb = b.metrics_hits
        await wait_for(lambda: b.metrics_hits >= hb + 3)  # b goes on, a stopped
        assert a.metrics_hits <= hits + 1  # at most one scrape that was already under way
        # a changed URL starts again from scratch
        sc.set_endpoints([("b", a.url, "vllm")])
        await wait_for(lambda: (sb := sc.get("b")) is not None and sb.running == 1)
    finally:
        sc.stop()
        await asyncio.wait_for(task, 10)
    assert task.done() and task.exception() is None


async def test_snapshot_ages_into_stale_when_scrapes_stop(session: aiohttp.ClientSession,
                                                          engines: list[FakeEngine]) -> None:
    e = await start_engine(FakeEngine(running=5))
    engines.append(e)
    now = [100.0]
    sc = EngineStateScraper(session, interval_s=1.0, clock=lambda: now[0])
    sc.set_endpoints([("a", e.url, "vllm")])
    await sc.scrape_once()
    s = sc.get("a")
    assert s is not None and s.running == 5
    now[0] += 3.5  # more than 3 intervals without a good scrape (e.g. the loop was stuck)
    s = sc.get("a")
    assert s is not None and s.stale and s.running is None
    assert sc.all()["a"].stale
