"""Refresh kthena_router/api/k8s_core_v1.json: the Kubernetes core types that Kthena's CRDs embed
(pod templates, resources, env, tolerations, object references, conditions), as the test
control plane's kube-apiserver publishes them (GET /openapi/v3/api/v1).

The snapshot keeps only the definitions reachable from ROOTS, without descriptions (the CRDs
would otherwise exceed a megabyte). kthena_router/api/k8s_types.py turns it into structural
CRD schema. Run from the repository root:

    PYTHONPATH=$PWD:$PWD/tests .venv/bin/python scripts/k8s-openapi-snapshot.py
    python -m kthena_router.api.crdgen          # then regenerate configs/crds
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import k8s_harness  # noqa: E402

from kthena_router.api.k8s_types import ROOTS, SNAPSHOT  # noqa: E402

PREFIX = "#/components/schemas/"


def _strip(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k != "description"}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def _refs(x: Any, out: set[str]) -> None:
    if isinstance(x, dict):
        for k, v in x.items():
            if k == "$ref":
                out.add(v.removeprefix(PREFIX))
            else:
                _refs(v, out)
    elif isinstance(x, list):
        for v in x:
            _refs(v, out)


def main() -> None:
    cp = k8s_harness.ControlPlane(k8s_harness.testbin_dir(), Path(tempfile.mkdtemp()), controller_manager=False)
    cp.start()
    try:
        with cp.client() as api:
            schemas = api.get("/openapi/v3/api/v1").raise_for_status().json()["components"]["schemas"]
            version = api.get("/version").raise_for_status().json()["gitVersion"]
    finally:
        cp.stop()
    keep: dict[str, Any] = {}
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep[name] = _strip(schemas[name])
        found: set[str] = set()
        _refs(keep[name], found)
        todo.extend(sorted(found - keep.keys()))
    doc = {"kubernetesVersion": version, "schemas": dict(sorted(keep.items()))}
    SNAPSHOT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{SNAPSHOT}: {len(keep)} definitions from Kubernetes {version}")


if __name__ == "__main__":
    main()
