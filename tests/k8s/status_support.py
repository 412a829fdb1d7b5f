"""Shared by the status and leader tests: an async API client for the test control plane,
and ClusterViews built from the apiserver's objects as the watcher builds them."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient

import k8s_harness
from kthena_router.config.errors import ConfigError, ConfigProblem
from kthena_router.config.loader import config_from_objects
from kthena_router.kube.view import ClusterView, ObjectKey, ObjectMeta

KTHENA_KINDS = ("ModelRoute", "ModelServer", "ExternalModelProvider")
_PLURALS = {"ModelRoute": "modelroutes", "ModelServer": "modelservers",
            "ExternalModelProvider": "externalmodelproviders"}
API = "networking.serving.volcano.sh/v1alpha1"


async def api_client(cp: k8s_harness.ControlPlane) -> ApiClient:
    return await kube_config.new_client_from_config(config_file=str(cp.kubeconfig))


def list_objects(cp: k8s_harness.ControlPlane, namespace: str) -> list[dict[str, Any]]:
    """Kthena's objects and the Secrets of a namespace, as the watcher lists them."""
    out: list[dict[str, Any]] = []
    with cp.client() as api:
        for kind, plural in _PLURALS.items():
            r = api.get(f"/apis/{API}/namespaces/{namespace}/{plural}")
            r.raise_for_status()
            out += [{**o, "kind": kind, "apiVersion": API} for o in r.json()["items"]]
        r = api.get(f"/api/v1/namespaces/{namespace}/secrets")
        r.raise_for_status()
        out += [{**o, "kind": "Secret", "apiVersion": "v1"} for o in r.json()["items"]]
    return out


def _key(obj: Mapping[str, Any]) -> ObjectKey:
    m = obj["metadata"]
    return (obj["kind"], m.get("namespace", "default"), m["name"])


def build_view(objects: Iterable[Mapping[str, Any]],
               ready: Mapping[tuple[str, str], Mapping[str, int]] | None = None) -> ClusterView:
    """config_from_objects over the valid objects: an object with a problem is left out and
    the rest loaded again (a route whose target was left out then fails in turn)."""
    docs = [dict(o) for o in objects]
    problems: dict[ObjectKey, str] = {}
    details: dict[ObjectKey, list[ConfigProblem]] = {}
    kept = list(docs)
    while True:
        try:
            cfg = config_from_objects(kept, source="kubernetes", digest="test")
            break
        except ConfigError as e:
            bad: set[int] = set()
            for p in e.problems:
                m = re.match(r"document (\d+)", p.document)
                assert m, p
                i = int(m.group(1)) - 1
                bad.add(i)
                key = _key(kept[i])
                details.setdefault(key, []).append(p)
                problems[key] = problems.get(key, "") + ("; " if key in problems else "") + str(p)
            kept = [d for i, d in enumerate(kept) if i not in bad]
    metas = {
        _key(o): ObjectMeta(o["apiVersion"], o["metadata"]["uid"], int(o["metadata"].get("generation", 1)),
                            o["metadata"]["resourceVersion"])
        for o in docs if o["kind"] in KTHENA_KINDS
    }
    return ClusterView(cfg, metas, {k: v for k, v in problems.items() if k[0] in KTHENA_KINDS},
                       dict(ready or {}), {k: tuple(v) for k, v in details.items() if k[0] in KTHENA_KINDS})
