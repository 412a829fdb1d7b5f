"""The ModelBooster's status (Kthena's condition.go): conditions Initialized, Active and Failed,
and observedGeneration. Pure."""

from __future__ import annotations

from datetime import datetime
from typing import Any

Obj = dict[str, Any]

INITIALIZED, ACTIVE, FAILED = "Initialized", "Active", "Failed"
REASON_INIT = "ModelCreating"
REASON_ACTIVE = "ModelAvailable"
REASON_PROCESSING = "ModelProcessing"
REASON_FAILED = "ModelAbnormal"
REASON_OK = "ModelReconciled"  # ours: Kthena never clears Failed once set


def serving_available(serving: Obj | None) -> bool:
    for cond in ((serving or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Available":
            return cond.get("status") == "True"
    return False


def desired(booster: Obj, now: datetime, problem: str | None, serving: Obj | None, serving_name: str) -> Obj:
    """`problem`: why the generated objects are not as wanted (Failed True), else None."""
    old = {c.get("type"): c for c in ((booster.get("status") or {}).get("conditions") or [])}
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")

    def cond(ctype: str, ok: bool, reason: str, message: str) -> Obj:
        status = "True" if ok else "False"
        prev = old.get(ctype) or {}
        since = prev.get("lastTransitionTime") if prev.get("status") == status else None
        return {"type": ctype, "status": status, "reason": reason, "message": message,
                "lastTransitionTime": since or stamp}

    active = problem is None and serving_available(serving)
    if active:
        act = cond(ACTIVE, True, REASON_ACTIVE, "ModelBooster is ready")
    elif serving is None:
        act = cond(ACTIVE, False, REASON_PROCESSING, f"ModelBooster not ready yet: ModelServing {serving_name} "
                                                     "does not exist")
    else:
        act = cond(ACTIVE, False, REASON_PROCESSING, f"ModelBooster not ready yet: ModelServing {serving_name} "
                                                     "is not Available")
    failed = (cond(FAILED, True, REASON_FAILED, problem) if problem is not None
              else cond(FAILED, False, REASON_OK, "the generated objects are as the ModelBooster asks"))
    conditions = [cond(INITIALIZED, True, REASON_INIT, "ModelBooster initialized"), act, failed]
    # keep conditions written by others (the list is keyed by type)
    conditions += [c for t, c in old.items() if t not in (INITIALIZED, ACTIVE, FAILED)]
    out = dict(booster.get("status") or {})
    out["conditions"] = conditions
    out["observedGeneration"] = int((booster.get("metadata") or {}).get("generation") or 0)
    return out
