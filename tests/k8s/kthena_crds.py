"""Minimal CRDs for Kthena's networking kinds (same group, version, kind, plural, status
subresource) with a permissive schema, for tests that need the kinds to exist.

`crd_documents()` are the real CRDs (configs/crds; their status schemas declare the fields
the router writes). `crd(kind)` is a permissive one, and `kthena_shaped_status()` Kthena's own
status schema for ModelRoute (an empty object), for the test of a CRD that prunes our status.
"""

from __future__ import annotations

import time
from typing import Any

import k8s_crds
import k8s_harness

GROUP = "networking.serving.volcano.sh"
KINDS = {  # kind -> plural
    "ModelRoute": "modelroutes",
    "ModelServer": "modelservers",
    "ExternalModelProvider": "externalmodelproviders",
}
_OPEN = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def crd(kind: str, status_schema: dict[str, Any] | None = None) -> dict[str, Any]:
    plural = KINDS[kind]
    schema = {"type": "object", "properties": {"spec": _OPEN, "status": status_schema or _OPEN}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": schema}, "subresources": {"status": {}}}],
        },
    }


def crd_documents() -> list[dict[str, Any]]:
    """The project's real CRDs (configs/crds) of the networking kinds."""
    return [d for d in k8s_crds.crd_documents() if d["spec"]["names"]["kind"] in KINDS]


def kthena_shaped_status() -> dict[str, Any]:
    """Kthena's ModelRouteStatus / ModelServerStatus: an empty struct (unknown fields pruned)."""
    return {"type": "object"}


def install(cp: k8s_harness.ControlPlane, docs: list[dict[str, Any]] | None = None) -> None:
    """Apply the CRDs (default: the real ones, every kind) and wait until each is Established and served."""
    if docs is None:
        k8s_crds.install_crds(cp)
        return
    cp.apply(docs, "--force-conflicts")
    deadline = time.monotonic() + 60
    with cp.client() as api:
        for d in docs:
            name = d["metadata"]["name"]
            plural, group = name.split(".", 1)
            while True:
                got = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}").json()
                conds = {c["type"]: c["status"] for c in got.get("status", {}).get("conditions", [])}
                listed = api.get(f"/apis/{group}/v1alpha1/{plural}").status_code == 200
                if conds.get("Established") == "True" and listed:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"CRD {name} not established: {got.get('status')}")
                time.sleep(0.2)
