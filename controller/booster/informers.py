"""List+watch of ModelBoosters and of the objects they generate (ModelServings, ModelServers,
ModelRoutes, AutoscalingPolicies carrying Kthena's managed-by label), indexed by their
controller ownerReference; every change enqueues the owning ModelBooster."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from kthena_router.kube.client import KubeApi
from kthena_router.kube.reflector import Reflector, Resource

from controller.informers import reindex

from . import names

__all__ = ["BoosterInformers", "CHILD_KINDS", "Key"]

log = logging.getLogger(__name__)

Key = tuple[str, str]
Obj = dict[str, Any]

# kind -> (apiVersion, plural)
CHILD_KINDS: dict[str, tuple[str, str]] = {
    "ModelServing": (names.WORKLOAD_API, "modelservings"),
    "ModelServer": (names.NETWORKING_API, "modelservers"),
    "ModelRoute": (names.NETWORKING_API, "modelroutes"),
    "AutoscalingPolicy": (names.WORKLOAD_API, "autoscalingpolicies"),
}


def booster_owner(obj: Obj) -> tuple[Key, str] | None:
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == names.KIND and ref.get("apiVersion") == names.WORKLOAD_API:
            return (str(meta.get("namespace") or ""), str(ref.get("name") or "")), str(ref.get("uid") or "")
    return None


def _path(namespace: str, api_version: str, plural: str) -> str:
    base = f"/apis/{api_version}"
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


class BoosterInformers:
    def __init__(self, api: KubeApi, namespace: str, enqueue: Callable[[Key], None],
                 watch_timeout_s: float = 300.0) -> None:
        self.enqueue = enqueue
        self._owned: dict[str, dict[Key, set[Key]]] = {k: defaultdict(set) for k in CHILD_KINDS}
        self.boosters = Reflector(
            api, Resource(names.PLURAL, _path(namespace, names.WORKLOAD_API, names.PLURAL), {}), lambda: None,
            self._error, watch_timeout_s=watch_timeout_s, on_object=lambda key, old, new: self.enqueue(key))
        selector = {"labelSelector": f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY}"}
        self.children: dict[str, Reflector] = {}
        for kind, (api_version, plural) in CHILD_KINDS.items():
            self.children[kind] = Reflector(
                api, Resource(f"booster {plural}", _path(namespace, api_version, plural), dict(selector)),
                lambda: None, self._error, watch_timeout_s=watch_timeout_s,
                on_object=lambda key, old, new, kind=kind: self._child(kind, key, old, new))
        self.reflectors = (self.boosters, *self.children.values())

    @property
    def synced(self) -> bool:
        return all(r.synced for r in self.reflectors)

    def _error(self, resource: str, reason: str) -> None:
        log.debug("informer %s: %s", resource, reason)

    def _child(self, kind: str, key: Key, old: Obj | None, new: Obj | None) -> None:
        before = booster_owner(old) if old is not None else None
        after = booster_owner(new) if new is not None else None
        reindex(self._owned[kind], key, before, after)
        for o in {x[0] for x in (before, after) if x is not None}:
            self.enqueue(o)

    def booster(self, key: Key) -> Obj | None:
        return self.boosters.store.get(key)

    def child(self, kind: str, namespace: str, name: str) -> Obj | None:
        """The cached object of that name (owned by anyone, if it carries the managed-by label)."""
        return self.children[kind].store.get((namespace, name))

    def owned(self, kind: str, key: Key, uid: str) -> list[Obj]:
        """Live objects of `kind` whose controller is that ModelBooster incarnation."""
        store = self.children[kind].store
        out = []
        for k in sorted(self._owned[kind].get(key, ())):
            obj = store.get(k)
            if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
                continue
            o = booster_owner(obj)
            if o is not None and o[1] == uid:
                out.append(obj)
        return out

    async def run(self) -> None:
        await asyncio.gather(*(r.run() for r in self.reflectors))
