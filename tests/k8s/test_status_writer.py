"""The status writer on a real apiserver: conditions of each kind, idempotency (a second pass
writes nothing), a 409 handled by re-reading, lastTransitionTime stable across no-op passes,
convergence from a hand-edited status, and a non-leader writes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import pytest_asyncio

import k8s_harness
import kthena_crds
from kthena_router.kube.status_writer import StatusWriter
from status_support import API, api_client, build_view, list_objects

NS = "status-writer-test"
SECRET_LABEL = {"networking.serving.volcano.sh/external-model-provider-credential": "true"}


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now


def _obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": kind, "metadata": {"name": name, "namespace": NS}, "spec": spec}


def _route(name: str, model: str, target: dict[str, str]) -> dict[str, Any]:
    return _obj("ModelRoute", name, {"modelName": model, "rules": [{"name": "r", "targetModels": [target]}]})


def _server(name: str, pd: bool = False) -> dict[str, Any]:
    ws: dict[str, Any] = {"matchLabels": {"app": name}}
    if pd:
        ws["pdGroup"] = {"groupKey": "group", "prefillLabels": {"role": "prefill"}, "decodeLabels": {"role": "decode"}}
    return _obj("ModelServer", name, {"model": "m", "inferenceEngine": "vLLM", "workloadSelector": ws,
                                      "workloadPort": {"port": 8000}})


@pytest.fixture(scope="module")
def cluster(control_plane: k8s_harness.ControlPlane) -> Iterator[k8s_harness.ControlPlane]:
    kthena_crds.install(control_plane)
    control_plane.kubectl("create", "namespace", NS)
    # "a-old" first: with equal creationTimestamps the name decides, so it owns "m" either way
    control_plane.apply([_server("srv"), _server("pd", pd=True), _route("a-old", "m", {"modelServerName": "srv"})])
    control_plane.apply([
        _route("b-new", "m", {"modelServerName": "srv"}),
        _route("missing", "x", {"modelServerName": "nope"}),
        # valid for the CRD, refused by the router's loader (a regex Python cannot compile)
        _obj("ModelRoute", "bad", {"modelName": "bad", "rules": [{"name": "r", "modelMatch": {
            "headers": {"x-tier": {"regex": "(unclosed"}}}, "targetModels": [{"modelServerName": "srv"}]}]}),
        _obj("ExternalModelProvider", "open", {"baseURL": "https://api.example.com"}),
        _obj("ExternalModelProvider", "keyed", {"baseURL": "https://api.example.com",
                                                "auth": {"secretRef": {"name": "creds", "key": "api-key"}}}),
    ])
    try:
        yield control_plane
    finally:
        control_plane.kubectl("delete", "namespace", NS, "--wait=false")


@pytest_asyncio.fixture(loop_scope="function")  # the loop the tests run on
async def writer_parts(cluster: k8s_harness.ControlPlane) -> AsyncIterator[tuple[StatusWriter, Clock]]:
    client = await api_client(cluster)
    clock = Clock()
    try:
        yield StatusWriter(client, clock=clock), clock
    finally:
        await client.close()


READY = {(NS, "srv"): {"all": 2}, (NS, "pd"): {"all": 3, "prefill": 2, "decode": 1}}


def _get(cp: k8s_harness.ControlPlane, kind: str, name: str) -> dict[str, Any]:
    plural = kthena_crds.KINDS[kind]
    with cp.client() as api:
        r = api.get(f"/apis/{API}/namespaces/{NS}/{plural}/{name}")
        r.raise_for_status()
        return r.json()


def _conds(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}


def _put_status(cp: k8s_harness.ControlPlane, obj: dict[str, Any]) -> dict[str, Any]:
    plural = kthena_crds.KINDS[obj["kind"]]
    with cp.client() as api:
        r = api.put(f"/apis/{API}/namespaces/{NS}/{plural}/{obj['metadata']['name']}/status", json=obj)
        assert r.status_code == 200, r.text
        return r.json()


async def test_status_conditions_idempotency_and_transitions(
        cluster: k8s_harness.ControlPlane, writer_parts: tuple[StatusWriter, Clock]) -> None:
    writer, clock = writer_parts
    first = await writer.write(build_view(list_objects(cluster, NS), READY))
    assert not first.errors, first.errors
    assert len(first.written) == 8

    old, new = _get(cluster, "ModelRoute", "a-old"), _get(cluster, "ModelRoute", "b-new")
    assert {t: (c["status"], c["reason"]) for t, c in _conds(old).items()} == {
        "Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}
    assert _conds(new)["Accepted"]["reason"] == "ModelNameConflict" and _conds(new)["Accepted"]["status"] == "True"
    assert f"{NS}/a-old" in _conds(new)["Accepted"]["message"]
    assert old["status"]["observedGeneration"] == old["metadata"]["generation"]
    assert _conds(old)["Accepted"]["observedGeneration"] == old["metadata"]["generation"]
    assert _conds(old)["Accepted"]["lastTransitionTime"] == "2026-12-01T12:00:00Z"
    assert "spec" in old and old["spec"]["modelName"] == "m"  # spec untouched

    missing = _conds(_get(cluster, "ModelRoute", "missing"))
    assert (missing["ResolvedRefs"]["status"], missing["ResolvedRefs"]["reason"]) == ("False", "BackendNotFound")
    assert "'nope' not found" in missing["ResolvedRefs"]["message"]
    assert (missing["Accepted"]["status"], missing["Accepted"]["reason"]) == ("False", "UnresolvedRefs")
    bad = _conds(_get(cluster, "ModelRoute", "bad"))
    assert (bad["Accepted"]["status"], bad["Accepted"]["reason"]) == ("False", "Invalid")
    assert "regex" in bad["Accepted"]["message"]

    srv, pd = _get(cluster, "ModelServer", "srv"), _get(cluster, "ModelServer", "pd")
    assert srv["status"]["readyEndpoints"] == 2 and _conds(srv)["Ready"]["status"] == "True"
    assert "readyPrefillEndpoints" not in srv["status"]
    assert (pd["status"]["readyEndpoints"], pd["status"]["readyPrefillEndpoints"],
            pd["status"]["readyDecodeEndpoints"]) == (3, 2, 1)
    assert _conds(pd)["Ready"]["status"] == "True"

    opened = _conds(_get(cluster, "ExternalModelProvider", "open"))
    assert (opened["CredentialsResolved"]["reason"], opened["Ready"]["status"]) == ("CredentialNotRequired", "True")
    keyed = _conds(_get(cluster, "ExternalModelProvider", "keyed"))
    assert (keyed["CredentialsResolved"]["status"], keyed["CredentialsResolved"]["reason"]) == (
        "False", "CredentialNotFound")
    assert (keyed["Ready"]["status"], keyed["Ready"]["reason"]) == ("False", "CredentialNotFound")

    # Second pass, an hour later, from a fresh listing: nothing written, nothing changed.
    before = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in list_objects(cluster, NS)}
    clock.now += timedelta(hours=1)
    second = await writer.write(build_view(list_objects(cluster, NS), READY))
    assert second.written == [] and not second.errors and second.unchanged == 8
    after = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in list_objects(cluster, NS)}
    assert after == before
    # A fresh writer (another replica, no cache) agrees: still no write.
    fresh = StatusWriter(writer._api.api_client, clock=clock)
    third = await fresh.write(build_view(list_objects(cluster, NS), READY))
    assert third.written == [] and third.unchanged == 8

    # The Secret appears: the provider turns Ready, lastTransitionTime moves; a flip of srv too.
    cluster.apply([{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "namespace": NS,
                                                                       "labels": SECRET_LABEL},
                    "stringData": {"api-key": "sk-test-123"}}])
    clock.now += timedelta(hours=1)
    ready2 = {**READY, (NS, "srv"): {"all": 0}}
    fourth = await writer.write(build_view(list_objects(cluster, NS), ready2))
    assert sorted(k[2] for k in fourth.written) == ["keyed", "srv"], fourth
    keyed_obj = _get(cluster, "ExternalModelProvider", "keyed")
    keyed = _conds(keyed_obj)
    assert (keyed["CredentialsResolved"]["status"], keyed["CredentialsResolved"]["reason"]) == (
        "True", "CredentialResolved")
    assert keyed["Ready"]["lastTransitionTime"] == "2026-12-01T14:00:00Z"
    assert "sk-test-123" not in str(keyed_obj["status"])
    srv = _get(cluster, "ModelServer", "srv")
    assert (_conds(srv)["Ready"]["status"], _conds(srv)["Ready"]["reason"]) == ("False", "NoReadyEndpoints")
    assert srv["status"]["readyEndpoints"] == 0
    # untouched conditions keep their time
    assert _conds(_get(cluster, "ModelRoute", "a-old"))["Accepted"]["lastTransitionTime"] == "2026-12-01T12:00:00Z"


async def test_conflict_is_reread_and_foreign_conditions_kept(
        cluster: k8s_harness.ControlPlane, writer_parts: tuple[StatusWriter, Clock]) -> None:
    writer, clock = writer_parts
    await writer.write(build_view(list_objects(cluster, NS), READY))
    seen = list_objects(cluster, NS)  # what the watcher last saw (our write included)
    # Another writer changes the status before the watcher sees it: our PUT carries the
    # resourceVersion the watcher saw and gets a 409.
    srv = _get(cluster, "ModelServer", "srv")
    srv["status"]["conditions"].append({"type": "Scheduled", "status": "True", "reason": "ByHand", "message": "x",
                                        "lastTransitionTime": "2026-01-01T00:00:00Z"})
    _put_status(cluster, srv)
    view = build_view(seen, {**READY, (NS, "srv"): {"all": 7}})
    result = await writer.write(view)
    assert result.conflicts >= 1 and ("ModelServer", NS, "srv") in result.written and not result.errors
    srv = _get(cluster, "ModelServer", "srv")
    assert srv["status"]["readyEndpoints"] == 7
    assert set(_conds(srv)) == {"Ready", "Scheduled"}


async def test_hand_edited_status_converges_and_non_leader_writes_nothing(
        cluster: k8s_harness.ControlPlane, writer_parts: tuple[StatusWriter, Clock]) -> None:
    writer, clock = writer_parts
    await writer.write(build_view(list_objects(cluster, NS), READY))
    route = _get(cluster, "ModelRoute", "a-old")
    route["status"] = {"observedGeneration": 0, "conditions": [
        {"type": "Accepted", "status": "False", "reason": "Bogus", "message": "edited",
         "lastTransitionTime": "2020-01-01T00:00:00Z"}]}
    edited = _put_status(cluster, route)
    # a follower sees the difference but does not write
    follower = StatusWriter(writer._api.api_client, is_leader=lambda: False, clock=clock)
    r = await follower.write(build_view(list_objects(cluster, NS), READY))
    assert r.written == [] and ("ModelRoute", NS, "a-old") in r.skipped
    assert _get(cluster, "ModelRoute", "a-old")["metadata"]["resourceVersion"] == edited["metadata"]["resourceVersion"]
    # the leader converges it
    r = await writer.write(build_view(list_objects(cluster, NS), READY))
    assert r.written == [("ModelRoute", NS, "a-old")]
    c = _conds(_get(cluster, "ModelRoute", "a-old"))
    assert (c["Accepted"]["status"], c["Accepted"]["reason"]) == ("True", "Accepted")
    assert c["Accepted"]["lastTransitionTime"] == clock.now.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert c["ResolvedRefs"]["status"] == "True"


async def test_background_writer_ends_at_the_latest_view(
        cluster: k8s_harness.ControlPlane, writer_parts: tuple[StatusWriter, Clock]) -> None:
    writer, _ = writer_parts
    task = asyncio.create_task(writer.run())
    try:
        for n in (11, 12, 13):
            writer.update(build_view(list_objects(cluster, NS), {**READY, (NS, "srv"): {"all": n}}))
        for _ in range(200):
            if _get(cluster, "ModelServer", "srv")["status"].get("readyEndpoints") == 13:
                break
            await asyncio.sleep(0.05)
        assert _get(cluster, "ModelServer", "srv")["status"]["readyEndpoints"] == 13
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_crd_without_our_status_fields_is_reported_not_rewritten(
        cluster: k8s_harness.ControlPlane, writer_parts: tuple[StatusWriter, Clock]) -> None:
    """Kthena's own ModelRoute CRD has an empty status schema: the apiserver would prune our
    conditions. The writer notices (Strict field validation), stops writing that kind and
    keeps writing the others."""
    writer, _ = writer_parts
    kthena_crds.install(cluster, [kthena_crds.crd("ModelRoute", kthena_crds.kthena_shaped_status())])
    try:
        for _ in range(2):  # the second pass does not try again
            r = await writer.write(build_view(list_objects(cluster, NS), {**READY, (NS, "srv"): {"all": 21}}))
            assert set(writer.unsupported_kinds) == {"ModelRoute"}, r
            assert not r.errors and not [k for k in r.written if k[0] == "ModelRoute"]
            assert {k for k in r.skipped if k[0] == "ModelRoute"} == {
                ("ModelRoute", NS, n) for n in ("a-old", "b-new", "missing", "bad")}
        assert _get(cluster, "ModelServer", "srv")["status"]["readyEndpoints"] == 21
    finally:
        kthena_crds.install(cluster)
