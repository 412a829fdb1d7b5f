"""The controller's writes: create, delete (with a uid precondition), status merge patch.

Raw JSON through kubernetes-asyncio's ApiClient (as kthena_router.kube.client reads), so
objects stay plain dicts. Every write first asks `is_leader()`: a replica that lost the
Lease stops writing at once, even in the middle of a reconcile.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

import aiohttp

from kthena_router.kube.client import ApiError, KubeApi

from .workqueue import RetryableError

__all__ = ["Conflict", "NotLeader", "Writer", "collection_path", "object_path"]

FIELD_MANAGER = "kthena-controller"

log = logging.getLogger(__name__)


class NotLeader(RetryableError):
    pass


class Conflict(RetryableError):
    """409: the object changed since it was read (or already exists)."""


def collection_path(api_version: str, plural: str, namespace: str) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/namespaces/{namespace}/{plural}"


def object_path(api_version: str, plural: str, namespace: str, name: str) -> str:
    return f"{collection_path(api_version, plural, namespace)}/{name}"


_VERB = {"POST": "create", "DELETE": "delete", "PUT": "update", "PATCH": "patch"}


def _resource(path: str) -> str:
    """`pods`, `modelservings/status`, ... from a namespaced request path."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    try:
        i = parts.index("namespaces")
    except ValueError:
        return parts[-1] if parts else ""
    rest = parts[i + 2:]  # plural[, name[, subresource]]
    return "/".join([rest[0], *rest[2:3]]) if rest else ""


class Writer:
    def __init__(self, api: KubeApi, is_leader: Callable[[], bool] = lambda: True, timeout_s: float = 30.0,
                 on_write: Callable[[str, str, int], None] | None = None, exit_after_writes: int = 0) -> None:
        """`on_write(verb, resource, status)` after each response (metrics); `exit_after_writes`
        (tests only: --exit-after-writes): SIGKILL this process right after the k-th response."""
        self.api = api
        self.is_leader = is_leader
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.writes = 0  # requests sent (tests, logs)
        self.on_write = on_write
        self.exit_after_writes = exit_after_writes

    async def _call(self, method: str, path: str, body: Any, query: list[tuple[str, Any]] | None = None,
                    content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
        if not self.is_leader():
            raise NotLeader(f"not the leader: {method} {path} not sent")
        self.writes += 1
        resp = await self.api.api.call_api(
            path, method, query_params=query or [], body=body,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            auth_settings=["BearerToken"], _preload_content=False, _request_timeout=self.timeout)
        try:
            raw = await resp.read()
        finally:
            resp.release()
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"message": raw[:300].decode(errors="replace")}
        if self.on_write is not None:
            self.on_write(_VERB.get(method, method.lower()), _resource(path), resp.status)
        if self.exit_after_writes and self.writes >= self.exit_after_writes:
            # crash tests: die between two writes as a node failure or OOM kill would
            log.warning("--exit-after-writes %d reached (%s %s -> %d): SIGKILL", self.exit_after_writes,
                        method, path, resp.status)
            os.kill(os.getpid(), signal.SIGKILL)
        return resp.status, data

    @staticmethod
    def _error(status: int, data: dict[str, Any]) -> ApiError:
        return ApiError(status, str(data.get("reason") or ""), str(data.get("message") or ""))

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The created object, or None when one of that name exists already."""
        status, data = await self._call("POST", path, body, [("fieldManager", FIELD_MANAGER)])
        if status == 409 and data.get("reason") == "AlreadyExists":
            return None
        if not 200 <= status <= 299:
            raise self._error(status, data)
        return data

    async def delete(self, path: str, uid: str) -> bool:
        """Delete that incarnation only (uid precondition); False if it is gone already or replaced."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid},
                "propagationPolicy": "Background"}
        status, data = await self._call("DELETE", path, body)
        if status in (404, 409):
            return False
        if not 200 <= status <= 299:
            raise self._error(status, data)
        return True

    async def patch_status(self, path: str, resource_version: str, status: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of .../status with only the changed fields (`status`, null for a
        removed one) and metadata.resourceVersion: the apiserver refuses it with 409 when the
        object changed since it was read (optimistic concurrency, as a PUT would)."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        code, data = await self._call("PATCH", path + "/status", body, [("fieldManager", FIELD_MANAGER)],
                                      content_type="application/merge-patch+json")
        if code == 409:
            raise Conflict(f"status of {path}: {data.get('message', 'conflict')}")
        if not 200 <= code <= 299:
            raise self._error(code, data)
        return data

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (only the changed fields; a metadata.resourceVersion in it makes
        it conditional). 409 (changed meanwhile) and 404 (gone) retry the reconcile."""
        status, data = await self._call("PATCH", path, patch, [("fieldManager", FIELD_MANAGER)],
                                         content_type="application/merge-patch+json")
        if status in (404, 409):
            raise Conflict(f"patch of {path}: {data.get('message', status)}")
        if not 200 <= status <= 299:
            raise self._error(status, data)
        return data
