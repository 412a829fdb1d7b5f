"""The router configuration's `traffic` section: timeouts, outlier detection, admission.

Ours, not Kthena's: Kthena's CRDs are never extended, so these settings live in the router
configuration file (--router-config) with per-ModelServer overrides keyed by name:

    traffic:
      timeouts: {connect: 5s, response: 60s, firstToken: 60s, idle: 60s, total: 0s, poolWait: 5s}
      outlierDetection: {consecutiveFailures: 5, failureRatePercent: 50, failureRateMinRequests: 20,
                         interval: 10s, baseEjectionTime: 1s, maxEjectionTime: 30s,
                         panicThresholdPercent: 50, stallFactor: 4, stallMinimum: 2s}
      admission: {maxInFlightPerWorker: 1024, retryAfter: 1s}
      maxBufferedResponseBytes: 67108864
      modelServers:                 # overrides; key "name" (namespace default) or "namespace/name"
        llama-70b: {timeouts: {firstToken: 120s}, outlierDetection: {consecutiveFailures: 10}}

Meaning of the timeouts (a duration of 0s switches one off, except connect and poolWait):
- response: Kthena's ModelServer `trafficPolicy.timeout`: connecting, sending the request and
  waiting for the response headers. Engines send a non-streamed reply's headers when
  generation ends, so it bounds the whole generation there, as in Kthena. Precedence: a
  `modelServers` override, then the ModelServer's own trafficPolicy.timeout, then this default.
- firstToken: streams, from sending the request until the first SSE data event.
- idle: streams, the longest gap between two events (also between body chunks of a buffered reply).
- total: the whole request, all attempts included; 0s = none.
- poolWait: waiting for a free upstream connection when the pool is exhausted (then 503).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from .checks import named_overrides
from .duration import parse_duration

__all__ = ["Timeouts", "OutlierDetection", "Admission", "ServerTraffic", "TrafficSettings",
           "DEFAULT_TRAFFIC", "parse_traffic"]


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 5.0
    response_s: float | None = 60.0  # None: no bound
    first_token_s: float | None = 60.0
    idle_s: float | None = 60.0
    total_s: float | None = None
    pool_wait_s: float = 5.0


@dataclass(frozen=True, slots=True)
class OutlierDetection:
    """Envoy-style: an endpoint is ejected on consecutive failures or on its failure rate
    over a sliding interval, never on one failure."""

    consecutive_failures: int = 5
    failure_rate_percent: float | None = 50.0  # None: rate-based ejection off
    failure_rate_min_requests: int = 20  # fewer outcomes in the interval: no rate decision
    interval_s: float = 10.0
    base_ejection_s: float = 1.0  # doubles per consecutive ejection, capped
    max_ejection_s: float = 30.0
    # When fewer than this share of a server's endpoints are healthy, route to all of them
    # (Envoy's panic threshold): better a try than a certain 503.
    panic_threshold_percent: float = 50.0
    # A request still waiting for its first byte after max(stallMinimum, stallFactor x the
    # endpoint's recent TTFT) counts against the endpoint before any timeout fires.
    stall_factor: float = 4.0
    stall_min_s: float = 2.0


@dataclass(frozen=True, slots=True)
class Admission:
    max_in_flight_per_worker: int = 1024  # then 503 + Retry-After; 0 = unlimited
    retry_after_s: float = 1.0


@dataclass(frozen=True, slots=True)
class ServerTraffic:
    """The effective settings of one ModelServer (defaults with its override applied)."""

    timeouts: Timeouts = field(default_factory=Timeouts)
    outlier: OutlierDetection = field(default_factory=OutlierDetection)
    max_buffered_response_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TrafficSettings:
    defaults: ServerTraffic = field(default_factory=ServerTraffic)
    admission: Admission = field(default_factory=Admission)
    # "namespace/name" -> effective settings (override applied over the defaults); the
    # response timeout here already wins over the ModelServer's trafficPolicy.timeout.
    overrides: Mapping[str, ServerTraffic] = field(default_factory=lambda: MappingProxyType({}))
    # "namespace/name" -> the override's raw `timeouts.response` presence (True when set)
    response_overridden: frozenset[str] = frozenset()

    def for_server(self, namespace: str, name: str, crd_timeout_s: float | None) -> ServerTraffic:
        """Effective settings of a ModelServer; `crd_timeout_s` is its trafficPolicy.timeout."""
        key = f"{namespace}/{name}"
        eff = self.overrides.get(key, self.defaults)
        if crd_timeout_s is not None and key not in self.response_overridden:
            eff = dataclasses.replace(eff, timeouts=dataclasses.replace(eff.timeouts, response_s=crd_timeout_s or None))
        return eff


DEFAULT_TRAFFIC = TrafficSettings()


class Collector(Protocol):
    def err(self, path: str, message: str) -> None: ...
    def warn(self, path: str, message: str) -> None: ...


# YAML key -> (field, kind). Kinds: "dur" (>0), "dur0" (0 = off -> None), "int", "pct", "pos".
_TIMEOUT_KEYS = {
    "connect": ("connect_s", "dur"), "response": ("response_s", "dur0"),
    "firstToken": ("first_token_s", "dur0"), "idle": ("idle_s", "dur0"), "total": ("total_s", "dur0"),
    "poolWait": ("pool_wait_s", "dur"),
}
_OUTLIER_KEYS = {
    "consecutiveFailures": ("consecutive_failures", "int"),
    "failureRatePercent": ("failure_rate_percent", "pct0"),
    "failureRateMinRequests": ("failure_rate_min_requests", "int"),
    "interval": ("interval_s", "dur"),
    "baseEjectionTime": ("base_ejection_s", "dur"),
    "maxEjectionTime": ("max_ejection_s", "dur"),
    "panicThresholdPercent": ("panic_threshold_percent", "pct"),
    "stallFactor": ("stall_factor", "pos"),
    "stallMinimum": ("stall_min_s", "dur"),
}
_ADMISSION_KEYS = {
    "maxInFlightPerWorker": ("max_in_flight_per_worker", "int0"),
    "retryAfter": ("retry_after_s", "dur"),
}
_SERVER_KEYS = ("timeouts", "outlierDetection", "maxBufferedResponseBytes")
_TOP_KEYS = ("timeouts", "outlierDetection", "admission", "maxBufferedResponseBytes", "modelServers")


def _value(c: Collector, v: Any, path: str, kind: str) -> tuple[bool, Any]:
    """(ok, value) of one setting."""
    if kind.startswith("dur"):
        if not isinstance(v, str):
            c.err(path, f"must be a duration string like \"30s\", got {type(v).__name__} {v!r}")
            return False, None
        try:
            seconds = parse_duration(v)
        except ValueError as e:
            c.err(path, str(e))
            return False, None
        if seconds < 0 or (kind == "dur" and seconds == 0):
            c.err(path, f"must be {'greater than 0' if kind == 'dur' else 'at least 0s'}, got {v!r}")
            return False, None
        return True, (None if kind == "dur0" and seconds == 0 else seconds)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        c.err(path, f"must be a number, got {type(v).__name__} {v!r}")
        return False, None
    if kind in ("int", "int0"):
        if not isinstance(v, int) or v < (0 if kind == "int0" else 1):
            c.err(path, f"must be an integer >= {0 if kind == 'int0' else 1}, got {v!r}")
            return False, None
        return True, v
    if kind in ("pct", "pct0"):
        if not 0 <= v <= 100:
            c.err(path, f"must be a percentage in 0..100, got {v!r}")
            return False, None
        return True, (None if kind == "pct0" and v == 0 else float(v))
    if v <= 0:  # "pos"
        c.err(path, f"must be greater than 0, got {v!r}")
        return False, None
    return True, float(v)


def _mapping(c: Collector, v: Any, path: str, known: tuple[str, ...]) -> dict[str, Any] | None:
    if v is None:
        return {}
    if not isinstance(v, dict):
        c.err(path, f"must be a mapping, got {type(v).__name__}")
        return None
    for k in v:
        if k not in known:
            c.err(f"{path}.{k}", f"unknown field (known: {', '.join(known)})")
    return v


def _struct(c: Collector, base: Any, v: Any, path: str, keys: dict[str, tuple[str, str]]) -> tuple[Any, set[str]]:
    """`base` with the fields present in `v` replaced; also the YAML keys that were set."""
    m = _mapping(c, v, path, tuple(keys))
    changes: dict[str, Any] = {}
    present: set[str] = set()
    for k, raw in (m or {}).items():
        if k not in keys:
            continue
        ok, value = _value(c, raw, f"{path}.{k}", keys[k][1])
        if ok:
            changes[keys[k][0]] = value
            present.add(k)
    return (dataclasses.replace(base, **changes) if changes else base), present


def _server(c: Collector, base: ServerTraffic, v: Any, path: str) -> tuple[ServerTraffic, bool]:
    """(settings, whether timeouts.response was set)."""
    m = _mapping(c, v, path, _SERVER_KEYS) or {}
    timeouts, t_keys = _struct(c, base.timeouts, m.get("timeouts"), f"{path}.timeouts", _TIMEOUT_KEYS)
    outlier, _ = _struct(c, base.outlier, m.get("outlierDetection"), f"{path}.outlierDetection", _OUTLIER_KEYS)
    if outlier.base_ejection_s > outlier.max_ejection_s:
        c.err(f"{path}.outlierDetection.baseEjectionTime", "must not exceed maxEjectionTime")
    cap = base.max_buffered_response_bytes
    if "maxBufferedResponseBytes" in m:
        ok, value = _value(c, m["maxBufferedResponseBytes"], f"{path}.maxBufferedResponseBytes", "int")
        cap = value if ok else cap
    return ServerTraffic(timeouts, outlier, cap), "response" in t_keys


def parse_traffic(c: Collector, v: Any, path: str = "traffic") -> TrafficSettings:
    """Validate the `traffic` mapping; problems go to `c` (the result then holds defaults)."""
    m = _mapping(c, v, path, _TOP_KEYS)
    if not m:
        return DEFAULT_TRAFFIC
    defaults, _ = _server(c, ServerTraffic(), {k: m[k] for k in _SERVER_KEYS if k in m}, path)
    admission, _ = _struct(c, Admission(), m.get("admission"), f"{path}.admission", _ADMISSION_KEYS)
    overrides: dict[str, ServerTraffic] = {}
    response_set: set[str] = set()
    for key, p, raw in named_overrides(c, m.get("modelServers"), f"{path}.modelServers", "ModelServer"):
        eff, response = _server(c, defaults, raw, p)
        overrides[key] = eff
        if response:
            response_set.add(key)
    return TrafficSettings(defaults, admission, MappingProxyType(overrides), frozenset(response_set))
