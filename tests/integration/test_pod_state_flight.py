"""In-flight counts across a pod's workers (docs/pod-state.md): every worker's least-request
load counts what the other workers sent since the last scrape, relayed by the hub.

A real router with 2 workers and least-request decided in the Rust front, three simulator
engines holding every request for a while: while requests are held, each worker's own count
plus what it was told about the other worker equals the pod's total on every engine; once
they end, nothing is left counted anywhere. Without the relay a worker sees its own requests
only and this fails. Run with scrapes once an hour (only the relays move the counts) and
every half second, checked again after two scrape rounds during the hold: a scrape must
not reset the relayed count (it did, and a scrape that fell while requests were held left
negative counts behind).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import harness

WORKERS = 2
HELD = 8
HOLD_S = 6.0


@pytest.fixture(params=[3600.0, 0.5], ids=["scrape-hourly", "scrape-0.5s"])
def scrape_s(request: pytest.FixtureRequest) -> float:
    return float(request.param)


@pytest.fixture
def router(scrape_s: float, simulator: harness.Simulator, tmp_path: Path) -> Iterator[harness.Router]:
    config = harness.write_config(tmp_path / "routes.yaml", harness.engine_config(simulator.ports))
    rc = tmp_path / "router-config.yaml"
    rc.write_text("scheduler:\n  plugins:\n    Score:\n      enabled:\n      - {name: least-request, weight: 1}\n")
    r = harness.start_router(config, tmp_path, workers=WORKERS,
                             extra_args=["--router-config", str(rc), "--scrape-interval-s", str(scrape_s)])
    try:
        harness.wait_until(lambda: [w["mode"] for w in _views(r)] == ["hub"] * WORKERS, 60,
                           what="both workers on the hub")
        yield r
    finally:
        r.stop()


def _views(router: harness.Router) -> list[dict[str, Any]]:
    r = router.admin_get("/debug/pod_state")
    return list(r.json()["workers"]) if r.status_code == 200 else []


def hub_scrapes(router: harness.Router) -> float:
    return harness.metric_value(harness.parse_metrics(router.metrics_text()),
                                "kthena_router_pod_state_hub_scrapes_total", result="ok")


def counts(router: harness.Router) -> list[dict[str, dict[str, int]]]:
    """Per worker: endpoint -> {"local": in flight from it, "remote": relayed from the other}."""
    return [w["in_flight"] for w in _views(router)]


def consistent(views: list[dict[str, dict[str, int]]], total: int) -> bool:
    if len(views) != WORKERS:
        return False
    keys = set().union(*views)
    pod = {k: sum(v.get(k, {}).get("local", 0) for v in views) for k in keys}
    if sum(pod.values()) != total:
        return False
    return all(v[k]["local"] + v[k]["remote"] == pod[k] for v in views for k in keys if k in v)


def test_each_worker_counts_the_other_workers_requests(router: harness.Router, simulator: harness.Simulator,
                                                       scrape_s: float) -> None:
    for i in range(len(simulator.ports)):
        simulator.set_faults(i, first_byte_delay_s=HOLD_S)
    statuses_seen: list[int] = []

    def one(i: int) -> None:
        with httpx.Client(timeout=60) as c:  # a new connection each: the workers take turns
            r = c.post(router.base_url + "/v1/chat/completions", json={
                "model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": f"held {i}"}]})
        statuses_seen.append(r.status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(HELD)]
    for t in threads:
        t.start()
    last: list[Any] = []

    def held_everywhere() -> bool:
        last[:] = counts(router)
        return consistent(last, HELD)

    try:
        harness.wait_until(held_everywhere, HOLD_S - 1, what="every worker counting the pod's held requests")
    except Exception as exc:
        raise AssertionError(f"per-worker counts while {HELD} requests are held: {last}") from exc
    if scrape_s < HOLD_S:
        scrapes = hub_scrapes(router)
        harness.wait_until(lambda: hub_scrapes(router) >= scrapes + 2 * len(simulator.ports), HOLD_S,
                           what="two scrape rounds while the requests are held")
        last[:] = counts(router)
        assert not statuses_seen, "the requests ended before two scrape rounds: the check below means nothing"
        assert consistent(last, HELD), f"per-worker counts after scrapes while {HELD} requests are held: {last}"
    for t in threads:
        t.join()
    assert statuses_seen == [200] * HELD

    def none_left() -> bool:
        last[:] = counts(router)
        return consistent(last, 0) and all(c == {"local": 0, "remote": 0} for v in last for c in v.values())

    try:
        harness.wait_until(none_left, 20, what="nothing left in flight on any worker")
    except Exception as exc:
        raise AssertionError(f"per-worker counts after the {HELD} requests ended: {last}") from exc
