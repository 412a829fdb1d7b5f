"""Pure parts of the autoscaler benchmark: the day shape and arrivals, the replica pool's
accounting and fabricated pods, the configurations' policies (parsed by the real parser)."""

from __future__ import annotations

import pytest

from controller.autoscaler import parse_policy
from controller.autoscaler.targets import metric_pods
from loadtest.autoscale_cluster import MS_NAME, NAMESPACE, ReplicaPool, router_docs
from loadtest.autoscale_configs import make_config
from loadtest.autoscale_trace import BURST, TraceSpec, arrivals, hour_of, shape


def test_shape_has_its_peak_in_the_burst_and_its_trough_at_night() -> None:
    values = {h / 4: shape(h / 4) for h in range(0, 96)}
    peak = max(values, key=values.get)  # type: ignore[arg-type]
    assert BURST[0] <= peak < BURST[1] and values[peak] == pytest.approx(1.0)
    assert min(values, key=values.get) < 6  # type: ignore[arg-type]
    assert shape(12) > shape(8) > shape(5) and shape(20) < shape(16)


def test_arrivals_follow_the_shape_and_the_seed() -> None:
    spec = TraceSpec(day_s=240, peak_rate=10, seed=3)
    a = arrivals(spec)
    assert a == arrivals(spec) and a != arrivals(TraceSpec(day_s=240, peak_rate=10, seed=4))
    assert all(0 <= x < 240 for x in a) and a == sorted(a)
    per_hour = [0] * 24
    for x in a:
        per_hour[hour_of(spec, x)] += 1
    # expected ~ 10 req/s x 10 s per hour x shape: burst hour ~77, night ~11
    assert per_hour[13] > 2 * per_hour[10] / 1.5 and per_hour[13] > 3 * per_hour[3]
    assert sum(per_hour) == len(a)


def test_pool_counts_replica_seconds_from_request_to_removal() -> None:
    pool = ReplicaPool(["127.0.0.11", "127.0.0.12", "127.0.0.13"], startup_s=2.0)
    pool.start(1, 0.0)
    assert pool.current == 1 and pool.active_ips() == ["127.0.0.11"]
    assert pool.scale_to(3, 10.0) is False  # starting replicas are not in the router yet
    assert pool.current == 3 and pool.active_ips() == ["127.0.0.11"]
    assert pool.tick(11.0) is False and pool.tick(12.0) is True
    assert pool.active_ips() == ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
    assert pool.scale_to(1, 20.0) is True  # newest first
    assert pool.active_ips() == ["127.0.0.11"]
    # 1 x 30 + 2 x (20 - 10)
    assert pool.replica_seconds(30.0) == pytest.approx(50.0)
    assert pool.replica_seconds(15.0) == pytest.approx(15.0 + 2 * 5.0)
    # a scale-down during the startup removes the starting replica, never billed twice
    pool.scale_to(2, 40.0)
    assert pool.scale_to(1, 41.0) is False and pool.replica_seconds(50.0) == pytest.approx(50.0 + 20.0 + 1.0)
    # the next scale-up reuses the engine removed longest ago
    pool.scale_to(2, 60.0)
    assert pool.replicas[pool.order[-1]].ip == "127.0.0.13"


def test_fabricated_pods_are_what_the_collector_selects() -> None:
    pool = ReplicaPool(["127.0.0.11", "127.0.0.12"], startup_s=1.0)
    pool.start(1, 0.0)
    pool.scale_to(2, 0.5)
    ps = metric_pods(pool.pods(), NAMESPACE, MS_NAME, None, None)
    assert [ip for _, ip in ps.ready] == ["127.0.0.11"] and len(ps.unready) == 1 and not ps.errored
    pool.tick(1.5)
    ps = metric_pods(pool.pods(), NAMESPACE, MS_NAME, None, None)
    assert [ip for _, ip in ps.ready] == ["127.0.0.11", "127.0.0.12"] and not ps.unready


@pytest.mark.parametrize("name", ["stable", "panic", "router"])
def test_configurations_parse_with_the_real_parser(name: str) -> None:
    cfg = make_config(name, 3.0, 1, 6, 9000)
    p = parse_policy(cfg.spec)
    assert p.homogeneous is not None and (p.homogeneous.min_replicas, p.homogeneous.max_replicas) == (1, 6)
    panic = p.behavior.panic
    assert (panic.hold > 0) == (name != "stable")
    assert list(p.metrics) == ["router:tokens_per_second" if name == "router" else "num_requests_waiting"]
    assert (cfg.sources is None) == (name == "router")
    with pytest.raises(ValueError):
        make_config("other", 3.0, 1, 6, 9000)


def test_router_docs_list_the_active_replicas() -> None:
    text = router_docs(["127.0.0.11", "127.0.0.12"], 9000)
    assert "{address: 127.0.0.11, port: 9000" in text and "{address: 127.0.0.12, port: 9000" in text
    assert "kind: Endpoints" in text and f"modelServerName: {MS_NAME}" in text
