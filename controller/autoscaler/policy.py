"""AutoscalingPolicy spec -> typed, fully defaulted model (pure; no I/O).

Defaults are applied in the order the apiserver and Kthena's mutating webhook apply them:
1. CRD field defaults, for objects that are present (a `stablePolicy: {}` gets instances 1,
   percent 100, period 15s, selectPolicy Or; a `panicPolicy` gets percent 1000,
   panicThresholdPercent 200, panicModeHold 60s; the spec gets tolerancePercent 10;
   heterogeneousTarget gets costExpansionRatePercent 200);
2. the webhook's block defaults, for blocks that are absent or empty (no scalar set):
   behavior -> scaleUp {stable: 4 instances/100%/1m/Or/window 0s, panic: 0%/period 0s/
   threshold 200/hold 0s}, scaleDown {0 instances/100%/1m/Or/window 5m}; a present scaleDown
   without stabilizationWindow gets 5m, a present scaleUp.stablePolicy without one gets 0s.
So a policy that omits `behavior` gets the webhook's numbers, not the CRD's. A spec that
already went through the apiserver and the webhook parses to the same model (idempotent).

Errors name the field (`spec.behavior.scaleUp.panicPolicy.period: ...`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kthena_router.config.duration import parse_duration

__all__ = [
    "AND", "OR", "Behavior", "Disaggregated", "HeteroParam", "Heterogeneous", "Homogeneous", "PanicPolicy",
    "Policy", "PolicyError", "RatioConstraint", "RoleParam", "StablePolicy", "Target", "parse_policy",
    "parse_quantity",
]

OR = "Or"
AND = "And"


class PolicyError(ValueError):
    """An AutoscalingPolicy spec the autoscaler cannot use; the message names the field."""


@dataclass(frozen=True)
class StablePolicy:
    instances: int
    percent: int
    period: float  # seconds; 0 disables the rate limit
    select_policy: str  # Or | And
    stabilization_window: float  # seconds; 0 disables it


@dataclass(frozen=True)
class PanicPolicy:
    percent: int
    period: float  # seconds; 0 disables the panic rate limit
    threshold_percent: int | None  # None: never enter panic mode
    hold: float  # seconds; 0 disables panic mode


@dataclass(frozen=True)
class Behavior:
    scale_up: StablePolicy
    panic: PanicPolicy
    scale_down: StablePolicy


@dataclass(frozen=True)
class Target:
    kind: str
    name: str
    namespace: str  # "" = the policy's namespace
    metric_sources: tuple[str, ...]  # metric keys that have a source (the collector's business)

    def key(self, policy_namespace: str) -> str:
        """Kthena's HeterogeneousTargetKey: namespace/name, the policy's namespace by default."""
        return f"{self.namespace or policy_namespace}/{self.name}"


@dataclass(frozen=True)
class Homogeneous:
    target: Target
    min_replicas: int
    max_replicas: int


@dataclass(frozen=True)
class HeteroParam:
    target: Target
    cost: int
    min_replicas: int
    max_replicas: int


@dataclass(frozen=True)
class Heterogeneous:
    params: tuple[HeteroParam, ...]
    cost_expansion_rate_percent: int


@dataclass(frozen=True)
class RoleParam:
    min_replicas: int
    max_replicas: int
    metrics: Mapping[str, float]  # effective targets: the role's own, else spec.metrics

    @property
    def fixed(self) -> bool:
        """Kthena's isFixedRole: min == max > 0 is a placeholder, never autoscaled."""
        return self.max_replicas > 0 and self.min_replicas == self.max_replicas


@dataclass(frozen=True)
class RatioConstraint:
    numerator_role: str
    denominator_role: str
    min_ratio: float
    max_ratio: float


@dataclass(frozen=True)
class Disaggregated:
    target: Target
    roles: Mapping[str, RoleParam]
    ratio: RatioConstraint | None


@dataclass(frozen=True)
class Policy:
    tolerance_percent: int
    metrics: Mapping[str, float]  # metric name -> target value per replica
    behavior: Behavior
    homogeneous: Homogeneous | None = None
    heterogeneous: Heterogeneous | None = None
    disaggregated: Disaggregated | None = None

    @property
    def tolerance(self) -> float:
        return self.tolerance_percent / 100.0


# --- quantities and durations ---------------------------------------------------------------

_SUFFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "E": 1e18, "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50,
           "Ei": 2.0 ** 60}
_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))((?:[KMGTPE]i)|[numkMGTPE]|(?:[eE][+-]?\d+))?$")


def parse_quantity(value: Any) -> float:
    """A Kubernetes resource.Quantity ("500m", "1.5", "2k", 3) as a float (AsFloat64Slow)."""
    if isinstance(value, bool):
        raise ValueError(f"invalid quantity {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"invalid quantity {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"invalid quantity {value!r}")
    m = _QUANTITY.match(value.strip())
    if m is None:
        raise ValueError(f"invalid quantity {value!r}")
    number, suffix = float(m.group(1)), m.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return number * 10.0 ** int(suffix[1:])
    return number * _SUFFIX[suffix]


# --- defaulting (apiserver CRD defaults, then Kthena's webhook) -----------------------------

_CRD_STABLE = {"instances": 1, "percent": 100, "period": "15s", "selectPolicy": OR}
_CRD_PANIC = {"percent": 1000, "panicThresholdPercent": 200, "panicModeHold": "60s"}
_HOOK_SCALE_DOWN = {"instances": 0, "percent": 100, "period": "1m", "selectPolicy": OR, "stabilizationWindow": "5m"}
_HOOK_STABLE_UP = {"instances": 4, "percent": 100, "period": "1m", "selectPolicy": OR, "stabilizationWindow": "0s"}
_HOOK_PANIC = {"percent": 0, "period": "0s", "panicThresholdPercent": 200, "panicModeHold": "0s"}


def _empty(value: Any) -> bool:
    """Go's `== (T{})` on a decoded block: nothing but (nested) empty objects."""
    if value is None:
        return True
    if isinstance(value, Mapping):
        return all(_empty(v) for v in value.values())
    return False


def _with_defaults(block: Any, defaults: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(block) if isinstance(block, Mapping) else {}
    for k, v in defaults.items():
        if out.get(k) is None:
            out[k] = v
    return out


def default_behavior(raw: Any) -> dict[str, Any]:
    """The behavior block as the apiserver + Kthena's mutating webhook leave it."""
    behavior = dict(raw) if isinstance(raw, Mapping) else {}
    up = dict(behavior.get("scaleUp") or {})
    # 1. CRD defaults inside present objects
    if isinstance(behavior.get("scaleDown"), Mapping):
        behavior["scaleDown"] = _with_defaults(behavior["scaleDown"], _CRD_STABLE)
    if isinstance(up.get("stablePolicy"), Mapping):
        up["stablePolicy"] = _with_defaults(up["stablePolicy"], _CRD_STABLE)
    if isinstance(up.get("panicPolicy"), Mapping):
        up["panicPolicy"] = _with_defaults(up["panicPolicy"], _CRD_PANIC)
    behavior["scaleUp"] = up
    # 2. the webhook (createPolicyBatch)
    if _empty(behavior):
        return {"scaleUp": {"stablePolicy": dict(_HOOK_STABLE_UP), "panicPolicy": dict(_HOOK_PANIC)},
                "scaleDown": dict(_HOOK_SCALE_DOWN)}
    if _empty(behavior.get("scaleDown")):
        behavior["scaleDown"] = dict(_HOOK_SCALE_DOWN)
    elif behavior["scaleDown"].get("stabilizationWindow") is None:
        behavior["scaleDown"]["stabilizationWindow"] = "5m"
    if _empty(up):
        behavior["scaleUp"] = {"stablePolicy": dict(_HOOK_STABLE_UP), "panicPolicy": dict(_HOOK_PANIC)}
        return behavior
    if _empty(up.get("stablePolicy")):
        up["stablePolicy"] = dict(_HOOK_STABLE_UP)
    elif up["stablePolicy"].get("stabilizationWindow") is None:
        up["stablePolicy"]["stabilizationWindow"] = "0s"
    if _empty(up.get("panicPolicy")):
        up["panicPolicy"] = dict(_HOOK_PANIC)
    return behavior


# --- parsing --------------------------------------------------------------------------------

def _int(block: Mapping[str, Any], key: str, path: str, *, default: int | None = None, lo: int | None = None,
         hi: int | None = None) -> int:
    value = block.get(key)
    if value is None:
        if default is None:
            raise PolicyError(f"{path}.{key}: required")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(f"{path}.{key}: must be an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise PolicyError(f"{path}.{key}: {value} is out of range [{lo}, {hi if hi is not None else 'inf'}]")
    return value


def _seconds(block: Mapping[str, Any], key: str, path: str) -> float:
    value = block.get(key)
    if value is None:
        raise PolicyError(f"{path}.{key}: required")
    try:
        seconds = parse_duration(str(value))
    except ValueError as e:
        raise PolicyError(f"{path}.{key}: {e}") from None
    if seconds < 0 or seconds > _MAX_DURATION:
        # Kthena's validating webhook: every period, window and hold is within [0, 30m].
        raise PolicyError(f"{path}.{key}: must be between 0 and 30 minutes, got {value!r}")
    return seconds


_MAX_DURATION = 30 * 60.0


def _quantity(block: Mapping[str, Any], key: str, path: str) -> float:
    if block.get(key) is None:
        raise PolicyError(f"{path}.{key}: required")
    try:
        return parse_quantity(block[key])
    except ValueError as e:
        raise PolicyError(f"{path}.{key}: {e}") from None


def _obj(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PolicyError(f"{path}: must be an object")
    return value


def _stable(block: Mapping[str, Any], path: str) -> StablePolicy:
    select = block.get("selectPolicy")
    if select not in (OR, AND):
        raise PolicyError(f"{path}.selectPolicy: must be Or or And, got {select!r}")
    return StablePolicy(
        instances=_int(block, "instances", path, lo=0),
        percent=_int(block, "percent", path, lo=0, hi=1000),
        period=_seconds(block, "period", path),
        select_policy=select,
        stabilization_window=_seconds(block, "stabilizationWindow", path),
    )


def _panic(block: Mapping[str, Any], path: str) -> PanicPolicy:
    threshold = block.get("panicThresholdPercent")
    return PanicPolicy(
        percent=_int(block, "percent", path, lo=0, hi=1000),
        period=_seconds(block, "period", path),
        threshold_percent=None if threshold is None else _int(block, "panicThresholdPercent", path, lo=110,
                                                                hi=1000),
        hold=_seconds(block, "panicModeHold", path),
    )


def parse_behavior(raw: Any, path: str = "spec.behavior") -> Behavior:
    b = default_behavior(_obj(raw, path))
    up = b["scaleUp"]
    return Behavior(scale_up=_stable(up["stablePolicy"], f"{path}.scaleUp.stablePolicy"),
                    panic=_panic(up["panicPolicy"], f"{path}.scaleUp.panicPolicy"),
                    scale_down=_stable(b["scaleDown"], f"{path}.scaleDown"))


def _metrics(raw: Any, path: str) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise PolicyError(f"{path}: must be a list")
    out: dict[str, float] = {}
    for i, m in enumerate(raw):
        m = _obj(m, f"{path}[{i}]")
        name = m.get("name")
        if not isinstance(name, str) or not name:
            raise PolicyError(f"{path}[{i}].name: required")
        target = _quantity(m, "targetValue", f"{path}[{i}]")
        if target <= 0:
            raise PolicyError(f"{path}[{i}].targetValue: must be greater than 0 and finite")
        if name in out:
            raise PolicyError(f"{path}[{i}].name: duplicate metric name {name}")
        out[name] = target
    return out


def _ref(raw: Any, path: str) -> tuple[str, str, str]:
    ref = _obj(raw, path)
    name = ref.get("name")
    if not isinstance(name, str) or not name:
        raise PolicyError(f"{path}.name: required")
    kind = ref.get("kind") or "ModelServing"
    if kind != "ModelServing":
        raise PolicyError(f"{path}.kind: only ModelServing can be scaled, got {kind!r}")
    return kind, name, str(ref.get("namespace") or "")


def _target(raw: Any, path: str) -> Target:
    t = _obj(raw, path)
    kind, name, ns = _ref(t.get("targetRef"), f"{path}.targetRef")
    return Target(kind, name, ns, tuple(sorted(_obj(t.get("metricSources"), f"{path}.metricSources"))))


def _bounds(block: Mapping[str, Any], path: str) -> tuple[int, int]:
    lo = _int(block, "minReplicas", path, lo=0, hi=1000000)
    hi = _int(block, "maxReplicas", path, lo=1, hi=1000000)
    if lo > hi:
        raise PolicyError(f"{path}: minReplicas {lo} is greater than maxReplicas {hi}")
    return lo, hi


def parse_policy(spec: Mapping[str, Any]) -> Policy:
    """The spec of an AutoscalingPolicy (a dict as read from the apiserver or a YAML file)."""
    spec = _obj(spec, "spec")
    kinds = [k for k in ("homogeneousTarget", "heterogeneousTarget", "disaggregatedTarget") if spec.get(k) is not None]
    if len(kinds) != 1:
        raise PolicyError("spec: exactly one of homogeneousTarget, heterogeneousTarget or disaggregatedTarget "
                          f"must be set (got {', '.join(kinds) or 'none'})")
    tolerance = _int(spec, "tolerancePercent", "spec", default=10, lo=0, hi=100)
    metrics = _metrics(spec.get("metrics"), "spec.metrics")
    behavior = parse_behavior(spec.get("behavior"))
    if kinds[0] != "disaggregatedTarget" and not metrics:
        raise PolicyError("spec.metrics: at least one metric must be set")
    homo = hetero = disagg = None
    if kinds[0] == "homogeneousTarget":
        h = _obj(spec["homogeneousTarget"], "spec.homogeneousTarget")
        lo, hi = _bounds(h, "spec.homogeneousTarget")
        homo = Homogeneous(_target(h.get("target"), "spec.homogeneousTarget.target"), lo, hi)
    elif kinds[0] == "heterogeneousTarget":
        h = _obj(spec["heterogeneousTarget"], "spec.heterogeneousTarget")
        raw_params = h.get("params")
        if not isinstance(raw_params, list) or not raw_params:
            raise PolicyError("spec.heterogeneousTarget.params: at least one is required")
        params = []
        for i, p in enumerate(raw_params):
            path = f"spec.heterogeneousTarget.params[{i}]"
            p = _obj(p, path)
            lo, hi = _bounds(p, path)
            params.append(HeteroParam(_target(p.get("target"), f"{path}.target"),
                                      _int(p, "cost", path, default=0, lo=0), lo, hi))
        hetero = Heterogeneous(tuple(params), _int(h, "costExpansionRatePercent", "spec.heterogeneousTarget",
                                                   default=200, lo=0))
    else:
        disagg = _disaggregated(_obj(spec["disaggregatedTarget"], "spec.disaggregatedTarget"), metrics)
    return Policy(tolerance, metrics, behavior, homo, hetero, disagg)


def _disaggregated(d: Mapping[str, Any], spec_metrics: Mapping[str, float]) -> Disaggregated:
    path = "spec.disaggregatedTarget"
    kind, name, ns = _ref(d.get("targetRef"), f"{path}.targetRef")
    raw_roles = _obj(d.get("roles"), f"{path}.roles")
    if not 1 <= len(raw_roles) <= 2:
        raise PolicyError(f"{path}.roles: one or two roles are required, got {len(raw_roles)}")
    roles: dict[str, RoleParam] = {}
    sources: set[str] = set()
    for role, raw in sorted(raw_roles.items()):
        rpath = f"{path}.roles.{role}"
        r = _obj(raw, rpath)
        lo, hi = _bounds(r, rpath)
        own = _metrics(r.get("metrics"), f"{rpath}.metrics")
        param = RoleParam(lo, hi, own or dict(spec_metrics))
        if not param.fixed and not param.metrics:
            raise PolicyError(f"{rpath}: an autoscaled role needs metrics (its own or spec.metrics)")
        roles[role] = param
        sources.update(_obj(r.get("metricSources"), f"{rpath}.metricSources"))
    ratio = None
    if d.get("ratioConstraint") is not None:
        c = _obj(d["ratioConstraint"], f"{path}.ratioConstraint")
        cpath = f"{path}.ratioConstraint"
        num, den = c.get("numeratorRole"), c.get("denominatorRole")
        for key, role in (("numeratorRole", num), ("denominatorRole", den)):
            if role not in roles:
                raise PolicyError(f"{cpath}.{key}: role {role!r} is not in {path}.roles")
        if num == den:
            raise PolicyError(f"{cpath}: numeratorRole and denominatorRole must differ")
        lo_r, hi_r = _quantity(c, "minRatio", cpath), _quantity(c, "maxRatio", cpath)
        if lo_r < 0 or hi_r <= 0:
            raise PolicyError(f"{cpath}: minRatio must be >= 0 and maxRatio must be > 0")
        if lo_r > hi_r:
            raise PolicyError(f"{cpath}.minRatio: {lo_r:g} is greater than maxRatio {hi_r:g}")
        n, d = roles[str(num)], roles[str(den)]
        if (n.min_replicas == 0) != (d.min_replicas == 0):
            raise PolicyError(f"{cpath}: ratio roles must be scalable to zero together "
                              "(both minReplicas 0 or both > 0)")
        if n.min_replicas / d.max_replicas > hi_r or (d.min_replicas > 0 and n.max_replicas / d.min_replicas < lo_r):
            raise PolicyError(f"{cpath}: the ratio is not achievable within the roles' replica bounds")
        ratio = RatioConstraint(str(num), str(den), lo_r, hi_r)
    return Disaggregated(Target(kind, name, ns, tuple(sorted(sources))), roles, ratio)
