"""What the cluster offers for gang scheduling, watched (level-triggered): Volcano's
PodGroup CRD (podgroups.scheduling.volcano.sh) and, while it is installed, the PodGroups the
ModelServings own.

As Kthena's podgroupmanager: a watch of the one CRD by name (field selector) decides whether
PodGroups are used (the CRD exists, is Established and serves v1beta1) and whether its
schema declares spec.subGroupPolicy (older Volcano releases do not; the field is then never
sent). When the CRD appears the PodGroup informer starts, when it goes away it stops, and
every ModelServing is reconciled again (`on_change`), so a Volcano installed after the
controller is used at once, without a restart.

If the CRD cannot be read (RBAC forbids it, the apiserver fails), the state is reported as
unknown and PodGroups are not used; the reflector keeps retrying.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kthena_router.kube.client import KubeApi
from kthena_router.kube.reflector import Reflector, Resource

from . import gang
from . import naming as n
from .informers import Key, owner_key

__all__ = ["Capabilities", "VolcanoWatch", "crd_capabilities"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
VERSION = "v1beta1"


@dataclass(frozen=True)
class Capabilities:
    podgroups: bool  # the PodGroup CRD is installed and served
    subgroups: bool  # its schema has spec.subGroupPolicy
    detail: str  # why not (for the condition's message), or ""


def crd_capabilities(crd: Obj | None) -> Capabilities:
    """Kthena's check (podGroupCRDHasSubGroup) plus Established and a served v1beta1."""
    if crd is None:
        return Capabilities(False, False, f"the CRD {gang.CRD_NAME} is not installed")
    if (crd.get("metadata") or {}).get("deletionTimestamp"):
        return Capabilities(False, False, f"the CRD {gang.CRD_NAME} is being deleted")
    conds = {c.get("type"): c.get("status") for c in (crd.get("status") or {}).get("conditions") or []}
    if conds.get("Established") != "True":
        return Capabilities(False, False, f"the CRD {gang.CRD_NAME} is not Established yet")
    version = next((v for v in (crd.get("spec") or {}).get("versions") or []
                    if v.get("name") == VERSION and v.get("served")), None)
    if version is None:
        return Capabilities(False, False, f"the CRD {gang.CRD_NAME} does not serve {VERSION}")
    spec = (((version.get("schema") or {}).get("openAPIV3Schema") or {}).get("properties") or {}).get("spec") or {}
    return Capabilities(True, "subGroupPolicy" in (spec.get("properties") or {}), "")


def _path(namespace: str) -> str:
    base = f"/apis/{gang.API_VERSION}"
    return f"{base}/namespaces/{namespace}/{gang.PLURAL}" if namespace else f"{base}/{gang.PLURAL}"


class VolcanoWatch:
    def __init__(self, api: KubeApi, namespace: str, enqueue: Callable[[Key], None],
                 on_change: Callable[[], None], watch_timeout_s: float = 300.0) -> None:
        """`enqueue(key)` for a change of an owned PodGroup; `on_change()` when the
        capabilities change (the caller re-queues every ModelServing)."""
        self.api, self.namespace = api, namespace
        self.enqueue, self.on_change = enqueue, on_change
        self.watch_timeout_s = watch_timeout_s
        self.state = Capabilities(False, False, "the PodGroup CRD has not been read yet")
        self.crds = Reflector(
            api, Resource("customresourcedefinitions", CRD_PATH, {"fieldSelector": f"metadata.name={gang.CRD_NAME}"}),
            self._crd_changed, self._crd_error, watch_timeout_s=watch_timeout_s)
        self.podgroups: Reflector | None = None
        self._pg_task: asyncio.Task[None] | None = None
        self._owned: dict[Key, set[Key]] = defaultdict(set)
        self._crd_failed = False

    @property
    def synced(self) -> bool:
        """The CRD was read (or could not be: then PodGroups are off) and, when PodGroups are
        used, their cache is filled."""
        if not (self.crds.synced or self._crd_failed):
            return False
        pg = self.podgroups
        # A PodGroup list that fails (RBAC) must not keep the workers from starting; the
        # reconciles of volcano-scheduled ModelServings then wait for it (GangSync).
        return not self.state.podgroups or (pg is not None and (pg.synced or bool(pg.last_error)))

    def _crd_error(self, resource: str, reason: str) -> None:
        if not self.crds.synced and not self._crd_failed:
            self._crd_failed = True
            self.state = Capabilities(False, False, f"the CRD {gang.CRD_NAME} cannot be read "
                                                    f"({self.crds.last_error or reason})")
            log.warning("gang scheduling off: %s", self.state.detail)
            self.on_change()

    def _crd_changed(self) -> None:
        crd = next(iter(self.crds.store.values()), None)
        new = crd_capabilities(crd)
        if new == self.state:
            return
        old, self.state = self.state, new
        log.info("Volcano PodGroups %s%s", "in use" if new.podgroups else "not used",
                 (" (subGroupPolicy supported)" if new.subgroups else " (no subGroupPolicy)") if new.podgroups
                 else f": {new.detail}")
        if new.podgroups and not old.podgroups:
            self._start_podgroups()
        elif old.podgroups and not new.podgroups:
            self._stop_podgroups()
        self.on_change()

    def _start_podgroups(self) -> None:
        self.podgroups = Reflector(
            self.api, Resource("podgroups", _path(self.namespace), {"labelSelector": n.LABEL_GROUP}),
            lambda: None, lambda resource, reason: log.debug("informer podgroups: %s", reason),
            watch_timeout_s=self.watch_timeout_s, on_object=self._podgroup)
        self._pg_task = asyncio.get_running_loop().create_task(self.podgroups.run(), name="informer podgroups")

    def _stop_podgroups(self) -> None:
        if self._pg_task is not None:
            self._pg_task.cancel()
        self._pg_task, self.podgroups = None, None
        owners = list(self._owned)
        self._owned.clear()
        for o in owners:
            self.enqueue(o)

    def _podgroup(self, key: Key, old: Obj | None, new: Obj | None) -> None:
        before = owner_key(old) if old is not None else None
        after = owner_key(new) if new is not None else None
        if before is not None and (after is None or before[0] != after[0]):
            self._owned[before[0]].discard(key)
            if not self._owned[before[0]]:
                del self._owned[before[0]]
        if after is not None:
            self._owned[after[0]].add(key)
        for o in {x[0] for x in (before, after) if x is not None}:
            self.enqueue(o)

    def get(self, namespace: str, name: str) -> Obj | None:
        return self.podgroups.store.get((namespace, name)) if self.podgroups is not None else None

    def owned(self, key: Key, uid: str) -> list[Obj]:
        """PodGroups whose controller is that ModelServing incarnation, not being deleted."""
        if self.podgroups is None:
            return []
        out = []
        for k in sorted(self._owned.get(key, ())):
            obj = self.podgroups.store.get(k)
            if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
                continue
            ok = owner_key(obj)
            if ok is not None and ok[1] == uid:
                out.append(obj)
        return out

    async def run(self) -> None:
        try:
            await self.crds.run()
        finally:
            if self._pg_task is not None:
                self._pg_task.cancel()
