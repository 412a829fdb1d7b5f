"""ControllerRevisions (apps/v1) of a ModelServing, as Kthena records them
(utils/controller_revision.go): one per revision, named `<ms>-<revision>`, labelled
`modelserving.volcano.sh/name` and `modelserving.volcano.sh/revision`, owned by the
ModelServing (controller ownerReference, so the garbage collector removes them with it),
`revision: 1`, `data: {"data": <spec.template.roles>}`.

The update revision's ControllerRevision is created before any pod is created at it; a
replica that must be rebuilt at an older revision (partition-protected, or recreated
after a failure) is rendered from the stored roles. ControllerRevision data is immutable
(the apiserver refuses to change it), so a revision's record is written once; role
`replicas` are not part of the revision and come from the current spec (see `roles_at`).

Pruning: Kthena deletes every ControllerRevision except status.currentRevision and
updateRevision (it has no history limit). We keep, in addition, every revision a live pod
still carries, so a pod of a group two updates behind can still be rebuilt as it was.

The I/O (`ensure`, `prune`) goes through kubeapi.Writer; the rest is pure.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from typing import Any

from . import naming as n
from .expectations import Expectations
from .kubeapi import Writer, collection_path, object_path
from .render import owner_reference

__all__ = ["KIND", "ensure", "in_use", "name", "prunable", "prune", "render", "roles_at", "templates"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
KIND = "controllerrevisions"
API = "apps/v1"


def name(ms_name: str, revision: str) -> str:
    return f"{ms_name}-{revision}"


def render(ms: Obj, revision: str, roles: list[Obj]) -> Obj:
    meta = ms["metadata"]
    return {"apiVersion": API, "kind": "ControllerRevision",
            "metadata": {"name": name(meta["name"], revision), "namespace": meta["namespace"],
                         "labels": {n.LABEL_NAME: meta["name"], n.LABEL_REVISION: revision},
                         "ownerReferences": [owner_reference(ms)]},
            "revision": 1, "data": {"data": copy.deepcopy(roles)}}


def _revision_of(cr: Obj) -> str:
    return str(((cr.get("metadata") or {}).get("labels") or {}).get(n.LABEL_REVISION) or "")


def templates(crs: Iterable[Obj]) -> dict[str, list[Obj]]:
    """revision -> its stored roles, from the ModelServing's ControllerRevisions (Kthena's
    wrapped {"data": roles}, or a bare list as its reader also accepts)."""
    out: dict[str, list[Obj]] = {}
    for cr in crs:
        rev = _revision_of(cr)
        data = cr.get("data")
        roles = data.get("data") if isinstance(data, dict) else data
        if rev and isinstance(roles, list) and all(isinstance(r, dict) and r.get("name") for r in roles):
            out[rev] = roles
    return out


def roles_at(stored: list[Obj], current: list[Obj]) -> list[Obj]:
    """The roles of an older revision as they are rendered now: its templates, with the
    replicas of the current spec where the role still exists (replicas are not part of a
    revision; scaling a role is not an update)."""
    now = {r["name"]: r for r in current}
    out = []
    for role in stored:
        r = dict(role)
        if role["name"] in now:
            r["replicas"] = now[role["name"]].get("replicas", 1)
        out.append(r)
    return out


def in_use(status: Obj, pods: Iterable[Obj]) -> set[str]:
    keep = {str(status.get(k)) for k in ("currentRevision", "updateRevision") if status.get(k)}
    keep |= {str(((p.get("metadata") or {}).get("labels") or {}).get(n.LABEL_REVISION) or "") for p in pods}
    keep.discard("")
    return keep


def prunable(crs: Iterable[Obj], keep: set[str]) -> list[Obj]:
    return [cr for cr in crs if _revision_of(cr) not in keep]


async def ensure(writer: Writer, expectations: Expectations, key: tuple[str, str], ms: Obj, revision: str,
                 have: Iterable[Obj]) -> bool:
    """Create the ControllerRevision of `revision` unless it is among `have` (this
    ModelServing's, from the cache). False when the name is held by another object (e.g.
    one of a deleted ModelServing of the same name the garbage collector has not removed)."""
    if any(_revision_of(cr) == revision for cr in have):
        return True
    roles = (ms.get("spec") or {}).get("template", {}).get("roles") or []
    made = await writer.create(collection_path(API, KIND, key[0]), render(ms, revision, roles))
    if made is None:
        return False
    expectations.created(key, KIND, made)
    log.info("%s/%s: recorded revision %s (ControllerRevision %s)", key[0], key[1], revision, made["metadata"]["name"])
    return True


async def prune(writer: Writer, expectations: Expectations, key: tuple[str, str], crs: Iterable[Obj],
                keep: set[str]) -> int:
    done = 0
    for cr in prunable(crs, keep):
        m = cr["metadata"]
        await writer.delete(object_path(API, KIND, key[0], m["name"]), str(m["uid"]))
        expectations.deleted(key, KIND, str(m["uid"]))
        done += 1
    if done:
        log.info("%s/%s: pruned %d old ControllerRevisions (kept %s)", key[0], key[1], done, ", ".join(sorted(keep)))
    return done
