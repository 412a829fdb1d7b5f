"""What the booster owns on a generated object, and the merge patch that restores it.

The desired `spec` is first put through what the apiserver does to a custom resource
(`normalize`: unknown fields pruned, schema defaults filled in, from the same declarations
as the installed CRDs), so a converged object compares equal and is never patched again.
The booster owns the whole `spec` and its own labels; other labels, annotations and fields
outside `spec` are left alone. Two exceptions on a ModelServing:
- `spec.replicas` when an AutoscalingPolicy scales it (the autoscaler owns it then);
- `spec.template.gangPolicy.minRoleReplicas`, immutable by the CRD: kept as created.
A ModelRoute's `spec.modelName` is immutable too: a route whose name must change is
replaced (deleted, then created anew), as the old name should not be served any more.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from controller import mergepatch
from kthena_router.api.kinds import by_kind

Obj = dict[str, Any]


@cache
def spec_schema(kind: str) -> Obj:
    crd = by_kind(kind).crd()
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def normalize(value: Any, schema: Obj) -> Any:
    """`value` as the apiserver would store it under `schema`: pruned and defaulted (a copy)."""
    value = copy.deepcopy(value)
    return _norm(value, schema)


def _norm(value: Any, schema: Obj) -> Any:
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is not None:
            keep = schema.get("x-kubernetes-preserve-unknown-fields", False)
            for k in list(value):
                if k in props:
                    value[k] = _norm(value[k], props[k])
                elif not keep:
                    del value[k]
            for k, sub in props.items():
                if k not in value and "default" in sub:
                    value[k] = _norm(copy.deepcopy(sub["default"]), sub)
        elif isinstance(schema.get("additionalProperties"), dict):
            sub = schema["additionalProperties"]
            for k in list(value):
                value[k] = _norm(value[k], sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_norm(v, schema["items"]) for v in value]
    return value


def desired_spec(obj: Obj, live: Obj | None, autoscaled: bool) -> Obj:
    spec = normalize(obj.get("spec") or {}, spec_schema(obj["kind"]))
    if live is None or obj["kind"] != "ModelServing":
        return spec
    lspec = live.get("spec") or {}
    if autoscaled and "replicas" in lspec:
        spec["replicas"] = lspec["replicas"]
    old_gang = ((lspec.get("template") or {}).get("gangPolicy") or {}).get("minRoleReplicas")
    gang = (spec.get("template") or {}).get("gangPolicy")
    if old_gang is not None and isinstance(gang, dict):
        gang["minRoleReplicas"] = old_gang
    return spec


def patch_for(obj: Obj, live: Obj, autoscaled: bool = False) -> Obj:
    """The merge patch (without resourceVersion) turning `live` into what the booster wants;
    empty when nothing differs."""
    patch: Obj = {}
    want_labels = (obj.get("metadata") or {}).get("labels") or {}
    have_labels = (live.get("metadata") or {}).get("labels") or {}
    labels = {k: v for k, v in want_labels.items() if have_labels.get(k) != v}
    if labels:
        patch["metadata"] = {"labels": labels}
    spec = mergepatch.diff(live.get("spec") or {}, desired_spec(obj, live, autoscaled))
    if spec:
        patch["spec"] = spec
    return patch


IMMUTABLE = {"ModelRoute": ("modelName",)}


def must_replace(obj: Obj, live: Obj) -> str | None:
    """The immutable spec field that differs (the object must be deleted and created), or None."""
    for f in IMMUTABLE.get(obj["kind"], ()):
        if (obj.get("spec") or {}).get(f) != (live.get("spec") or {}).get(f):
            return f"spec.{f}"
    return None
