"""`lws-standard-labels` (Kthena's): for a ModelServing owned by a LeaderWorkerSet, the pods get
LWS's standard labels (name, group-index, worker-index, and group-key: the hex SHA-1 of
"<lws>-<group index>"), so tools written for LWS find them."""

from __future__ import annotations

import hashlib
from typing import Any

from .. import naming as n
from .registry import REGISTRY, PluginError, PluginRequest

NAME = "lws-standard-labels"
PREFIX = "leaderworkerset.sigs.k8s.io/"


class LwsLabels:
    def __init__(self, config: Any) -> None:
        del config  # takes none

    def on_pod_create(self, req: PluginRequest) -> None:
        refs = (req.modelserving.get("metadata") or {}).get("ownerReferences") or []
        lws = next((r.get("name") for r in refs if r.get("kind") == "LeaderWorkerSet" and r.get("name")), None)
        if not lws:
            return
        _, group_index = n.parent_and_ordinal(req.serving_group)
        _, worker_index = n.parent_and_ordinal(req.pod["metadata"]["name"])
        if group_index < 0 or worker_index < 0:
            raise PluginError(f"cannot derive the group/worker index of {req.pod['metadata']['name']}")
        labels = req.pod["metadata"].setdefault("labels", {})
        labels[PREFIX + "name"] = lws
        labels[PREFIX + "group-index"] = str(group_index)
        labels[PREFIX + "worker-index"] = str(0 if req.is_entry else worker_index)
        labels[PREFIX + "group-key"] = hashlib.sha1(f"{lws}-{group_index}".encode()).hexdigest()


REGISTRY.register(NAME, LwsLabels)
