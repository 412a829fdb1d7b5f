"""ModelServing status from a plan and the pods it saw. Pure; the clock is passed in.

- replicas: ServingGroups that exist or are being created (the plan's groups).
- availableReplicas: groups whose every expected pod exists and is Running and Ready.
- updatedReplicas: groups whose pods all carry the current revision (a group being created
  is created at it). currentRevision: the update revision once every group has it; before
  that the revision most pods of the other groups carry (the one in status is kept while
  some group still has it, as Kthena does); currentReplicas: groups at currentRevision.
- observedGeneration, labelSelector (the scale subresource's selector, as Kthena pins it:
  the entry pod of the first role's replica 0, one pod per group).
- conditions Available and Progressing, each always present, True or False (Kthena only
  adds the True one and flips the other; both present is easier to read and to wait on).
  lastTransitionTime changes only when a condition's status does. UpdateInProgress
  (rollout.update_condition): True while a group not protected by the partition has
  outdated pods.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from . import naming as n
from .planner import GroupPlan, Plan, is_ready
from .rollout import update_condition

__all__ = ["desired_status", "format_time"]

Obj = dict[str, Any]


def format_time(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _available(g: GroupPlan) -> bool:
    have = {p["metadata"]["name"]: p for p in g.pods}
    return bool(g.expected) and all(name in have and is_ready(have[name]) for name in g.expected)


def _condition(old: list[Obj], ctype: str, ok: bool, reason: str, message: str, generation: int,
               now: str) -> Obj:
    status = "True" if ok else "False"
    prev = next((c for c in old if c.get("type") == ctype), None)
    since = prev["lastTransitionTime"] if prev and prev.get("status") == status and prev.get(
        "lastTransitionTime") else now
    return {"type": ctype, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": since}


# A condition the reconciler decides outside the plan (e.g. plugins, gang scheduling):
# (ok, reason, message), or None to remove that type.
Extra = tuple[bool, str, str] | None


def desired_status(ms: Obj, plan: Plan, now: datetime, extra: Mapping[str, Extra] | None = None) -> Obj:
    spec = ms.get("spec") or {}
    old = ms.get("status") or {}
    generation = int(ms["metadata"].get("generation") or 0)
    want = int(spec.get("replicas", 1))
    update = plan.revision
    revisions = {g.name: g.revision or update for g in plan.groups}
    available = [g for g in plan.groups if _available(g)]
    not_ready = [g.ordinal for g in plan.groups if g not in available]
    updated = [g for g in plan.groups if g.updated]
    others = Counter(revisions[g.name] for g in plan.groups if g not in updated)
    if not others:
        current = update
    elif old.get("currentRevision") in others:
        current = str(old["currentRevision"])
    else:
        current = others.most_common(1)[0][0]

    roles = (spec.get("template") or {}).get("roles") or []
    all_ready = len(available) == want == len(plan.groups)
    stamp = format_time(now)
    conds = old.get("conditions") or []
    if all_ready:
        progressing_msg = "All Serving groups are ready"
    else:
        progressing_msg = "Some groups is progressing: [" + " ".join(map(str, not_ready)) + "]" if not_ready else (
            f"ServingGroups: {len(plan.groups)} of {want}")
    status: Obj = {
        "observedGeneration": generation,
        "replicas": len(plan.groups),
        "currentReplicas": sum(1 for g in plan.groups if revisions[g.name] == current),
        "updatedReplicas": len(updated),
        "availableReplicas": len(available),
        "currentRevision": current,
        "updateRevision": update,
        "labelSelector": n.label_selector(ms["metadata"]["name"], roles[0]["name"] if roles else None),
        "conditions": [
            _condition(conds, "Available", all_ready, "AllGroupsReady" if all_ready else "GroupsNotReady",
                       "All Serving groups are ready" if all_ready else
                       f"{len(available)} of {want} ServingGroups are ready", generation, stamp),
            _condition(conds, "Progressing", not all_ready, "GroupProgressing" if not all_ready else "AllGroupsReady",
                       progressing_msg, generation, stamp),
        ],
    }
    status["conditions"].append(update_condition(  # rolling updates (rollout.py)
        conds, [g.ordinal for g in plan.groups if g.rolling], [g.ordinal for g in updated], not_ready,
        plan.partition, generation, now))
    extra = extra or {}
    for ctype, cond in sorted(extra.items()):
        if cond is not None:
            status["conditions"].append(_condition(conds, ctype, cond[0], cond[1], cond[2], generation, stamp))
    # Conditions this controller does not manage (e.g. written by a later version) are kept.
    managed = {"Available", "Progressing", "UpdateInProgress", *extra}
    status["conditions"] += [c for c in conds if c.get("type") not in managed]
    return status
