"""The autoscaler's Prometheus metric source (controller/autoscaler/prometheus.py `query` and
the Collector's `metricSources[...].prometheus`) against Debian's real `prometheus` server
scraping real engine simulators (python -m loadtest.simulator, vLLM pages) every second.

Two engines, one sequence at a time each: a few concurrent requests on engine 0 build its
waiting queue, which the server scrapes and `sum(vllm:num_requests_waiting)` returns.
Error cases are the server's own answers: a PromQL syntax error, a vector of several
samples, an empty vector, a NaN scalar; each reads as missing for the collector.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

import engine_load
import harness
import prometheus_harness
from controller.autoscaler.collector import Collector
from controller.autoscaler.metrics import Observation
from controller.autoscaler.prometheus import PrometheusError, query

WAITING = "sum(vllm:num_requests_waiting)"
TIMEOUT = aiohttp.ClientTimeout(total=5)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with prometheus_harness.scraped_simulator(tmp_path_factory.mktemp("autoscaler-prom"), 2,
                                              ["--max-num-seqs", "1"]) as (sim, prom):
        yield {"sim": sim, "prom": prom}


def run_query(url: str, promql: str) -> float:
    async def go() -> float:
        async with aiohttp.ClientSession() as s:
            return await query(s, url, promql, TIMEOUT)
    return asyncio.run(go())


def observe(url: str, queries: dict[str, str]) -> Observation:
    """The Collector's observation of a target whose metrics all come from Prometheus."""
    async def go() -> Observation:
        c = Collector(timeout_s=5)
        try:
            return await c.observe([], "ns", "llm", None, list(queries),
                                   {k: {"prometheus": {"serverURL": url, "query": q}} for k, q in queries.items()})
        finally:
            await c.close()
    return asyncio.run(go())


def waiting_at_least(url: str, n: float) -> float | None:
    v = run_query(url, WAITING)
    return v if v >= n else None


def test_queue_on_the_engines_is_read_through_prometheus(env: dict[str, Any]) -> None:
    prom: prometheus_harness.PrometheusServer = env["prom"]
    sim: harness.Simulator = env["sim"]
    harness.wait_until(lambda: prom.query("vllm:num_requests_waiting")["data"]["result"], 30, interval=0.2,
                       what="engine series scraped")
    assert run_query(prom.url, WAITING) == 0.0
    assert run_query(prom.url, 'count(up{job="engines"} == 1)') == 2.0
    # five requests at a time on engine 0, which runs one: about four waiting
    with engine_load.Load(engine_load.completions(sim.urls[0], max_tokens=64), threads=5) as load:
        seen = harness.wait_until(lambda: waiting_at_least(prom.url, 3), 30, interval=0.2,
                                  what=f"{WAITING} >= 3")
        assert 3 <= seen <= 4
        obs = harness.wait_until(
            lambda: (o := observe(prom.url, {"waiting": WAITING})).metrics.get("waiting")
            and o.metrics["waiting"].external is not None and o.metrics["waiting"].external >= 3 and o,
            30, interval=0.2, what="the collector's external value >= 3")
        sample = obs.metrics["waiting"]
        assert sample.pods == () and obs.unready_pods == 0
    assert not load.errors, load.errors[:3]
    assert load.ok > 0
    # drained: back to zero
    harness.wait_until(lambda: run_query(prom.url, WAITING) == 0.0, 30, interval=0.2, what=f"{WAITING} == 0")


@pytest.mark.parametrize(("promql", "error"), [
    ("sum(vllm:num_requests_waiting", "bad_data"),                       # PromQL syntax error (HTTP 400)
    ("vllm:num_requests_waiting", "got 2 samples"),                      # one series per engine
    ("sum(no_such_metric_anywhere)", "got 0 samples"),                   # empty vector
    ("0 / 0", "non-finite value NaN"),                                   # a NaN scalar
])
def test_server_errors_and_ambiguous_results_read_as_missing(env: dict[str, Any], promql: str, error: str) -> None:
    prom: prometheus_harness.PrometheusServer = env["prom"]
    harness.wait_until(lambda: len(prom.query("vllm:num_requests_waiting")["data"]["result"]) == 2, 30,
                       interval=0.2, what="both engines' series scraped")
    with pytest.raises(PrometheusError, match=error):
        run_query(prom.url, promql)
    # the collector: that metric missing, a good one next to it still read
    obs = observe(prom.url, {"bad": promql, "good": WAITING})
    assert "bad" not in obs.metrics
    assert obs.metrics["good"].external == 0.0
