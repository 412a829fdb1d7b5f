"""Which Events a reconcile's plan means for its role replicas (Kthena's reasons and messages).

Creating and Deleting follow from what the plan creates and deletes; Running is a transition,
so the role replicas that were running at the last reconcile are remembered per ModelServing
(a replica that stops running and comes back gets a new RoleRunning). Pure apart from that
memory: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import naming as n
from .informers import Key
from .planner import Obj, Plan, is_ready

__all__ = ["RoleEvents", "role_message"]

Replica = tuple[str, str, str]  # (group, role, role id)
Event = tuple[str, str, str]  # (type, reason, message)


def role_message(role: str, rid: str, group: str, state: str) -> str:
    return f"Role {role}/{rid} in ServingGroup {group} is now {state}"


def _replicas(pods: Iterable[Obj]) -> set[Replica]:
    out: set[Replica] = set()
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        group, role, rid = labels.get(n.LABEL_GROUP), labels.get(n.LABEL_ROLE), labels.get(n.LABEL_ROLE_ID)
        if group and role and rid:
            out.add((group, role, rid))
    return out


def _of_replica(names: Iterable[str], group: str, rid: str) -> int:
    """How many of `names` belong to that role replica (`<group>-<rid>-<k>`)."""
    prefix = f"{group}-{rid}-"
    return sum(1 for name in names if name.startswith(prefix) and name[len(prefix):].isdigit())


def _running(p: Plan, leaving: set[Replica]) -> set[Replica]:
    out: set[Replica] = set()
    for g in p.groups:
        for replica in _replicas(g.pods):
            if replica in leaving:
                continue
            _, _, rid = replica
            pods = [pod for pod in g.pods if _of_replica([pod["metadata"]["name"]], g.name, rid)]
            if len(pods) == _of_replica(g.expected, g.name, rid) and all(is_ready(pod) for pod in pods):
                out.add(replica)
    return out


class RoleEvents:
    def __init__(self) -> None:
        self._running: dict[Key, set[Replica]] = {}

    def forget(self, key: Key) -> None:
        self._running.pop(key, None)

    def step(self, key: Key, p: Plan, created: Iterable[Obj], deleted: Iterable[Obj]) -> list[Event]:
        """The Events of one applied plan: `created` the pods it created, `deleted` the pods it
        and the recovery before it deleted."""
        gone = _replicas(deleted)
        events = [("Normal", "RoleDeleting", role_message(role, rid, group, "Deleting"))
                  for group, role, rid in sorted(gone)]
        events += [("Normal", "RoleCreating", role_message(role, rid, group, "Creating"))
                   for group, role, rid in sorted(_replicas(created))]
        running = _running(p, gone)
        before = self._running.get(key, set())
        events += [("Normal", "RoleRunning", role_message(role, rid, group, "Running"))
                   for group, role, rid in sorted(running - before)]
        self._running[key] = running
        return events
