"""Registry: per-server outlier settings (shared endpoints), endpoints leaving the config
and the pruning of their metric label children."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from pathlib import Path

from config_fixtures import endpoints, load, route, server
from kthena_router.config.traffic import OutlierDetection, ServerTraffic, TrafficSettings
from kthena_router.endpoints.registry import EndpointRegistry
from kthena_router.metrics import RouterMetrics

A, B = "127.0.0.1:9001", "127.0.0.1:9002"


def _cfg(tmp_path: Path, ports_a: list[int], ports_b: list[int]):
    eps = [{"address": "127.0.0.1", "port": p, "labels": {"app": "a"}} for p in ports_a]
    eps += [{"address": "127.0.0.1", "port": p, "labels": {"app": "b"}} for p in ports_b]
    docs = [route("ra", "ma", server="a"), route("rb", "mb", server="b"),
            server("a", labels={"app": "a"}, workloadPort={"port": 9001}),
            server("b", labels={"app": "b"}, workloadPort={"port": 9001}), endpoints("e", eps)]
    return load(tmp_path, docs)


def test_shared_endpoint_takes_the_first_servers_settings_and_gone_keys_are_reported(tmp_path: Path) -> None:
    strict = ServerTraffic(outlier=OutlierDetection(consecutive_failures=2))
    loose = ServerTraffic(outlier=OutlierDetection(consecutive_failures=9))
    traffic = TrafficSettings(overrides={"default/a": strict, "default/b": loose})
    reg = EndpointRegistry(traffic=traffic)
    gone: list[set[str]] = []
    reg.on_gone = gone.append
    targets = reg.build(_cfg(tmp_path, [9001, 9002], [9001]))
    (shared_in_a, only_a), (shared_in_b,) = targets[("default", "a")], targets[("default", "b")]
    assert shared_in_a.health is shared_in_b.health  # one engine, one health object
    assert shared_in_a.health.policy.consecutive_failures == 2  # "default/a" sorts first
    assert only_a.key == B and gone == []
    reg.build(_cfg(tmp_path, [9001], [9001]))
    assert gone == [{B}]


def test_prune_drops_every_child_of_a_gone_endpoint() -> None:
    m = RouterMetrics(CollectorRegistry())
    for ep in (A, B):
        m.observe_request("m", "/v1/completions", 200, "", "default/r", "default/s", ep, 0.01)
        m.upstream("default/r", "default/s", ep).inc()
        m.upstream_error("default/s", ep, "timeout")
        m.set_endpoint_healthy("default/s", ep, True)
        m.decision("default/s", ep)
        m.stalled_attempts(ep, 1)
        m.set_metrics_stale(ep, False)
    m.retry("default/s")
    m.prune_endpoints({A})

    def endpoints_exported() -> set[str]:
        return {s.labels["endpoint"] for fam in m.registry.collect() for s in fam.samples if "endpoint" in s.labels}

    assert endpoints_exported() == {B}
    assert not [k for k in m._children if A in k]
    # the survivor and label-less families are untouched; a returning endpoint starts afresh
    m.upstream_error("default/s", A, "timeout")
    assert endpoints_exported() == {A, B}


def test_a_router_configuration_reload_reaches_health_and_panic(tmp_path: Path) -> None:
    from kthena_router.endpoints.selection import EndpointSelector

    current = [TrafficSettings()]
    reg = EndpointRegistry(traffic=lambda: current[0])
    sel = EndpointSelector(lambda: current[0])
    targets = reg.build(_cfg(tmp_path, [9001], [9002]))
    assert sel.threshold(("default", "a")) == 50.0
    strict = ServerTraffic(outlier=OutlierDetection(consecutive_failures=2, panic_threshold_percent=10.0))
    current[0] = TrafficSettings(overrides={"default/a": strict})  # installed by a reload
    reg.apply_policies(targets)
    (ep_a,), (ep_b,) = targets[("default", "a")], targets[("default", "b")]
    assert ep_a.health.policy.consecutive_failures == 2 and ep_b.health.policy.consecutive_failures == 5
    assert sel.threshold(("default", "a")) == 10.0 and sel.threshold(("default", "b")) == 50.0
