"""/metrics on the admin port aggregates every worker's values, each request counted once."""

from __future__ import annotations

import shutil
import tempfile

import httpx
from prometheus_client import CollectorRegistry, generate_latest, multiprocess

import harness

REQUESTS = "kthena_router_requests_total"
TOKENS = "kthena_router_tokens_total"


def _per_worker(router: harness.Router, sample: str, **labels: str) -> dict[int, float]:
    """Value of `sample` in each worker's own multiprocess files (by pid)."""
    prom = router.runtime_dir / "prometheus"
    pids = {int(p.stem.rsplit("_", 1)[1]) for p in prom.glob("*.db")}
    out: dict[int, float] = {}
    for pid in pids:
        with tempfile.TemporaryDirectory() as one:
            for f in prom.glob(f"*_{pid}.db"):
                shutil.copy(f, one)
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=one)
            fams = harness.parse_metrics(generate_latest(registry).decode())
        out[pid] = harness.metric_value(fams, sample, **labels)
    return out


def test_metrics_aggregate_workers(router: harness.Router, simulator: harness.Simulator) -> None:
    ok = {"model": "demo", "path": "/v1/chat/completions", "status_code": "200"}
    before_total = harness.metric_value(harness.parse_metrics(router.metrics_text()), REQUESTS, **ok)
    before = _per_worker(router, REQUESTS, **ok)
    before_out = harness.metric_value(harness.parse_metrics(router.metrics_text()), TOKENS,
                                      model="demo", token_type="output")
    n = 30
    completion_tokens = 0
    for i in range(n):
        # A fresh connection per request: the kernel spreads connections over the workers.
        r = httpx.post(f"{router.openai_url}/chat/completions", timeout=60, headers={"Connection": "close"},
                       json={"model": "demo", "max_tokens": 3 + i % 4,
                             "messages": [{"role": "user", "content": f"hello {i}"}]})
        assert r.status_code == 200, r.text
        completion_tokens += r.json()["usage"]["completion_tokens"]

    fams = harness.metrics_when(router, lambda f: harness.metric_value(f, REQUESTS, **ok) - before_total >= n
                                and harness.metric_value(f, "kthena_router_active_downstream_requests") == 0)
    assert harness.metric_value(fams, REQUESTS, **ok) - before_total == n
    assert harness.metric_value(fams, TOKENS, model="demo", token_type="output") - before_out == completion_tokens
    assert sum(simulator.received()) == n

    after = _per_worker(router, REQUESTS, **ok)
    delta = {pid: after.get(pid, 0) - before.get(pid, 0) for pid in after}
    assert sum(delta.values()) == n  # each request counted once, by one worker
    served_by = {pid for pid, d in delta.items() if d > 0}
    assert served_by <= set(router.worker_pids())
    assert len(served_by) == router.workers  # every worker took a share
    # Nothing is left in flight once the replies are in.
    assert harness.metric_value(fams, "kthena_router_active_downstream_requests") == 0


def test_metrics_parse_and_name_families(router: harness.Router) -> None:
    r = httpx.post(f"{router.openai_url}/chat/completions", timeout=60,
                   json={"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200
    text = router.metrics_text()
    fams = harness.parse_metrics(text)  # raises on malformed exposition text
    for name in ("kthena_router_requests", "kthena_router_request_duration_seconds", "kthena_router_tokens"):
        assert name in fams, sorted(fams)
    assert router.admin_get("/metrics").headers["content-type"].startswith("text/plain")


def test_runtime_metrics_of_every_worker(router: harness.Router) -> None:
    """GC pauses (per generation) and event-loop lag are exported by each worker."""
    lag_count = "kthena_router_event_loop_lag_seconds_count"
    workers = router.worker_pids()
    first = _per_worker(router, lag_count)
    # The lag timer ticks 4 times a second in every worker.
    harness.wait_until(
        lambda: all(_per_worker(router, lag_count).get(pid, 0) > first.get(pid, 0) for pid in workers), 10,
        what="event-loop lag samples from every worker")
    fams = harness.parse_metrics(router.metrics_text())
    present = {(s.name, s.labels.get("generation")) for fam in fams.values() for s in fam.samples}
    for gen in ("0", "1", "2"):  # zero counts are fine: collections are rare once nothing leaks
        assert ("kthena_router_gc_pause_seconds_count", gen) in present
        assert ("kthena_router_gc_collected_objects_total", gen) in present
