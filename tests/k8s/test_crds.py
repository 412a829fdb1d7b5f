"""The generated CRDs on a real kube-apiserver: they install and become Established, valid
objects are accepted with Kthena's defaults, invalid ones are rejected with clear messages
(bounds, enums, required fields, CEL rules, unknown fields under strict field validation),
printer columns and the ModelServing scale subresource work."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import k8s_crds
import k8s_harness
from kthena_router.api.kinds import KINDS, by_kind

NS = "crds-test"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def api(control_plane: k8s_harness.ControlPlane) -> Iterator[httpx.Client]:
    k8s_crds.install_crds(control_plane)
    k8s_crds.install_crds(control_plane)  # idempotent
    with control_plane.client() as client:
        r = client.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
        assert r.status_code in (201, 409), r.text
        yield client
        client.delete(f"/api/v1/namespaces/{NS}")


def _path(kind: str, name: str | None = None) -> str:
    k = by_kind(kind)
    base = f"/apis/{k.api_version}/namespaces/{NS}/{k.plural}"
    return f"{base}/{name}" if name else base


def _create(api: httpx.Client, doc: dict[str, Any]) -> httpx.Response:
    doc = {"apiVersion": by_kind(doc["kind"]).api_version, **doc}
    return api.post(_path(doc["kind"]), params={"fieldValidation": "Strict"}, json=doc)


def _reject(api: httpx.Client, doc: dict[str, Any], *expected: str, status: int = 422) -> str:
    """Invalid: 422; unknown fields under strict field validation: 400 (a strict decoding error)."""
    r = _create(api, doc)
    assert r.status_code == status, f"{r.status_code}: {r.text}"
    msg = r.json()["message"]
    for e in expected:
        assert e in msg, msg
    return msg


def _route(name: str, **spec: Any) -> dict[str, Any]:
    body = {"modelName": name, "rules": [{"targetModels": [{"modelServerName": "s"}]}], **spec}
    return {"kind": "ModelRoute", "metadata": {"name": name}, "spec": body}


def _server(name: str, **spec: Any) -> dict[str, Any]:
    body = {"inferenceEngine": "vLLM", "workloadSelector": {"matchLabels": {"app": name}},
            "workloadPort": {"port": 8000}, **spec}
    return {"kind": "ModelServer", "metadata": {"name": name}, "spec": body}


def _pod(image: str = "example.invalid/engine:1") -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "m"}},
            "spec": {"containers": [{"name": "engine", "image": image, "ports": [{"containerPort": 8000}],
                                     "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "8Gi"}}}]}}


def _serving(name: str, **spec: Any) -> dict[str, Any]:
    body = {"template": {"roles": [{"name": "prefill", "entryTemplate": _pod(), "workerReplicas": 0},
                                   {"name": "decode", "replicas": 2, "entryTemplate": _pod(), "workerReplicas": 1,
                                    "workerTemplate": _pod()}]}, **spec}
    return {"kind": "ModelServing", "metadata": {"name": name}, "spec": body}


def _policy(name: str, **spec: Any) -> dict[str, Any]:
    body = {"metrics": [{"name": "waiting", "targetValue": "10"}],
            "homogeneousTarget": {"minReplicas": 1, "maxReplicas": 4,
                                  "target": {"targetRef": {"kind": "ModelServing", "name": "m"},
                                             "metricSources": {"waiting": {"pod": {"name": "vllm:num_requests_waiting"}}}}},
            **spec}
    return {"kind": "AutoscalingPolicy", "metadata": {"name": name}, "spec": body}


def _booster(name: str, **backend: Any) -> dict[str, Any]:
    b = {"name": "main", "type": "vLLM", "modelURI": "hf://Qwen/Qwen2.5-0.5B", "replicas": 1,
         "workers": [{"type": "server", "image": "vllm/vllm-openai:latest", "replicas": 1, "pods": 1,
                      "config": {"tensor-parallel-size": 1, "max-model-len": 4096}}], **backend}
    return {"kind": "ModelBooster", "metadata": {"name": name}, "spec": {"backend": b}}


def test_all_crds_established_with_status_subresource(api: httpx.Client) -> None:
    for k in KINDS:
        crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{k.crd_name}").json()
        conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conds.get("Established") == "True" and conds.get("NamesAccepted") == "True", (k.kind, conds)
        assert crd["spec"]["group"] == k.group and crd["spec"]["versions"][0]["name"] == "v1alpha1"
        assert "status" in crd["spec"]["versions"][0]["subresources"]


def test_kthena_examples_apply_under_strict_validation(control_plane: k8s_harness.ControlPlane,
                                                       api: httpx.Client) -> None:
    """The repository's Kthena YAML (without our file-mode-only Endpoints kind) is accepted unchanged."""
    docs = []
    for f in sorted((REPO / "configs" / "examples").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d and d["kind"] != "Endpoints"]
    assert {d["kind"] for d in docs} >= {"ModelRoute", "ModelServer"}
    for d in docs:
        d["metadata"]["namespace"] = NS
    out = control_plane.kubectl("apply", "--validate=strict", "-f", "-", input=yaml.safe_dump_all(docs))
    assert out.returncode == 0 and "created" in out.stdout, out


def test_defaults_are_applied(api: httpx.Client) -> None:
    r = _create(api, _route("defaults", rateLimit={"inputTokensPerUnit": 100}))
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert spec["rules"][0]["targetModels"][0]["weight"] == 100
    assert spec["rateLimit"]["unit"] == "second"
    r = _create(api, _server("defaults", trafficPolicy={"retry": {"attempts": 2}}, kvConnector={}))
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert spec["workloadPort"]["protocol"] == "http" and spec["kvConnector"]["type"] == "http"
    assert spec["trafficPolicy"]["retry"]["retryInterval"] == "100ms"
    r = _create(api, _serving("defaults"))
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert (spec["replicas"], spec["schedulerName"], spec["recoveryPolicy"]) == (1, "volcano", "RoleRecreate")
    assert spec["template"]["roles"][0]["replicas"] == 1
    assert spec["template"]["roles"][0]["entryTemplate"]["spec"]["containers"][0]["ports"][0]["protocol"] == "TCP"
    r = _create(api, _policy("defaults", behavior={"scaleUp": {"panicPolicy": {"period": "10s"}}}))
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert spec["tolerancePercent"] == 10
    assert spec["behavior"]["scaleUp"]["panicPolicy"] == {"period": "10s", "percent": 1000,
                                                           "panicThresholdPercent": 200, "panicModeHold": "60s"}
    src = spec["homogeneousTarget"]["target"]["metricSources"]["waiting"]["pod"]
    assert (src["uri"], src["port"]) == ("/metrics", 8100)
    r = _create(api, _booster("defaults"))
    assert r.status_code == 201, r.text
    worker = r.json()["spec"]["backend"]["workers"][0]
    assert worker["config"] == {"tensor-parallel-size": 1, "max-model-len": 4096}  # free-form JSON kept
    r = _create(api, {"kind": "ExternalModelProvider", "metadata": {"name": "defaults"},
                      "spec": {"baseURL": "https://api.example.com"}})
    assert r.status_code == 201, r.text
    assert r.json()["spec"] == {"baseURL": "https://api.example.com", "providerType": "OpenAI",
                                "insecureSkipVerify": False}


def test_bounds_enums_and_required_fields(api: httpx.Client) -> None:
    bad = _route("weight")
    bad["spec"]["rules"][0]["targetModels"][0]["weight"] = 101
    _reject(api, bad, "spec.rules[0].targetModels[0].weight", "less than or equal to 100")
    _reject(api, _route("units", rateLimit={"unit": "week"}), "spec.rateLimit.unit", "Unsupported value",
            '"second"')
    _reject(api, _route("many", loraAdapters=[f"a{i}" for i in range(11)]), "spec.loraAdapters",
            "must have at most 10 items")
    _reject(api, _server("engine", inferenceEngine="TGI"), "spec.inferenceEngine", "Unsupported value: \"TGI\"")
    _reject(api, _server("port", workloadPort={"port": 70000}), "spec.workloadPort.port",
            "less than or equal to 65535")
    noport = _server("noport")
    del noport["spec"]["workloadPort"]
    _reject(api, noport, "spec.workloadPort", "Required value")
    _reject(api, {"kind": "ExternalModelProvider", "metadata": {"name": "nourl"}, "spec": {"model": "x"}},
            "spec.baseURL", "Required value")
    _reject(api, {"kind": "ExternalModelProvider", "metadata": {"name": "http"},
                  "spec": {"baseURL": "http://api.example.com"}}, "spec.baseURL", "should match '^https://.+'")
    long_role = _serving("role")
    long_role["spec"]["template"]["roles"][0]["name"] = "prefill-role-x"
    _reject(api, long_role, "spec.template.roles[0].name", "may not be more than 12")
    _reject(api, _policy("tolerance", tolerancePercent=101), "spec.tolerancePercent")
    _reject(api, _booster("uri", modelURI="ftp://x/y"), "spec.backend.modelURI")
    _reject(api, _booster("type", type="MindIE"), "spec.backend.type", "Unsupported value")


def test_cel_rules(api: httpx.Client) -> None:
    both = _route("both")
    both["spec"]["rules"][0]["targetModels"][0]["externalModelProviderName"] = "openai"
    _reject(api, both, "spec.rules[0].targetModels[0]",
            "exactly one of modelServerName or externalModelProviderName must be set")
    empty = _route("empty")
    del empty["spec"]["modelName"]
    _reject(api, empty, "modelName and loraAdapters cannot both be empty")
    assert _create(api, {**empty, "spec": {**empty["spec"], "loraAdapters": ["sql-lora"]}}).status_code == 201
    dup = _serving("dup")
    dup["spec"]["template"]["roles"][1]["name"] = "prefill"
    _reject(api, dup, "roles name must be unique")
    _reject(api, _policy("two", heterogeneousTarget={"params": [{"minReplicas": 0, "maxReplicas": 2}]}),
            "exactly one of homogeneousTarget, heterogeneousTarget or disaggregatedTarget must be set")
    src = _policy("src")
    src["spec"]["homogeneousTarget"]["target"]["metricSources"]["waiting"]["prometheus"] = {
        "serverURL": "http://prom:9090", "query": "sum(x)"}
    _reject(api, src, "pod and prometheus configs are mutually exclusive")
    ratio = _policy("ratio")
    del ratio["spec"]["homogeneousTarget"]
    ratio["spec"]["disaggregatedTarget"] = {
        "targetRef": {"name": "m"}, "roles": {"decode": {"minReplicas": 1, "maxReplicas": 4}},
        "ratioConstraint": {"numeratorRole": "decode", "denominatorRole": "decode", "minRatio": "1", "maxRatio": 2}}
    _reject(api, ratio, "numeratorRole and denominatorRole must differ",
            "roles must contain at least two entries when ratioConstraint is configured")
    _reject(api, {"kind": "ExternalModelProvider", "metadata": {"name": "optional"},
                  "spec": {"baseURL": "https://x", "auth": {"secretRef": {"name": "s", "key": "k", "optional": True}}}},
            "secretRef.optional must be false or unset")


def test_transition_rule_modelname_is_immutable(api: httpx.Client) -> None:
    r = _create(api, _route("immutable"))
    assert r.status_code == 201, r.text
    obj = r.json()
    obj["spec"]["modelName"] = "other"
    r = api.put(_path("ModelRoute", "immutable"), json=obj)
    assert r.status_code == 422 and "modelName is immutable" in r.json()["message"], r.text


def test_unknown_fields_rejected_under_strict_validation(control_plane: k8s_harness.ControlPlane,
                                                         api: httpx.Client) -> None:
    _reject(api, _route("unknown", sessionAffinity=True), 'unknown field "spec.sessionAffinity"', status=400)
    typo = _server("typo", workloadPort={"port": 8000, "protocl": "http"})
    _reject(api, typo, 'unknown field "spec.workloadPort.protocl"', status=400)
    # inside the embedded pod template too (the full core/v1 PodSpec schema, not a free-form object)
    pod = _serving("podtypo")
    pod["spec"]["template"]["roles"][0]["entryTemplate"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    _reject(api, pod, 'unknown field "spec.template.roles[0].entryTemplate.spec.containers[0].imagePullPolcy"',
            status=400)
    # kubectl's strict client validation says the same
    doc = {"apiVersion": by_kind("ModelServer").api_version, **_server("kubectl", extra=1)}
    doc["metadata"]["namespace"] = NS
    out = control_plane.kubectl("apply", "--validate=strict", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert out.returncode != 0 and 'unknown field "spec.extra"' in out.stderr, out
    # without strict validation the apiserver prunes (never stores) the unknown field
    r = api.post(_path("ModelServer"), json={"apiVersion": by_kind("ModelServer").api_version,
                                             **_server("pruned", extra=1)})
    assert r.status_code == 201 and "extra" not in r.json()["spec"], r.text


def test_printer_columns_and_scale_subresource(control_plane: k8s_harness.ControlPlane, api: httpx.Client) -> None:
    assert _create(api, _server("columns", workloadPort={"port": 8443, "protocol": "https"})).status_code == 201
    out = control_plane.kubectl("get", "modelservers", "columns", "-n", NS).stdout
    header, row = out.splitlines()[:2]
    assert header.split()[:4] == ["NAME", "ENGINE", "PORT", "PROTOCOL"], out
    assert row.split()[:4] == ["columns", "vLLM", "8443", "https"], out
    assert _create(api, _serving("scaled")).status_code == 201
    control_plane.kubectl("scale", "modelserving", "scaled", "-n", NS, "--replicas=3")
    assert api.get(_path("ModelServing", "scaled")).json()["spec"]["replicas"] == 3
    status = copy.deepcopy(api.get(_path("ModelServing", "scaled")).json())
    status["status"] = {"replicas": 3, "availableReplicas": 2, "updatedReplicas": 3,
                        "labelSelector": "modelserving.volcano.sh/name=scaled"}
    r = api.put(_path("ModelServing", "scaled") + "/status", json=status)
    assert r.status_code == 200, r.text
    scale = api.get(_path("ModelServing", "scaled") + "/scale").json()
    assert scale["spec"]["replicas"] == 3 and scale["status"]["selector"] == "modelserving.volcano.sh/name=scaled"
    out = control_plane.kubectl("get", "modelservings", "scaled", "-n", NS).stdout
    assert out.splitlines()[0].split()[:4] == ["NAME", "REPLICAS", "AVAILABLE", "UPDATED"], out
    assert out.splitlines()[1].split()[:4] == ["scaled", "3", "2", "3"], out
