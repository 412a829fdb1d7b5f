"""The autoscaler benchmark's configurations: an AutoscalingPolicy spec (the real parser and
algorithm read it) and the signal the collector reads for it.

- `stable`: metric `num_requests_waiting` (the engines' `vllm:num_requests_waiting`, the
  collector's engine default) per pod; behaviour: Kthena's webhook defaults for scale-up
  (+4 / +100 % per 1 m) and scale-down (5 m window, -100 % per 1 m), panic mode off;
- `panic`: the same with a panicPolicy (threshold 200 %, +200 % per 30 s, hold 1 m);
- `router`: metric `router:tokens_per_second` read from the router's /metrics page
  (branch wp-autoscaler-router: a collector option pointing at router pages; the router
  exports kthena_router_endpoint_tokens_total on branch wp-router-signals), the same
  behaviour as `panic`.

All durations are trace seconds (the harness runs the algorithm on the trace clock).
targetValues have no default here: the benchmark is told them (chosen on tuning seeds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller.autoscaler.collector import Collector

CONFIGS = ("stable", "panic", "router")
ROUTER_METRIC = "router:tokens_per_second"

STABLE_BEHAVIOR: dict[str, Any] = {
    "scaleUp": {"stablePolicy": {"instances": 4, "percent": 100, "period": "1m", "selectPolicy": "Or",
                                 "stabilizationWindow": "0s"},
                "panicPolicy": {"percent": 0, "period": "0s", "panicThresholdPercent": 200, "panicModeHold": "0s"}},
    "scaleDown": {"instances": 0, "percent": 100, "period": "1m", "selectPolicy": "Or",
                  "stabilizationWindow": "5m"},
}
PANIC_POLICY: dict[str, Any] = {"percent": 200, "period": "30s", "panicThresholdPercent": 200,
                                "panicModeHold": "1m"}


@dataclass(frozen=True)
class BenchConfig:
    name: str
    spec: dict[str, Any]  # AutoscalingPolicy spec
    sources: dict[str, Any] | None  # the target's metricSources

    def collector(self, timeout_s: float, router_metrics_url: str, sim_clock: Callable[[], float],
                  compression: float) -> Collector:
        """The real collector; for `router` with a RouterSource on the router's page.

        The source's clock is the simulated one, so rates are tokens per simulated second
        (the engines' physics); its intervals (1 s between fetches, a rate over at least 5 s,
        pages kept 10 m: the controller's defaults) are trace seconds, compressed.
        """
        if self.name != "router":
            return Collector(timeout_s=timeout_s)
        try:  # branch wp-autoscaler-router (merged): --router-metrics-url's source
            from controller.autoscaler.router_source import RouterSource
        except ImportError as exc:
            raise NotImplementedError("configuration 'router' needs controller/autoscaler/router_source.py "
                                      "(branch wp-autoscaler-router)") from exc
        source = RouterSource([router_metrics_url], min_interval_s=1.0 / compression, min_rate_s=5.0 / compression,
                              max_age_s=600.0 / compression, clock=sim_clock)
        return Collector(timeout_s=timeout_s, router=source)  # type: ignore[call-arg]


def make_config(name: str, target: float, min_replicas: int, max_replicas: int, engine_port: int) -> BenchConfig:
    if name not in CONFIGS:
        raise ValueError(f"unknown configuration {name!r} (one of {', '.join(CONFIGS)})")
    behavior = {"scaleUp": dict(STABLE_BEHAVIOR["scaleUp"]), "scaleDown": dict(STABLE_BEHAVIOR["scaleDown"])}
    if name != "stable":
        behavior["scaleUp"]["panicPolicy"] = dict(PANIC_POLICY)
    metric = ROUTER_METRIC if name == "router" else "num_requests_waiting"
    sources = None if name == "router" else {metric: {"pod": {"port": engine_port, "uri": "/metrics"}}}
    spec = {
        "tolerancePercent": 10,
        "metrics": [{"name": metric, "targetValue": str(target)}],
        "behavior": behavior,
        "homogeneousTarget": {"target": {"targetRef": {"kind": "ModelServing", "name": "llm"},
                                         **({"metricSources": sources} if sources else {})},
                              "minReplicas": min_replicas, "maxReplicas": max_replicas},
    }
    return BenchConfig(name, spec, sources)
