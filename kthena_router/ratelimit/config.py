"""The router configuration's `rateLimits` section, and the per-key `limits` of the API keys file.

Ours, not Kthena's (Kthena's only rate limit is ModelRoute.spec.rateLimit, parsed in
config/model_route.py; its CRD is never extended). Shape (docs/ratelimit.md):

    rateLimits:
      redis: {address: "10.0.0.5:6379"}  # these limits are global (shared by routers) when set
      failMode: open                     # Redis unreachable: open (admit) | closed (503)
      leasePercent: 1                    # share of a global bucket taken per Redis round trip
      leaseIdle: 1s                      # an unused lease goes back to Redis after this long
      redisTimeout: 250ms                # one Redis call; after a failure Redis is skipped for redisRetry
      redisRetry: 1s
      maxPromptTokens: 32768             # estimated prompt tokens; over it 400
      route: {inputTokensPerUnit: .., outputTokensPerUnit: .., requestsPerUnit: .., unit: minute}
      perTenant: {...}                   # one bucket per tenant
      perUser: {...}                     # one bucket per (tenant, user)
      perTenantModel: {...}              # one bucket per (tenant, requested model)
      tenants: {acme: {...}}             # a named tenant's own limit instead of perTenant
      routes:                            # overrides keyed "namespace/name" or "name" (default namespace)
        llama: {failMode: closed, perTenant: {...}, perUser: {}}   # {} switches a limit off there

A limit's fields are Kthena's names (inputTokensPerUnit, outputTokensPerUnit, unit) plus
requestsPerUnit. `Identity.limits` (the keys file's `limits`) is a `KeyLimits`, parsed by
`parse_key_limits` (the identity package calls it while loading the keys file).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from ..config.checks import check_enum, check_int, check_mapping, check_str, is_host_port, join_path, \
    positive_duration, type_name

__all__ = ["UNIT_SECONDS", "Limit", "KeyLimits", "LimitSet", "RateLimitSettings", "parse_rate_limits",
           "parse_key_limits", "parse_limit", "route_key"]

# Kthena's units; a month is 30 days, as in Kthena (getTimeUnitDuration).
UNIT_SECONDS = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0, "month": 30 * 86400.0}
_UNITS = tuple(UNIT_SECONDS)
_MAX = 2**53  # integer budgets up to what a float (and Redis' Lua numbers) hold exactly
FAIL_MODES = ("open", "closed")


class Collector(Protocol):
    def err(self, path: str, message: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Limit:
    """One bucket shape: capacity per unit, refilled continuously (token bucket, full at start)."""

    unit: str = "second"
    input_tokens: int | None = None
    output_tokens: int | None = None
    requests: int | None = None

    @property
    def unit_s(self) -> float:
        return UNIT_SECONDS[self.unit]

    @property
    def empty(self) -> bool:
        return self.input_tokens is None and self.output_tokens is None and self.requests is None


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """An API key's own limits (keys file `limits`), on every route."""

    limit: Limit | None = None
    max_prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class LimitSet:
    """The limits of one route (the section's defaults with the route's override applied)."""

    route: Limit | None = None
    per_tenant: Limit | None = None
    per_user: Limit | None = None
    per_tenant_model: Limit | None = None
    tenants: Mapping[str, Limit] = field(default_factory=lambda: MappingProxyType({}))
    max_prompt_tokens: int | None = None
    fail_mode: str = "open"

    @property
    def empty(self) -> bool:
        return (self.route is None and self.per_tenant is None and self.per_user is None
                and self.per_tenant_model is None and not self.tenants and self.max_prompt_tokens is None)


@dataclass(frozen=True, slots=True)
class RateLimitSettings:
    defaults: LimitSet = field(default_factory=LimitSet)
    routes: Mapping[str, LimitSet] = field(default_factory=lambda: MappingProxyType({}))  # "ns/name"
    redis_address: str | None = None
    lease_percent: float = 1.0
    lease_idle_s: float = 1.0
    redis_timeout_s: float = 0.25
    redis_retry_s: float = 1.0

    def for_route(self, namespace: str, name: str) -> LimitSet:
        return self.routes.get(f"{namespace}/{name}", self.defaults)


DEFAULT_RATE_LIMITS = RateLimitSettings()

_LIMIT_KEYS = ("inputTokensPerUnit", "outputTokensPerUnit", "requestsPerUnit", "unit")
_SET_KEYS = ("route", "perTenant", "perUser", "perTenantModel", "tenants", "maxPromptTokens", "failMode")
_TOP_KEYS = _SET_KEYS + ("redis", "leasePercent", "leaseIdle", "redisTimeout", "redisRetry", "routes")
_SET_FIELDS = {"route": "route", "perTenant": "per_tenant", "perUser": "per_user",
               "perTenantModel": "per_tenant_model", "tenants": "tenants",
               "maxPromptTokens": "max_prompt_tokens", "failMode": "fail_mode"}


def route_key(name: str) -> str:
    """An override key as written ("name" or "namespace/name") -> "namespace/name"."""
    return name if "/" in name else f"default/{name}"


def parse_limit(c: Collector, v: Any, path: str, *, allow_off: bool = False) -> Limit | None:
    """One limit mapping; `{}` means "no limit" where `allow_off` (route overrides)."""
    m = check_mapping(c, v, path, _LIMIT_KEYS)
    if m is None:
        return None
    inp = check_int(c, m.get("inputTokensPerUnit"), join_path(path, "inputTokensPerUnit"), 1, _MAX)
    out = check_int(c, m.get("outputTokensPerUnit"), join_path(path, "outputTokensPerUnit"), 1, _MAX)
    req = check_int(c, m.get("requestsPerUnit"), join_path(path, "requestsPerUnit"), 1, _MAX)
    unit = "second" if m.get("unit") is None else check_enum(c, m.get("unit"), join_path(path, "unit"), _UNITS)
    limit = Limit(unit or "second", inp, out, req)
    if limit.empty and not any(m.get(k) is not None for k in _LIMIT_KEYS[:3]):
        if not allow_off:
            c.err(path, "set at least one of inputTokensPerUnit, outputTokensPerUnit, requestsPerUnit")
        return None
    return limit


def _limit_set(c: Collector, base: LimitSet, m: dict[str, Any], path: str, override: bool) -> LimitSet:
    """`base` with the set-level fields present in `m` replaced."""
    changes: dict[str, Any] = {}
    for key, attr in _SET_FIELDS.items():
        if key not in m:
            continue
        p = join_path(path, key)
        raw = m[key]
        if key == "tenants":
            tenants: dict[str, Limit] = {}
            tm = check_mapping(c, raw, p, ()) if not isinstance(raw, dict) else raw
            for name, lv in (tm or {}).items():
                if not isinstance(name, str) or not name:
                    c.err(p, f"tenant names must be non-empty strings, got {name!r}")
                    continue
                lim = parse_limit(c, lv, join_path(p, name))
                if lim is not None:
                    tenants[name] = lim
            changes[attr] = MappingProxyType(tenants)
        elif key == "maxPromptTokens":
            changes[attr] = check_int(c, raw, p, 1, _MAX)
        elif key == "failMode":
            changes[attr] = check_enum(c, raw, p, FAIL_MODES) or base.fail_mode
        else:
            changes[attr] = parse_limit(c, raw, p, allow_off=override)
    return dataclasses.replace(base, **changes) if changes else base


def parse_rate_limits(c: Collector, v: Any) -> RateLimitSettings:
    """The `rateLimits` section (absent: no limits beyond Kthena's route rateLimit)."""
    if v is None:
        return DEFAULT_RATE_LIMITS
    m = check_mapping(c, v, "rateLimits", _TOP_KEYS)
    if m is None:
        return DEFAULT_RATE_LIMITS
    defaults = _limit_set(c, LimitSet(), m, "rateLimits", override=False)
    redis_address = None
    if m.get("redis") is not None:
        r = check_mapping(c, m["redis"], "rateLimits.redis", ("address",), required=("address",))
        if r is not None and r.get("address") is not None:
            redis_address = check_str(c, r["address"], "rateLimits.redis.address")
            if redis_address is not None and not is_host_port(redis_address):
                c.err("rateLimits.redis.address", f"must be host:port, got {redis_address!r}")
    lease = m.get("leasePercent", 1.0)
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 <= lease <= 100:
        c.err("rateLimits.leasePercent", f"must be a number in 0..100, got {lease!r}")
        lease = 1.0
    routes: dict[str, LimitSet] = {}
    raw_routes = m.get("routes")
    if raw_routes is not None:
        if not isinstance(raw_routes, dict):
            c.err("rateLimits.routes", f"must be a mapping of route name to limits, got {type_name(raw_routes)}")
        else:
            for name, rv in raw_routes.items():
                p = join_path("rateLimits.routes", str(name))
                if not isinstance(name, str) or not name:
                    c.err(p, "route names must be non-empty strings")
                    continue
                rm = check_mapping(c, rv, p, _SET_KEYS)
                key = route_key(name)
                if key in routes:
                    c.err(p, f"route {key} has two overrides")
                elif rm is not None:
                    routes[key] = _limit_set(c, defaults, rm, p, override=True)
    return RateLimitSettings(
        defaults=defaults, routes=MappingProxyType(routes), redis_address=redis_address,
        lease_percent=float(lease),
        lease_idle_s=positive_duration(c, m.get("leaseIdle"), "rateLimits.leaseIdle", 1.0),
        redis_timeout_s=positive_duration(c, m.get("redisTimeout"), "rateLimits.redisTimeout", 0.25),
        redis_retry_s=positive_duration(c, m.get("redisRetry"), "rateLimits.redisRetry", 1.0))


def parse_key_limits(c: Collector, v: Any, path: str) -> KeyLimits | None:
    """An API key's `limits`: a limit's fields plus maxPromptTokens. None when absent."""
    if v is None:
        return None
    m = check_mapping(c, v, path, _LIMIT_KEYS + ("maxPromptTokens",))
    if m is None:
        return None
    cap = check_int(c, m.get("maxPromptTokens"), join_path(path, "maxPromptTokens"), 1, _MAX)
    rest = {k: m[k] for k in _LIMIT_KEYS if k in m}  # unknown keys are reported above
    limit = parse_limit(c, rest, path, allow_off=cap is not None)
    if limit is None and cap is None:
        return None
    return KeyLimits(limit, cap)
