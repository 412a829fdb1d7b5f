"""List+watch of one resource: a local store kept in step with the apiserver.

The loop: list (paginated; the list's resourceVersion), then watch from that version with
bookmarks (the server sends the newest version now and then, so a reconnect resumes from
there instead of a version etcd may have compacted). A watch ended by the server
(timeoutSeconds) or by a dropped connection resumes from the last version seen. `410 Gone`
(the version is too old, as an HTTP status or an ERROR event) makes it re-list. Other
errors (apiserver down, 403 Forbidden, CRD not installed) keep the store as it is and
retry after a jittered exponential backoff. A re-list replaces the store as a whole, so
objects deleted while the watch was down disappear too.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from .client import CONNECTED, ApiError, KubeApi

log = logging.getLogger(__name__)

__all__ = ["Backoff", "Reflector", "Resource"]

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class Resource:
    """What to watch: a display name, the collection path and query parameters."""

    name: str  # e.g. "modelroutes", "pods" (metric label, log lines)
    path: str  # /apis/<group>/<version>[/namespaces/<ns>]/<plural> or /api/v1[/namespaces/<ns>]/pods
    params: dict[str, str]  # e.g. labelSelector


class Backoff:
    """Full-jitter exponential backoff: uniform(0, min(cap, base * 2**n)), at least `floor`."""

    def __init__(self, base: float = 0.5, cap: float = 30.0, floor: float = 0.1,
                 rng: random.Random | None = None) -> None:
        self.base, self.cap, self.floor = base, cap, floor
        self.failures = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        top = min(self.cap, self.base * (2 ** min(self.failures, 30)))
        self.failures += 1
        return max(self.floor, self._rng.uniform(0, top))

    def reset(self) -> None:
        self.failures = 0


class _Gone(Exception):
    pass


class Reflector:
    def __init__(self, api: KubeApi, resource: Resource, on_change: Callable[[], None],
                 on_error: Callable[[str, str], None], *, watch_timeout_s: float = 300.0,
                 transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 on_object: Callable[[Key, dict[str, Any] | None, dict[str, Any] | None], None] | None = None,
                 ) -> None:
        """`on_change()` after every change of the store; `on_error(resource, reason)` per failure
        (reason: forbidden | not_found | gone | unavailable | error). `transform` trims each
        object before it is stored (e.g. a pod down to what endpoints need). `on_object(key, old,
        new)` per changed object (new None: deleted; old None: added), also for the differences a
        re-list finds (a controller maps objects to the keys it must reconcile)."""
        self.api = api
        self.resource = resource
        self.on_change = on_change
        self.on_error = on_error
        self.watch_timeout_s = watch_timeout_s
        self.transform = transform or (lambda o: o)
        self.on_object = on_object
        self.store: dict[Key, dict[str, Any]] = {}
        self.resource_version = ""
        self.synced = False  # a first list completed
        self.last_error = ""
        self.lists = 0  # completed lists (tests, logs)
        self.backoff = Backoff()

    @staticmethod
    def key_of(obj: dict[str, Any]) -> Key:
        meta = obj.get("metadata") or {}
        return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))

    async def run(self) -> None:
        while True:
            try:
                if not self.resource_version:
                    await self._list()
                await self._watch()
                self.backoff.reset()
            except (_Gone, ApiError) as exc:
                if isinstance(exc, ApiError) and exc.status != 410:
                    await self._failed(exc)
                    continue
                self.on_error(self.resource.name, "gone")
                log.info("watch of %s: resourceVersion %s is too old (410 Gone); re-listing",
                         self.resource.name, self.resource_version)
                self.resource_version = ""
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep the store; retry later
                await self._failed(exc)

    async def _failed(self, exc: Exception) -> None:
        reason, text = _describe(exc, self.resource)
        self.last_error = text
        self.on_error(self.resource.name, reason)
        delay = self.backoff.next()
        level = logging.WARNING if self.backoff.failures <= 3 or reason == "forbidden" else logging.INFO
        log.log(level, "watch of %s failed (%s); keeping the last state, retrying in %.1fs",
                self.resource.name, text, delay)
        await asyncio.sleep(delay)

    async def _list(self) -> None:
        items, rv = await self.api.list(self.resource.path, self.resource.params)
        store = {}
        for obj in items:
            store[self.key_of(obj)] = self.transform(obj)
        old, self.store = self.store, store
        if self.on_object is not None:
            for key in old.keys() | store.keys():
                before, after = old.get(key), store.get(key)
                if before is None or after is None or _rv(before) != _rv(after):
                    self.on_object(key, before, after)
        self.resource_version = rv
        self.synced = True
        self.last_error = ""
        self.lists += 1
        self.on_change()

    async def _watch(self) -> None:
        async for ev in self.api.watch(self.resource.path, self.resource.params, self.resource_version,
                                       self.watch_timeout_s):
            kind = ev.get("type")
            if kind == CONNECTED:
                if self.last_error:  # recovered: let the owner see it (health gauge, readiness text)
                    self.last_error = ""
                    self.on_change()
                continue
            obj = ev.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise _Gone()
                raise ApiError(int(obj.get("code") or 500), str(obj.get("reason") or ""), str(obj.get("message") or ""))
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            if kind == "BOOKMARK":
                if rv:
                    self.resource_version = rv
                continue
            key = self.key_of(obj)
            before = self.store.get(key)
            after: dict[str, Any] | None
            if kind in ("ADDED", "MODIFIED"):
                after = self.store[key] = self.transform(obj)
            elif kind == "DELETED":
                before = self.store.pop(key, None) or self.transform(obj)
                after = None
            else:
                continue
            if self.on_object is not None:
                self.on_object(key, before, after)
            if rv:
                self.resource_version = rv
            self.last_error = ""
            self.backoff.reset()
            self.on_change()


def _rv(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _describe(exc: Exception, res: Resource) -> tuple[str, str]:
    if isinstance(exc, ApiError):
        if exc.status == 410:
            return "gone", str(exc)
        if exc.status in (401, 403):
            return "forbidden", (f"{exc.status} {exc.reason}: {exc.message} (the router's RBAC must allow "
                                 f"list and watch on {res.name}; see docs/kubernetes.md)")
        if exc.status == 404:
            return "not_found", f"404: {res.path} is not served (is the CRD installed?)"
        if exc.status >= 500:
            return "unavailable", str(exc)
        return "error", str(exc)
    if isinstance(exc, (aiohttp.ClientConnectionError, asyncio.TimeoutError, ConnectionError, OSError)):
        return "unavailable", f"apiserver unreachable: {type(exc).__name__}: {exc}"
    return "error", f"{type(exc).__name__}: {exc}"
