"""Writes the status computed by kube.status to the objects' status subresource.

- Optimistic concurrency: a PUT of /status carries the resourceVersion it was computed
  from; a 409 (someone wrote in between) re-reads the object and merges again.
- Idempotent: nothing is written when the merged status equals the stored one. The status
  last read or written is cached per object with its resourceVersion, so a sync whose
  object is unchanged costs no request at all.
- Level-triggered: every call compares with the stored status, so any starting status
  (hand-edited, written by an older router, half-written) converges.
- Only the leader writes: `is_leader()` is asked just before each PUT.
- A CRD whose status schema cannot hold these fields (fieldValidation=Strict turns silent
  pruning into a 400) is reported once and that kind is not written again.

Use `update(view)` from the watcher (returns at once; the latest view wins) with `run()`
as a task, or `await write(view)` for one pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from .status import KINDS, DesiredStatus, desired_statuses, format_time, merge_status
from .view import ClusterView, ObjectKey

__all__ = ["StatusWriter", "WriteResult"]

log = logging.getLogger("kthena_router.kube.status")

FIELD_MANAGER = "kthena-router"
_MAX_ATTEMPTS = 5  # per object per pass: a 409 means re-read and merge again
_CONCURRENCY = 4
_RETRY_S = 5.0  # run(): a pass with errors is retried after this


@dataclass
class WriteResult:
    written: list[ObjectKey] = field(default_factory=list)
    unchanged: int = 0
    conflicts: int = 0  # 409s, each followed by a re-read
    skipped: list[ObjectKey] = field(default_factory=list)  # not leader, gone, recreated, stale view, bad CRD
    errors: list[tuple[ObjectKey, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Stored:
    uid: str
    resource_version: str
    status: dict[str, Any]


class StatusWriter:
    def __init__(self, api_client: ApiClient, is_leader: Callable[[], bool] = lambda: True,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 request_timeout: float = 10.0,
                 on_result: Callable[[WriteResult], None] | None = None) -> None:
        self._api = CustomObjectsApi(api_client)
        self._on_result = on_result  # run(): told each pass's result (metrics)
        self._is_leader = is_leader
        self._clock = clock
        self._timeout = request_timeout
        self._stored: dict[ObjectKey, _Stored] = {}
        self._unsupported: dict[str, str] = {}  # kind -> the apiserver's refusal
        self._lock = asyncio.Lock()
        self._latest: ClusterView | None = None
        self._wake = asyncio.Event()

    # ---- the watcher's side

    def update(self, view: ClusterView) -> None:
        """Remember the latest view and wake run(); never blocks."""
        self._latest = view
        self._wake.set()

    def kick(self) -> None:
        """Write the latest view again (e.g. when this replica becomes leader)."""
        self._wake.set()

    async def run(self) -> None:
        """Write each new view (coalesced: only the latest one); retry a pass with errors."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            view = self._latest
            if view is None or not self._is_leader():
                continue
            try:
                result = await self.write(view)
            except Exception:  # never let the task die: the next view or kick retries
                log.exception("status pass failed")
                result = WriteResult(errors=[(("", "", ""), "internal error")])
            if self._on_result is not None:
                self._on_result(result)
            if result.errors and not self._wake.is_set():
                asyncio.get_running_loop().call_later(_RETRY_S, self._wake.set)

    # ---- one pass

    async def write(self, view: ClusterView) -> WriteResult:
        async with self._lock:
            desired = desired_statuses(view)
            for key in [k for k in self._stored if k not in desired]:
                del self._stored[key]
            result = WriteResult()
            sem = asyncio.Semaphore(_CONCURRENCY)

            async def one(d: DesiredStatus) -> None:
                async with sem:
                    await self._write_one(d, result)

            await asyncio.gather(*(one(d) for d in desired.values()))
            return result

    async def _write_one(self, d: DesiredStatus, result: WriteResult) -> None:
        key, meta, info = d.key, d.meta, KINDS[d.kind]
        if d.kind in self._unsupported:
            result.skipped.append(key)
            return
        stored = self._stored.get(key)
        if stored is None or stored.resource_version != meta.resource_version or stored.uid != meta.uid:
            stored = await self._read(d, result)
            if stored is None:
                return
        for _ in range(_MAX_ATTEMPTS):
            if stored.uid != meta.uid:  # deleted and created again: the next view describes it
                result.skipped.append(key)
                return
            if _int(stored.status.get("observedGeneration")) > meta.generation:
                result.skipped.append(key)  # written from a newer view (another replica): ours is stale
                return
            merged = merge_status(stored.status, d, format_time(self._clock()))
            if merged == stored.status:
                result.unchanged += 1
                return
            if not self._is_leader():
                result.skipped.append(key)
                return
            body = {"apiVersion": f"{info.group}/{info.version}", "kind": d.kind,
                    "metadata": {"name": d.name, "namespace": d.namespace, "uid": stored.uid,
                                 "resourceVersion": stored.resource_version},
                    "status": merged}
            try:
                obj = await self._api.replace_namespaced_custom_object_status(
                    info.group, info.version, d.namespace, info.plural, d.name, body,
                    field_manager=FIELD_MANAGER, field_validation="Strict", _request_timeout=self._timeout)
            except ApiException as e:
                if e.status == 409:
                    result.conflicts += 1
                    reread = await self._read(d, result)
                    if reread is None:
                        return
                    stored = reread
                    continue
                if e.status == 404:
                    self._stored.pop(key, None)
                    result.skipped.append(key)
                    return
                if e.status in (400, 422) and "unknown field" in str(e.body):
                    self._unsupported[d.kind] = str(e.body)
                    log.warning("the %s CRD's status schema does not hold the router's status fields; "
                                "%s status is not written (apiserver: %s)", d.kind, d.kind, _short(e))
                    result.skipped.append(key)
                    return
                self._stored.pop(key, None)
                result.errors.append((key, _short(e)))
                log.warning("status of %s %s/%s not written: %s", d.kind, d.namespace, d.name, _short(e))
                return
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                self._stored.pop(key, None)
                result.errors.append((key, repr(e)))
                return
            self._stored[key] = _from_object(obj)
            result.written.append(key)
            return
        result.errors.append((key, f"gave up after {_MAX_ATTEMPTS} conflicting writes"))

    async def _read(self, d: DesiredStatus, result: WriteResult) -> _Stored | None:
        info = KINDS[d.kind]
        try:
            obj = await self._api.get_namespaced_custom_object_status(
                info.group, info.version, d.namespace, info.plural, d.name, _request_timeout=self._timeout)
        except ApiException as e:
            self._stored.pop(d.key, None)
            if e.status == 404:
                result.skipped.append(d.key)
            else:
                result.errors.append((d.key, _short(e)))
            return None
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            self._stored.pop(d.key, None)
            result.errors.append((d.key, repr(e)))
            return None
        stored = _from_object(obj)
        self._stored[d.key] = stored
        return stored

    @property
    def unsupported_kinds(self) -> dict[str, str]:
        return dict(self._unsupported)


def _from_object(obj: dict[str, Any]) -> _Stored:
    meta = obj.get("metadata") or {}
    status = obj.get("status")
    return _Stored(str(meta.get("uid", "")), str(meta.get("resourceVersion", "")),
                   dict(status) if isinstance(status, dict) else {})


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _short(e: ApiException) -> str:
    return f"HTTP {e.status} {e.reason}: {str(e.body)[:300]}"
