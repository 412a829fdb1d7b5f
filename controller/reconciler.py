"""One reconcile of one ModelServing: converge its pods and Services to the plan, then its
status. Level-triggered: it reads only the caches (never the event that woke it), so any
starting state converges and running it twice changes nothing.

- Recovery first (controller/recovery.py): failed, restarted or lost pods get their role
  replica or ServingGroup deleted per spec.recoveryPolicy; the plan recreates them.
- Deletes (the surplus chosen by the planner), each with a uid precondition, then
  creates (Services, then pods): POST of the rendered object; an existing object of the
  same name is never overwritten (no blind update). A name held by an object that is not
  ours (or still terminating) blocks that create; the reconcile is retried with backoff.
- Status: written only when it differs from the stored one, as a PUT of /status carrying
  the cached resourceVersion (a 409 retries the reconcile with the newer object).
- A ModelServing that is gone or being deleted is left to the garbage collector: the pods
  and Services carry its ownerReference (blockOwnerDeletion), so a foreground or background
  cascade removes them; the controller never deletes them for that.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from .expectations import Expectations
from .informers import Informers, Key
from .kubeapi import Writer, collection_path, object_path
from .planner import Plan, plan
from .recovery import Decision, Recovery
from .status import desired_status
from .workqueue import RetryableError

__all__ = ["Reconciler"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
_PLURAL = {"pods": "pods", "services": "services"}


class Blocked(RetryableError):
    pass


class Reconciler:
    def __init__(self, informers: Informers, writer: Writer, expectations: Expectations | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 recovery: Recovery | None = None) -> None:
        self.informers = informers
        self.writer = writer
        self.expectations = expectations or Expectations()
        self.clock = clock
        self.recovery = recovery or Recovery()
        self.status_writes = 0

    async def reconcile(self, key: Key) -> float | None:
        ms = self.informers.modelserving(key)
        if ms is None:
            self.expectations.forget(key)
            self.recovery.forget(key)
            return None
        meta = ms["metadata"]
        if meta.get("deletionTimestamp"):
            return None  # the garbage collector removes what it owns
        uid = str(meta["uid"])
        ours = self.expectations.pending_deletes(key, "pods")  # before overlay drops the confirmed ones
        pods = self.expectations.overlay(key, "pods", self.informers.owned("pods", key, uid))
        services = self.expectations.overlay(key, "services", self.informers.owned("services", key, uid))
        pods, services, again = await self._recover(key, ms, pods, services, ours)
        p = plan(ms, pods, services)
        blocked = await self._apply(key, p)
        await self._write_status(key, ms, p)
        if blocked:
            raise Blocked(f"{key[0]}/{key[1]}: {', '.join(blocked)} exist but are not ours (or still "
                          f"terminating); retrying")
        return again

    async def _recover(self, key: Key, ms: Obj, pods: list[Obj], services: list[Obj], ours: set[str]
                       ) -> tuple[list[Obj], list[Obj], float | None]:
        """The recovery policy (controller/recovery.py): delete the role replicas or groups to
        recreate (uid preconditions); the plan then sees them missing and creates them.
        Returns the pods and Services left, and when to look again (a grace period or backoff)."""
        d: Decision = self.recovery.step(key, ms, pods, services, ours, self.clock())
        for unit, why in d.recreate:
            log.info("%s/%s: recreating %s (%s)", key[0], key[1], unit, why)
        for unit, wait in d.postponed:
            log.info("%s/%s: recreation of %s held back %.0fs (backoff)", key[0], key[1], unit, wait)
        gone: set[str] = set()
        for kind, doomed in (("services", d.delete_services), ("pods", d.delete_pods)):
            for obj in doomed:
                m = obj["metadata"]
                await self.writer.delete(object_path("v1", _PLURAL[kind], key[0], m["name"]), str(m["uid"]))
                self.expectations.deleted(key, kind, str(m["uid"]))
                gone.add(str(m["uid"]))
        self.recovery.applied(key, d)
        if not gone:
            return pods, services, d.requeue_after
        keep = [o for o in pods if str(o["metadata"]["uid"]) not in gone]
        return keep, [s for s in services if str(s["metadata"]["uid"]) not in gone], d.requeue_after

    async def _apply(self, key: Key, p: Plan) -> list[str]:
        ns = key[0]
        if p.surplus_groups:
            log.info("%s/%s: removing ServingGroups %s", ns, key[1], ", ".join(p.surplus_groups))
        for kind, doomed in (("pods", p.delete_pods), ("services", p.delete_services)):
            for obj in doomed:
                m = obj["metadata"]
                await self.writer.delete(object_path("v1", _PLURAL[kind], ns, m["name"]), str(m["uid"]))
                self.expectations.deleted(key, kind, str(m["uid"]))
        blocked: list[str] = []
        for kind, new in (("services", p.create_services), ("pods", p.create_pods)):
            for obj in new:
                name = obj["metadata"]["name"]
                made = await self.writer.create(collection_path("v1", _PLURAL[kind], ns), obj)
                if made is None:
                    blocked.append(f"{kind[:-1]} {name}")
                else:
                    self.expectations.created(key, kind, made)
        if p.create_pods or p.delete_pods:
            log.info("%s/%s: created %d pods, %d Services; deleted %d pods, %d Services", ns, key[1],
                     len(p.create_pods), len(p.create_services), len(p.delete_pods), len(p.delete_services))
        return blocked

    async def _write_status(self, key: Key, ms: Obj, p: Plan) -> None:
        old = ms.get("status") or {}
        new = desired_status(ms, p, self.clock())
        if new == old:
            return  # nothing changed: no request
        body = copy.deepcopy(ms)
        body["status"] = new
        await self.writer.replace_status(
            object_path(ms["apiVersion"], "modelservings", key[0], key[1]), body)
        self.status_writes += 1
