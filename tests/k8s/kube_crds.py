"""Minimal permissive CRDs for the router's Kubernetes-mode tests.

Same group/version/kind/plural as Kthena's networking CRDs, spec accepted as is
(`x-kubernetes-preserve-unknown-fields`), a status subresource. Swap `crd_docs()` for the
real CRDs (configs/crds) once they are merged: the tests only call `install_crds()`.
"""

from __future__ import annotations

from typing import Any

import harness
import k8s_harness

GROUP = "networking.serving.volcano.sh"
KINDS = {"ModelRoute": "modelroutes", "ModelServer": "modelservers",
         "ExternalModelProvider": "externalmodelproviders"}


def crd_docs() -> list[dict[str, Any]]:
    docs = []
    for kind, plural in KINDS.items():
        schema = {"type": "object", "properties": {
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}
        docs.append({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                     "metadata": {"name": f"{plural}.{GROUP}"},
                     "spec": {"group": GROUP, "scope": "Namespaced",
                              "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                                        "listKind": f"{kind}List"},
                              "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                                            "subresources": {"status": {}},
                                            "schema": {"openAPIV3Schema": schema}}]}})
    return docs


def install_crds(cp: k8s_harness.ControlPlane) -> None:
    existing = cp.kubectl("get", "crd", "-o", "name", check=False).stdout
    if all(f"{plural}.{GROUP}" in existing for plural in KINDS.values()):
        return  # the real CRDs (or ours) are there already
    cp.apply(crd_docs(), "--force-conflicts")
    with cp.client() as api:
        def served() -> bool:
            return all(api.get(f"/apis/{GROUP}/v1alpha1/namespaces/default/{p}").status_code == 200
                       for p in KINDS.values())
        harness.wait_until(served, 60, interval=0.2, what="CRDs served")
