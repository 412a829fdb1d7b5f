"""Kubernetes' own types embedded in Kthena's CRDs (pod templates, resources, env, references,
conditions), as structural CRD schema.

The source is a snapshot of the published core/v1 OpenAPI (k8s_core_v1.json, refreshed by
scripts/k8s-openapi-snapshot.py from the test control plane). Conversion rules, the same
choices controller-gen makes for Kthena's CRDs:

- references are inlined; Quantity and IntOrString become int-or-string (Quantity with its
  pattern); Time is a date-time string; an embedded ObjectMeta is a bare object;
- descriptions, enums (they grow with Kubernetes releases; the apiserver checks the pod the
  controller creates) and patch-strategy markers are dropped;
- defaults are kept (``protocol: TCP`` keys the ports list) except on required properties and
  empty-object/empty-list defaults, which would inject values the user never wrote.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from .schema import QUANTITY_PATTERN, Node, raw

__all__ = ["ROOTS", "SNAPSHOT", "core", "kubernetes_version"]

SNAPSHOT = Path(__file__).with_name("k8s_core_v1.json")
_CORE = "io.k8s.api.core.v1."
_META = "io.k8s.apimachinery.pkg.apis.meta.v1."
ROOTS = (
    _CORE + "PodSpec", _CORE + "ResourceRequirements", _CORE + "Affinity", _CORE + "Toleration",
    _CORE + "EnvVar", _CORE + "EnvFromSource", _CORE + "SecretKeySelector", _CORE + "ObjectReference",
    _META + "LabelSelector", _META + "Condition",
)
_SPECIAL: dict[str, dict[str, Any]] = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {
        "anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": True},
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
        "anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True},
    _META + "Time": {"format": "date-time", "type": "string"},
    _META + "MicroTime": {"format": "date-time", "type": "string"},
    _META + "ObjectMeta": {"type": "object"},
}
_DROP = {"description", "enum", "default", "discriminator", "x-kubernetes-patch-merge-key",
         "x-kubernetes-patch-strategy", "x-kubernetes-unions", "x-kubernetes-group-version-kind"}
_PREFIX = "#/components/schemas/"


@cache
def _snapshot() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    return doc


def kubernetes_version() -> str:
    return str(_snapshot()["kubernetesVersion"])


def _convert(s: dict[str, Any], *, required: bool = False) -> dict[str, Any]:
    ref = s.get("$ref")
    if ref is None and len(s.get("allOf", ())) == 1:
        ref = s["allOf"][0].get("$ref")
    if ref is not None:
        out = _resolve(ref.removeprefix(_PREFIX))
    else:
        out = {}
        for k, v in s.items():
            if k in _DROP or k == "allOf":
                continue
            if k == "properties":
                req = set(s.get("required", ()))
                out[k] = {name: _convert(p, required=name in req) for name, p in v.items()}
            elif k in ("items", "additionalProperties") and isinstance(v, dict):
                out[k] = _convert(v)
            else:
                out[k] = v
    d = s.get("default")
    if d is not None and not required and d not in ({}, []):
        out = {**out, "default": d}
    return out


@cache
def _resolve_cached(name: str) -> str:
    if name in _SPECIAL:
        return json.dumps(_SPECIAL[name])
    return json.dumps(_convert(_snapshot()["schemas"][name]))


def _resolve(name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(_resolve_cached(name))  # a fresh copy each time
    return result


def core(name: str, description: str = "") -> Node:
    """A Kubernetes type by short name: ``core("PodSpec")``, ``core("meta.Condition")``."""
    full = _META + name[5:] if name.startswith("meta.") else _CORE + name
    return raw(_resolve(full), description)
