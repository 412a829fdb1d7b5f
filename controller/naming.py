"""Kthena's names, labels, annotations and env vars of ModelServing's pods and Services
(pkg/apis/workload/v1alpha1/labels.go, model_serving_types.go; utils.go of its controller)."""

from __future__ import annotations

import re

from kthena_router.api.modelserving import MODEL_SERVING

GROUP_VERSION = MODEL_SERVING.api_version  # workload.serving.volcano.sh/v1alpha1
KIND = MODEL_SERVING.kind

LABEL_NAME = "modelserving.volcano.sh/name"
LABEL_GROUP = "modelserving.volcano.sh/group-name"
LABEL_ROLE = "modelserving.volcano.sh/role"
LABEL_ROLE_ID = "modelserving.volcano.sh/role-id"
LABEL_ENTRY = "modelserving.volcano.sh/entry"
LABEL_REVISION = "modelserving.volcano.sh/revision"
LABEL_ROLE_TEMPLATE_HASH = "modelserving.volcano.sh/role-template-hash"
ENTRY = "true"

ENV_GROUP_SIZE = "GROUP_SIZE"
ENV_ENTRY_ADDRESS = "ENTRY_ADDRESS"
ENV_WORKER_INDEX = "WORKER_INDEX"

ANNOTATION_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DEFAULT_SCHEDULER = "volcano"

_ORDINAL = re.compile(r"^(.*)-([0-9]+)$")


def group_name(ms_name: str, ordinal: int) -> str:
    return f"{ms_name}-{ordinal}"


def role_id(role: str, index: int) -> str:
    return f"{role}-{index}"


def pod_name(group: str, rid: str, k: int) -> str:
    """k = 0 is the entry pod; workers count from 1 (e.g. llm-0-prefill-1-2)."""
    return f"{group}-{rid}-{k}"


def parent_and_ordinal(name: str) -> tuple[str, int]:
    """("llm", 3) for "llm-3"; ("", -1) when the name has no ordinal suffix."""
    m = _ORDINAL.match(name)
    if not m:
        return "", -1
    return m.group(1), int(m.group(2))


def label_selector(ms_name: str, first_role: str | None) -> str:
    """status.labelSelector (scale subresource): one pod per ServingGroup, the entry pod of the
    first role's replica 0, as Kthena pins it; keys sorted as labels.Set.String() prints them."""
    sel = {LABEL_NAME: ms_name, LABEL_ENTRY: ENTRY}
    if first_role:
        sel[LABEL_ROLE] = first_role
        sel[LABEL_ROLE_ID] = role_id(first_role, 0)
    return ",".join(f"{k}={v}" for k, v in sorted(sel.items()))
