"""Kubernetes Events on a ModelServing, on the real apiserver with the controller a real
process: Kthena's RoleCreating / RoleRunning / RoleDeleting with its message text, a repeat
of the same Event bumping its count instead of a new object, and a Warning when the
recovery policy recreates a role replica."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import harness
import k8s_harness
from controller_support import Api, controller_namespace, modelserving, template

NS = "controller-events"
ROLES = [{"name": "llm", "replicas": 1, "workerReplicas": 1, "entryTemplate": template("e:1"),
          "workerTemplate": template("w:1")}]


@pytest.fixture(scope="module")
def api(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    with controller_namespace(control_plane, NS, tmp_path_factory.mktemp("controller"), "ctl-events") as a:
        yield a


def _events(api: Api, ms: str) -> list[dict[str, Any]]:
    r = api.http.get(f"/api/v1/namespaces/{NS}/events",
                     params={"fieldSelector": f"involvedObject.kind=ModelServing,involvedObject.name={ms}"})
    r.raise_for_status()
    return r.json()["items"]


def _wait_event(api: Api, ms: str, reason: str, message: str, count: int = 1) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        hits = [e for e in _events(api, ms) if e["reason"] == reason and e["message"] == message]
        return hits[0] if len(hits) == 1 and hits[0].get("count", 1) >= count else None
    try:
        return harness.wait_until(found, 30, interval=0.1, what=f"{reason} {message!r} x{count}")
    except TimeoutError as exc:
        have = [(e["reason"], e["message"], e.get("count")) for e in _events(api, ms)]
        raise AssertionError(f"{exc}: have {have}") from None


def test_role_lifecycle_events(control_plane: k8s_harness.ControlPlane, api: Api) -> None:
    control_plane.apply([modelserving("ev", NS, 2, ROLES)])
    pods = api.wait_pods("ev", {f"ev-{g}-llm-0-{k}" for g in (0, 1) for k in (0, 1)})
    for g in (0, 1):
        e = _wait_event(api, "ev", "RoleCreating", f"Role llm/llm-0 in ServingGroup ev-{g} is now Creating")
        assert e["type"] == "Normal" and e["source"]["component"] == "kthena-controller"
        assert e["involvedObject"]["uid"] == api.ms("ev")["metadata"]["uid"]
    running = "Role llm/llm-0 in ServingGroup ev-0 is now Running"
    api.set_ready("ev-0-llm-0-0")
    api.wait_status("ev", availableReplicas=0)
    assert not [e for e in _events(api, "ev") if e["reason"] == "RoleRunning"]  # one of its two pods only
    api.set_ready("ev-0-llm-0-1")
    first = _wait_event(api, "ev", "RoleRunning", running)
    # not ready and back: the same Event again, counted on the object already written
    api.set_ready("ev-0-llm-0-1", ready=False)
    api.wait_status("ev", availableReplicas=0)
    api.set_ready("ev-0-llm-0-1")
    again = _wait_event(api, "ev", "RoleRunning", running, count=2)
    assert again["metadata"]["name"] == first["metadata"]["name"]
    # scale down: the surplus group's role replica is deleted
    control_plane.kubectl("scale", "-n", NS, "modelserving/ev", "--replicas=1")
    api.wait_pods("ev", {"ev-0-llm-0-0", "ev-0-llm-0-1"})
    _wait_event(api, "ev", "RoleDeleting", "Role llm/llm-0 in ServingGroup ev-1 is now Deleting")
    assert set(pods) >= {"ev-1-llm-0-0"}


def test_recovery_recreate_is_a_warning(control_plane: k8s_harness.ControlPlane, api: Api) -> None:
    control_plane.apply([modelserving("rec", NS, 1, ROLES)])
    api.wait_pods("rec", {"rec-0-llm-0-0", "rec-0-llm-0-1"})
    for k in (0, 1):
        api.set_ready(f"rec-0-llm-0-{k}")
    _wait_event(api, "rec", "RoleRunning", "Role llm/llm-0 in ServingGroup rec-0 is now Running")
    old = api.pods("rec")["rec-0-llm-0-1"]["metadata"]["uid"]
    r = api.http.patch(f"/api/v1/namespaces/{NS}/pods/rec-0-llm-0-1/status", json={"status": {"phase": "Failed"}},
                       headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text

    def warned() -> list[dict[str, Any]] | None:
        hits = [e for e in _events(api, "rec") if e["reason"] == "Recreating"]
        return hits or None
    [w] = harness.wait_until(warned, 30, interval=0.1, what="a Recreating warning")
    assert w["type"] == "Warning" and "llm-0" in w["message"], w
    _wait_event(api, "rec", "RoleDeleting", "Role llm/llm-0 in ServingGroup rec-0 is now Deleting")
    harness.wait_until(lambda: (p := api.pods("rec").get("rec-0-llm-0-1")) is not None
                       and p["metadata"]["uid"] != old, 30, what="the pod recreated")
