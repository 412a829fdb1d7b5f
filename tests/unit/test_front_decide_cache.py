"""front/plan_cache.py, front/report_children.py and front/mpvalues.py: what the fast path
caches never outlives the state or the children it came from, and the batched multiprocess
writes leave the files as `inc` would."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, values
from prometheus_client.multiprocess import MultiProcessCollector

from kthena_router.front.batch import MetricBatch
from kthena_router.front.plan_cache import PlanCache, host_header
from kthena_router.front.report_children import ReportCache
from kthena_router.metrics import RouterMetrics
from loadtest.front_decide_cost import ENGINE_PORTS, MODEL, worker
from loadtest.procs import router_config


def _ep(ip: str, port: int) -> SimpleNamespace:
    return SimpleNamespace(ip=ip, port=port, key=f"{ip}:{port}")


def test_host_header_forms() -> None:
    assert host_header(_ep("10.0.0.1", 8000)) == ("10.0.0.1:8000", "10.0.0.1:8000")
    assert host_header(_ep("10.0.0.1", 80)) == ("10.0.0.1:80", "10.0.0.1")
    assert host_header(_ep("fd00::1", 8000)) == ("[fd00::1]:8000", "[fd00::1]:8000")


def test_target_keeps_query() -> None:
    cache = PlanCache()
    assert cache.target("/v1/completions", b"") == "/v1/completions"
    assert cache.target("/v1/completions", b"a=1&b=2") == "/v1/completions?a=1&b=2"
    assert cache.target("/v1/completions", b"") == "/v1/completions"


def _reloaded(interval: str, ports: list[int]) -> str:
    text = router_config(MODEL, ports).replace("metadata: {name: bench, namespace: default}\nspec:\n  modelName",
                                               "metadata: {name: bench2, namespace: default}\nspec:\n  modelName")
    return text.replace("  inferenceEngine: vLLM\n",
                        f"  inferenceEngine: vLLM\n  trafficPolicy: {{retry: {{retryInterval: {interval}}}}}\n")


@pytest.fixture
def process_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """create_app switches this process to multiprocess values: undone after the test."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "unset-by-the-app")
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)


def test_reload_changes_the_plan(tmp_path: Path, process_metrics: None) -> None:
    """A config reload that renames the route, moves the endpoints and changes the retry
    interval: the next decision carries the new values, none of the old state's."""

    async def run() -> None:
        async with worker(False, tmp_path, watch=True) as w:
            body = w.bodies[True]
            holder = w.fast.fw.holder
            w.fast.decide(1, "/v1/chat/completions", b"", [("content-type", "application/json")], body)
            addrs, _hosts, *_rest = w.core.fast_calls[-1][1:]
            timeouts = w.core.fast_calls[-1][8]
            assert {a.rsplit(":", 1)[1] for a in addrs} <= {str(p) for p in ENGINE_PORTS}, addrs
            assert timeouts[6] == pytest.approx(0.1), timeouts
            assert w.fast.live[1].route_label == "default/bench"
            first = holder.current
            new_ports = [p + 100 for p in ENGINE_PORTS]
            (w.tmp / "config.yaml").write_text(_reloaded("250ms", new_ports))
            deadline = time.monotonic() + 20
            while holder.current is first and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert holder.current is not first, "the config reload was not installed within 20 s"
            w.fast.decide(2, "/v1/chat/completions", b"", [("content-type", "application/json")], body)
            assert not w.core.slow_calls, w.core.slow_calls
            call = w.core.fast_calls[-1]
            assert call[0] == 2
            assert {a.rsplit(":", 1)[1] for a in call[1]} <= {str(p) for p in new_ports}, call[1]
            assert call[2] == call[1], call[2]  # Host headers follow the addresses
            assert call[8][6] == pytest.approx(0.25), call[8]
            assert w.fast.live[2].route_label == "default/bench2"
            for rid in (1, 2):
                w.fast.done(rid, 200, 0, [(0, 0)], 0.01, 0.001, 0.001, 0.001, 3, 4, 5)
            w.fast.flush()

    asyncio.run(run())


def test_report_cache_starts_over_after_a_prune() -> None:
    metrics = RouterMetrics(CollectorRegistry())
    cache = ReportCache(metrics)
    key = ("m", "chat", "ns/r", "ns/s", "10.0.0.1:8000", 200, "")
    first = cache.get(key)
    assert cache.get(key) is first
    assert first.requests is metrics._child(metrics.requests, ("m", "chat", "200", "", "ns/r", "ns/s",
                                                               "10.0.0.1:8000"))
    in_tokens = first.tokens("input")
    metrics.prune_endpoints({"10.0.0.1:8000"})
    second = cache.get(key)
    assert second is not first
    assert second.requests is metrics._child(metrics.requests, ("m", "chat", "200", "", "ns/r", "ns/s",
                                                                "10.0.0.1:8000"))
    assert second.requests is not first.requests  # the pruned child is never written again
    assert second.tokens("input")[1] is not in_tokens[1]
    assert second.tokens("input")[0] is in_tokens[0]  # no endpoint label: not pruned


def test_report_children_created_only_when_written() -> None:
    """A child's creation adds its series: TTFT/TPOT/tokens appear only once observed."""
    metrics = RouterMetrics(CollectorRegistry())
    children = ReportCache(metrics).get(("m", "chat", "ns/r", "ns/s", "10.0.0.1:8000", 200, ""))
    assert children._ttft is None and children._tpot is None and not children._tokens
    assert children.ttft() is metrics._child(metrics.ttft, ("m", "chat"))
    assert children.tpot() is metrics._child(metrics.tpot, ("m", "chat"))


def _samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry()
    MultiProcessCollector(reg, path=str(path))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in reg.collect() for s in fam.samples}


def test_batched_multiprocess_writes_equal_inc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mmap files after a batched flush hold what `inc`/`observe` would have written."""
    results = []
    for name in ("direct", "batched"):
        d = tmp_path / name
        d.mkdir()
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(d))
        monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(os.getpid))
        reg = CollectorRegistry()
        c = Counter("c_total", "c", ["k"], registry=reg)
        h = Histogram("h_seconds", "h", ["k"], buckets=(0.01, 0.1, 1.0), registry=reg)
        batch = MetricBatch()
        observations = [0.005, 0.05, 0.05, 2.0, float("nan"), 0.1]
        for i, v in enumerate(observations):
            k = "a" if i % 2 else "b"
            if name == "direct":
                c.labels(k).inc(i + 1)
                h.labels(k).observe(v)
            else:
                batch.add(c.labels(k), i + 1)
                batch.observe(h.labels(k), v)
            if i == 2 and name == "batched":
                batch.flush()  # the values keep counting from what the file holds
        batch.flush()
        results.append(_samples(d))
    direct, batched = results
    nan_free = {k: v for k, v in direct.items() if v == v}
    assert {k: v for k, v in batched.items() if v == v} == nan_free
    assert {k for k, v in direct.items() if v != v} == {k for k, v in batched.items() if v != v}
