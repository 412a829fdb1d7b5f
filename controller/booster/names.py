"""Kthena's names and labels of what a ModelBooster generates (model-booster-controller
utils/template.go, utils/common.go), the owner reference and the revision label value."""

from __future__ import annotations

import json
from typing import Any

from controller.revision import fnv1_32

GROUP = "workload.serving.volcano.sh"
WORKLOAD_API = f"{GROUP}/v1alpha1"
NETWORKING_API = "networking.serving.volcano.sh/v1alpha1"
KIND = "ModelBooster"
PLURAL = "modelboosters"

LABEL_MODEL_NAME = f"{GROUP}/model-name"
LABEL_BACKEND_NAME = f"{GROUP}/backend-name"
LABEL_MANAGED_BY = f"{GROUP}/managed-by"
LABEL_REVISION = f"{GROUP}/revision"
LABEL_MODEL_UID = f"{GROUP}/model-uid"
MANAGED_BY = GROUP  # Kthena's value: the group name

# Ours (Kthena's ModelBooster has no autoscaling field any more): the AutoscalingPolicy to
# generate, as JSON, on the ModelBooster's metadata.annotations (docs/booster.md).
ANNOTATION_AUTOSCALING = "booster.kthena.io/autoscaling"

DEFAULT_DOWNLOADER_IMAGE = "kthena/downloader:latest"
DEFAULT_RUNTIME_IMAGE = "kthena/runtime:latest"

Obj = dict[str, Any]

_SAFE = "bcdfghjklmnpqrstvwxz2456789"


def revision(value: Any) -> str:
    """A hash of `value` in the alphabet of Kthena's revision labels (FNV-1 32 of canonical JSON)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "".join(_SAFE[b % len(_SAFE)] for b in str(fnv1_32(text.encode())).encode())


def backend_resource_name(model: str, backend: str) -> str:
    return f"{model}-{backend}" if backend else model


def labels(booster: Obj, backend_name: str, rev: str) -> dict[str, str]:
    meta = booster["metadata"]
    return {LABEL_MODEL_NAME: meta["name"], LABEL_BACKEND_NAME: backend_name, LABEL_MANAGED_BY: MANAGED_BY,
            LABEL_REVISION: rev, LABEL_MODEL_UID: str(meta.get("uid") or "")}


def owner_ref(booster: Obj) -> Obj:
    meta = booster["metadata"]
    return {"apiVersion": WORKLOAD_API, "kind": KIND, "name": meta["name"], "uid": str(meta.get("uid") or ""),
            "controller": True, "blockOwnerDeletion": True}
