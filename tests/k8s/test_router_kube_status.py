"""Status written by routers in Kubernetes mode, on the real apiserver and the real CRDs.

Two router processes watch one namespace; exactly one holds the Lease and writes
ModelRoute Accepted/ResolvedRefs, ModelServer Ready/readyEndpoints (PD roles too) and
ExternalModelProvider Ready/CredentialsResolved, while the other writes nothing. An
ExternalModelProvider with a labelled Secret serves requests through the HTTPS stub
provider. When the leader stops it releases the Lease: the other takes over and changes
made after the first router stopped show up in status.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import harness
import k8s_harness
from external_stub import StubProvider, make_pki
from kube_crds import install_crds
from kube_router_env import API, Cluster, conditions, eventually, lease_holder, metric, route, server, \
    start_engine, start_kube_router, status_of, wait_model

NS = "kube-router-status"
ENGINE_IP = "127.0.0.7"
PREFILL_IP, DECODE_IP, EXTRA_IP = "127.0.0.8", "127.0.0.9", "127.0.0.10"  # pods only: no engine needed
KEY = "sk-status-test-do-not-leak"
SECRET_LABEL = {"networking.serving.volcano.sh/external-model-provider-credential": "true"}


def _provider(name: str, base_url: str, secret: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ExternalModelProvider", "metadata": {"name": name, "namespace": NS},
            "spec": {"providerType": "OpenAI", "baseURL": base_url, "model": "up-gpt",
                     "auth": {"scheme": "Bearer", "secretRef": {"name": secret, "key": "api-key"}}}}


def _ext_route(name: str, model: str, provider: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ModelRoute", "metadata": {"name": name, "namespace": NS},
            "spec": {"modelName": model, "rules": [{"name": "default",
                                                    "targetModels": [{"externalModelProviderName": provider}]}]}}


def _pd_server(port: int) -> dict[str, Any]:
    doc = server("pd", {"app": "pd"}, port, NS)
    doc["spec"]["inferenceEngine"] = "SGLang"
    doc["spec"]["workloadSelector"]["pdGroup"] = {"groupKey": "g", "prefillLabels": {"role": "prefill"},
                                                  "decodeLabels": {"role": "decode"}}
    return doc


@pytest.fixture(scope="module")
def env(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    install_crds(control_plane)
    log_dir = tmp_path_factory.mktemp("kube-status")
    cluster = Cluster(control_plane, NS)
    cluster.create_namespace()
    port = harness.free_port()
    sim = start_engine(ENGINE_IP, port, log_dir)
    pki = make_pki(log_dir / "pki", "status")
    stub = StubProvider(pki)
    stub.state.expect = {"/bearer": ("authorization", f"Bearer {KEY}")}
    rc = log_dir / "router-config.yaml"
    rc.write_text(json.dumps({"externalProviders": {"caFile": str(pki.ca_pem)}}))
    routers: dict[str, harness.Router] = {}

    def start(identity: str) -> harness.Router:
        routers[identity] = start_kube_router(
            log_dir, control_plane.kubeconfig, namespace=NS, name=identity,
            extra_args=["--router-config", str(rc), "--leader-identity", identity])
        return routers[identity]

    try:
        yield {"cluster": cluster, "cp": control_plane, "port": port, "stub": stub, "start": start,
               "routers": routers, "log_dir": log_dir}
    finally:
        for r in routers.values():
            r.stop()
        stub.close()
        sim.stop()
        cluster.delete_namespace()
        cluster.close()


def _cond(cp: k8s_harness.ControlPlane, kind: str, name: str) -> dict[str, tuple[str, str]]:
    return conditions(status_of(cp, kind, NS, name))


def _converges(cp: k8s_harness.ControlPlane, kind: str, name: str, want: dict[str, tuple[str, str]],
               **fields: Any) -> dict[str, Any]:
    def ok() -> bool:
        st = status_of(cp, kind, NS, name)
        return conditions(st) == want and all(st.get(k) == v for k, v in fields.items())
    try:
        eventually(ok, 30, what=f"{kind} {name} status {want} {fields}")
    except AssertionError:
        raise AssertionError(f"{kind} {name}: {status_of(cp, kind, NS, name)}") from None
    return status_of(cp, kind, NS, name)


def test_leader_writes_every_kind_and_the_follower_writes_nothing(env: dict[str, Any]) -> None:
    c: Cluster = env["cluster"]
    cp: k8s_harness.ControlPlane = env["cp"]
    port, stub = env["port"], env["stub"]
    a = env["start"]("router-a")
    eventually(lambda: lease_holder(cp, NS) == "router-a", 30, what="router-a holds the Lease")
    b = env["start"]("router-b")

    c.create(server("pool", {"app": "pool"}, port, NS))
    c.create(route("pool", "pool-model", [("pool", None)], NS))
    c.create(route("orphan", "orphan-model", [("missing", None)], NS))
    c.pod("pool-0", ENGINE_IP, {"app": "pool"})
    c.create(_pd_server(port))
    c.pod("pd-p0", PREFILL_IP, {"app": "pd", "role": "prefill", "g": "1"})
    c.pod("pd-d0", DECODE_IP, {"app": "pd", "role": "decode", "g": "1"})
    r = c.api.post(f"/api/v1/namespaces/{NS}/secrets", json={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "oai-key", "labels": SECRET_LABEL},
        "type": "Opaque", "data": {"api-key": base64.b64encode(KEY.encode()).decode()}})
    assert r.status_code == 201, r.text
    c.create(_provider("oai", f"https://127.0.0.1:{stub.port}/bearer/v1", "oai-key"))
    c.create(_provider("nokey", f"https://127.0.0.1:{stub.port}/bearer/v1", "absent"))
    c.create(_ext_route("gpt", "gpt", "oai"))

    ok_route = {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}
    st = _converges(cp, "ModelRoute", "pool", ok_route)
    assert st["observedGeneration"] == 1
    _converges(cp, "ModelRoute", "gpt", ok_route)
    st = _converges(cp, "ModelRoute", "orphan", {"Accepted": ("False", "UnresolvedRefs"),
                                                 "ResolvedRefs": ("False", "BackendNotFound")})
    msg = next(x["message"] for x in st["conditions"] if x["type"] == "ResolvedRefs")
    assert "targetModels[0]" in msg and "missing" in msg
    _converges(cp, "ModelServer", "pool", {"Ready": ("True", "EndpointsReady")}, readyEndpoints=1)
    _converges(cp, "ModelServer", "pd", {"Ready": ("True", "EndpointsReady")}, readyEndpoints=2,
               readyPrefillEndpoints=1, readyDecodeEndpoints=1)
    _converges(cp, "ExternalModelProvider", "oai", {"CredentialsResolved": ("True", "CredentialResolved"),
                                                    "Ready": ("True", "Ready")})
    st = _converges(cp, "ExternalModelProvider", "nokey", {"CredentialsResolved": ("False", "CredentialNotFound"),
                                                           "Ready": ("False", "CredentialNotFound")})
    assert KEY not in json.dumps(st)

    # the leader wrote all of it; the follower (watching the same objects) wrote nothing
    assert metric(a, "kthena_router_kube_status_leader") == 1
    assert metric(b, "kthena_router_kube_status_leader") == 0
    assert metric(a, "kthena_router_kube_status_writes_total", result="written") >= 7
    assert metric(b, "kthena_router_kube_status_writes_total", result="written") == 0
    assert lease_holder(cp, NS) == "router-a"

    # both replicas serve: the external provider through its labelled Secret, the pool's engine
    for router in (a, b):
        wait_model(router, "gpt")
        stub.reset()
        client = router.openai()
        out = client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=5)
        assert out.choices[0].message.content == "stub answer from up-gpt"
        [seen] = stub.seen()
        assert seen.headers["authorization"] == f"Bearer {KEY}" and seen.body["model"] == "up-gpt"
        out = client.chat.completions.create(model="pool-model", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=3)
        assert out.choices[0].message.content


def test_status_follows_changes_and_a_bad_edit(env: dict[str, Any]) -> None:
    c: Cluster = env["cluster"]
    cp: k8s_harness.ControlPlane = env["cp"]
    # a bad edit the CRD admits and the router refuses (a target naming no server): the last
    # valid version keeps serving, Accepted turns False naming the missing backend
    c.patch("ModelRoute", "pool", {"spec": {"rules": [{"name": "default",
                                                       "targetModels": [{"modelServerName": "gone"}]}]}})
    st = _converges(cp, "ModelRoute", "pool", {"Accepted": ("False", "UnresolvedRefs"),
                                               "ResolvedRefs": ("False", "BackendNotFound")})
    assert st["observedGeneration"] == 2
    assert all(x["observedGeneration"] == 2 for x in st["conditions"])
    accepted = next(x for x in st["conditions"] if x["type"] == "Accepted")
    assert "last valid version" in accepted["message"]
    wait_model(env["routers"]["router-a"], "pool-model")  # still served
    c.patch("ModelRoute", "pool", {"spec": {"rules": [{"name": "default",
                                                       "targetModels": [{"modelServerName": "pool"}]}]}})
    _converges(cp, "ModelRoute", "pool", {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")},
               observedGeneration=3)
    # the missing backend appears: the orphan route resolves
    c.create(server("missing", {"app": "none"}, env["port"], NS))
    _converges(cp, "ModelRoute", "orphan", {"Accepted": ("True", "Accepted"),
                                            "ResolvedRefs": ("True", "ResolvedRefs")})
    _converges(cp, "ModelServer", "missing", {"Ready": ("False", "NoReadyEndpoints")}, readyEndpoints=0)


def test_follower_takes_over_when_the_leader_stops(env: dict[str, Any]) -> None:
    c: Cluster = env["cluster"]
    cp: k8s_harness.ControlPlane = env["cp"]
    a, b = env["routers"]["router-a"], env["routers"]["router-b"]
    assert lease_holder(cp, NS) == "router-a"
    assert a.stop() == 0
    # released on shutdown: router-b takes it at its next retry, not after the Lease expires
    eventually(lambda: lease_holder(cp, NS) == "router-b", 15, what="router-b holds the Lease")
    eventually(lambda: metric(b, "kthena_router_kube_status_leader") == 1, 15, what="router-b leads")
    # changes made after router-a stopped converge through router-b
    c.pod("pool-1", EXTRA_IP, {"app": "pool"})
    _converges(cp, "ModelServer", "pool", {"Ready": ("True", "EndpointsReady")}, readyEndpoints=2)
    c.create(route("late", "late-model", [("pool", None)], NS))
    _converges(cp, "ModelRoute", "late", {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")})
    c.delete_pod("pd-d0", 0)
    _converges(cp, "ModelServer", "pd", {"Ready": ("False", "NoReadyPair")}, readyEndpoints=1,
               readyPrefillEndpoints=1, readyDecodeEndpoints=0)
    assert metric(b, "kthena_router_kube_status_writes_total", result="written") >= 3
    assert "releasing Lease" not in a.process.stderr()  # the release itself did not fail
