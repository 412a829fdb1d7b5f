"""One reconcile of one ModelServing: converge its pods and Services to the plan, then its
status. Level-triggered: it reads only the caches (never the event that woke it), so any
starting state converges and running it twice changes nothing.

- Recovery first (controller/recovery.py): failed, restarted or lost pods get their role
  replica or ServingGroup deleted per spec.recoveryPolicy; the plan recreates them.
- Deletes (the surplus chosen by the planner), each with a uid precondition, then
  creates (Services, then pods): POST of the rendered object; an existing object of the
  same name is never overwritten (no blind update). A name held by an object that is not
  ours (or still terminating) blocks that create; the reconcile is retried with backoff.
  Writes of one kind go out in slow-start batches (1, 2, 4, ... 32 at once), as the
  ReplicaSet controller creates pods.
- Revisions (history.py): the update revision's ControllerRevision is created before
  anything else; revisions no longer in use are pruned after the status write.
- Status: written only when it differs from the stored one, as a JSON merge patch of
  /status with only the changed fields and the cached resourceVersion (a 409 retries the
  reconcile with the newer object).
- Plugins (`spec.plugins`, plugins/): run on every pod before its POST. A chain that cannot
  be built or fails on a pod creates no pod (a pod without its plugins would be wrong); the
  condition `PluginsApplied` (present only with plugins) says why.
- Half-done deletes are finished: an owned pod (or Service) left with a deletionTimestamp,
  deletionGracePeriodSeconds 0 and no finalizer is deleted again (uid precondition). The
  apiserver removes such an object in two steps (store the deletionTimestamp, then delete
  it); a client gone in between (a controller killed during its DELETE) leaves it
  terminating for good where no kubelet or pod GC finishes it, holding its name and counted
  by nobody. A second DELETE completes it at once (apiserver rest.BeforeDelete); its event
  requeues the ModelServing. Not for a DELETE this process saw answered (the cache only
  lags behind it: no second request).
- A ModelServing that is gone or being deleted is left to the garbage collector: the pods
  and Services carry its ownerReference (blockOwnerDeletion), so a foreground or background
  cascade removes them; the controller never deletes them for that.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

from . import history, mergepatch
from . import naming as n
from .plugins import Chain, HookRequest, PluginError, build_chain
from .events import EventRecorder
from .expectations import Expectations
from .gang import CONDITION as GANG_CONDITION
from .gang_sync import GangSync
from .informers import Informers, Key
from .kubeapi import Writer, collection_path, object_path
from .planner import Plan, plan
from .recovery import Decision, Recovery
from .role_events import RoleEvents
from .status import Extra, desired_status
from .workqueue import RetryableError

__all__ = ["Reconciler"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
_PLURAL = {"pods": "pods", "services": "services"}
PLUGINS_CONDITION = "PluginsApplied"
SLOW_START_LIMIT = 32  # most writes of one reconcile in flight at once
ANSWERED_TTL = 300.0  # seconds a DELETE this process saw answered is remembered (Expectations' ttl)


class Blocked(RetryableError):
    pass


def half_deleted(obj: Obj) -> bool:
    """Being deleted with no grace period left and nothing to wait for: the apiserver's second
    step (removing it) never happened, and a new DELETE does it."""
    m = obj.get("metadata") or {}
    return bool(m.get("deletionTimestamp")) and m.get("deletionGracePeriodSeconds") in (0, None) \
        and not m.get("finalizers")


async def slow_start(items: list[Obj], call: Callable[[Obj], Awaitable[None]], limit: int = SLOW_START_LIMIT) -> None:
    """`call` on every item in concurrent batches of 1, 2, 4, ... up to `limit` (client-go's
    slow start, as the ReplicaSet controller creates pods): a large ModelServing is not ~1000
    sequential round trips, and a failing write stops after a small batch instead of
    repeating for every object. The first error is raised once its batch has finished, so
    every write that succeeded is recorded by `call`."""
    size, i = 1, 0
    while i < len(items):
        batch = items[i:i + size]
        results = await asyncio.gather(*(call(o) for o in batch), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        i += len(batch)
        size = min(size * 2, limit)


class Reconciler:
    def __init__(self, informers: Informers, writer: Writer, expectations: Expectations | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 gang: GangSync | None = None, recovery: Recovery | None = None,
                 events: EventRecorder | None = None) -> None:
        """`gang`: Volcano PodGroups (controller/gang_sync.py); None: never used. `events`:
        Kubernetes Events on the ModelServings; None: none written."""
        self.informers = informers
        self.gang = gang
        self.writer = writer
        self.expectations = expectations or Expectations()
        self.clock = clock
        self.recovery = recovery or Recovery()
        self.status_writes = 0
        self.events = events
        self.role_events = RoleEvents()
        # key -> (the resourceVersion a status patch was based on, the object it returned): until
        # the cache moves past that resourceVersion, the returned object is the newer one
        self._own_writes: dict[Key, tuple[str, Obj]] = {}
        self._answered: dict[str, float] = {}  # uid -> until when: our DELETE of it was answered

    async def _delete(self, key: Key, kind: str, obj: Obj) -> None:
        """DELETE one owned pod or Service (that incarnation: uid precondition)."""
        m = obj["metadata"]
        uid = str(m["uid"])
        await self.writer.delete(object_path("v1", _PLURAL[kind], key[0], m["name"]), uid)
        self.expectations.deleted(key, kind, uid)
        self._answered[uid] = time.monotonic() + ANSWERED_TTL

    def _latest(self, key: Key, ms: Obj) -> Obj:
        """The cached ModelServing, or the one our last status patch returned while the watch
        has not delivered it yet (the cached resourceVersion would only earn a 409)."""
        own = self._own_writes.get(key)
        if own is not None:
            if own[0] == ms["metadata"].get("resourceVersion") and own[1]["metadata"].get("uid") == ms["metadata"]["uid"]:
                return own[1]
            del self._own_writes[key]
        return ms

    async def reconcile(self, key: Key) -> float | None:
        ms = self.informers.modelserving(key)
        if ms is None:
            self.expectations.forget(key)
            self._own_writes.pop(key, None)
            self.recovery.forget(key)
            self.role_events.forget(key)
            return None
        ms = self._latest(key, ms)
        meta = ms["metadata"]
        if meta.get("deletionTimestamp"):
            return None  # the garbage collector removes what it owns
        uid = str(meta["uid"])
        ours = self.expectations.pending_deletes(key, "pods")  # before overlay drops the confirmed ones
        pods = self.expectations.overlay(key, "pods", self.informers.owned("pods", key, uid))
        services = self.expectations.overlay(key, "services", self.informers.owned("services", key, uid))
        revisions = self.expectations.overlay(key, history.KIND, self.informers.owned(history.KIND, key, uid))
        await self._finish_deletes(key, uid)
        pods, services, again, recovered = await self._recover(key, ms, pods, services, ours)
        p = plan(ms, pods, services, history.templates(revisions))
        gang = await self.gang.sync(key, ms, p) if self.gang is not None else None  # before any pod
        if gang is not None and gang.wait is not None:
            return gang.wait
        if not await history.ensure(self.writer, self.expectations, key, ms, p.revision, revisions):
            raise Blocked(f"{key[0]}/{key[1]}: ControllerRevision {history.name(key[1], p.revision)} exists but is "
                          f"not ours (or still terminating); retrying")
        extra: dict[str, Extra] = {}
        if gang is not None:
            extra[GANG_CONDITION] = (gang.ok, gang.reason, gang.message)
        chain = self._plugins(ms, p, extra)
        created: list[Obj] = []
        blocked = await self._apply(key, p, ms, chain, extra, created)
        self._record(key, ms, p, created, recovered, blocked)
        blocked += gang.blocked if gang is not None else []
        status = await self._write_status(key, ms, p, extra)
        await history.prune(self.writer, self.expectations, key, revisions, history.in_use(status, pods))
        if blocked:
            raise Blocked(f"{key[0]}/{key[1]}: {', '.join(blocked)} exist but are not ours (or still "
                          f"terminating); retrying")
        return again

    def _record(self, key: Key, ms: Obj, p: Plan, created: list[Obj], recovered: list[Obj],
                blocked: list[str]) -> None:
        if self.events is None:
            return
        for etype, reason, message in self.role_events.step(key, p, created, [*recovered, *p.delete_pods]):
            self.events.emit(ms, etype, reason, message)
        if blocked:
            self.events.emit(ms, "Warning", "FailedCreate",
                             f"{', '.join(blocked)} exist but are not owned by this ModelServing")

    async def _finish_deletes(self, key: Key, uid: str) -> None:
        """DELETE again the owned objects a DELETE left half done (half_deleted), unless it was
        ours and answered (the object is gone already; the cache has not shown it yet)."""
        now = time.monotonic()
        for u in [u for u, until in self._answered.items() if until <= now]:
            del self._answered[u]
        for kind in ("pods", "services"):
            for obj in self.informers.terminating(kind, key, uid):
                if half_deleted(obj) and str(obj["metadata"]["uid"]) not in self._answered:
                    log.info("%s/%s: finishing the deletion of %s %s", key[0], key[1], kind[:-1],
                             obj["metadata"]["name"])
                    await self._delete(key, kind, obj)

    async def _recover(self, key: Key, ms: Obj, pods: list[Obj], services: list[Obj], ours: set[str]
                       ) -> tuple[list[Obj], list[Obj], float | None, list[Obj]]:
        """The recovery policy (controller/recovery.py): delete the role replicas or groups to
        recreate (uid preconditions); the plan then sees them missing and creates them.
        Returns the pods and Services left, when to look again (a grace period or backoff),
        and the pods deleted."""
        d: Decision = self.recovery.step(key, ms, pods, services, ours, self.clock())
        for unit, why in d.recreate:
            log.info("%s/%s: recreating %s (%s)", key[0], key[1], unit, why)
            if self.events is not None:
                self.events.emit(ms, "Warning", "Recreating", f"{unit}: {why}")
        for unit, wait in d.postponed:
            log.info("%s/%s: recreation of %s held back %.0fs (backoff)", key[0], key[1], unit, wait)
        gone: set[str] = set()
        for kind, doomed in (("services", d.delete_services), ("pods", d.delete_pods)):
            for obj in doomed:
                await self._delete(key, kind, obj)
                gone.add(str(obj["metadata"]["uid"]))
        self.recovery.applied(key, d)
        if not gone:
            return pods, services, d.requeue_after, []
        keep = [o for o in pods if str(o["metadata"]["uid"]) not in gone]
        return (keep, [s for s in services if str(s["metadata"]["uid"]) not in gone], d.requeue_after,
                list(d.delete_pods))

    @staticmethod
    def _plugins(ms: Obj, p: Plan, extra: dict[str, Extra]) -> Chain | None:
        """The plugin chain, or None when it cannot be built (no pod is created then)."""
        if not (ms.get("spec") or {}).get("plugins"):
            extra[PLUGINS_CONDITION] = None
            return Chain([])
        try:
            chain = build_chain(ms)
        except PluginError as exc:
            extra[PLUGINS_CONDITION] = (False, "PluginError", str(exc))
            return None
        extra[PLUGINS_CONDITION] = (True, "PluginsApplied", f"{len(chain.entries)} plugin(s) run on every new pod")
        return chain

    async def _apply(self, key: Key, p: Plan, ms: Obj, chain: Chain | None, extra: dict[str, Extra],
                     created: list[Obj]) -> list[str]:
        """Deletes and creates the plan's objects; the pods created are appended to `created`;
        returns the objects that exist but are not ours."""
        ns = key[0]
        if p.surplus_groups:
            log.info("%s/%s: removing ServingGroups %s", ns, key[1], ", ".join(p.surplus_groups))
        if p.updating:
            log.info("%s/%s: replacing %s for revision %s", ns, key[1], ", ".join(p.updating), p.revision)
        for kind, doomed in (("pods", p.delete_pods), ("services", p.delete_services)):
            async def delete(obj: Obj, kind: str = kind) -> None:
                await self._delete(key, kind, obj)
            await slow_start(doomed, delete)
        blocked: list[str] = []
        pods = self._with_plugins(ms, p.create_pods, chain, extra)
        for kind, new in (("services", p.create_services), ("pods", pods)):  # Services first: DNS names
            async def create(obj: Obj, kind: str = kind) -> None:
                made = await self.writer.create(collection_path("v1", _PLURAL[kind], ns), obj)
                if made is None:
                    blocked.append(f"{kind[:-1]} {obj['metadata']['name']}")
                else:
                    self.expectations.created(key, kind, made)
                    if kind == "pods":
                        created.append(made)
            await slow_start(new, create)
        if p.create_pods or p.delete_pods:
            log.info("%s/%s: created %d pods, %d Services; deleted %d pods, %d Services", ns, key[1],
                     len(p.create_pods), len(p.create_services), len(p.delete_pods), len(p.delete_services))
        return blocked

    @staticmethod
    def _with_plugins(ms: Obj, pods: list[Obj], chain: Chain | None, extra: dict[str, Extra]) -> list[Obj]:
        """The pods to create, each run through the plugins; none if a plugin fails."""
        if chain is None:
            return []
        if not chain:
            return pods
        try:
            for pod in pods:
                labels = pod["metadata"].get("labels") or {}
                chain.on_pod_create(HookRequest(ms, labels.get(n.LABEL_GROUP, ""), labels.get(n.LABEL_ROLE, ""),
                                                labels.get(n.LABEL_ROLE_ID, ""), labels.get(n.LABEL_ENTRY) == n.ENTRY,
                                                pod))
        except PluginError as exc:
            extra[PLUGINS_CONDITION] = (False, "PluginError", str(exc))
            return []
        return pods

    async def _write_status(self, key: Key, ms: Obj, p: Plan, extra: dict[str, Extra]) -> Obj:
        """The status now stored (the desired one once written)."""
        old = ms.get("status") or {}
        new = desired_status(ms, p, self.clock(), extra)
        patch = mergepatch.diff(old, new)
        if not patch:
            return old  # nothing changed: no request
        rv = str(ms["metadata"]["resourceVersion"])
        written = await self.writer.patch_status(object_path(ms["apiVersion"], "modelservings", key[0], key[1]),
                                                 rv, patch)
        if written.get("metadata"):
            self._own_writes[key] = (rv, written)
        self.status_writes += 1
        return new
