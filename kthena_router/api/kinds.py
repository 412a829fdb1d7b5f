"""Every kind with a CRD, in install order."""

from __future__ import annotations

from .autoscalingpolicy import AUTOSCALING_POLICY
from .externalmodelprovider import EXTERNAL_MODEL_PROVIDER
from .modelbooster import MODEL_BOOSTER
from .modelroute import MODEL_ROUTE
from .modelserver import MODEL_SERVER
from .modelserving import MODEL_SERVING
from .schema import Kind

__all__ = ["KINDS", "by_kind"]

KINDS: tuple[Kind, ...] = (
    MODEL_ROUTE, MODEL_SERVER, EXTERNAL_MODEL_PROVIDER, MODEL_SERVING, MODEL_BOOSTER, AUTOSCALING_POLICY,
)


def by_kind(kind: str) -> Kind:
    for k in KINDS:
        if k.kind == kind:
            return k
    raise KeyError(kind)
