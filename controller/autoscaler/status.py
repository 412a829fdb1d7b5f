"""The AutoscalingPolicy's status from one round (pure): observedGeneration, conditions Ready,
TargetFound and (with a ratio constraint) RatioConstraintViolated, and the per-target or
per-role scaling state (currentReplicas as observed at the start of the round,
desiredReplicas as the metrics want it, mode, lastScaleTime of the last write that changed
the count). The reason of the decision is the Ready condition's message (the CRD has no
other field for it). A condition keeps its lastTransitionTime while its status stays.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["Round", "Scaled", "desired_status", "stamp"]

Obj = dict[str, Any]

READY, TARGET_FOUND, RATIO_VIOLATED = "Ready", "TargetFound", "RatioConstraintViolated"
OWN = (READY, TARGET_FOUND, RATIO_VIOLATED)


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Scaled:
    """One target (heterogeneous member, homogeneous target) or role."""
    name: str  # "" for the homogeneous target
    current: int
    desired: int
    mode: str
    scaled: bool  # the count was written this round


@dataclass(frozen=True)
class Round:
    ok: bool  # Ready
    reason: str  # Ready's reason: Reconciled | DryRun | InvalidPolicy | TargetInvalid | ScaleFailed
    message: str
    target_found: bool | None  # None: not looked at (invalid policy)
    target_message: str = ""
    kind: str = ""  # homogeneous | heterogeneous | disaggregated ("" : leave the scaling state)
    scaled: tuple[Scaled, ...] = ()
    ratio: tuple[str, str, str] | None = None  # numerator, denominator, current ratio
    ratio_adjusted: bool = False
    ratio_violated: bool | None = None  # None: no ratio constraint


def _entry(s: Scaled, prev: Obj | None, now: str, named: bool) -> Obj:
    out: Obj = {}
    if named:
        out["name"] = s.name
    out.update({"currentReplicas": s.current, "desiredReplicas": s.desired, "mode": s.mode})
    last = now if s.scaled else (prev or {}).get("lastScaleTime")
    if last:
        out["lastScaleTime"] = last
    return out


def desired_status(policy: Obj, r: Round, now: datetime) -> Obj:
    old = policy.get("status") or {}
    at = stamp(now)
    generation = int((policy.get("metadata") or {}).get("generation") or 0)
    prev_conds = {c.get("type"): c for c in old.get("conditions") or []}

    def cond(ctype: str, ok: bool, reason: str, message: str) -> Obj:
        status = "True" if ok else "False"
        prev = prev_conds.get(ctype) or {}
        since = prev.get("lastTransitionTime") if prev.get("status") == status else None
        return {"type": ctype, "status": status, "observedGeneration": generation,
                "lastTransitionTime": since or at, "reason": reason, "message": message}

    conds = [cond(READY, r.ok, r.reason, r.message)]
    if r.target_found is not None:
        conds.append(cond(TARGET_FOUND, r.target_found, "TargetFound" if r.target_found else "TargetInvalid",
                          r.target_message or ("target model serving found" if r.target_found
                                               else "target model serving not found")))
    elif TARGET_FOUND in prev_conds:
        conds.append(prev_conds[TARGET_FOUND])
    if r.ratio_violated is not None:
        conds.append(cond(RATIO_VIOLATED, r.ratio_violated,
                          "RatioInfeasible" if r.ratio_violated else "RatioSatisfied",
                          "the role ratio cannot be met within the roles' replica bounds" if r.ratio_violated
                          else "the role ratio is met"))
    elif RATIO_VIOLATED in prev_conds and not r.kind:
        conds.append(prev_conds[RATIO_VIOLATED])  # not looked at this round (a full round drops it)
    conds += [c for t, c in prev_conds.items() if t not in OWN]  # conditions written by others

    out: Obj = {k: v for k, v in old.items() if k not in ("conditions", "observedGeneration")}
    out["observedGeneration"] = generation
    out["conditions"] = conds
    if not r.kind:
        return out
    for k in ("homogeneousStatus", "heterogeneousStatus", "disaggregatedStatus"):
        out.pop(k, None)
    if r.kind == "homogeneous" and r.scaled:
        out["homogeneousStatus"] = _entry(r.scaled[0], old.get("homogeneousStatus"), at, named=False)
    elif r.kind == "heterogeneous":
        prev = {e.get("name"): e for e in old.get("heterogeneousStatus") or []}
        out["heterogeneousStatus"] = [_entry(s, prev.get(s.name), at, named=True) for s in r.scaled]
    elif r.kind == "disaggregated":
        prev = {e.get("name"): e for e in ((old.get("disaggregatedStatus") or {}).get("roles") or [])}
        d: Obj = {"roles": [_entry(s, prev.get(s.name), at, named=True) for s in r.scaled]}
        if r.ratio is not None:
            ratio: Obj = {"numeratorRole": r.ratio[0], "denominatorRole": r.ratio[1]}
            if r.ratio[2]:
                ratio["currentRatio"] = r.ratio[2]
            d["ratioStatus"] = ratio
        if r.ratio_adjusted:
            d["ratioAdjusted"] = True
        out["disaggregatedStatus"] = d
    return out
