"""The plan: from a ModelServing and the pods and Services it owns now, the objects it
should own, what to create and what to delete. Pure: no I/O, no clock.

Which ServingGroups (and, inside each, which role replicas) stay follows Kthena: when there
are fewer than `replicas`, the missing ordinals from 0 up are filled (so gaps left by an
earlier scale-down are reused); when there are more, the surplus is removed in this order:
groups not running-and-ready first, then the lowest summed
`controller.kubernetes.io/pod-deletion-cost` of their pods, then the highest ordinal.
Inside each kept group the same rule picks role replicas by role.replicas. Every owned pod
or Service that is not in the resulting set is deleted (a surplus group, a removed role, a
worker index beyond workerReplicas); every object of the set that is missing is created.

Not in this slice: pods present but at an older revision are kept as they are (rolling
updates come later); missing pods are created from the current template.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from . import naming as n
from .render import render_pod, render_service, wants_service, worker_count
from .revision import role_template_hash, serving_revision

__all__ = ["GroupPlan", "Plan", "deletion_cost", "is_ready", "plan"]

Obj = dict[str, Any]


def is_ready(pod: Obj) -> bool:
    st = pod.get("status") or {}
    return st.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])


def deletion_cost(pod: Obj) -> int:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(n.ANNOTATION_DELETION_COST)
    try:
        return int(str(raw)) if raw is not None else 0
    except ValueError:
        return 0  # as Kthena (and the ReplicaSet controller): an unparsable cost counts as 0


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def _labels(obj: Obj) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


@dataclass
class GroupPlan:
    name: str
    ordinal: int
    expected: list[str]  # names of the pods it should have
    pods: list[Obj]  # the pods of it that exist (observed), expected or not


@dataclass
class Plan:
    revision: str
    groups: list[GroupPlan]  # the ServingGroups that stay or are created, by ordinal
    create_pods: list[Obj] = field(default_factory=list)
    create_services: list[Obj] = field(default_factory=list)
    delete_pods: list[Obj] = field(default_factory=list)  # observed objects (name, uid)
    delete_services: list[Obj] = field(default_factory=list)
    surplus_groups: list[str] = field(default_factory=list)  # groups removed, by ordinal

    @property
    def changes(self) -> int:
        return len(self.create_pods) + len(self.create_services) + len(self.delete_pods) + len(self.delete_services)


def _choose(existing: dict[int, list[Obj]], target: int, complete: Callable[[list[Obj]], bool]) -> list[int]:
    """Ordinals to keep: all existing ones plus missing ordinals from 0 up when short; else the
    existing minus the surplus in deletion order (not ready, lowest cost, highest ordinal)."""
    target = max(0, target)
    if len(existing) <= target:
        keep = set(existing)
        i = 0
        while len(keep) < target:
            keep.add(i)
            i += 1
        return sorted(keep)

    def order(o: int) -> tuple[int, int, int]:
        pods = existing[o]
        ready = complete(pods) and all(is_ready(p) for p in pods)
        return (1 if ready else 0, sum(deletion_cost(p) for p in pods), -o)

    doomed = sorted(existing, key=order)[: len(existing) - target]
    return sorted(set(existing) - set(doomed))


def _by_ordinal(objs: Iterable[Obj], label: str, parent: str) -> tuple[dict[int, list[Obj]], list[Obj]]:
    """Objects keyed by the ordinal in their `label` (which must read `<parent>-<n>`); the rest."""
    out: dict[int, list[Obj]] = defaultdict(list)
    stray: list[Obj] = []
    for o in objs:
        p, ordinal = n.parent_and_ordinal(_labels(o).get(label, ""))
        if p == parent and ordinal >= 0:
            out[ordinal].append(o)
        else:
            stray.append(o)
    return dict(out), stray


def plan(ms: Obj, pods: list[Obj], services: list[Obj]) -> Plan:
    """`pods`/`services`: the live objects this ModelServing owns (its uid), not being deleted."""
    meta, spec = ms["metadata"], ms.get("spec") or {}
    ms_name = meta["name"]
    roles: list[Obj] = (spec.get("template") or {}).get("roles") or []
    revision = serving_revision(roles)
    hashes = {r["name"]: role_template_hash(r) for r in roles}
    per_group = sum((1 + worker_count(r)) * int(r.get("replicas", 1)) for r in roles)

    by_group, _ = _by_ordinal(pods, n.LABEL_GROUP, ms_name)
    keep = _choose(by_group, int(spec.get("replicas", 1)), lambda ps: len(ps) >= per_group)
    surplus = [o for o in sorted(by_group) if o not in keep]

    desired_pods: dict[str, Obj] = {}
    desired_services: dict[str, Obj] = {}
    groups: list[GroupPlan] = []
    for ordinal in keep:
        gname = n.group_name(ms_name, ordinal)
        gpods = by_group.get(ordinal, [])
        expected: list[str] = []
        for role in roles:
            rname = role["name"]
            rpods = [p for p in gpods if _labels(p).get(n.LABEL_ROLE) == rname]
            by_replica, _ = _by_ordinal(rpods, n.LABEL_ROLE_ID, rname)
            size = 1 + worker_count(role)
            for r in _choose(by_replica, int(role.get("replicas", 1)), lambda ps, s=size: len(ps) >= s):
                for k in range(size):
                    pod = render_pod(ms, gname, role, r, k, revision, hashes[rname])
                    desired_pods[_name(pod)] = pod
                    expected.append(_name(pod))
                if wants_service(role):
                    svc = render_service(ms, gname, rname, r)
                    desired_services[_name(svc)] = svc
        groups.append(GroupPlan(gname, ordinal, expected, gpods))

    have_pods = {_name(p) for p in pods}
    have_services = {_name(s) for s in services}
    return Plan(
        revision=revision,
        groups=groups,
        create_pods=[p for name, p in desired_pods.items() if name not in have_pods],
        create_services=[s for name, s in desired_services.items() if name not in have_services],
        delete_pods=[p for p in pods if _name(p) not in desired_pods],
        delete_services=[s for s in services if _name(s) not in desired_services],
        surplus_groups=[n.group_name(ms_name, o) for o in surplus],
    )
