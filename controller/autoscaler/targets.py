"""The autoscaler's view of its targets (pure): which ModelServing a policy scales, its current
replica counts, which pods report its metrics, and the writes that change the counts.

- Homogeneous / heterogeneous: `spec.replicas` (unset = 1, the CRD default), written through
  the scale subresource as a JSON merge patch of `spec.replicas` (no precondition: the value
  is absolute, as Kthena's merge patch of the ModelServing).
- Disaggregated: `spec.template.roles[].replicas` (unset = 1). `roles` is a list, so a merge
  patch replaces it whole: the patch carries the full list as cached with only `replicas`
  changed, and `metadata.resourceVersion` (the apiserver refuses it with 409 if the
  ModelServing changed since it was read; Kthena uses a JSON patch with `test` operations).
- Metric pods (Kthena's GetMetricPods): the ModelServing's entry pods
  (`modelserving.volcano.sh/name=<ms>`, `modelserving.volcano.sh/entry=true`), a role's
  pods also `modelserving.volcano.sh/role=<role>`, and the metric source's labelSelector.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller import naming as n
from controller.recovery import is_errored, running_and_ready

__all__ = ["PodSet", "TargetError", "current_replicas", "matches", "metric_pods", "role_replicas",
           "roles_patch", "scale_patch"]

Obj = dict[str, Any]


class TargetError(Exception):
    """The target cannot be scaled (missing ModelServing, missing role); status TargetFound False."""


def current_replicas(ms: Obj) -> int:
    value = (ms.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)


def role_replicas(ms: Obj, roles: list[str]) -> dict[str, int]:
    """The current count of each named role; TargetError naming a role the ModelServing lacks."""
    listed = ((ms.get("spec") or {}).get("template") or {}).get("roles") or []
    out: dict[str, int] = {}
    for r in listed:
        name = r.get("name")
        if name in roles and name not in out:
            out[name] = 1 if r.get("replicas") is None else int(r["replicas"])
    missing = [r for r in roles if r not in out]
    if missing:
        meta = ms.get("metadata") or {}
        raise TargetError(f"role {', '.join(sorted(missing))} not found in ModelServing "
                          f"{meta.get('namespace')}/{meta.get('name')}")
    return out


def scale_patch(replicas: int) -> Obj:
    """The merge patch for .../modelservings/<name>/scale."""
    return {"spec": {"replicas": int(replicas)}}


def roles_patch(ms: Obj, replicas: Mapping[str, int]) -> Obj | None:
    """The merge patch setting those roles' replicas (None when nothing changes): the whole
    roles list as cached, only `replicas` changed, with the cached resourceVersion."""
    roles = copy.deepcopy(((ms.get("spec") or {}).get("template") or {}).get("roles") or [])
    changed = False
    for r in roles:
        want = replicas.get(r.get("name"))
        if want is None:
            continue
        have = 1 if r.get("replicas") is None else int(r["replicas"])
        if have != want:
            r["replicas"] = int(want)
            changed = True
    if not changed:
        return None
    rv = str((ms.get("metadata") or {}).get("resourceVersion") or "")
    return {"metadata": {"resourceVersion": rv}, "spec": {"template": {"roles": roles}}}


# --- label selectors (metav1.LabelSelector) -------------------------------------------------

def matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics: matchLabels and every matchExpression (In, NotIn,
    Exists, DoesNotExist). An unknown operator matches nothing."""
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), set(e.get("values") or [])
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            return False
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class PodSet:
    """The pods a metric source reads: ready ones with their address, plus the counts the
    algorithm needs."""
    ready: tuple[tuple[str, str], ...]  # (pod name, pod IP; "" when the pod has none yet)
    unready: tuple[str, ...]  # names of selected pods that are not Running and Ready
    errored: bool  # a selected pod failed or restarted (Kthena skips such a group's metrics)

    @property
    def empty(self) -> bool:
        return not self.ready and not self.unready


def metric_pods(pods: list[Obj], namespace: str, ms_name: str, role: str | None,
                selector: Mapping[str, Any] | None) -> PodSet:
    ready: list[tuple[str, str]] = []
    unready: list[str] = []
    errored = False
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") != namespace:
            continue
        labels = meta.get("labels") or {}
        if labels.get(n.LABEL_NAME) != ms_name or labels.get(n.LABEL_ENTRY) != n.ENTRY:
            continue
        if role is not None and labels.get(n.LABEL_ROLE) != role:
            continue
        if not matches(selector, labels):
            continue
        name = str(meta.get("name") or "")
        if meta.get("deletionTimestamp") or is_errored(pod):
            errored = True
        if running_and_ready(pod) and not meta.get("deletionTimestamp"):
            ready.append((name, str((pod.get("status") or {}).get("podIP") or "")))
        else:
            unready.append(name)
    return PodSet(tuple(sorted(ready)), tuple(sorted(unready)), errored)
