"""The ModelServing controller (python -m controller, a real process) on the real apiserver:
the exact pods, env, labels and headless Services Kthena creates; status and conditions;
scale up and down through the scale subresource (kubectl scale) with Kthena's deletion
order; a deleted pod or Service is recreated; nothing is written once converged; deleting a
ModelServing cascades through kube-controller-manager's garbage collector."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import harness
import k8s_harness
from controller_support import Api, LABEL_GROUP, condition, controller_namespace, env, modelserving, template
from k8s_crds import install_crds

NS = "controller-ms"


@pytest.fixture(scope="module")
def control_plane(controller_cluster: k8s_harness.ControlPlane) -> k8s_harness.ControlPlane:
    """This module runs on both clusters: without and with Volcano's CRDs (conftest.py)."""
    return controller_cluster

PD_ROLES = [
    {"name": "prefill", "replicas": 2, "workerReplicas": 1, "entryTemplate": template("p:1", labels={"app": "p"}),
     "workerTemplate": template("pw:1")},
    {"name": "decode", "replicas": 1, "workerReplicas": 2, "entryTemplate": template("d:1", annotations={"a": "b"}),
     "workerTemplate": template("dw:1")},
]
WEB_ROLES = [{"name": "web", "replicas": 1, "workerReplicas": 0, "entryTemplate": template("w:1")}]


@pytest.fixture(scope="module")
def api(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    install_crds(control_plane)
    with controller_namespace(control_plane, NS, tmp_path_factory.mktemp("controller"), "ctl-a") as a:
        yield a


def test_creates_kthena_pods_services_and_status(api: Api) -> None:
    api.cp.apply([modelserving("pd", NS, 1, PD_ROLES)])
    want = {"pd-0-prefill-0-0", "pd-0-prefill-0-1", "pd-0-prefill-1-0", "pd-0-prefill-1-1",
            "pd-0-decode-0-0", "pd-0-decode-0-1", "pd-0-decode-0-2"}
    pods = api.wait_pods("pd", want)
    ms = api.ms("pd")
    assert ms is not None
    uid = ms["metadata"]["uid"]
    for name, pod in pods.items():
        meta = pod["metadata"]
        role = "prefill" if "prefill" in name else "decode"
        r, k = int(name.split("-")[-2]), int(name.split("-")[-1])
        entry = name[: name.rfind("-")] + "-0"
        assert meta["ownerReferences"] == [{"apiVersion": "workload.serving.volcano.sh/v1alpha1",
                                            "kind": "ModelServing", "name": "pd", "uid": uid,
                                            "controller": True, "blockOwnerDeletion": True}]
        labels = meta["labels"]
        assert labels["modelserving.volcano.sh/name"] == "pd" and labels[LABEL_GROUP] == "pd-0"
        assert labels["modelserving.volcano.sh/role"] == role
        assert labels["modelserving.volcano.sh/role-id"] == f"{role}-{r}"
        assert labels.get("modelserving.volcano.sh/entry") == ("true" if k == 0 else None)
        assert labels["modelserving.volcano.sh/revision"] and labels["modelserving.volcano.sh/role-template-hash"]
        assert pod["spec"]["schedulerName"] == "volcano"
        size = "2" if role == "prefill" else "3"
        assert env(pod) == {"MODEL": "m", "GROUP_SIZE": size, "ENTRY_ADDRESS": f"{entry}.{NS}", "WORKER_INDEX": str(k)}
    assert pods["pd-0-prefill-0-0"]["metadata"]["labels"]["app"] == "p"
    gang = {"scheduling.k8s.io/group-name": "pd-0", "volcano.sh/task-spec": "decode-0"} if api.cp.volcano else {}
    assert pods["pd-0-decode-0-0"]["metadata"]["annotations"] == {"a": "b", **gang}
    assert pods["pd-0-decode-0-2"]["spec"]["containers"][0]["image"] == "dw:1"
    assert len({p["metadata"]["labels"]["modelserving.volcano.sh/revision"] for p in pods.values()}) == 1

    svcs = harness.wait_until(lambda: (s := api.services("pd")) and len(s) == 3 and s, 20, what="3 services")
    assert set(svcs) == {"pd-0-prefill-0-0", "pd-0-prefill-1-0", "pd-0-decode-0-0"}
    svc = svcs["pd-0-prefill-1-0"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {LABEL_GROUP: "pd-0", "modelserving.volcano.sh/role": "prefill",
                                       "modelserving.volcano.sh/role-id": "prefill-1",
                                       "modelserving.volcano.sh/entry": "true"}
    assert svc["metadata"]["ownerReferences"][0]["uid"] == uid

    ms = api.wait_status("pd", replicas=1, availableReplicas=0, updatedReplicas=1, observedGeneration=1)
    st = ms["status"]
    assert st["labelSelector"] == ("modelserving.volcano.sh/entry=true,modelserving.volcano.sh/name=pd,"
                                   "modelserving.volcano.sh/role=prefill,modelserving.volcano.sh/role-id=prefill-0")
    assert st["currentRevision"] == st["updateRevision"] == pods["pd-0-decode-0-0"]["metadata"]["labels"][
        "modelserving.volcano.sh/revision"]
    assert condition(ms, "Available") == "False" and condition(ms, "Progressing") == "True"
    assert condition(ms, "GangScheduling") == ("True" if api.cp.volcano else "False")
    if api.cp.volcano:  # the gang: every pod of the group (2 x 2 prefill + 3 decode)
        pg = api.http.get(f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{NS}/podgroups/pd-0").json()
        assert pg["spec"]["minMember"] == 7 and pg["metadata"]["ownerReferences"][0]["uid"] == uid

    for name in want:
        api.set_ready(name)
    ms = api.wait_status("pd", availableReplicas=1)
    assert condition(ms, "Available") == "True" and condition(ms, "Progressing") == "False"

    # Converged: nothing more is written (the ModelServing, its pods and Services keep their versions).
    before = (ms["metadata"]["resourceVersion"], {n: p["metadata"]["resourceVersion"] for n, p in api.pods("pd").items()},
              sorted(api.services("pd")))
    time.sleep(1.5)
    after_ms = api.ms("pd")
    assert after_ms is not None
    assert (after_ms["metadata"]["resourceVersion"],
            {n: p["metadata"]["resourceVersion"] for n, p in api.pods("pd").items()}, sorted(api.services("pd"))) == before


def test_deleted_pod_and_service_are_recreated(api: Api) -> None:
    api.cp.apply([modelserving("heal", NS, 1, PD_ROLES)])
    pods = api.wait_pods("heal", {"heal-0-prefill-0-0", "heal-0-prefill-0-1", "heal-0-prefill-1-0",
                                  "heal-0-prefill-1-1", "heal-0-decode-0-0", "heal-0-decode-0-1", "heal-0-decode-0-2"})
    harness.wait_until(lambda: len(api.services("heal")) == 3, 20, what="3 services")
    old_uid = pods["heal-0-decode-0-1"]["metadata"]["uid"]
    # the Service first: the deleted pod then takes its role replica's Service along
    # (RoleRecreate, tests/k8s/test_controller_recovery.py)
    api.delete("services", "heal-0-decode-0-0")
    api.delete("pods", "heal-0-decode-0-1")
    harness.wait_until(lambda: (p := api.pods("heal").get("heal-0-decode-0-1")) and p["metadata"]["uid"] != old_uid,
                       20, what="pod recreated")
    harness.wait_until(lambda: "heal-0-decode-0-0" in api.services("heal"), 20, what="service recreated")
    assert env(api.pods("heal")["heal-0-decode-0-1"])["WORKER_INDEX"] == "1"


def _groups(pods: dict[str, dict[str, Any]]) -> set[str]:
    return {p["metadata"]["labels"][LABEL_GROUP] for p in pods.values()}


def test_scale_subresource_and_deletion_order(api: Api) -> None:
    api.cp.apply([modelserving("web", NS, 1, WEB_ROLES)])
    api.wait_pods("web", {"web-0-web-0-0"})
    api.cp.kubectl("scale", "-n", NS, "modelserving/web", "--replicas=4")
    api.wait_pods("web", {f"web-{g}-web-0-0" for g in range(4)})
    ms = api.wait_status("web", replicas=4)
    scale = api.http.get(f"/apis/workload.serving.volcano.sh/v1alpha1/namespaces/{NS}/modelservings/web/scale").json()
    assert scale["spec"]["replicas"] == 4 and scale["status"]["replicas"] == 4
    assert scale["status"]["selector"] == ms["status"]["labelSelector"]

    # group 2 not ready; group 0 protected by a higher deletion cost; 1 and 3 equal (cost 0)
    for g in (0, 1, 3):
        api.set_ready(f"web-{g}-web-0-0")
    api.annotate("web-0-web-0-0", {"controller.kubernetes.io/pod-deletion-cost": "10"})
    api.wait_status("web", availableReplicas=3)
    api.cp.kubectl("scale", "-n", NS, "modelserving/web", "--replicas=2")
    # not ready first (2), then the highest ordinal among equal cost (3)
    api.wait_pods("web", {"web-0-web-0-0", "web-1-web-0-0"})
    api.wait_status("web", replicas=2, availableReplicas=2)
    api.cp.kubectl("scale", "-n", NS, "modelserving/web", "--replicas=1")
    api.wait_pods("web", {"web-0-web-0-0"})  # the lower cost (1) goes before the higher (0)
    ms = api.wait_status("web", replicas=1, availableReplicas=1)
    assert condition(ms, "Available") == "True"
    # scale up fills the free ordinals from 0 up
    api.cp.kubectl("scale", "-n", NS, "modelserving/web", "--replicas=3")
    api.wait_pods("web", {"web-0-web-0-0", "web-1-web-0-0", "web-2-web-0-0"})
    ms = api.wait_status("web", replicas=3, availableReplicas=1, observedGeneration=api.ms("web")["metadata"]["generation"])
    assert condition(ms, "Available") == "False"


def test_role_replicas_scale_inside_groups(api: Api) -> None:
    roles = [dict(PD_ROLES[0], replicas=1)]
    api.cp.apply([modelserving("roles", NS, 2, roles)])
    api.wait_pods("roles", {f"roles-{g}-prefill-0-{k}" for g in range(2) for k in range(2)})
    roles = [dict(PD_ROLES[0], replicas=2)]
    api.cp.apply([modelserving("roles", NS, 2, roles)])
    api.wait_pods("roles", {f"roles-{g}-prefill-{r}-{k}" for g in range(2) for r in range(2) for k in range(2)})
    harness.wait_until(lambda: len(api.services("roles")) == 4, 20, what="4 services")
    # group 0: none ready, same cost: the highest role replica (1) goes; group 1: replica 1 is
    # ready and replica 0 is not: the not-ready one goes first
    for k in range(2):
        api.set_ready(f"roles-1-prefill-1-{k}")
    api.cp.apply([modelserving("roles", NS, 2, [dict(PD_ROLES[0], replicas=1)])])
    api.wait_pods("roles", {"roles-0-prefill-0-0", "roles-0-prefill-0-1", "roles-1-prefill-1-0", "roles-1-prefill-1-1"})
    harness.wait_until(lambda: set(api.services("roles")) == {"roles-0-prefill-0-0", "roles-1-prefill-1-0"}, 20,
                       what="services of the removed role replicas deleted")


def test_cascade_deletion_through_the_garbage_collector(api: Api) -> None:
    api.cp.apply([modelserving("gone", NS, 2, PD_ROLES[1:])])
    api.wait_pods("gone", {f"gone-{g}-decode-0-{k}" for g in range(2) for k in range(3)})
    harness.wait_until(lambda: len(api.services("gone")) == 2, 20, what="2 services")
    # foreground: the ModelServing stays (deletionTimestamp) until the GC removed its dependents;
    # the controller must not recreate them meanwhile
    api.cp.kubectl("delete", "-n", NS, "modelserving/gone", "--cascade=foreground", "--wait=false")
    harness.wait_until(lambda: not api.pods("gone") and not api.services("gone") and api.ms("gone") is None, 60,
                       what="pods, services and the ModelServing removed by the garbage collector")
    time.sleep(0.5)
    assert not api.pods("gone") and not api.services("gone")
