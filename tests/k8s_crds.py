"""Install the project's CRDs (configs/crds, generated from kthena_router/api) into a test
control plane: ``install_crds(cp)``; idempotent, and it takes over CRDs of the same names that
another test installed (server-side apply with --force-conflicts)."""

from __future__ import annotations

import time

import yaml

import harness
import k8s_harness
from kthena_router.api.crdgen import CRD_DIR, file_name
from kthena_router.api.kinds import KINDS

__all__ = ["crd_documents", "install_crds"]


def crd_documents() -> list[dict]:
    """Every CRD as a decoded document."""
    return [yaml.safe_load((CRD_DIR / file_name(k)).read_text(encoding="utf-8")) for k in KINDS]


def install_crds(cp: k8s_harness.ControlPlane, timeout: float = 60.0, only: tuple[str, ...] | None = None) -> None:
    """Apply every CRD (or those of the kinds in `only`; server-side: ModelServing's is too large
    for client-side apply's annotation), wait until each is Established and its resource is served."""
    kinds = [k for k in KINDS if only is None or k.kind in only]
    text = "".join((CRD_DIR / file_name(k)).read_text(encoding="utf-8") for k in kinds)
    cp.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager", "kthena-crds", "-f", "-",
               input=text)
    deadline = time.monotonic() + timeout
    with cp.client() as api:
        for k in kinds:
            def established(name: str = k.crd_name) -> bool:
                r = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conds = (r.json().get("status") or {}).get("conditions") or [] if r.status_code == 200 else []
                return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

            harness.wait_until(established, max(deadline - time.monotonic(), 1), interval=0.2,
                               what=f"CRD {k.crd_name} Established")
            path = f"/apis/{k.api_version}/{k.plural}"
            harness.wait_until(lambda p=path: api.get(p).status_code == 200, max(deadline - time.monotonic(), 1),
                               interval=0.2, what=f"{path} served")
