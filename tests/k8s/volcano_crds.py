"""Volcano's PodGroup and Queue CRDs (configs/crds/volcano) in a test control plane.

The session fixture installs only Kthena's CRDs: with Volcano's installed, every
ModelServing (schedulerName volcano by default) gets PodGroups and annotated pods, which the
other controller tests do not expect. The gang tests install them in their module and
remove them afterwards (`uninstall` waits until the resource is no longer served).

`podgroup_crd(subgroups=False)` is the PodGroup CRD of a Volcano release before
subGroupPolicy, with one test-only twist: its spec keeps unknown fields, so a controller
that sent subGroupPolicy anyway would find it stored (and the test would see it).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import yaml

import k8s_harness

DIR = Path(__file__).resolve().parents[2] / "configs" / "crds" / "volcano"
PODGROUPS = "podgroups.scheduling.volcano.sh"
QUEUES = "queues.scheduling.volcano.sh"
GROUP_VERSION = "scheduling.volcano.sh/v1beta1"


def _load(name: str) -> dict[str, Any]:
    return yaml.safe_load((DIR / f"{name.split('.', 1)[1]}_{name.split('.', 1)[0]}.yaml").read_text())


def podgroup_crd(subgroups: bool = True) -> dict[str, Any]:
    doc = _load(PODGROUPS)
    if not subgroups:
        doc = copy.deepcopy(doc)
        spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        del spec["properties"]["subGroupPolicy"]
        spec["x-kubernetes-preserve-unknown-fields"] = True
    return doc


def queue_crd() -> dict[str, Any]:
    return _load(QUEUES)


def _wait(what: str, ok: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def install(cp: k8s_harness.ControlPlane, subgroups: bool = True) -> None:
    """Apply both CRDs (server-side, taking over earlier variants); wait until Established,
    served and, for PodGroup, the stored schema is the variant asked for."""
    docs = [podgroup_crd(subgroups), queue_crd()]
    cp.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager", "volcano-crds", "-f", "-",
               input="---\n".join(yaml.safe_dump(d) for d in docs))
    with cp.client() as api:
        for name, plural in ((PODGROUPS, "podgroups"), (QUEUES, "queues")):
            def ready(name: str = name, plural: str = plural) -> bool:
                r = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                if r.status_code != 200:
                    return False
                crd = r.json()
                conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
                props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                if name == PODGROUPS and ("subGroupPolicy" in props) != subgroups:
                    return False
                return conds.get("Established") == "True" and api.get(f"/apis/{GROUP_VERSION}/{plural}").status_code == 200
            _wait(f"CRD {name}", ready)


def uninstall(cp: k8s_harness.ControlPlane) -> None:
    cp.kubectl("delete", "crd", PODGROUPS, QUEUES, "--ignore-not-found", "--wait=true", "--timeout=120s")
    with cp.client() as api:
        _wait("Volcano CRDs gone", lambda: all(
            api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}").status_code == 404
            for n in (PODGROUPS, QUEUES)), timeout=120)
