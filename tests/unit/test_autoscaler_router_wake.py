"""The routers' signals in the algorithm: router: metric checks, the ModelServers that select a
ModelServing (its pods as rendered), the wake signal wired as the controller does (replayed
over router pages: pending at zero replicas -> 1, drained -> back to 0 after the scale-down
window; without routers never down to zero), and the --router-metrics-url flag."""

from __future__ import annotations

from typing import Any

import pytest

from controller.autoscaler import Observation, ScalerState, recommend_homogeneous
from controller.autoscaler.controller import WAKE
from controller.autoscaler.router_metrics import (
    WAKE_METRIC, entry_labels, router_metric_error, router_samples, selecting_servers, split_metrics, woken,
)
from controller.autoscaler.router_source import RouterSource
from controller.cli import _autoscaler, build_parser
from controller.manager import AutoscalerConfig
from tests.unit.autoscaler_fixtures import behavior, homogeneous
from tests.unit.test_autoscaler_router_source import MS, page


def test_router_metric_checks() -> None:
    ok = {"router:tokens_per_second": 10.0, "load": 1.0}
    assert split_metrics(ok) == (["load"], ["router:tokens_per_second"])
    assert router_metric_error(ok, {"load": {"pod": {}}}, "spec.homogeneousTarget", True) is None
    assert router_metric_error({"load": 1.0}, None, "w", False) is None  # no router metric: no routers needed
    err = router_metric_error(ok, {"router:tokens_per_second": {"pod": {}}}, "spec.homogeneousTarget", True)
    assert err is not None and "spec.homogeneousTarget: metricSources['router:tokens_per_second']" in err
    err = router_metric_error({"router:queue": 1.0}, None, "w", True)
    assert err is not None and "unknown router metric router:queue" in err and "router:kv_cache_usage" in err
    err = router_metric_error({WAKE_METRIC: 1.0}, None, "w", True)
    assert err is not None and "unknown router metric" in err  # the wake signal is not a policy metric
    err = router_metric_error(ok, None, "w", False)
    assert err is not None and "needs the controller's --router-metrics-url" in err


def _ms(template_labels: dict[str, str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"spec": {"containers": []}}
    if template_labels:
        entry["metadata"] = {"labels": template_labels}
    return {"metadata": {"name": "llm", "namespace": "ns"},
            "spec": {"replicas": 0, "template": {"roles": [{"name": "leader", "entryTemplate": entry}]}}}


def _server(name: str, labels: dict[str, str] | None, ns: str = "ns") -> dict[str, Any]:
    spec: dict[str, Any] = {"inferenceEngine": "vLLM", "workloadSelector": {}}
    if labels is not None:
        spec["workloadSelector"]["matchLabels"] = labels
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec}


def test_model_servers_selecting_a_modelserving_at_zero_replicas() -> None:
    ms = _ms({"app": "llm"})
    assert entry_labels(ms) == [{"modelserving.volcano.sh/name": "llm", "modelserving.volcano.sh/role": "leader",
                                 "modelserving.volcano.sh/entry": "true", "app": "llm"}]
    servers = [_server("by-name", {"modelserving.volcano.sh/name": "llm"}), _server("by-app", {"app": "llm"}),
               _server("both", {"app": "llm", "modelserving.volcano.sh/role": "leader"}),
               _server("other", {"app": "other"}), _server("elsewhere", {"app": "llm"}, ns="x"),
               _server("everything", None)]
    assert selecting_servers(servers, "ns", ms) == ["ns/both", "ns/by-app", "ns/by-name", "ns/everything"]
    # a label only the existing pods carry
    pod = {"metadata": {"labels": {"tier": "gold"}}}
    assert selecting_servers([_server("gold", {"tier": "gold"})], "ns", ms) == []
    assert selecting_servers([_server("gold", {"tier": "gold"})], "ns", ms, [pod]) == ["ns/gold"]


EP = "10.0.0.1:8000"


def test_scale_from_zero_and_back_through_the_router_signals() -> None:
    """Rounds every 15 s; each round the router page, the pods' IPs (ready ones), then the
    recommendation applied, as the controller's homogeneous round."""
    policy = homogeneous(0, 3, metrics={"router:tokens_per_second": "100"},
                         beh=behavior(down={"stabilizationWindow": "60s"}))
    # (pending, output tokens so far, ready pod IPs)
    trace = [(0, 0, []), (1, 0, []), (1, 0, []), (0, 750, ["10.0.0.1"])] + [(0, 750, ["10.0.0.1"])] * 5 + \
        [(0, 750, [])]
    src = RouterSource(["http://127.0.0.1:1/metrics"], min_rate_s=7.5)
    state, current = ScalerState(), 0
    got: list[tuple[int, bool]] = []
    for i, (pending, out, ips) in enumerate(trace):
        now = 1000.0 + 15 * i
        p = page(now, tokens={(MS, EP, "output"): out} if out else {}, pending={("m", MS): pending})
        snap = src.record([p])
        obs = woken(Observation(router_samples(["router:tokens_per_second"], ips, snap)), snap, [MS])
        rec, state = recommend_homogeneous(policy, state, obs, current, now, WAKE)
        got.append((rec.replicas, rec.skipped))
        current = rec.replicas
    assert [r for r, _ in got] == [0, 1, 1, 1, 1, 1, 1, 1, 0, 0]
    # at zero nothing pending: skipped; pending -> 1 although no pod reports anything; the new pod
    # not ready yet: skipped at 1; 50 tokens/s on 1 (wants 1); idle: 0 wanted, the 60 s window
    # keeps 1 until the round 60 s after the last 1 has aged out; then 0, and skipped there
    assert [s for _, s in got] == [True, False, True, False, False, False, False, False, False, True]


def test_without_routers_min_replicas_zero_never_reaches_zero() -> None:
    policy = homogeneous(0, 3, metrics={"router:tokens_per_second": "100"})
    src = RouterSource(["http://127.0.0.1:1/metrics"], min_rate_s=1.0)
    state, current = ScalerState(), 2
    for i in range(3):
        snap = src.record([page(15.0 * i, tokens={(MS, EP, "output"): 1})])
        obs = Observation(router_samples(["router:tokens_per_second"], ["10.0.0.1", "10.0.0.2"], snap))
        rec, state = recommend_homogeneous(policy, state, obs, current, 15.0 * i, WAKE)  # no wake value
        current = rec.replicas
    assert current == 1 and "wake signal router:pending_requests missing" in rec.reason
    # a failed router: a pending sum of 0 is unknown, so no scale to zero either
    two = RouterSource(["http://127.0.0.1:1/a", "http://127.0.0.1:1/b"])
    snap = two.record([page(0.0, pending={("m", MS): 0}), None])
    assert WAKE_METRIC not in woken(Observation(), snap, [MS]).metrics
    assert woken(Observation(), None, [MS]).metrics == {}


def _config(*argv: str) -> AutoscalerConfig | None:
    return _autoscaler(build_parser().parse_args(list(argv)), AutoscalerConfig)


def test_router_metrics_url_flag() -> None:
    assert _config() == AutoscalerConfig(router_metrics_urls=())
    cfg = _config("--router-metrics-url", "http://127.0.0.1:8080/metrics",
                  "--router-metrics-url", "http://127.0.0.2:8080/metrics",
                  "--router-metrics-url", "http://127.0.0.1:8080/metrics")
    assert cfg is not None and cfg.router_metrics_urls == ("http://127.0.0.1:8080/metrics",
                                                           "http://127.0.0.2:8080/metrics")
    with pytest.raises(ValueError, match="--router-metrics-url 'router:8080/metrics'"):
        _config("--router-metrics-url", "router:8080/metrics")
    with pytest.raises(ValueError, match="not with --autoscaler=false"):
        _config("--autoscaler=false", "--router-metrics-url", "http://127.0.0.1:8080/metrics")
