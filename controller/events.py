"""Kubernetes Events on the objects the controller manages, for `kubectl describe`.

Kthena records RoleCreating / RoleRunning / RoleDeleting on a ModelServing (with the same
message text as here). Events are best effort and never hold up a reconcile: `emit` only
queues, one task writes. A full queue drops the event (counted). The same event on the same
object (type, reason, message) within `window_s` bumps the count of the Event already
written instead of creating another object, as client-go's EventCorrelator does; the
correlation is in memory, so a restarted controller starts new Events.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from kthena_router.kube.client import ApiError

from .kubeapi import Conflict, NotLeader, Writer, collection_path, object_path

__all__ = ["COMPONENT", "EventRecorder", "Recorded", "event_body"]

COMPONENT = "kthena-controller"
NORMAL, WARNING = "Normal", "Warning"

log = logging.getLogger(__name__)

Obj = dict[str, Any]


@dataclass
class Recorded:
    name: str  # the Event object's name
    count: int
    at: float  # monotonic time of the last write


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(obj: Obj, etype: str, reason: str, message: str, name: str, instance: str) -> Obj:
    """A core/v1 Event about `obj` (count 1)."""
    meta = obj["metadata"]
    ts = _now()
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", ""),
                               "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid", "")},
            "type": etype, "reason": reason, "message": message[:1024],
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT, "reportingInstance": instance,
            "firstTimestamp": ts, "lastTimestamp": ts, "count": 1}


class EventRecorder:
    def __init__(self, writer: Writer, *, max_queue: int = 1000, window_s: float = 600.0, remember: int = 4096,
                 clock: Callable[[], float] | None = None, on_drop: Callable[[], None] | None = None) -> None:
        self.writer = writer
        self.window_s = window_s
        self.remember = remember
        self._clock = clock or time.monotonic
        self._queue: asyncio.Queue[tuple[Obj, str, str, str]] = asyncio.Queue(max_queue)
        self._seen: OrderedDict[tuple[str, str, str, str], Recorded] = OrderedDict()
        self._on_drop = on_drop
        self._instance = f"{socket.gethostname()}-{os.getpid()}"
        self._serial = 0
        self.written = 0  # Events created or bumped (tests, logs)

    def emit(self, obj: Obj, etype: str, reason: str, message: str) -> None:
        try:
            self._queue.put_nowait((obj, etype, reason, message))
        except asyncio.QueueFull:
            if self._on_drop is not None:
                self._on_drop()

    async def run(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                await self._write(*item)
            except NotLeader:
                pass  # a replica that lost the Lease writes nothing, events included
            except (ApiError, Conflict, OSError, asyncio.TimeoutError) as exc:
                log.debug("event %s on %s not written: %s", item[2], item[0]["metadata"].get("name"), exc)

    async def _write(self, obj: Obj, etype: str, reason: str, message: str) -> None:
        meta = obj["metadata"]
        key = (str(meta.get("uid", "")), etype, reason, message)
        now = self._clock()
        seen = self._seen.get(key)
        ns = meta["namespace"]
        if seen is not None and now - seen.at <= self.window_s:
            try:
                await self.writer.merge_patch(object_path("v1", "events", ns, seen.name),
                                              {"count": seen.count + 1, "lastTimestamp": _now()})
            except Conflict:  # the Event is gone (its TTL): write a new one
                pass
            else:
                seen.count += 1
                seen.at = now
                self._seen.move_to_end(key)
                self.written += 1
                return
        self._serial += 1
        # client-go names Events <object>.<hex timestamp>; a serial keeps names unique per process
        name = f"{meta['name']}.{int(now * 1e6):x}{self._serial:04x}"
        made = await self.writer.create(collection_path("v1", "events", ns),
                                        event_body(obj, etype, reason, message, name, self._instance))
        if made is None:
            return
        self._seen[key] = Recorded(name, 1, now)
        self._seen.move_to_end(key)
        while len(self._seen) > self.remember:
            self._seen.popitem(last=False)
        self.written += 1
