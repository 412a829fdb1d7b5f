"""Expectations: the controller's own writes that its caches have not shown yet.

After a create or delete, the next reconcile of the same ModelServing may run before the
watch delivers that change (the pod event that caused it, a status write...). Planned on
the stale cache, it would delete a second surplus group or count a created group as
missing. So the reconciler overlays what it wrote and has not seen yet: objects it created
count as present, objects it deleted as gone, until the cache agrees or `ttl` passes (a
lost event must not block forever; the ReplicaSet controller uses 5 minutes too).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["Expectations"]

Key = tuple[str, str]
Obj = dict[str, Any]


def _meta(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


class Expectations:
    def __init__(self, ttl: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock
        self._creates: dict[tuple[Key, str], dict[str, tuple[Obj, float]]] = {}  # (owner, kind) -> name -> obj
        self._deletes: dict[tuple[Key, str], dict[str, float]] = {}  # (owner, kind) -> uid -> deadline

    def created(self, owner: Key, kind: str, obj: Obj) -> None:
        self._creates.setdefault((owner, kind), {})[str(_meta(obj)["name"])] = (obj, self.clock() + self.ttl)

    def deleted(self, owner: Key, kind: str, uid: str) -> None:
        self._deletes.setdefault((owner, kind), {})[uid] = self.clock() + self.ttl

    def forget(self, owner: Key) -> None:
        for d in (self._creates, self._deletes):
            for k in [k for k in d if k[0] == owner]:
                del d[k]

    def pending(self, owner: Key) -> int:
        return sum(len(v) for k, v in self._creates.items() if k[0] == owner) + sum(
            len(v) for k, v in self._deletes.items() if k[0] == owner)

    def observe(self, owner: Key, kind: str, obj: Obj) -> None:
        """An informer event showed `obj`: the create of that incarnation (same uid) is seen.
        Without this, a created object deleted by someone else before the next reconcile
        looked at the cache would stay overlaid as present until the ttl."""
        creates = self._creates.get((owner, kind))
        if not creates:
            return
        m = _meta(obj)
        name = str(m.get("name"))
        expected = creates.get(name)
        if expected is not None and str(_meta(expected[0]).get("uid")) == str(m.get("uid")):
            del creates[name]

    def pending_deletes(self, owner: Key, kind: str) -> set[str]:
        """Uids this controller deleted whose removal the cache may not show yet (read before
        `overlay`, which drops the confirmed ones)."""
        return set(self._deletes.get((owner, kind), {}))

    def overlay(self, owner: Key, kind: str, observed: list[Obj]) -> list[Obj]:
        """`observed` (live objects from the cache) corrected by the writes not seen yet;
        expectations the cache now confirms (or that expired) are dropped."""
        now = self.clock()
        names = {str(_meta(o).get("name")) for o in observed}
        uids = {str(_meta(o).get("uid")) for o in observed}
        creates = self._creates.get((owner, kind), {})
        for name in [x for x, (_, deadline) in creates.items() if x in names or deadline <= now]:
            del creates[name]
        deletes = self._deletes.get((owner, kind), {})
        for uid in [u for u, deadline in deletes.items() if u not in uids or deadline <= now]:
            del deletes[uid]
        out = [o for o in observed if str(_meta(o).get("uid")) not in deletes]
        out += [obj for obj, _ in creates.values()]
        return out
