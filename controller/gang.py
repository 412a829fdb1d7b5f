"""Volcano gang scheduling, the pure part: the PodGroup of a ServingGroup, the merge patch
that brings an existing one in line, the pods' annotations and the ModelServing's
`GangScheduling` condition (pkg/model-serving-controller/podgroupmanager of Kthena).

- One PodGroup (scheduling.volcano.sh/v1beta1) per ServingGroup, named like it
  (`<ms>-<ordinal>`), labelled `modelserving.volcano.sh/{name,group-name}`, annotated
  `scheduling.k8s.io/group-name`, controlled by the ModelServing (ownerReference without
  blockOwnerDeletion, as Kthena).
- Only when spec.schedulerName is `volcano` (and the PodGroup CRD is installed).
- spec.minMember = sum over roles of (1 + workers) x min(gangPolicy.minRoleReplicas[role],
  replicas); a role missing from minRoleReplicas (or no gangPolicy) counts all its replicas.
- spec.minResources = the containers' requests (not init containers) of the entry template
  and of each worker, times that role's minimum replicas; quantities summed and printed as
  Go's resource.Quantity prints them.
- spec.queue from the ModelServing annotation `scheduling.volcano.sh/queue-name` (absent:
  Volcano's `default`).
- spec.networkTopology = template.networkTopology.groupPolicy.
- spec.subGroupPolicy, only when the installed CRD declares it: per role {name, labelSelector
  (ModelServing name + role), matchLabelKeys [role-id], subGroupSize 1 + workers,
  minSubGroups min(minRoleReplicas, replicas), networkTopology = rolePolicy}.
- Pods get `scheduling.k8s.io/group-name: <group>` and `volcano.sh/task-spec: <role>-<r>`.
"""

from __future__ import annotations

from typing import Any

from . import naming as n
from .quantity import Quantity, canonical, parse
from .render import scheduler_name, worker_count

__all__ = ["API_VERSION", "CONDITION", "PLURAL", "annotate_pod", "podgroup_patch",
           "render_podgroup", "requirements", "wants_podgroups"]

GROUP = "scheduling.volcano.sh"
API_VERSION = f"{GROUP}/v1beta1"
KIND = "PodGroup"
PLURAL = "podgroups"
CRD_NAME = f"{PLURAL}.{GROUP}"
VOLCANO = "volcano"
DEFAULT_QUEUE = "default"

ANNOTATION_QUEUE = "scheduling.volcano.sh/queue-name"  # on the ModelServing
ANNOTATION_GROUP = "scheduling.k8s.io/group-name"  # on pods and the PodGroup
ANNOTATION_TASK = "volcano.sh/task-spec"  # on pods: the role replica (`<role>-<r>`)

CONDITION = "GangScheduling"

Obj = dict[str, Any]


def wants_podgroups(ms: Obj) -> bool:
    """Kthena creates PodGroups only for the volcano scheduler."""
    return scheduler_name(ms) == VOLCANO


def _template(ms: Obj) -> Obj:
    return (ms.get("spec") or {}).get("template") or {}


def min_replicas(ms: Obj, role: Obj) -> int:
    replicas = int(role.get("replicas", 1))
    minimum = ((_template(ms).get("gangPolicy") or {}).get("minRoleReplicas") or {}).get(role["name"])
    return replicas if minimum is None else min(int(minimum), replicas)


def _add_requests(total: dict[str, Quantity], pod_spec: Obj, times: int) -> None:
    for c in pod_spec.get("containers") or []:
        for name, raw in ((c.get("resources") or {}).get("requests") or {}).items():
            q = parse(raw) * times
            total[name] = total[name] + q if name in total else q


def requirements(ms: Obj) -> tuple[int, dict[str, str]]:
    """(minMember, minResources) of one ServingGroup."""
    members = 0
    total: dict[str, Quantity] = {}
    for role in _template(ms).get("roles") or []:
        k = min_replicas(ms, role)
        workers = worker_count(role)
        members += (1 + workers) * k
        _add_requests(total, (role.get("entryTemplate") or {}).get("spec") or {}, k)
        for _ in range(workers):
            _add_requests(total, (role.get("workerTemplate") or {}).get("spec") or {}, k)
    return members, {name: canonical(q) for name, q in total.items()}


def _subgroups(ms: Obj) -> list[Obj]:
    tpl = _template(ms)
    role_policy = (tpl.get("networkTopology") or {}).get("rolePolicy")
    out = []
    for role in tpl.get("roles") or []:
        sub: Obj = {
            "name": role["name"],
            "labelSelector": {"matchLabels": {n.LABEL_NAME: ms["metadata"]["name"], n.LABEL_ROLE: role["name"]}},
            "matchLabelKeys": [n.LABEL_ROLE_ID],
            "subGroupSize": 1 + worker_count(role),
            "minSubGroups": min_replicas(ms, role),
        }
        if role_policy:
            sub["networkTopology"] = dict(role_policy)
        out.append(sub)
    return out


def desired_spec(ms: Obj, subgroups: bool) -> Obj:
    """The PodGroup spec fields the controller owns (absent ones are meant to be unset)."""
    members, resources = requirements(ms)
    spec: Obj = {"minResources": resources}
    if members:
        spec["minMember"] = members  # Go's omitempty: 0 is not written
    queue = ((ms.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_QUEUE)
    if queue:
        spec["queue"] = queue
    group_policy = (_template(ms).get("networkTopology") or {}).get("groupPolicy")
    if group_policy:
        spec["networkTopology"] = dict(group_policy)
    if subgroups:
        spec["subGroupPolicy"] = _subgroups(ms)
    return spec


def render_podgroup(ms: Obj, group: str, subgroups: bool) -> Obj:
    meta = ms["metadata"]
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {
            "name": group, "namespace": meta["namespace"],
            "labels": {n.LABEL_NAME: meta["name"], n.LABEL_GROUP: group},
            "annotations": {ANNOTATION_GROUP: group},
            "ownerReferences": [{"apiVersion": n.GROUP_VERSION, "kind": n.KIND, "name": meta["name"],
                                 "uid": meta["uid"], "controller": True}],
        },
        "spec": desired_spec(ms, subgroups),
    }


# --- comparison with what the apiserver holds (its CRD defaults applied) ----------------

def _topology(v: Any) -> Any:
    if not v:
        return None
    return {"mode": "hard", **v}  # the CRD's default


def _resources(v: Any) -> dict[str, str]:
    out = {}
    for name, raw in (v or {}).items():
        try:
            out[name] = canonical(parse(raw))
        except ValueError:
            out[name] = str(raw)  # unparsable: differs from any value we write
    return out


def _subgroup_list(v: Any) -> Any:
    if v is None:
        return None
    return [{"subGroupSize": 1, "minSubGroups": 0, **{k: x for k, x in s.items() if k != "networkTopology"},
             **({"networkTopology": _topology(s["networkTopology"])} if s.get("networkTopology") else {})}
            for s in v]


_NORMALISE = {
    "minMember": lambda v: int(v or 0),
    "minResources": _resources,
    "queue": lambda v: v or DEFAULT_QUEUE,
    "networkTopology": _topology,
    "subGroupPolicy": _subgroup_list,
}


def podgroup_patch(existing: Obj, ms: Obj, subgroups: bool) -> Obj | None:
    """A JSON merge patch carrying only the spec fields that differ (with the resourceVersion
    read, so a concurrent change is a 409), or None when the PodGroup is in line. Without the
    CRD's subGroupPolicy the field is not ours to touch."""
    have = existing.get("spec") or {}
    want = desired_spec(ms, subgroups)
    changed: Obj = {}
    for field, norm in _NORMALISE.items():
        if field == "subGroupPolicy" and not subgroups:
            continue
        if norm(have.get(field)) == norm(want.get(field)):
            continue
        new = want.get(field)
        if field == "minResources" and have.get(field):  # per key; merge patch: null removes
            old = norm(have[field])
            new = {**{k: None for k in old if k not in new}, **{k: v for k, v in new.items() if old.get(k) != v}}
        elif field == "networkTopology" and new is not None and have.get(field):
            new = {**{k: None for k in have[field] if k not in new}, **new}
        changed[field] = 0 if field == "minMember" and new is None else new
    if not changed:
        return None
    return {"metadata": {"resourceVersion": existing["metadata"].get("resourceVersion")}, "spec": changed}


def annotate_pod(pod: Obj) -> None:
    """Volcano's gang annotations from the pod's Kthena labels (group and role replica)."""
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    annotations = meta.setdefault("annotations", {})
    annotations[ANNOTATION_GROUP] = labels[n.LABEL_GROUP]
    annotations[ANNOTATION_TASK] = labels[n.LABEL_ROLE_ID]


