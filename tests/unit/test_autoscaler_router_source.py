"""The routers' pages for the autoscaler: the contract families parsed from a page in the
router's exposition format (prometheus_client, as kthena_router/metrics.py), tokens per
second from counter deltas (first observation, resets, several routers, a failed router),
KV usage and pending requests, and the fetch/cache/collector against real HTTP servers."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from controller.autoscaler.collector import Collector
from controller.autoscaler.router_source import (
    RouterPage, RouterSource, endpoint_host, parse_router_page, validate_router_url,
)
from tests.unit.test_autoscaler_loop_metrics import _pod

MS = "ns/llm"


def router_page(tokens: dict[tuple[str, str, str], float] | None = None,
                kv: dict[tuple[str, str], float] | None = None,
                pending: dict[tuple[str, str], float] | None = None) -> str:
    """A page as the router writes it (prometheus_client), with an unrelated family too."""
    reg = CollectorRegistry()
    c = Counter("kthena_router_endpoint_tokens_total", "tokens", ["model_server", "endpoint", "token_type"],
                registry=reg)
    g = Gauge("kthena_router_endpoint_kv_cache_usage", "kv", ["model_server", "endpoint"], registry=reg)
    p = Gauge("kthena_router_pending_requests", "held", ["model", "model_server"], registry=reg)
    other = Counter("kthena_router_tokens_total", "other", ["model", "path", "token_type"], registry=reg)
    other.labels("m", "/v1/completions", "input").inc(1e6)
    for key, v in (tokens or {}).items():
        c.labels(*key).inc(v)
    for key2, v in (kv or {}).items():
        g.labels(*key2).set(v)
    for key3, v in (pending or {}).items():
        p.labels(*key3).set(v)
    return generate_latest(reg).decode()


def page(at: float, **kw: Any) -> RouterPage:
    return parse_router_page(router_page(**kw), at)


def test_parse_keeps_only_the_contract_families() -> None:
    p = page(5.0, tokens={(MS, "10.0.0.1:8000", "input"): 100, (MS, "10.0.0.1:8000", "output"): 40,
                          ("ns/other", "[fd00::2]:8000", "output"): 7},
             kv={(MS, "10.0.0.1:8000"): 0.25}, pending={("m", MS): 3})
    assert p.at == 5.0
    assert p.tokens == {(MS, "10.0.0.1:8000", "input"): 100.0, (MS, "10.0.0.1:8000", "output"): 40.0,
                        ("ns/other", "[fd00::2]:8000", "output"): 7.0}
    assert p.kv == {(MS, "10.0.0.1:8000"): 0.25}
    assert p.pending == {("m", MS): 3.0}
    assert set(p.hosts) == {"10.0.0.1", "fd00::2"}
    assert page(0.0).tokens == {}  # no series yet: nothing, and no error


def test_parse_refuses_a_broken_page() -> None:
    with pytest.raises(ValueError):
        parse_router_page('kthena_router_pending_requests{model="m" 1\n', 0.0)


def test_endpoint_host_and_url_validation() -> None:
    assert endpoint_host("10.0.0.5:8000") == "10.0.0.5"
    assert endpoint_host("[fd00::1]:8000") == "fd00::1"
    assert endpoint_host("10.0.0.5") == "10.0.0.5"
    assert validate_router_url("http://127.0.0.1:8080/metrics") == "http://127.0.0.1:8080/metrics"
    for bad in ("127.0.0.1:8080/metrics", "ftp://x/metrics", "http:///metrics", "http://h:99999/metrics",
                "http://h/metrics?x=1"):
        with pytest.raises(ValueError, match="--router-metrics-url"):
            validate_router_url(bad)


def _source(n: int = 1, min_rate: float = 1.0) -> RouterSource:
    return RouterSource([f"http://127.0.0.1:1/r{i}" for i in range(n)], min_rate_s=min_rate)


EP = "10.0.0.1:8000"


def test_tokens_per_second_from_counter_deltas() -> None:
    src = _source()
    first = src.record([page(10.0, tokens={(MS, EP, "input"): 100, (MS, EP, "output"): 50})])
    assert first.token_rate("10.0.0.1", ("input", "output")) is None  # the first observation
    snap = src.record([page(20.0, tokens={(MS, EP, "input"): 300, (MS, EP, "output"): 150,
                                          ("ns/b", "10.0.0.1:9000", "output"): 100})])
    assert snap.token_rate("10.0.0.1", ("input", "output")) == pytest.approx(40.0)  # (200 + 100 + 100) / 10
    assert snap.token_rate("10.0.0.1", ("output",)) == pytest.approx(20.0)
    assert snap.token_rate("10.0.0.9", ("input", "output")) == 0.0  # no traffic through the router
    # a counter that went down (the router restarted): no rate this round; the next one has it
    reset = src.record([page(30.0, tokens={(MS, EP, "input"): 10, (MS, EP, "output"): 150,
                                           ("ns/b", "10.0.0.1:9000", "output"): 100})])
    assert reset.token_rate("10.0.0.1", ("input", "output")) is None
    assert reset.token_rate("10.0.0.1", ("output",)) == 0.0
    after = src.record([page(40.0, tokens={(MS, EP, "input"): 60, (MS, EP, "output"): 150,
                                           ("ns/b", "10.0.0.1:9000", "output"): 100})])
    assert after.token_rate("10.0.0.1", ("input", "output")) == pytest.approx(5.0)
    # a series that vanished (a restarted router that has not seen the endpoint yet)
    gone = src.record([page(50.0, tokens={(MS, EP, "input"): 60})])
    assert gone.token_rate("10.0.0.1", ("output",)) is None


def test_the_base_is_at_least_min_rate_old() -> None:
    src = _source(min_rate=5.0)
    src.record([page(0.0, tokens={(MS, EP, "output"): 0})])
    near = src.record([page(2.0, tokens={(MS, EP, "output"): 20})])
    assert near.token_rate("10.0.0.1", ("output",)) is None  # nothing 5 s old yet
    snap = src.record([page(6.0, tokens={(MS, EP, "output"): 60})])
    assert snap.bases[0] is not None and snap.bases[0].at == 0.0
    assert snap.token_rate("10.0.0.1", ("output",)) == pytest.approx(10.0)
    snap = src.record([page(8.0, tokens={(MS, EP, "output"): 100})])
    assert snap.bases[0] is not None and snap.bases[0].at == 2.0  # the newest old enough


def test_several_routers_are_summed_and_a_failed_one_makes_rates_unknown() -> None:
    src = _source(2)
    src.record([page(0.0, tokens={(MS, EP, "output"): 0}), page(0.0)])
    snap = src.record([page(10.0, tokens={(MS, EP, "output"): 100}, kv={(MS, EP): 0.5}, pending={("m", MS): 2}),
                       page(10.0, tokens={(MS, EP, "output"): 50}, kv={(MS, EP): 0.6}, pending={("m", MS): 1})])
    assert snap.complete and snap.any
    assert snap.token_rate("10.0.0.1", ("output",)) == pytest.approx(15.0)
    assert snap.kv_usage("10.0.0.1") == 0.6  # the largest view
    assert snap.kv_usage("10.0.0.2") is None
    assert snap.pending([MS]) == 3.0
    assert snap.pending(["ns/other"]) == 0.0
    failed = src.record([page(20.0, tokens={(MS, EP, "output"): 200}, kv={(MS, EP): 0.4}), None])
    assert not failed.complete and failed.any
    assert failed.token_rate("10.0.0.1", ("output",)) is None  # the failed router's share is unknown
    assert failed.kv_usage("10.0.0.1") == 0.4
    assert failed.pending([MS]) is None  # 0 is not certain: the failed router may hold requests
    held = src.record([page(30.0, pending={("m", MS): 4}), None])
    assert held.pending([MS]) == 4.0  # > 0 is certain
    none = src.record([None, None])
    assert not none.any and none.pending([MS]) is None and none.kv_usage("10.0.0.1") is None


# --- fetching: real HTTP servers on 127.0.0.1 ----------------------------------------------------

@contextlib.asynccontextmanager
async def routers(n: int) -> Any:
    """n fake routers serving their `page`; `hits` counts the fetches."""
    states: list[dict[str, Any]] = []
    runners = []
    for _ in range(n):
        state: dict[str, Any] = {"page": router_page(), "hits": 0, "status": 200}

        async def metrics(request: web.Request, state: dict[str, Any] = state) -> web.Response:
            state["hits"] += 1
            return web.Response(text=state["page"], status=state["status"])

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/metrics"  # type: ignore[union-attr]
        states.append(state)
        runners.append(runner)
    try:
        yield states
    finally:
        for r in runners:
            await r.cleanup()


async def test_fetch_is_shared_within_the_interval_and_a_failed_router_is_none() -> None:
    async with routers(2) as rs:
        clock = [0.0]
        src = RouterSource([r["url"] for r in rs], min_interval_s=1.0, min_rate_s=1.0, clock=lambda: clock[0])
        c = Collector(timeout_s=2, router=src)
        try:
            rs[0]["page"] = router_page(pending={("m", MS): 1})
            a = await c.router_snapshot()
            b = await c.router_snapshot()
            assert a is b and [r["hits"] for r in rs] == [1, 1]
            assert a is not None and a.complete and a.pending([MS]) == 1.0
            clock[0] = 1.5
            rs[1]["status"] = 500
            d = await c.router_snapshot()
            assert d is not a and [r["hits"] for r in rs] == [2, 2]
            assert d is not None and not d.complete and d.pages[1] is None and d.pending([MS]) == 1.0
        finally:
            await c.close()


async def test_collector_reads_router_metrics_per_pod_by_ip() -> None:
    async with routers(1) as rs:
        clock = [0.0]
        src = RouterSource([rs[0]["url"]], min_interval_s=0.0, min_rate_s=1.0, clock=lambda: clock[0])
        c = Collector(timeout_s=2, router=src)
        pods = [_pod("a", ip="10.0.0.1"), _pod("b", ip="10.0.0.2"), _pod("c", ip="10.0.0.3"),
                _pod("d", ready=False, ip="10.0.0.4"), _pod("e", ip="")]
        names = ["router:tokens_per_second", "router:output_tokens_per_second", "router:kv_cache_usage"]

        def serve(out: float) -> None:
            rs[0]["page"] = router_page(
                tokens={(MS, "10.0.0.1:8000", "input"): 10, (MS, "10.0.0.1:8000", "output"): out,
                        (MS, "10.0.0.2:8000", "output"): out / 2},
                kv={(MS, "10.0.0.1:8000"): 0.3, (MS, "10.0.0.2:8000"): 0.7})
        try:
            serve(0)
            obs = await c.observe(pods, "ns", "ms", None, names, None)
            # no rate yet (first observation): only KV usage, for the pods the router knows
            assert set(obs.metrics) == {"router:kv_cache_usage"}
            assert obs.metrics["router:kv_cache_usage"].pods == (0.3, 0.7)
            assert obs.metrics["router:kv_cache_usage"].missing_pods == 2  # c (unknown) and e (no IP)
            assert obs.unready_pods == 1
            clock[0] = 10.0
            serve(100)
            obs = await c.observe(pods, "ns", "ms", None, names, None)
            # c: no series at all through the router -> 0 tokens/s; e: no IP -> missing
            assert obs.metrics["router:tokens_per_second"].pods == (10.0, 5.0, 0.0)
            assert obs.metrics["router:output_tokens_per_second"].pods == (10.0, 5.0, 0.0)
            assert obs.metrics["router:tokens_per_second"].missing_pods == 1
            # router: metrics beside a pod metric: both read
            obs = await c.observe(pods, "ns", "ms", None, ["router:kv_cache_usage", "load"],
                                  {"load": {"pod": {"port": 1}}})
            assert set(obs.metrics) == {"router:kv_cache_usage"}
        finally:
            await c.close()


async def test_collector_without_routers_has_no_router_data() -> None:
    c = Collector(timeout_s=1)
    try:
        assert await c.router_snapshot() is None
        obs = await c.observe([_pod("a")], "ns", "ms", None, ["router:kv_cache_usage"], None)
        assert obs.metrics == {}
    finally:
        await c.close()
