"""The router configuration's `traffic` section: parsing, validation, per-server resolution."""

from __future__ import annotations

import pytest

from kthena_router.config.errors import ConfigError
from kthena_router.config.traffic import DEFAULT_TRAFFIC, Timeouts
from kthena_router.scheduling.config import load_router_configuration_bytes


def _load(text: str):
    return load_router_configuration_bytes(text, source="rc.yaml")


def test_absent_section_gives_defaults() -> None:
    rc = _load("scheduler: {plugins: {Score: {enabled: [{name: random}]}}}\n")
    assert rc.traffic is DEFAULT_TRAFFIC
    eff = rc.traffic.for_server("default", "x", None)
    assert eff.timeouts == Timeouts()


def test_defaults_overrides_and_crd_timeout_precedence() -> None:
    rc = _load("""
traffic:
  timeouts: {firstToken: 10s, idle: 0s, total: 2m}
  outlierDetection: {consecutiveFailures: 3, failureRatePercent: 0}
  admission: {maxInFlightPerWorker: 0, retryAfter: 2s}
  maxBufferedResponseBytes: 1024
  modelServers:
    big: {timeouts: {firstToken: 120s}}
    other/slow: {timeouts: {response: 5m}}
""")
    t = rc.traffic
    d = t.for_server("default", "plain", None)
    assert (d.timeouts.first_token_s, d.timeouts.idle_s, d.timeouts.total_s) == (10.0, None, 120.0)
    assert d.timeouts.response_s == 60.0
    assert d.outlier.consecutive_failures == 3 and d.outlier.failure_rate_percent is None
    assert d.max_buffered_response_bytes == 1024
    assert (t.admission.max_in_flight_per_worker, t.admission.retry_after_s) == (0, 2.0)
    # the ModelServer's own trafficPolicy.timeout beats the default response timeout ...
    assert t.for_server("default", "plain", 7.0).timeouts.response_s == 7.0
    # ... an override keyed by name inherits the section's defaults and adds its own ...
    big = t.for_server("default", "big", 7.0)
    assert (big.timeouts.first_token_s, big.timeouts.total_s, big.timeouts.response_s) == (120.0, 120.0, 7.0)
    # ... and an override's own response timeout beats the ModelServer's.
    assert t.for_server("other", "slow", 7.0).timeouts.response_s == 300.0


@pytest.mark.parametrize("body, field", [
    ("traffic: {timeouts: {connect: 0s}}", "traffic.timeouts.connect"),
    ("traffic: {timeouts: {firstToken: fast}}", "traffic.timeouts.firstToken"),
    ("traffic: {timeouts: {idel: 5s}}", "traffic.timeouts.idel"),
    ("traffic: {outlierDetection: {panicThresholdPercent: 150}}", "traffic.outlierDetection.panicThresholdPercent"),
    ("traffic: {outlierDetection: {consecutiveFailures: 0}}", "traffic.outlierDetection.consecutiveFailures"),
    ("traffic: {outlierDetection: {baseEjectionTime: 60s}}", "traffic.outlierDetection.baseEjectionTime"),
    ("traffic: {admission: {maxInFlightPerWorker: -1}}", "traffic.admission.maxInFlightPerWorker"),
    ("traffic: {modelServers: {a/b/c: {}}}", 'traffic.modelServers["a/b/c"]'),
    ("traffic: {modelServers: {x: {timeouts: {idle: 1}}}}", "traffic.modelServers.x.timeouts.idle"),
    ("traffic: [1]", "traffic"),
])
def test_invalid_values_name_the_field(body: str, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        _load(body + "\n")
    assert exc.value.file == "rc.yaml"
    assert any(p.field == field for p in exc.value.problems), str(exc.value)
