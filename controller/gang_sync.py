"""Gang scheduling in one reconcile: the PodGroups of a ModelServing's ServingGroups exist,
match the spec, and precede the pods (Kthena: createOrUpdatePodGroupByServingGroup before
CreatePodsForServingGroup; DeletePodGroup when a group is removed).

Called by the reconciler with the plan, before it touches pods:
- PodGroups this ModelServing controls whose group is not in the plan (a surplus group, or
  every group once the scheduler is not volcano) are deleted (uid precondition).
- A missing PodGroup is created (POST); an existing one that differs gets a JSON merge patch
  of the changed spec fields with its resourceVersion (409: the reconcile is retried).
- A PodGroup name held by an object this ModelServing does not control blocks that group:
  its pods are not created (as Kthena, which returns an error and requeues).
- Pods to create are annotated for Volcano (group and task) when PodGroups are used.
The outcome also carries the `GangScheduling` condition for the status.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from . import gang
from . import naming as n
from .capabilities import VolcanoWatch
from .expectations import Expectations
from .informers import Key, owner_key
from .kubeapi import Writer, collection_path, object_path
from .planner import Plan
from .render import scheduler_name

__all__ = ["GangOutcome", "GangSync"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
KIND = "podgroups"  # expectations kind
WAIT_FOR_CACHE = 1.0  # Kthena's enqueueAfter when its PodGroup informer is not ready


@dataclass
class GangOutcome:
    ok: bool
    reason: str
    message: str
    blocked: list[str] = field(default_factory=list)  # "podgroup <name>" not ours
    wait: float | None = None  # the PodGroup cache is not filled yet: reconcile again later



class GangSync:
    def __init__(self, watch: VolcanoWatch, writer: Writer, expectations: Expectations) -> None:
        self.watch = watch
        self.writer = writer
        self.expectations = expectations
        self.patches = 0
        self._patched: dict[tuple[str, str], str] = {}  # PodGroup -> resourceVersion it was patched from

    async def sync(self, key: Key, ms: Obj, p: Plan) -> GangOutcome:
        caps = self.watch.state
        if not gang.wants_podgroups(ms):
            out = GangOutcome(False, "SchedulerNotVolcano",
                              f"spec.schedulerName is {scheduler_name(ms)!r}: Volcano PodGroups are only used "
                              f"with the {gang.VOLCANO!r} scheduler")
        elif not caps.podgroups:
            return GangOutcome(False, "PodGroupCRDNotInstalled",
                               f"{caps.detail}: pods are created without PodGroups (no gang scheduling); "
                               f"PodGroups are created once Volcano's CRD is installed")
        else:
            out = GangOutcome(True, "PodGroupsInUse",
                              "one Volcano PodGroup per ServingGroup" +
                              (" with subGroupPolicy per role" if caps.subgroups else
                               " (the installed PodGroup CRD has no subGroupPolicy)"))
        if not caps.podgroups:
            return out
        if self.watch.podgroups is None or not self.watch.podgroups.synced:
            if out.ok:  # no pod of a gang before its PodGroup: look again soon
                out.wait = WAIT_FOR_CACHE
            return out  # (not volcano: PodGroups left over are deleted once the cache is filled)
        ns, uid = key[0], str(ms["metadata"]["uid"])
        owned = self.expectations.overlay(key, KIND, self.watch.owned(key, uid))
        keep = {g.name for g in p.groups} if out.ok else set()
        for pg in owned:
            m = pg["metadata"]
            if m["name"] not in keep and m.get("uid"):
                await self.writer.delete(object_path(gang.API_VERSION, gang.PLURAL, ns, m["name"]), str(m["uid"]))
                self.expectations.deleted(key, KIND, str(m["uid"]))
                self._patched.pop((ns, m["name"]), None)
                log.info("%s/%s: deleted PodGroup %s", ns, key[1], m["name"])
        if not out.ok:
            return out
        mine = {pg["metadata"]["name"]: pg for pg in owned}
        for g in p.groups:
            pg = mine.get(g.name)
            if pg is None:
                other = self.watch.get(ns, g.name)
                if other is not None and not _controlled_by(other, uid):
                    out.blocked.append(f"podgroup {g.name}")
                    continue
                made = await self.writer.create(collection_path(gang.API_VERSION, gang.PLURAL, ns),
                                                gang.render_podgroup(ms, g.name, self.watch.state.subgroups))
                if made is None:
                    out.blocked.append(f"podgroup {g.name}")
                    continue
                self.expectations.created(key, KIND, made)
                log.info("%s/%s: created PodGroup %s", ns, key[1], g.name)
            else:
                rv = str(pg["metadata"].get("resourceVersion") or "")
                if self._patched.get((ns, g.name)) == rv:
                    continue  # the cache has not shown our last patch yet; its event requeues us
                self._patched.pop((ns, g.name), None)
                patch = gang.podgroup_patch(pg, ms, self.watch.state.subgroups)
                if patch is not None:
                    await self.writer.merge_patch(object_path(gang.API_VERSION, gang.PLURAL, ns, g.name), patch)
                    self._patched[(ns, g.name)] = rv
                    self.patches += 1
                    log.info("%s/%s: updated PodGroup %s: %s", ns, key[1], g.name, sorted(patch["spec"]))
        blocked_groups = {b.split(" ", 1)[1] for b in out.blocked}
        p.create_pods[:] = [pod for pod in p.create_pods
                            if (pod["metadata"].get("labels") or {}).get(n.LABEL_GROUP) not in blocked_groups]
        for pod in p.create_pods:
            gang.annotate_pod(pod)
        return out


def _controlled_by(obj: Obj, uid: str) -> bool:
    ok = owner_key(obj)
    return ok is not None and ok[1] == uid
