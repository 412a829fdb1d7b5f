"""``metadata`` of a config object: name, namespace, annotations, creationTimestamp."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .checks import Ctx, check_labels, check_str, check_timestamp, type_name
from .model import DEFAULT_NAMESPACE

__all__ = ["ObjectMeta", "parse_metadata"]


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    name: str
    namespace: str
    annotations: dict[str, str]
    creation_timestamp: datetime | None
    labels: dict[str, str] = field(default_factory=dict)  # used by Secrets (Kthena's credential label)


def parse_metadata(c: Ctx, v: Any) -> ObjectMeta | None:
    if v is None:
        c.err("metadata", "required field is missing (metadata.name names the object)")
        return None
    if not isinstance(v, dict):
        c.err("metadata", f"must be a mapping, got {type_name(v)}")
        return None
    # Other metadata (uid, managedFields, ...) is accepted and not used, so that
    # `kubectl get -o yaml` output loads as it is (it describes, it configures nothing).
    before = len(c.problems)
    name = check_str(c, v.get("name"), "metadata.name")
    if v.get("name") is None:
        c.err("metadata.name", "required field is missing")
    namespace = check_str(c, v.get("namespace"), "metadata.namespace") or DEFAULT_NAMESPACE
    annotations = check_labels(c, v.get("annotations"), "metadata.annotations")
    labels = check_labels(c, v.get("labels"), "metadata.labels")
    ts = check_timestamp(c, v.get("creationTimestamp"), "metadata.creationTimestamp")
    if name is None or len(c.problems) > before:
        return None
    return ObjectMeta(name, namespace, annotations, ts, labels)
