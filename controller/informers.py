"""Informers: list+watch of ModelServings and of the pods, Services and ControllerRevisions
they own, in local stores (kthena_router.kube.reflector: bookmarks, re-list on 410 Gone,
backoff), with an owner index, feeding the work queue.

Every change of a ModelServing enqueues its key; every change of an owned pod or Service
enqueues its owner's key (before and after the change, so moving ownership is seen on both
sides). Pods and Services are watched with Kthena's selector (the group-name label exists)
and owned by their controller ownerReference to a ModelServing. Pods are trimmed to what
the controller reads (metadata, status phase/conditions, and the container statuses'
restartCount/state/lastState for recovery, podIP for the autoscaler's scrapes).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from kthena_router.kube.client import KubeApi
from kthena_router.kube.reflector import Reflector, Resource

from . import naming as n

__all__ = ["Informers", "Key", "owner_key", "reindex"]

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
Obj = dict[str, Any]

_SELECTOR = {"labelSelector": n.LABEL_GROUP}


def owner_key(obj: Obj) -> tuple[Key, str] | None:
    """(the owning ModelServing's key, its uid) from the controller ownerReference."""
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == n.KIND and ref.get("apiVersion") == n.GROUP_VERSION:
            return (str(meta.get("namespace") or ""), str(ref.get("name") or "")), str(ref.get("uid") or "")
    return None


def reindex(index: dict[Key, set[Key]], key: Key, before: tuple[Key, str] | None,
            after: tuple[Key, str] | None) -> None:
    """Move child `key` in an owner -> children index from its owner before a change to its
    owner after it (owner_key() results; None: no owner)."""
    if before is not None and (after is None or before[0] != after[0]):
        index[before[0]].discard(key)
        if not index[before[0]]:
            del index[before[0]]
    if after is not None:
        index[after[0]].add(key)


def _trim_pod(pod: Obj) -> Obj:
    meta = pod.get("metadata") or {}
    st = pod.get("status") or {}
    keep = ("name", "namespace", "uid", "resourceVersion", "labels", "annotations", "ownerReferences",
            "deletionTimestamp", "deletionGracePeriodSeconds", "finalizers", "creationTimestamp")
    status: Obj = {"phase": st.get("phase"), "conditions": st.get("conditions") or []}
    if st.get("podIP"):  # the autoscaler scrapes the pods' metrics (controller/autoscaler/collector.py)
        status["podIP"] = st["podIP"]
    for field in ("initContainerStatuses", "containerStatuses"):  # recovery: restarts and their times
        if st.get(field):
            status[field] = [_trim_container_status(cs) for cs in st[field]]
    return {"metadata": {k: meta[k] for k in keep if k in meta}, "status": status}


def _trim_container_status(cs: Obj) -> Obj:
    return {k: cs[k] for k in ("name", "restartCount", "ready", "state", "lastState") if k in cs}


def _path(namespace: str, api_version: str, plural: str) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


class Informers:
    def __init__(self, api: KubeApi, namespace: str, enqueue: Callable[[Key], None],
                 watch_timeout_s: float = 300.0) -> None:
        """`namespace`: watch one namespace, or all when empty."""
        self.enqueue = enqueue
        # every event of an owned object, before its owner is queued (Expectations.observe: a
        # created object seen once is no longer overlaid, even if deleted before a reconcile)
        self.on_owned_event: Callable[[Key, str, Obj], None] | None = None
        self._owned: dict[str, dict[Key, set[Key]]] = {
            "pods": defaultdict(set), "services": defaultdict(set), "controllerrevisions": defaultdict(set)}
        self.modelservings = Reflector(
            api, Resource("modelservings", _path(namespace, n.GROUP_VERSION, "modelservings"), {}),
            lambda: None, self._error, watch_timeout_s=watch_timeout_s,
            on_object=lambda key, old, new: self.enqueue(key))
        self.pods = Reflector(
            api, Resource("pods", _path(namespace, "v1", "pods"), dict(_SELECTOR)), lambda: None, self._error,
            watch_timeout_s=watch_timeout_s, transform=_trim_pod,
            on_object=lambda key, old, new: self._child("pods", key, old, new))
        self.services = Reflector(
            api, Resource("services", _path(namespace, "v1", "services"), dict(_SELECTOR)), lambda: None, self._error,
            watch_timeout_s=watch_timeout_s,
            on_object=lambda key, old, new: self._child("services", key, old, new))
        # ControllerRevisions (history.py) carry Kthena's name label, as pods and Services the group label.
        self.revisions = Reflector(
            api, Resource("controllerrevisions", _path(namespace, "apps/v1", "controllerrevisions"),
                          {"labelSelector": n.LABEL_NAME}), lambda: None, self._error,
            watch_timeout_s=watch_timeout_s,
            on_object=lambda key, old, new: self._child("controllerrevisions", key, old, new))
        self.reflectors = (self.modelservings, self.pods, self.services, self.revisions)

    @property
    def synced(self) -> bool:
        return all(r.synced for r in self.reflectors)

    def _error(self, resource: str, reason: str) -> None:
        log.debug("informer %s: %s", resource, reason)

    def _child(self, kind: str, key: Key, old: Obj | None, new: Obj | None) -> None:
        before = owner_key(old) if old is not None else None
        after = owner_key(new) if new is not None else None
        reindex(self._owned[kind], key, before, after)
        if self.on_owned_event is not None:
            for owner, obj in ((before, old), (after, new)):
                if owner is not None and obj is not None:
                    self.on_owned_event(owner[0], kind, obj)
        for o in {x[0] for x in (before, after) if x is not None}:
            self.enqueue(o)

    def modelserving(self, key: Key) -> Obj | None:
        return self.modelservings.store.get(key)

    def owned(self, kind: str, key: Key, uid: str) -> list[Obj]:
        """The live objects of `kind` (pods | services | controllerrevisions) whose controller is
        that ModelServing incarnation (uid), not being deleted."""
        return self._owned_objects(kind, key, uid, terminating=False)

    def terminating(self, kind: str, key: Key, uid: str) -> list[Obj]:
        """The objects of `kind` whose controller is that ModelServing incarnation and that are
        being deleted (a deletionTimestamp)."""
        return self._owned_objects(kind, key, uid, terminating=True)

    def _owned_objects(self, kind: str, key: Key, uid: str, terminating: bool) -> list[Obj]:
        store = {"pods": self.pods, "services": self.services, "controllerrevisions": self.revisions}[kind].store
        out = []
        for k in sorted(self._owned[kind].get(key, ())):
            obj = store.get(k)
            if obj is None or bool((obj.get("metadata") or {}).get("deletionTimestamp")) != terminating:
                continue
            ok = owner_key(obj)
            if ok is not None and ok[1] == uid:
                out.append(obj)
        return out

    async def run(self) -> None:
        await asyncio.gather(*(r.run() for r in self.reflectors))
