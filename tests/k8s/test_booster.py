"""The ModelBooster controller (inside python -m controller, a real process) on the real apiserver:
a booster of each template generates exactly the objects convert.build describes (accepted by
the CRDs, converged without further writes), booster edits propagate, hand edits of generated
objects are reverted, an unwanted AutoscalingPolicy is deleted, conditions follow the
ModelServing, a booster the webhook rules refuse gets Failed naming the field, and deleting
the booster removes everything through kube-controller-manager's garbage collector."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

import harness
import k8s_harness
from controller.booster import convert, desired, names
from controller_support import Api, condition, controller_namespace
from k8s_crds import install_crds

NS = "booster-test"
Obj = dict[str, Any]
PLURALS = {"ModelServing": ("workload.serving.volcano.sh/v1alpha1", "modelservings"),
           "ModelServer": ("networking.serving.volcano.sh/v1alpha1", "modelservers"),
           "ModelRoute": ("networking.serving.volcano.sh/v1alpha1", "modelroutes"),
           "AutoscalingPolicy": ("workload.serving.volcano.sh/v1alpha1", "autoscalingpolicies")}
MERGE = {"Content-Type": "application/merge-patch+json"}


def server_worker(image: str = "vllm/vllm-openai:v0.9", **extra: Any) -> Obj:
    return {"type": "server", "image": image, "replicas": 1, "pods": 1,
            "config": {"max-model-len": 4096, "served-model-name": "qwen"}, **extra}


def pd_workers(vllm: bool) -> list[Obj]:
    out = []
    for kind, role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        cfg: Obj = {"max-model-len": 2048}
        if vllm:
            cfg["kv-transfer-config"] = json.dumps({"kv_connector": "NixlConnector", "kv_role": role})
        out.append({"type": kind, "image": "engine:1", "replicas": 1, "pods": 1, "config": cfg})
    return out


def booster(name: str, btype: str, workers: list[Obj], **backend: Any) -> Obj:
    return {"apiVersion": "workload.serving.volcano.sh/v1alpha1", "kind": "ModelBooster",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"backend": {"name": "main", "type": btype, "modelURI": "hf://Qwen/Qwen2.5-0.5B-Instruct",
                                 "cacheURI": "pvc://models", "replicas": 1, "workers": workers, **backend}}}


class BoosterApi(Api):
    def get(self, kind: str, name: str) -> Obj | None:
        api_version, plural = PLURALS.get(kind, ("workload.serving.volcano.sh/v1alpha1", "modelboosters"))
        r = self.http.get(f"/apis/{api_version}/namespaces/{self.ns}/{plural}/{name}")
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return r.json()

    def patch(self, kind: str, name: str, body: Obj) -> Obj:
        api_version, plural = PLURALS.get(kind, ("workload.serving.volcano.sh/v1alpha1", "modelboosters"))
        r = self.http.patch(f"/apis/{api_version}/namespaces/{self.ns}/{plural}/{name}", json=body, headers=MERGE)
        assert r.status_code == 200, r.text
        return r.json()

    def booster(self, name: str) -> Obj:
        b = self.get("ModelBooster", name)
        assert b is not None
        return b

    def wait_obj(self, kind: str, name: str, ok: Any, what: str, timeout: float = 30) -> Obj:
        def check() -> Obj | None:
            o = self.get(kind, name)
            return o if o is not None and ok(o) else None
        try:
            return harness.wait_until(check, timeout, interval=0.1, what=f"{kind} {name}: {what}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: have {json.dumps(self.get(kind, name))[:3000]}") from None

    def wait_gone(self, kind: str, name: str, timeout: float = 60) -> None:
        harness.wait_until(lambda: self.get(kind, name) is None, timeout, interval=0.1, what=f"{kind} {name} gone")

    def wait_generated(self, name: str, timeout: float = 30) -> dict[str, Obj]:
        """Waits until every object convert.build wants exists exactly as wanted; returns them by kind."""
        def check() -> dict[str, Obj] | None:
            b = self.booster(name)
            out = {}
            wants = convert.build(b)
            autoscaled = any(w["kind"] == "AutoscalingPolicy" for w in wants)
            for want in wants:
                live = self.get(want["kind"], want["metadata"]["name"])
                if live is None or desired.patch_for(want, live, autoscaled):
                    return None
                out[want["kind"]] = live
            return out
        try:
            return harness.wait_until(check, timeout, interval=0.1, what=f"objects of booster {name}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: booster status {self.booster(name).get('status')}") from None

    def wait_condition(self, name: str, ctype: str, status: str, timeout: float = 30) -> Obj:
        return self.wait_obj("ModelBooster", name, lambda b: condition(b, ctype) == status and
                             (b.get("status") or {}).get("observedGeneration") == b["metadata"]["generation"],
                             f"{ctype}={status}", timeout)


@pytest.fixture(scope="module")
def api(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BoosterApi]:
    install_crds(control_plane)
    with controller_namespace(control_plane, NS, tmp_path_factory.mktemp("booster"), "booster-a", BoosterApi) as a:
        yield a


def owner_of(obj: Obj) -> Obj:
    (ref,) = obj["metadata"]["ownerReferences"]
    return ref


def test_vllm_booster_generates_objects_and_conditions(api: BoosterApi) -> None:
    api.cp.apply([booster("qwen", "vLLM", [server_worker()])])
    objs = api.wait_generated("qwen")
    b = api.booster("qwen")
    uid = b["metadata"]["uid"]
    assert sorted(objs) == ["ModelRoute", "ModelServer", "ModelServing"]
    for kind, o in objs.items():
        assert owner_of(o) == {"apiVersion": "workload.serving.volcano.sh/v1alpha1", "kind": "ModelBooster",
                               "name": "qwen", "uid": uid, "controller": True, "blockOwnerDeletion": True}
        labels = o["metadata"]["labels"]
        assert labels[names.LABEL_MODEL_UID] == uid and labels[names.LABEL_MANAGED_BY] == names.MANAGED_BY
    ms, server, route = objs["ModelServing"], objs["ModelServer"], objs["ModelRoute"]
    assert ms["metadata"]["name"] == "qwen-main" and server["metadata"]["name"] == "qwen-main"
    assert route["metadata"]["name"] == "qwen"
    spec = ms["spec"]["template"]["roles"][0]["entryTemplate"]["spec"]
    assert spec["volumes"][0] == {"name": "main-weights", "persistentVolumeClaim": {"claimName": "models"}}
    init = spec["initContainers"][0]
    assert init["image"] == "kthena/downloader:latest" and init["args"][:3] == ["--source",
                                                                                   "hf://Qwen/Qwen2.5-0.5B-Instruct",
                                                                                   "--output-dir"]
    assert init["args"][3].startswith("/models/")
    assert spec["containers"][1]["command"][:5] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model",
                                                    init["args"][3]]
    assert server["spec"]["model"] == "qwen" and server["spec"]["inferenceEngine"] == "vLLM"
    assert server["spec"]["workloadSelector"] == {"matchLabels": {names.LABEL_MODEL_UID: uid}}
    assert route["spec"]["rules"][0]["targetModels"][0]["modelServerName"] == "qwen-main"

    b = api.wait_condition("qwen", "Initialized", "True")
    assert condition(b, "Active") == "False" and condition(b, "Failed") == "False"
    # the ModelServing controller (same process) makes the pod; the test plays the kubelet
    pod = "qwen-main-0-leader-0-0"
    api.wait_pods("qwen-main", {pod})
    api.set_ready(pod)
    b = api.wait_condition("qwen", "Active", "True")
    assert {c["type"]: c["reason"] for c in b["status"]["conditions"]} == {
        "Initialized": "ModelCreating", "Active": "ModelAvailable", "Failed": "ModelReconciled"}

    # converged: nothing more is written
    def versions() -> list[str]:
        return [api.booster("qwen")["metadata"]["resourceVersion"]] + \
            [(api.get(k, n) or {}).get("metadata", {}).get("resourceVersion", "")
             for k, n in (("ModelServing", "qwen-main"), ("ModelServer", "qwen-main"), ("ModelRoute", "qwen"))]
    before = versions()
    time.sleep(1.5)
    assert versions() == before


@pytest.mark.parametrize("name,btype,workers,engine", [
    ("vpd", "vLLMDisaggregated", pd_workers(True), "vLLM"),
    ("sgl", "SGLang", [server_worker("lmsysorg/sglang:v0.5", pods=2)], "SGLang"),
    ("spd", "SGLangDisaggregated", pd_workers(False), "SGLang"),
])
def test_each_template(api: BoosterApi, name: str, btype: str, workers: list[Obj], engine: str) -> None:
    api.cp.apply([booster(name, btype, workers)])
    objs = api.wait_generated(name)
    b = api.wait_condition(name, "Failed", "False")
    assert condition(b, "Initialized") == "True"
    server = objs["ModelServer"]["spec"]
    assert server["inferenceEngine"] == engine
    roles = [r["name"] for r in objs["ModelServing"]["spec"]["template"]["roles"]]
    if btype.endswith("Disaggregated"):
        assert roles == ["prefill", "decode"]
        assert server["workloadSelector"]["pdGroup"]["groupKey"] == "modelserving.volcano.sh/group-name"
        assert server.get("kvConnector") == ({"type": "nixl"} if engine == "vLLM" else None)
        # the ModelServing controller makes one entry pod per role
        api.wait_pods(f"{name}-main", {f"{name}-main-0-prefill-0-0", f"{name}-main-0-decode-0-0"})
    else:
        assert roles == ["leader"]
        pods = api.wait_pods(f"{name}-main", {f"{name}-main-0-leader-0-0", f"{name}-main-0-leader-0-1"})
        worker = pods[f"{name}-main-0-leader-0-1"]["spec"]["containers"][0]
        assert "$(WORKER_INDEX)" in worker["command"]
    if btype == "SGLangDisaggregated":
        prefill = api.pods(f"{name}-main")[f"{name}-main-0-prefill-0-0"]
        assert prefill["metadata"]["annotations"]["router.kthena.io/bootstrap-port"] == "8998"


def test_booster_edits_propagate(api: BoosterApi) -> None:
    api.cp.apply([booster("edit", "vLLM", [server_worker()])])
    objs = api.wait_generated("edit")
    rev = objs["ModelServing"]["metadata"]["labels"][names.LABEL_REVISION]
    b = api.booster("edit")
    workers = b["spec"]["backend"]["workers"]
    workers[0]["image"] = "vllm/vllm-openai:v0.10"
    workers[0]["config"]["max-model-len"] = 8192
    api.patch("ModelBooster", "edit", {"spec": {"name": "edited", "backend": {"replicas": 2, "workers": workers}}})
    route_uid = objs["ModelRoute"]["metadata"]["uid"]
    objs = api.wait_generated("edit")
    ms = objs["ModelServing"]
    assert ms["spec"]["replicas"] == 2
    engine = ms["spec"]["template"]["roles"][0]["entryTemplate"]["spec"]["containers"][1]
    assert engine["image"] == "vllm/vllm-openai:v0.10" and "8192" in engine["command"]
    assert ms["metadata"]["labels"][names.LABEL_REVISION] != rev
    assert objs["ModelRoute"]["spec"]["modelName"] == "edited"  # immutable: the route was replaced
    assert objs["ModelRoute"]["metadata"]["uid"] != route_uid
    b = api.wait_condition("edit", "Initialized", "True")
    assert b["status"]["observedGeneration"] == 2


def test_hand_edits_are_reverted(api: BoosterApi) -> None:
    api.cp.apply([booster("hand", "vLLM", [server_worker()])])
    objs = api.wait_generated("hand")
    ms = objs["ModelServing"]
    roles = ms["spec"]["template"]["roles"]
    roles[0]["entryTemplate"]["spec"]["containers"][1]["image"] = "evil:1"
    api.patch("ModelServing", "hand-main", {"spec": {"replicas": 5, "template": {"roles": roles}},
                                            "metadata": {"labels": {"team": "ours"}}})
    api.patch("ModelRoute", "hand", {"spec": {"rules": [{"name": "x", "targetModels": [{"modelServerName": "y"}]}]}})
    api.patch("ModelServer", "hand-main", {"spec": {"workloadPort": {"port": 9999}}})
    objs = api.wait_generated("hand")
    assert objs["ModelServing"]["spec"]["replicas"] == 1
    assert objs["ModelRoute"]["spec"]["rules"][0]["targetModels"][0]["modelServerName"] == "hand-main"
    assert objs["ModelServer"]["spec"]["workloadPort"]["port"] == 8000
    assert objs["ModelServing"]["metadata"]["labels"]["team"] == "ours"  # not ours to remove
    # a deleted generated object comes back
    r = api.http.delete(f"/apis/networking.serving.volcano.sh/v1alpha1/namespaces/{NS}/modelroutes/hand")
    assert r.status_code == 200, r.text
    api.wait_obj("ModelRoute", "hand", lambda o: o["metadata"]["uid"] != objs["ModelRoute"]["metadata"]["uid"],
                 "recreated")


def test_autoscaling_policy_added_and_removed(api: BoosterApi) -> None:
    api.cp.apply([booster("auto", "vLLM", [server_worker()])])
    api.wait_generated("auto")
    req = {"minReplicas": 1, "maxReplicas": 3, "metrics": [{"name": "kthena:num_requests_waiting",
                                                            "targetValue": "10"}]}
    api.patch("ModelBooster", "auto", {"metadata": {"annotations": {names.ANNOTATION_AUTOSCALING: json.dumps(req)}}})
    objs = api.wait_generated("auto")
    policy = objs["AutoscalingPolicy"]
    assert policy["metadata"]["name"] == "auto-main"
    assert policy["spec"]["homogeneousTarget"]["target"]["targetRef"] == {"kind": "ModelServing", "name": "auto-main"}
    # the autoscaler owns spec.replicas now: a change of it stays
    api.patch("ModelServing", "auto-main", {"spec": {"replicas": 3}})
    api.patch("ModelRoute", "auto", {"spec": {"rules": [{"name": "x", "targetModels": [{"modelServerName": "y"}]}]}})
    api.wait_obj("ModelRoute", "auto", lambda o: o["spec"]["rules"][0]["name"] == "default", "reverted")
    assert (api.get("ModelServing", "auto-main") or {})["spec"]["replicas"] == 3
    # autoscaling removed: the policy is deleted
    api.patch("ModelBooster", "auto", {"metadata": {"annotations": {names.ANNOTATION_AUTOSCALING: None}}})
    api.wait_gone("AutoscalingPolicy", "auto-main", 30)
    objs = api.wait_generated("auto")
    assert objs["ModelServing"]["spec"]["replicas"] == 1  # owned by the booster again


def test_invalid_booster_fails_with_the_field(api: BoosterApi) -> None:
    bad = booster("bad", "vLLM", [server_worker(), server_worker()])
    api.cp.apply([bad])
    b = api.wait_condition("bad", "Failed", "True")
    failed = next(c for c in b["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "ModelAbnormal"
    assert "spec.backend.workers" in failed["message"] and "exactly one worker" in failed["message"]
    assert condition(b, "Active") == "False"
    assert api.get("ModelServing", "bad-main") is None and api.get("ModelRoute", "bad") is None
    api.patch("ModelBooster", "bad", {"spec": {"backend": {"workers": [server_worker()]}}})
    api.wait_generated("bad")
    api.wait_condition("bad", "Failed", "False")


def test_name_held_by_another_object_is_reported(api: BoosterApi) -> None:
    api.cp.apply([{"apiVersion": "networking.serving.volcano.sh/v1alpha1", "kind": "ModelRoute",
                   "metadata": {"name": "taken", "namespace": NS},
                   "spec": {"modelName": "someone-else", "rules": [{"name": "r", "targetModels": [
                       {"modelServerName": "x"}]}]}}])
    api.cp.apply([booster("taken", "vLLM", [server_worker()])])
    b = api.wait_condition("taken", "Failed", "True")
    msg = next(c for c in b["status"]["conditions"] if c["type"] == "Failed")["message"]
    assert f"ModelRoute {NS}/taken exists and is not controlled by this ModelBooster" in msg
    assert (api.get("ModelRoute", "taken") or {})["spec"]["modelName"] == "someone-else"  # left alone
    assert api.get("ModelServing", "taken-main") is not None  # the rest is generated


def test_deleting_the_booster_removes_everything(api: BoosterApi) -> None:
    api.cp.apply([booster("gone", "vLLM", [server_worker()])])
    api.wait_generated("gone")
    api.wait_pods("gone-main", {"gone-main-0-leader-0-0"})
    api.cp.kubectl("delete", "-n", NS, "modelbooster/gone", "--cascade=foreground", "--wait=false")
    for kind, name in (("ModelServing", "gone-main"), ("ModelServer", "gone-main"), ("ModelRoute", "gone")):
        api.wait_gone(kind, name, 60)
    harness.wait_until(lambda: not api.pods("gone-main") and api.get("ModelBooster", "gone") is None, 60,
                       what="pods and the booster removed by the garbage collector")
    time.sleep(0.5)  # nothing is recreated after the owner is gone
    assert api.get("ModelServing", "gone-main") is None and api.get("ModelRoute", "gone") is None


def test_backend_rename_replaces_the_generated_objects(api: BoosterApi) -> None:
    api.cp.apply([booster("ren", "vLLM", [server_worker()])])
    api.wait_generated("ren")
    api.patch("ModelBooster", "ren", {"spec": {"backend": {"name": "next"}}})
    objs = api.wait_generated("ren")
    assert objs["ModelServing"]["metadata"]["name"] == "ren-next"
    assert objs["ModelRoute"]["spec"]["rules"][0]["targetModels"][0]["modelServerName"] == "ren-next"
    api.wait_gone("ModelServing", "ren-main", 30)
    api.wait_gone("ModelServer", "ren-main", 30)
