"""The autoscaler benchmark's configurations: an AutoscalingPolicy spec (the real parser and
algorithm read it) and the signal the collector reads for it.

- `stable`: metric `num_requests_waiting` (the engines' `vllm:num_requests_waiting`, the
  collector's engine default) per pod; behaviour: Kthena's webhook defaults for scale-up
  (+4 / +100 % per 1 m) and scale-down (5 m window, -100 % per 1 m), panic mode off;
- `panic`: the same with a panicPolicy (threshold 200 %, +200 % per 30 s, hold 1 m);
- `router`: metric `router:tokens_per_second` read from the router's /metrics page
  (`kthena_router_endpoint_tokens_total`, per pod by IP) through the collector's
  `RouterSource` (the controller's `--router-metrics-url`), the same behaviour as `panic`.

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
                  rate_window_s: float) -> Collector:
        """The real collector; for `router` with the controller's RouterSource on the router's page.

        The source's clock is the simulated one: rates are tokens per simulated second (the
        engines' physics). The router counts a request's tokens when it completes (the
        engine's usage), so the counter moves in steps of one request: the rate window
        (`rate_window_s`, simulated) is not compressed with the trace, or it would hold a
        fraction of a request; pages are fetched every fifth of it.
        """
        if self.name != "router":
            return Collector(timeout_s=timeout_s)
        try:  # branch wp-autoscaler-router: the controller's --router-metrics-url source
            from controller.autoscaler.router_source import RouterSource
        except ImportError as exc:
            raise NotImplementedError("configuration 'router' needs controller/autoscaler/router_source.py "
                                      "(branch wp-autoscaler-router)") from exc
        source = RouterSource([router_metrics_url], min_interval_s=rate_window_s / 5, min_rate_s=rate_window_s,
                              max_age_s=20 * rate_window_s, clock=sim_clock)
        return Collector(timeout_s=timeout_s, router=source)


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
