"""CRDs for the router's Kubernetes-mode tests: `install_crds()` installs the real ones
(configs/crds); `crd_docs()` are permissive ones (spec accepted as is), same group, version,
kind and plural, kept for tests that need an object the real schema would refuse."""

from __future__ import annotations

from typing import Any

import k8s_crds
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
    """The project's real CRDs (configs/crds); `crd_docs()` stays for tests of a permissive schema."""
    k8s_crds.install_crds(cp)
