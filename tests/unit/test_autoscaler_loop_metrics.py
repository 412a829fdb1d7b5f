"""The autoscaler loop's metric reading (pure parts, plus the collector against a real local
HTTP server): Prometheus text pages, engine-name defaults, source planning, Prometheus
query responses, and pods -> Observation."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from aiohttp import web

from controller.autoscaler.collector import Collector, PromSource, plan_sources
from controller.autoscaler.prometheus import PrometheusError, parse_response
from controller.autoscaler.scrape import candidates, read_metrics

VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 50.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 3.5
vllm:num_requests_waiting_extra 99
"""

SGLANG_PAGE = """\
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 7
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 2
"""


def test_named_metric_is_summed_over_series() -> None:
    got = read_metrics(VLLM_PAGE, {"w": ("vllm:num_requests_waiting",), "r": ("vllm:num_requests_running",)})
    assert got == {"w": 5.0, "r": 5.0}


def test_counter_with_or_without_total_suffix() -> None:
    assert read_metrics(VLLM_PAGE, {"a": ("vllm:prompt_tokens_total",)}) == {"a": 150.0}
    assert read_metrics(VLLM_PAGE, {"a": ("vllm:prompt_tokens",)}) == {"a": 150.0}


def test_prefix_of_another_name_is_not_mixed_in() -> None:
    # vllm:num_requests_waiting_extra must not be counted as vllm:num_requests_waiting
    assert read_metrics(VLLM_PAGE, {"w": ("vllm:num_requests_waiting",)}) == {"w": 5.0}
    assert read_metrics(VLLM_PAGE, {"x": ("vllm:num_requests_waiting_extra",)}) == {"x": 99.0}


def test_histogram_and_absent_metrics_read_as_missing() -> None:
    assert read_metrics(VLLM_PAGE, {"h": ("vllm:e2e_request_latency_seconds",), "z": ("nope",)}) == {}


def test_engine_defaults_find_vllm_and_sglang_names() -> None:
    wanted = {"num_requests_waiting": candidates("num_requests_waiting", None),
              "num_requests_running": candidates("num_requests_running", None)}
    assert read_metrics(VLLM_PAGE, wanted) == {"num_requests_waiting": 5.0, "num_requests_running": 5.0}
    assert read_metrics(SGLANG_PAGE, wanted) == {"num_requests_waiting": 7.0, "num_requests_running": 2.0}


def test_explicit_name_disables_defaults_and_key_comes_first() -> None:
    assert candidates("num_requests_waiting", "my_queue") == ("my_queue",)
    c = candidates("num_requests_waiting", None)
    assert c[0] == "num_requests_waiting" and "vllm:num_requests_waiting" in c and "sglang:num_queue_reqs" in c
    assert candidates("custom_metric", None) == ("custom_metric",)
    page = "num_requests_waiting 2\nvllm:num_requests_waiting 9\n"
    assert read_metrics(page, {"num_requests_waiting": c}) == {"num_requests_waiting": 2.0}


def test_broken_page_raises_value_error() -> None:
    with pytest.raises(ValueError):
        read_metrics('load{a="1" 3\n', {"load": ("load",)})


def test_plan_groups_pod_sources_and_separates_prometheus() -> None:
    sel = {"matchLabels": {"tier": "a"}}
    sources = {
        "a": {"pod": {"port": 9000, "uri": "/m", "labelSelector": sel}},
        "b": {"pod": {"name": "engine_b", "port": 9000, "uri": "/m", "labelSelector": sel}},
        "c": {"pod": {"port": 9001}},
        "p": {"prometheus": {"serverURL": "http://prom:9090", "query": "sum(x)"}},
    }
    groups, prom = plan_sources(["a", "b", "c", "p", "d"], sources)
    assert prom == {"p": PromSource("http://prom:9090", "sum(x)")}
    by_port = {(g.uri, g.port): g for g in groups}
    assert set(by_port) == {("/m", 9000), ("/metrics", 9001), ("/metrics", 8100)}
    assert by_port[("/m", 9000)].wanted == {"a": ("a",), "b": ("engine_b",)}
    assert by_port[("/m", 9000)].selector == sel
    assert by_port[("/metrics", 8100)].wanted == {"d": ("d",)}  # no source: the engine default


def _vector(*values: str) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector",
                                          "result": [{"metric": {}, "value": [1.5, v]} for v in values]}}


def test_prometheus_responses() -> None:
    assert parse_response(_vector("12.5")) == 12.5
    assert parse_response({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "3"]}}) == 3.0
    for bad in (_vector(), _vector("1", "2"), _vector("NaN"), _vector("+Inf"), _vector("x"),
                {"status": "error", "errorType": "bad_data", "error": "parse error"},
                {"status": "success", "data": {"resultType": "matrix", "result": []}}, [1]):
        with pytest.raises(PrometheusError):
            parse_response(bad)


# --- the collector against a real HTTP server on 127.0.0.1 -----------------------------------

def _pod(name: str, ready: bool = True, ip: str = "127.0.0.1", role: str | None = None, restarts: int = 0,
         **labels: str) -> dict[str, Any]:
    lb = {"modelserving.volcano.sh/name": "ms", "modelserving.volcano.sh/entry": "true", **labels}
    if role:
        lb["modelserving.volcano.sh/role"] = role
    status: dict[str, Any] = {"phase": "Running" if ready else "Pending",
                              "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                              "containerStatuses": [{"name": "c", "restartCount": restarts}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": {"name": name, "namespace": "ns", "labels": lb}, "status": status}


@contextlib.asynccontextmanager
async def metrics_server() -> Any:
    """A real HTTP server on 127.0.0.1 in the test's own event loop."""
    state: dict[str, Any] = {"page": "load 3\n", "prom": _vector("42"), "queries": []}

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=state["page"])

    async def query(request: web.Request) -> web.Response:
        state["queries"].append(request.query.get("query"))
        return web.json_response(state["prom"])

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state["port"] = port
    try:
        yield state
    finally:
        await runner.cleanup()


async def test_collector_scrapes_ready_pods_and_counts_the_rest() -> None:
    async with metrics_server() as server:
        await _scrapes_ready_pods_and_counts_the_rest(server)


async def _scrapes_ready_pods_and_counts_the_rest(metrics_server: dict[str, Any]) -> None:
    port = metrics_server["port"]
    pods = [_pod("a"), _pod("b"), _pod("c", ready=False), _pod("d", ip=""),
            _pod("other-ms", **{"modelserving.volcano.sh/name": "x"})]
    c = Collector(timeout_s=2)
    try:
        obs = await c.observe(pods, "ns", "ms", None, ["load"], {"load": {"pod": {"port": port}}})
        assert obs.metrics["load"].pods == (3.0, 3.0)
        assert obs.metrics["load"].missing_pods == 1  # d: ready without an address
        assert obs.unready_pods == 1
        # a restarted pod: Kthena's rule, that group gives no data this round
        obs = await c.observe(pods + [_pod("e", restarts=1)], "ns", "ms", None, ["load"],
                              {"load": {"pod": {"port": port}}})
        assert "load" not in obs.metrics
        # the prometheus source: one external value
        obs = await c.observe(pods, "ns", "ms", None, ["q"], {"q": {"prometheus": {
            "serverURL": f"http://127.0.0.1:{port}", "query": "sum(rate(x[1m]))"}}})
        assert obs.metrics["q"].external == 42.0 and metrics_server["queries"] == ["sum(rate(x[1m]))"]
        metrics_server["prom"] = _vector("NaN")
        obs = await c.observe(pods, "ns", "ms", None, ["q"], {"q": {"prometheus": {
            "serverURL": f"http://127.0.0.1:{port}", "query": "q"}}})
        assert "q" not in obs.metrics
    finally:
        await c.close()


async def test_collector_role_and_selector_and_dead_port() -> None:
    async with metrics_server() as server:
        await _role_and_selector_and_dead_port(server)


async def _role_and_selector_and_dead_port(metrics_server: dict[str, Any]) -> None:
    port = metrics_server["port"]
    metrics_server["page"] = 'vllm:num_requests_waiting{engine="0"} 6\n'
    pods = [_pod("p0", role="prefill"), _pod("d0", role="decode", tier="gold"), _pod("d1", role="decode")]
    c = Collector(timeout_s=2)
    try:
        obs = await c.observe(pods, "ns", "ms", "decode", ["num_requests_waiting"],
                              {"num_requests_waiting": {"pod": {"port": port, "labelSelector": {
                                  "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]}]}}}})
        assert obs.metrics["num_requests_waiting"].pods == (6.0,)
        # nothing listens on the port: every ready pod is a pod that did not report
        dead = _free_port()
        obs = await c.observe(pods, "ns", "ms", "decode", ["w"], {"w": {"pod": {"port": dead}}})
        assert "w" not in obs.metrics and obs.unready_pods == 0
    finally:
        await c.close()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_realistic_vllm_page_with_two_ranks() -> None:
    from test_engine_state_parse import realistic_vllm_page
    page = realistic_vllm_page(ranks=2)
    got = read_metrics(page, {
        "num_requests_waiting": candidates("num_requests_waiting", None),  # ranks 1 + 2
        "kv": candidates("kv_cache_usage", None),  # 0.25 + 1.25: summed, as Kthena sums gauges
        "prompt": ("vllm:prompt_tokens_total",),  # 123456 + 123457 (the _created samples ignored)
        "success": ("vllm:request_success_total",),  # 3 finished reasons x (77 + 78)
        "ttft": ("vllm:time_to_first_token_seconds",),  # a histogram: missing
    })
    assert got == {"num_requests_waiting": 3.0, "kv": 1.5, "prompt": 246913.0, "success": 465.0}
