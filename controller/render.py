"""Renders the objects of one role replica of a ServingGroup as Kthena does: the entry pod
(`<group>-<role>-<r>-0`), worker pods (`...-1` .. `...-<workerReplicas>`), and the headless
Service named like the entry pod (utils.go: GenerateEntryPod, GenerateWorkerPod,
CreateHeadlessService). Pure functions of the ModelServing object."""

from __future__ import annotations

import copy
from typing import Any

from . import naming as n

__all__ = ["owner_reference", "render_pod", "render_service", "scheduler_name", "wants_service", "worker_count"]

Obj = dict[str, Any]


def owner_reference(ms: Obj) -> Obj:
    meta = ms["metadata"]
    return {"apiVersion": n.GROUP_VERSION, "kind": n.KIND, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def scheduler_name(ms: Obj) -> str:
    return str((ms.get("spec") or {}).get("schedulerName") or n.DEFAULT_SCHEDULER)


def worker_count(role: Obj) -> int:
    """Worker pods per role replica. Kthena's webhook refuses workerReplicas > 0 without a
    workerTemplate; its controller then creates no workers, and so do we."""
    if not role.get("workerTemplate"):
        return 0
    return max(0, int(role.get("workerReplicas") or 0))


def wants_service(role: Obj) -> bool:
    """Kthena creates the headless Service for every role replica whose role has a workerTemplate."""
    return bool(role.get("workerTemplate"))


def _env(role: Obj, entry_pod: str, namespace: str, k: int) -> list[Obj]:
    return [
        {"name": n.ENV_GROUP_SIZE, "value": str(int(role.get("workerReplicas") or 0) + 1)},
        {"name": n.ENV_ENTRY_ADDRESS, "value": f"{entry_pod}.{namespace}"},  # the headless Service's name
        {"name": n.ENV_WORKER_INDEX, "value": str(k)},
    ]


def render_pod(ms: Obj, group: str, role: Obj, r: int, k: int, revision: str, role_hash: str) -> Obj:
    """Pod k (0: entry) of replica r of `role` in ServingGroup `group`."""
    meta = ms["metadata"]
    ns = meta["namespace"]
    rid = n.role_id(role["name"], r)
    entry = n.pod_name(group, rid, 0)
    template = role["entryTemplate"] if k == 0 else role["workerTemplate"]
    labels = {n.LABEL_NAME: meta["name"], n.LABEL_GROUP: group, n.LABEL_ROLE: role["name"], n.LABEL_ROLE_ID: rid,
              n.LABEL_REVISION: revision, n.LABEL_ROLE_TEMPLATE_HASH: role_hash}
    if k == 0:
        labels[n.LABEL_ENTRY] = n.ENTRY
    tmeta = template.get("metadata") or {}
    labels.update(tmeta.get("labels") or {})  # as Kthena: the template's labels win
    pod_meta: Obj = {"name": n.pod_name(group, rid, k), "namespace": ns, "labels": labels,
                     "ownerReferences": [owner_reference(ms)]}
    if tmeta.get("annotations"):
        pod_meta["annotations"] = dict(tmeta["annotations"])
    spec = copy.deepcopy(template.get("spec") or {})
    spec["schedulerName"] = scheduler_name(ms)
    env = _env(role, entry, ns, k)
    names = {e["name"] for e in env}
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            c["env"] = [e for e in c.get("env") or [] if e.get("name") not in names] + copy.deepcopy(env)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


def render_service(ms: Obj, group: str, role_name: str, r: int) -> Obj:
    meta = ms["metadata"]
    rid = n.role_id(role_name, r)
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": n.pod_name(group, rid, 0), "namespace": meta["namespace"],
                     "labels": {n.LABEL_NAME: meta["name"], n.LABEL_GROUP: group, n.LABEL_ROLE: role_name,
                                n.LABEL_ROLE_ID: rid},
                     "ownerReferences": [owner_reference(ms)]},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {n.LABEL_GROUP: group, n.LABEL_ROLE: role_name, n.LABEL_ROLE_ID: rid,
                              n.LABEL_ENTRY: n.ENTRY}},
    }
