"""The router configuration's `fairness` section: priority classes, saturation, costs.

Ours, not a Kthena CRD field (Kthena configures fairness with FAIRNESS_* environment
variables; docs/fairness.md maps each one to a key below). The router reads no environment
variable for it.

    fairness:
      enabled: true                       # ENABLE_FAIRNESS_SCHEDULING
      priorityClasses:                    # served by ascending order; equal orders share a level
      - {name: interactive, order: 0, maxQueueLength: 1000, maxWaitSeconds: 30, weight: 1}
      - {name: default, order: 1, maxQueueLength: 1000, maxWaitSeconds: 60}
      defaultPriority: default            # class of a request that names none
      routes:                             # per-route default class; "name" or "namespace/name"
        chat-route: {defaultPriority: interactive}
      saturation:
        maxInFlightPerEndpoint: auto      # an integer, or auto (learned), per worker
        maxInFlight: 64                   # per ModelServer, per worker (FAIRNESS_MAX_CONCURRENT)
        maxWaitingPerEndpoint: 4          # engines' waiting queues (scraped)
      cost: {inputTokenWeight: 1, outputTokenWeight: 2, tokenWeight: 1, requestWeight: 0}
      tenants: {acme: {weight: 2}}
      defaultTenantWeight: 1
      tenantIdleSeconds: 300              # FAIRNESS_WINDOW_SIZE
      retryAfterSeconds: 1
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from ..config.checks import check_int, check_list, check_mapping, check_str, join_path, named_overrides, type_name

__all__ = ["FairnessSettings", "PriorityClass", "Saturation", "parse_fairness", "DEFAULT_CLASS"]

DEFAULT_CLASS = "default"
_MAX_LEN = 1 << 30


class Collector(Protocol):
    def err(self, path: str, message: str) -> None: ...
    def warn(self, path: str, message: str) -> None: ...


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    order: int = 0
    max_queue_length: int = 1000
    max_wait_s: float = 60.0  # Kthena's FAIRNESS_QUEUE_TIMEOUT default
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Saturation:
    max_in_flight_per_endpoint: int | None = None  # None: learned when `learn`, else no limit
    learn: bool = True  # maxInFlightPerEndpoint: auto
    max_in_flight: int | None = None
    max_waiting_per_endpoint: int | None = None


@dataclass(frozen=True, slots=True)
class FairnessSettings:
    enabled: bool = True
    classes: tuple[PriorityClass, ...] = (PriorityClass(DEFAULT_CLASS),)
    default_priority: str = DEFAULT_CLASS
    route_priority: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # "ns/name" -> class
    saturation: Saturation = Saturation()
    input_weight: float = 1.0
    output_weight: float = 2.0
    token_weight: float = 1.0
    request_weight: float = 0.0
    tenant_weights: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    default_tenant_weight: float = 1.0
    tenant_idle_s: float = 300.0
    retry_after_s: float = 1.0

    def class_index(self, name: str) -> int | None:
        for i, c in enumerate(self.classes):
            if c.name == name:
                return i
        return None

    def queue_shape(self) -> tuple[Any, ...]:
        """What a Rust queue is built from; a reload that changes it rebuilds the queues."""
        return (tuple((c.name, c.order, c.weight) for c in self.classes),
                self.input_weight, self.output_weight, self.token_weight, self.request_weight)


def _number(c: Collector, v: Any, path: str, *, positive: bool) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        c.err(path, f"must be a number, got {type_name(v)} {v!r}")
        return None
    if v < 0 or (positive and v == 0):
        c.err(path, f"must be {'greater than 0' if positive else 'at least 0'}, got {v!r}")
        return None
    return float(v)


def _classes(c: Collector, v: Any, path: str) -> tuple[PriorityClass, ...]:
    out: list[PriorityClass] = []
    names: set[str] = set()
    for i, item in enumerate(check_list(c, v, path)):
        p = f"{path}[{i}]"
        m = check_mapping(c, item, p, ("name", "order", "maxQueueLength", "maxWaitSeconds", "weight"),
                          required=("name",))
        if m is None:
            continue
        name = check_str(c, m.get("name"), f"{p}.name")
        if name is None:
            continue
        if name in names:
            c.err(f"{p}.name", f"duplicate priority class {name!r}")
            continue
        names.add(name)
        d = PriorityClass(name)
        order = check_int(c, m.get("order"), f"{p}.order", 0, 1 << 31)
        length = check_int(c, m.get("maxQueueLength"), f"{p}.maxQueueLength", 0, _MAX_LEN)
        wait = _number(c, m.get("maxWaitSeconds"), f"{p}.maxWaitSeconds", positive=True)
        weight = _number(c, m.get("weight"), f"{p}.weight", positive=True)
        out.append(PriorityClass(name, d.order if order is None else order,
                                 d.max_queue_length if length is None else length,
                                 d.max_wait_s if wait is None else wait, d.weight if weight is None else weight))
    if isinstance(v, list) and not v:
        c.err(path, "must list at least one priority class")
    return tuple(out) or (PriorityClass(DEFAULT_CLASS),)


def _saturation(c: Collector, v: Any, path: str) -> Saturation:
    if v is None:
        return Saturation()
    m = check_mapping(c, v, path, ("maxInFlightPerEndpoint", "maxInFlight", "maxWaitingPerEndpoint"))
    if m is None:
        return Saturation()
    per_ep: int | None = None
    learn = True
    raw = m.get("maxInFlightPerEndpoint", "auto")
    if isinstance(raw, str) and raw != "auto":
        c.err(f"{path}.maxInFlightPerEndpoint", f"must be an integer >= 1 or \"auto\", got {raw!r}")
    elif raw != "auto":
        per_ep = check_int(c, raw, f"{path}.maxInFlightPerEndpoint", 1)
        learn = False
    return Saturation(per_ep, learn, check_int(c, m.get("maxInFlight"), f"{path}.maxInFlight", 1),
                      check_int(c, m.get("maxWaitingPerEndpoint"), f"{path}.maxWaitingPerEndpoint", 0))


def _class_name(c: Collector, v: Any, path: str, known: set[str]) -> str | None:
    name = check_str(c, v, path)
    if name is not None and name not in known:
        c.err(path, f"no priority class {name!r} (classes: {', '.join(sorted(known))})")
        return None
    return name


def parse_fairness(c: Collector, v: Any, path: str = "fairness") -> FairnessSettings | None:
    """Validate the `fairness` mapping (None when absent); problems go to `c`."""
    if v is None:
        return None
    keys = ("enabled", "priorityClasses", "defaultPriority", "routes", "saturation", "cost", "tenants",
            "defaultTenantWeight", "tenantIdleSeconds", "retryAfterSeconds")
    m = check_mapping(c, v, path, keys)
    if m is None:
        return None
    d = FairnessSettings()
    enabled = m.get("enabled", True)
    if not isinstance(enabled, bool):
        c.err(f"{path}.enabled", f"must be true or false, got {type_name(enabled)} {enabled!r}")
        enabled = True
    classes = _classes(c, m.get("priorityClasses"), f"{path}.priorityClasses")
    known = {k.name for k in classes}
    default = m.get("defaultPriority")
    if default is None:
        if DEFAULT_CLASS not in known:
            c.err(f"{path}.defaultPriority", f"required when no priority class is named {DEFAULT_CLASS!r}")
        default_name = DEFAULT_CLASS
    else:
        default_name = _class_name(c, default, f"{path}.defaultPriority", known) or DEFAULT_CLASS
    routes: dict[str, str] = {}
    for key, p, item in named_overrides(c, m.get("routes"), f"{path}.routes", "ModelRoute"):
        rm = check_mapping(c, item, p, ("defaultPriority",), required=("defaultPriority",))
        if rm is None:
            continue
        cls = _class_name(c, rm.get("defaultPriority"), f"{p}.defaultPriority", known)
        if cls is not None:
            if key in routes:
                c.err(p, f"route {key} is listed twice")
            routes[key] = cls
    cost = check_mapping(c, m.get("cost", {}), f"{path}.cost",
                         ("inputTokenWeight", "outputTokenWeight", "tokenWeight", "requestWeight")) or {}
    weights = {k: _number(c, cost.get(k), f"{path}.cost.{k}", positive=False)
               for k in ("inputTokenWeight", "outputTokenWeight", "tokenWeight", "requestWeight")}
    tenants: dict[str, float] = {}
    raw_tenants = m.get("tenants")
    if raw_tenants is not None and not isinstance(raw_tenants, dict):
        c.err(f"{path}.tenants", f"must be a mapping of tenant to settings, got {type_name(raw_tenants)}")
        raw_tenants = None
    for name, item in (raw_tenants or {}).items():
        p = join_path(f"{path}.tenants", str(name))
        tm = check_mapping(c, item, p, ("weight",), required=("weight",))
        w = _number(c, tm.get("weight"), f"{p}.weight", positive=True) if tm is not None else None
        if isinstance(name, str) and w is not None:
            tenants[name] = w
    dtw = _number(c, m.get("defaultTenantWeight"), f"{path}.defaultTenantWeight", positive=True)
    idle = _number(c, m.get("tenantIdleSeconds"), f"{path}.tenantIdleSeconds", positive=True)
    retry = _number(c, m.get("retryAfterSeconds"), f"{path}.retryAfterSeconds", positive=True)

    def pick(x: float | None, default_value: float) -> float:
        return default_value if x is None else x

    return FairnessSettings(
        enabled=enabled, classes=classes, default_priority=default_name,
        route_priority=MappingProxyType(routes), saturation=_saturation(c, m.get("saturation"), f"{path}.saturation"),
        input_weight=pick(weights["inputTokenWeight"], d.input_weight),
        output_weight=pick(weights["outputTokenWeight"], d.output_weight),
        token_weight=pick(weights["tokenWeight"], d.token_weight),
        request_weight=pick(weights["requestWeight"], d.request_weight),
        tenant_weights=MappingProxyType(tenants), default_tenant_weight=pick(dtw, d.default_tenant_weight),
        tenant_idle_s=pick(idle, d.tenant_idle_s), retry_after_s=pick(retry, d.retry_after_s))
