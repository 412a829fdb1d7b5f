"""One reconcile of one ModelBooster: convert it, create what is missing (POST), restore what
differs on the fields the booster owns (JSON merge patch of only those fields, with the
cached resourceVersion), delete generated objects it no longer wants (uid precondition),
then write its status (merge patch of the changed fields, with resourceVersion).

Generated objects carry a controller ownerReference (blockOwnerDeletion): deleting the
ModelBooster is left to the garbage collector. A booster that fails validation, or whose
objects the apiserver refuses, gets Failed=True naming the field; its generated objects are
left as they are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from controller import mergepatch
from controller.kubeapi import Writer, collection_path, object_path
from kthena_router.kube.client import ApiError

from . import names
from . import status as st
from .common import Images
from .convert import build, validate
from .desired import must_replace, patch_for
from .informers import CHILD_KINDS, BoosterInformers, Key

__all__ = ["BoosterReconciler"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
RETRY_BLOCKED_S = 30.0  # a name held by an object that is not ours: look again (we do not watch it)
_CREATED_TTL_S = 60.0


class BoosterReconciler:
    def __init__(self, informers: BoosterInformers, writer: Writer, images: Images = Images(),
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
        self.informers = informers
        self.writer = writer
        self.images = images
        self.clock = clock
        # own writes the watch has not delivered yet: (kind, ns, name) -> (rv it replaced, object)
        self._written: dict[tuple[str, str, str], tuple[str, Obj]] = {}
        self._created: dict[tuple[str, str, str], tuple[float, Obj]] = {}

    def _live(self, kind: str, key: Key, uid: str, name: str) -> Obj | None:
        ns = key[0]
        live = next((o for o in self.informers.owned(kind, key, uid) if o["metadata"]["name"] == name), None)
        ck = (kind, ns, name)
        if live is not None:
            self._created.pop(ck, None)
            own = self._written.get(ck)
            if own is not None:
                if own[0] == live["metadata"].get("resourceVersion"):
                    return own[1]
                del self._written[ck]
            return live
        made = self._created.get(ck)
        if made is not None and time.monotonic() - made[0] < _CREATED_TTL_S:
            return made[1]
        self._created.pop(ck, None)
        return None

    async def reconcile(self, key: Key) -> float | None:
        booster = self.informers.booster(key)
        if booster is None:
            self._written.pop((names.KIND, key[0], key[1]), None)
            return None
        booster = self._fresh_booster(key, booster)
        meta = booster["metadata"]
        if meta.get("deletionTimestamp"):
            return None  # the garbage collector removes what it owns
        uid = str(meta["uid"])
        ns = key[0]
        serving_name = names.backend_resource_name(key[1], ((booster.get("spec") or {}).get("backend") or {})
                                                   .get("name", ""))
        errors = validate(booster)
        problems: list[str] = [str(e) for e in errors]
        again: float | None = None
        if not errors:
            objs = build(booster, self.images)
            serving_name = objs[0]["metadata"]["name"]
            autoscaled = any(o["kind"] == "AutoscalingPolicy" for o in objs)
            for obj in objs:
                problem = await self._converge(key, uid, obj, autoscaled)
                if problem is not None:
                    problems.append(problem)
                    again = RETRY_BLOCKED_S
            await self._delete_unwanted(key, uid, {(o["kind"], o["metadata"]["name"]) for o in objs})
        serving = self._live("ModelServing", key, uid, serving_name)
        await self._write_status(key, booster, "; ".join(problems) if problems else None, serving, serving_name)
        return again

    def _fresh_booster(self, key: Key, cached: Obj) -> Obj:
        own = self._written.get((names.KIND, key[0], key[1]))
        if own is not None:
            if own[0] == cached["metadata"].get("resourceVersion") and \
                    own[1]["metadata"].get("uid") == cached["metadata"].get("uid"):
                return own[1]
            del self._written[(names.KIND, key[0], key[1])]
        return cached

    async def _converge(self, key: Key, uid: str, obj: Obj, autoscaled: bool) -> str | None:
        """Create or patch one generated object; a problem to report (Failed) or None."""
        kind, name, ns = obj["kind"], obj["metadata"]["name"], key[0]
        api_version, plural = CHILD_KINDS[kind]
        live = self._live(kind, key, uid, name)
        try:
            if live is None:
                other = self.informers.child(kind, ns, name)
                if other is not None and not other["metadata"].get("deletionTimestamp"):
                    return f"{kind} {ns}/{name} exists and is not controlled by this ModelBooster"
                made = await self.writer.create(collection_path(api_version, plural, ns), obj)
                if made is None:
                    return f"{kind} {ns}/{name} exists and is not controlled by this ModelBooster"
                self._created[(kind, ns, name)] = (time.monotonic(), made)
                log.info("%s/%s: created %s %s", ns, key[1], kind, name)
                return None
            field = must_replace(obj, live)
            if field is not None:  # its watch event brings us back to create the new one
                log.info("%s/%s: replacing %s %s (%s is immutable)", ns, key[1], kind, name, field)
                await self.writer.delete(object_path(api_version, plural, ns, name), str(live["metadata"]["uid"]))
                self._written.pop((kind, ns, name), None)
                return None
            patch = patch_for(obj, live, autoscaled)
            if not patch:
                return None
            rv = str(live["metadata"].get("resourceVersion") or "")
            patch.setdefault("metadata", {})["resourceVersion"] = rv
            log.info("%s/%s: updating %s %s: %s", ns, key[1], kind, name, ", ".join(_paths(patch)))
            written = await self.writer.merge_patch(object_path(api_version, plural, ns, name), patch)
            if written.get("metadata"):
                self._written[(kind, ns, name)] = (rv, written)
            return None
        except ApiError as exc:
            if exc.status in (400, 422):  # the apiserver refuses what the booster asks for
                return f"{kind} {ns}/{name} refused by the apiserver: {exc.message}"
            raise

    async def _delete_unwanted(self, key: Key, uid: str, wanted: set[tuple[str, str]]) -> None:
        ns = key[0]
        for kind, (api_version, plural) in CHILD_KINDS.items():
            for obj in self.informers.owned(kind, key, uid):
                m = obj["metadata"]
                if (kind, m["name"]) in wanted:
                    continue
                log.info("%s/%s: deleting %s %s (no longer generated)", ns, key[1], kind, m["name"])
                await self.writer.delete(object_path(api_version, plural, ns, m["name"]), str(m["uid"]))
                self._created.pop((kind, ns, m["name"]), None)

    async def _write_status(self, key: Key, booster: Obj, problem: str | None, serving: Obj | None,
                            serving_name: str) -> None:
        old = booster.get("status") or {}
        new = st.desired(booster, self.clock(), problem, serving, serving_name)
        patch = mergepatch.diff(old, new)
        if not patch:
            return
        rv = str(booster["metadata"]["resourceVersion"])
        written = await self.writer.patch_status(object_path(names.WORKLOAD_API, names.PLURAL, key[0], key[1]), rv,
                                                 patch)
        if written.get("metadata"):
            self._written[(names.KIND, key[0], key[1])] = (rv, written)


def _paths(patch: Obj, prefix: str = "") -> list[str]:
    """The changed fields of a patch, for the log."""
    out = []
    for k, v in patch.items():
        if k == "resourceVersion":
            continue
        p = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v:
            out += _paths(v, p)
        else:
            out.append(p)
    return out
