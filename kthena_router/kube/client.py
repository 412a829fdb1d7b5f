"""The apiserver connection: kubeconfig or in-cluster credentials, raw JSON list and watch.

Lists and watches go through kubernetes-asyncio's ApiClient (authentication, TLS, token
refresh of in-cluster service-account tokens) but with `_preload_content=False`: the
router reads the JSON itself (plain dicts; the generated model classes cost a lot per pod
and would drop fields of our permissive CRDs).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client as kclient
from kubernetes_asyncio import config as kconfig

__all__ = ["CONNECTED", "ApiError", "KubeApi", "connect"]

CONNECTED = "_CONNECTED"  # a pseudo event: the watch request was accepted


class ApiError(Exception):
    """A non-2xx answer of the apiserver (status, reason, message of its Status body)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


@dataclass
class KubeApi:
    api: kclient.ApiClient
    server: str

    async def close(self) -> None:
        await self.api.close()

    async def _get(self, path: str, query: list[tuple[str, Any]], timeout: aiohttp.ClientTimeout) -> Any:
        resp = await self.api.call_api(
            path, "GET", query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout)
        if not 200 <= resp.status <= 299:
            body = await resp.read()
            resp.release()
            raise _api_error(resp.status, body)
        return resp

    async def list(self, path: str, params: dict[str, str], page: int = 500,
                   timeout_s: float = 60.0) -> tuple[list[dict[str, Any]], str]:
        """Every item (paginated) and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        cont = ""
        while True:
            query = [*params.items(), ("limit", page)]
            if cont:
                query.append(("continue", cont))
            resp = await self._get(path, query, aiohttp.ClientTimeout(total=timeout_s))
            try:
                body = json.loads(await resp.read())
            finally:
                resp.release()
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                return items, str(meta.get("resourceVersion") or "")

    async def watch(self, path: str, params: dict[str, str], resource_version: str,
                    timeout_s: float) -> AsyncIterator[dict[str, Any]]:
        """Events ({"type", "object"}) until the server ends the watch (timeoutSeconds)."""
        query = [*params.items(), ("watch", "true"), ("resourceVersion", resource_version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", int(timeout_s))]
        # No read may take longer than the server-side timeout plus a margin (bookmarks
        # arrive about once a minute; a dead connection without RST ends here).
        timeout = aiohttp.ClientTimeout(connect=10, sock_connect=10, sock_read=timeout_s + 30)
        resp = await self._get(path, query, timeout)
        try:
            yield {"type": CONNECTED}  # the watch is open (the reflector's health)
            while True:
                line = await resp.content.readline()
                if not line:
                    return
                line = line.strip()
                if line:
                    yield json.loads(line)
        finally:
            resp.close()


def _api_error(status: int, body: bytes) -> ApiError:
    try:
        st = json.loads(body)
        return ApiError(status, str(st.get("reason") or ""), str(st.get("message") or body[:300].decode(errors="replace")))
    except ValueError:
        return ApiError(status, "", body[:300].decode(errors="replace"))


async def connect(kubeconfig: str = "", context: str = "") -> KubeApi:
    """In-cluster credentials when `kubeconfig` is empty, else that file (and context)."""
    cfg = kclient.Configuration()
    if kubeconfig:
        await kconfig.load_kube_config(config_file=kubeconfig, context=context or None, client_configuration=cfg,
                                       persist_config=False)
    else:
        kconfig.load_incluster_config(client_configuration=cfg)
    return KubeApi(kclient.ApiClient(configuration=cfg), cfg.host)
