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

Revisions (rollout.py, history.py): a group (RoleRollingUpdate: a role replica) is rendered
at the revision its pods carry, from that revision's ControllerRevision when it is older;
a missing one at the update revision, or below the partition at the protected revision
(status.currentRevision). Outdated units are deleted whole, within the maxUnavailable
budget (rollout.pick), and recreated at the update revision by a later reconcile; nothing
of a unit being deleted is created in the same plan. Services are kept across updates
(they depend on names only).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from . import naming as n
from . import rollout
from .history import roles_at
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
    revision: str = ""  # the revision it is at (or is being created at)
    updated: bool = True  # every pod at the update revision (RoleRollingUpdate: every role template current)
    rolling: bool = False  # has outdated pods the rollout will replace (not protected by a partition)


@dataclass
class Plan:
    revision: str
    groups: list[GroupPlan]  # the ServingGroups that stay or are created, by ordinal
    create_pods: list[Obj] = field(default_factory=list)
    create_services: list[Obj] = field(default_factory=list)
    delete_pods: list[Obj] = field(default_factory=list)  # observed objects (name, uid)
    delete_services: list[Obj] = field(default_factory=list)
    surplus_groups: list[str] = field(default_factory=list)  # groups removed, by ordinal
    updating: list[str] = field(default_factory=list)  # groups / role replicas deleted to be recreated updated
    partition: int = 0  # ServingGroups protected by the partition

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


def _label(obj: Obj, key: str) -> str:
    return str(_labels(obj).get(key) or "")


def _majority(pods: list[Obj], update: str) -> str:
    """The revision most of `pods` carry; on a tie an older one (the unit is outdated)."""
    revs = Counter(_label(p, n.LABEL_REVISION) for p in pods)
    return max(revs, key=lambda r: (revs[r], r != update, r))


def _available(expected: list[str], pods: list[Obj]) -> bool:
    have = {_name(p): p for p in pods}
    return bool(expected) and all(x in have and is_ready(have[x]) for x in expected)


@dataclass
class _Ctx:
    ms: Obj
    roles: list[Obj]
    update: str
    hashes: dict[str, str]
    templates: dict[str, list[Obj]]  # revision -> roles (the update revision: the spec's)
    protected_revision: str  # where a missing partition-protected replica is rebuilt
    desired_pods: dict[str, Obj] = field(default_factory=dict)
    desired_services: dict[str, Obj] = field(default_factory=dict)

    def replica(self, group: str, role: Obj, r: int, revision: str) -> list[str]:
        """Render role replica r of `role` at `revision`; the names of its pods."""
        names = []
        role_hash = role_template_hash(role)
        for k in range(1 + worker_count(role)):
            pod = render_pod(self.ms, group, role, r, k, revision, role_hash)
            self.desired_pods[_name(pod)] = pod
            names.append(_name(pod))
        if wants_service(role):
            svc = render_service(self.ms, group, role["name"], r)
            self.desired_services[_name(svc)] = svc
        return names

    def roles_at(self, revision: str) -> list[Obj]:
        if revision == self.update:
            return self.roles
        return roles_at(self.templates[revision], self.roles)

    def role_at(self, role: Obj, pods: list[Obj], protected: bool) -> tuple[str, Obj]:
        """(revision, role template) of one role replica under RoleRollingUpdate: the revision its
        pods carry (a missing one: the protected revision below the partition, else the update
        revision), rendered from that revision's stored template; when it is not stored, the
        current template if the pods' role hash is the current one, else the update revision."""
        rev = _majority(pods, self.update) if pods else (self.protected_revision if protected else self.update)
        if rev == self.update:
            return rev, role
        old = next((x for x in self.templates.get(rev, []) if x.get("name") == role["name"]), None)
        if old is not None:
            return rev, dict(old, replicas=role.get("replicas", 1))
        if pods and all(_label(p, n.LABEL_ROLE_TEMPLATE_HASH) == self.hashes[role["name"]] for p in pods):
            return rev, role
        return self.update, role


def _protected_revision(cfg: rollout.Settings, status: Obj, update: str, templates: dict[str, list[Obj]]) -> str:
    """Kthena rebuilds a missing replica below the partition at status.currentRevision
    (RoleRollingUpdate: or another recorded revision); only where its template is stored."""
    current = str(status.get("currentRevision") or "")
    if current and current != update and current in templates:
        return current
    older = sorted(r for r in templates if r != update)
    if cfg.strategy == rollout.ROLE_ROLLING and older:
        return older[0]
    return update


def plan(ms: Obj, pods: list[Obj], services: list[Obj], history: dict[str, list[Obj]] | None = None) -> Plan:
    """`pods`/`services`: the live objects this ModelServing owns (its uid), not being deleted.
    `history`: revision -> roles from its ControllerRevisions (history.templates)."""
    meta, spec = ms["metadata"], ms.get("spec") or {}
    ms_name = meta["name"]
    roles: list[Obj] = (spec.get("template") or {}).get("roles") or []
    revision = serving_revision(roles)
    templates = dict(history or {})
    templates[revision] = roles
    cfg = rollout.settings(ms)
    ctx = _Ctx(ms, roles, revision, {r["name"]: role_template_hash(r) for r in roles}, templates,
               _protected_revision(cfg, ms.get("status") or {}, revision, templates))
    per_group = sum((1 + worker_count(r)) * int(r.get("replicas", 1)) for r in roles)

    by_group, _ = _by_ordinal(pods, n.LABEL_GROUP, ms_name)
    keep = _choose(by_group, int(spec.get("replicas", 1)), lambda ps: len(ps) >= per_group)
    surplus = [o for o in sorted(by_group) if o not in keep]

    groups: list[GroupPlan] = []
    group_units: list[rollout.Unit] = []
    doomed: set[str] = set()  # pods deleted by the rollout (to be recreated updated)
    hold: set[str] = set()  # pods of those units: not created this round
    updating: list[str] = []
    for pos, ordinal in enumerate(keep):
        gname = n.group_name(ms_name, ordinal)
        gpods = by_group.get(ordinal, [])
        protected = pos < cfg.partition
        expected: list[str] = []
        if cfg.strategy == rollout.ROLE_ROLLING and not protected:
            rolling = False
            for role in roles:
                rname = role["name"]
                rpods = [p for p in gpods if _label(p, n.LABEL_ROLE) == rname]
                by_replica, _ = _by_ordinal(rpods, n.LABEL_ROLE_ID, rname)
                size = 1 + worker_count(role)
                max_unavailable, partition = rollout.role_settings(role)
                units, names = [], {}
                kept = _choose(by_replica, int(role.get("replicas", 1)), lambda ps, s=size: len(ps) >= s)
                for i, r in enumerate(kept):
                    have = by_replica.get(r, [])
                    rev, source = ctx.role_at(role, have, i < partition)
                    names[r] = ctx.replica(gname, source, r, rev)
                    expected += names[r]
                    outdated = any(_label(p, n.LABEL_ROLE_TEMPLATE_HASH) != ctx.hashes[rname] for p in have)
                    units.append(rollout.Unit(r, _available(names[r], have), outdated, i < partition))
                    rolling |= outdated and i >= partition
                for r in rollout.pick(units, max_unavailable):
                    doomed.update(_name(p) for p in by_replica.get(r, []))
                    hold.update(names[r])
                    updating.append(f"{gname}/{n.role_id(rname, r)}")
            updated = all(_label(ctx.desired_pods[x], n.LABEL_ROLE_TEMPLATE_HASH) == ctx.hashes.get(
                _label(ctx.desired_pods[x], n.LABEL_ROLE), "") for x in expected) and all(
                _label(p, n.LABEL_ROLE_TEMPLATE_HASH) == ctx.hashes.get(_label(p, n.LABEL_ROLE), "") for p in gpods)
            older = [p for p in gpods if _label(p, n.LABEL_REVISION) != revision]
            grev = revision if updated else (_majority(older, revision) if older else ctx.protected_revision)
        else:
            grev = _majority(gpods, revision) if gpods else (ctx.protected_revision if protected else revision)
            at = grev if grev in templates else revision  # an unrecorded old revision: missing pods come updated
            for role in ctx.roles_at(at):
                rpods = [p for p in gpods if _label(p, n.LABEL_ROLE) == role["name"]]
                by_replica, _ = _by_ordinal(rpods, n.LABEL_ROLE_ID, role["name"])
                size = 1 + worker_count(role)
                for r in _choose(by_replica, int(role.get("replicas", 1)), lambda ps, s=size: len(ps) >= s):
                    expected += ctx.replica(gname, role, r, at)
            updated = grev == revision and all(_label(p, n.LABEL_REVISION) == revision for p in gpods)
            rolling = not updated and not protected and bool(gpods)
            group_units.append(rollout.Unit(ordinal, _available(expected, gpods), rolling, protected))
        groups.append(GroupPlan(gname, ordinal, expected, gpods, grev, updated, rolling))

    by_ordinal = {g.ordinal: g for g in groups}
    for o in rollout.pick(group_units, cfg.max_unavailable):  # groups under RoleRollingUpdate: protected only
        g = by_ordinal[o]
        doomed.update(_name(p) for p in g.pods)
        hold.update(g.expected)
        updating.append(g.name)

    have_pods = {_name(p) for p in pods}
    have_services = {_name(s) for s in services}
    desired_pods, desired_services = ctx.desired_pods, ctx.desired_services
    return Plan(
        revision=revision,
        groups=groups,
        create_pods=[p for name, p in desired_pods.items() if name not in have_pods and name not in hold],
        create_services=[s for name, s in desired_services.items() if name not in have_services],
        delete_pods=[p for p in pods if _name(p) not in desired_pods or _name(p) in doomed],
        delete_services=[s for s in services if _name(s) not in desired_services],
        surplus_groups=[n.group_name(ms_name, o) for o in surplus],
        updating=updating,
        partition=cfg.partition,
    )
