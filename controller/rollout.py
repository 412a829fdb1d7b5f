"""Rolling updates, as Kthena's manageRollingUpdate does them. Pure: no I/O, no clock.

- `spec.rolloutStrategy.type`: ServingGroupRollingUpdate (default) replaces whole outdated
  ServingGroups; RoleRollingUpdate replaces outdated role replicas (pods whose
  role-template-hash differs from their role's current hash) inside the groups, each
  (group, role) with its own budget, all groups at once (as Kthena).
- Settings: ServingGroupRollingUpdate reads `rolloutStrategy.rollingUpdateConfiguration`
  (`maxUnavailable`, default 1, a number or a percentage of spec.replicas rounded down;
  `partition`, default 0, a number or a percentage rounded up). RoleRollingUpdate reads
  `maxUnavailable` and `partition` of each role (percentages of that role's replicas);
  Kthena's webhook rejects rollingUpdateConfiguration with RoleRollingUpdate, but its
  controller still applies that partition to ServingGroups, and so do we.
- A maxUnavailable that resolves to 0 (Kthena's webhook rejects it) or cannot be parsed
  acts as 1, so an update always progresses; an unparsable partition acts as 0.
- Partition: the first `partition` replicas in ascending ordinal order keep their revision;
  a missing one is recreated at the old revision (the planner renders it from the
  ControllerRevision).
- Budget (`pick`): units (groups, or role replicas of one role in one group) that are not
  available count against maxUnavailable whatever their revision (missing, not ready,
  protected ones too). An available outdated unit is deleted only while fewer than
  maxUnavailable units are unavailable, so the controller never takes the count above
  maxUnavailable. Already-unavailable outdated units go first (deleting them loses
  nothing), then the highest ordinal; both kinds together are paced as Kthena's (and the
  Deployment controller's) maxScaleDown = maxUnavailable - unavailable units not waiting
  for an update.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["GROUP_ROLLING", "ROLE_ROLLING", "Settings", "Unit", "pick", "resolve", "role_settings", "settings",
           "update_condition"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
GROUP_ROLLING = "ServingGroupRollingUpdate"
ROLE_ROLLING = "RoleRollingUpdate"


def resolve(value: Any, total: int, round_up: bool) -> int:
    """Kubernetes' intstr.GetScaledValueFromIntOrPercent: an int as it is; "N%" of `total`,
    rounded up or down. ValueError for anything else (a string without %, a bad number)."""
    if isinstance(value, bool):
        raise ValueError(f"not an int or percentage: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.endswith("%"):
        pct = int(value[:-1])
        scaled = pct * total / 100
        return math.ceil(scaled) if round_up else math.floor(scaled)
    raise ValueError(f"not an int or percentage: {value!r}")


def _max_unavailable(value: Any, total: int, where: str) -> int:
    try:
        n = resolve(1 if value is None else value, total, round_up=False)
    except ValueError:
        log.warning("%s: maxUnavailable %r is not a number or percentage; using 1", where, value)
        return 1
    return max(1, n)


def _partition(value: Any, total: int, where: str) -> int:
    if value is None:
        return 0
    try:
        return max(0, resolve(value, total, round_up=True))
    except ValueError:
        log.warning("%s: partition %r is not a number or percentage; using 0", where, value)
        return 0


@dataclass(frozen=True)
class Settings:
    strategy: str
    max_unavailable: int  # groups (ServingGroupRollingUpdate)
    partition: int  # groups, both strategies


def settings(ms: Obj) -> Settings:
    spec = ms.get("spec") or {}
    strategy = spec.get("rolloutStrategy") or {}
    kind = strategy.get("type") or GROUP_ROLLING
    cfg = strategy.get("rollingUpdateConfiguration") or {}
    replicas = int(spec.get("replicas", 1))
    where = f"{(ms.get('metadata') or {}).get('name')}: rollingUpdateConfiguration"
    return Settings(kind if kind in (GROUP_ROLLING, ROLE_ROLLING) else GROUP_ROLLING,
                    _max_unavailable(cfg.get("maxUnavailable"), replicas, where),
                    _partition(cfg.get("partition"), replicas, where))


def role_settings(role: Obj) -> tuple[int, int]:
    """(maxUnavailable, partition) of a role under RoleRollingUpdate, in role replicas.
    maxUnavailable defaults to 1 (the CRD's default; the apiserver fills it in)."""
    replicas = int(role.get("replicas", 1))
    where = f"role {role.get('name')}"
    return (_max_unavailable(role.get("maxUnavailable"), replicas, where),
            _partition(role.get("partition"), replicas, where))


@dataclass(frozen=True)
class Unit:
    """A group, or a role replica inside one group."""
    ordinal: int
    available: bool  # every expected pod exists and is Running and Ready
    outdated: bool  # has pods of an older template
    protected: bool = False  # below the partition: never replaced by the rollout


def pick(units: Sequence[Unit], max_unavailable: int) -> list[int]:
    """Ordinals of the outdated units to delete now (see the module doc)."""
    unavailable = sum(1 for u in units if not u.available)
    candidates = [u for u in units if u.outdated and not u.protected]
    waiting = sum(1 for u in candidates if not u.available)  # unavailable and about to be replaced
    slots = max_unavailable - (unavailable - waiting)
    out: list[int] = []
    for u in sorted(candidates, key=lambda u: (u.available, -u.ordinal)):
        if slots <= 0:
            break
        if u.available:
            if unavailable >= max_unavailable:
                break
            unavailable += 1
        slots -= 1
        out.append(u.ordinal)
    return out


def update_condition(old: list[Obj], rolling: Sequence[int], updated: Sequence[int], progressing: Sequence[int],
                     partition: int, generation: int, now: datetime) -> Obj:
    """UpdateInProgress: True while a group that is not protected by the partition still has
    outdated pods (Kthena: GroupsUpdating, "Some groups is progressing: [..], Updated Groups
    are: [..]", group ordinals as Go prints an []int)."""
    from .status import format_time  # status imports the planner, which imports this module

    def ints(xs: Sequence[int]) -> str:
        return "[" + " ".join(map(str, xs)) + "]"

    if rolling:
        status, reason = "True", "GroupsUpdating"
        message = f"Some groups is progressing: {ints(progressing)}, Updated Groups are: {ints(updated)}"
    else:
        status, reason = "False", "AllGroupsUpdated"
        message = "Every ServingGroup not protected by the partition is at the update revision" + (
            f" (partition {partition})" if partition else "")
    prev = next((c for c in old if c.get("type") == "UpdateInProgress"), None)
    since = prev["lastTransitionTime"] if prev and prev.get("status") == status and prev.get(
        "lastTransitionTime") else format_time(now)
    return {"type": "UpdateInProgress", "status": status, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": since}
