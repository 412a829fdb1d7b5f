"""Two controller processes share the Lease: the second does nothing while the first holds it
(even when the first is frozen, until the Lease expires), then takes over and reconciles; the
first, thawed, finds its Lease taken and exits without acting."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

import harness
import k8s_harness
from controller_support import Api, modelserving, start_controller, template
from k8s_crds import install_crds

NS = "controller-leader"
LEASE = "lease.kthena.controller-manager"
ROLES = [{"name": "web", "replicas": 1, "workerReplicas": 0, "entryTemplate": template("w:1")}]
TIMING = (6.0, 4.0, 0.3)  # duration, renew deadline, retry period


@pytest.fixture(scope="module")
def api(control_plane: k8s_harness.ControlPlane) -> Iterator[Api]:
    install_crds(control_plane)
    control_plane.kubectl("create", "namespace", NS)
    a = Api(control_plane, NS)
    try:
        yield a
    finally:
        a.close()
        control_plane.kubectl("delete", "namespace", NS, "--wait=false")


def _holder(api: Api) -> str:
    r = api.http.get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{LEASE}")
    return r.json()["spec"].get("holderIdentity", "") if r.status_code == 200 else ""


def test_second_replica_waits_for_the_lease(api: Api, tmp_path_factory: pytest.TempPathFactory) -> None:
    logs = tmp_path_factory.mktemp("leader")
    a = start_controller(api.cp, NS, logs, "ctl-a", TIMING)
    b = None
    try:
        harness.wait_until(lambda: _holder(api) == "ctl-a", 30, what="ctl-a holds the Lease")
        b = start_controller(api.cp, NS, logs, "ctl-b", TIMING)
        harness.wait_until(lambda: "waiting for the Lease" in b.stderr(), 30, what="ctl-b waiting")
        api.cp.apply([modelserving("web", NS, 1, ROLES)])
        api.wait_pods("web", {"web-0-web-0-0"})
        assert "starting" not in b.stderr() and _holder(api) == "ctl-a"

        # Freeze the leader: it holds the Lease but cannot act; ctl-b must not act either.
        a.send_signal(signal.SIGSTOP)
        api.cp.kubectl("scale", "-n", NS, "modelserving/web", "--replicas=2")
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            holder = _holder(api)
            pods = set(api.pods("web"))
            if holder != "ctl-a":
                break  # the Lease expired already (a slow machine): the check below still holds
            assert pods == {"web-0-web-0-0"}, "a replica acted without holding the Lease"
            time.sleep(0.1)
        # After expiry ctl-b takes over and reconciles.
        harness.wait_until(lambda: _holder(api) == "ctl-b", 30, what="ctl-b takes the expired Lease")
        api.wait_pods("web", {"web-0-web-0-0", "web-1-web-0-0"})
        assert "starting 2 workers" in b.stderr()

        # The old leader, thawed, sees the Lease taken and exits (code 1) without acting.
        a.send_signal(signal.SIGCONT)
        assert a.wait(30) == 1, a.tail()
        assert "leader election lost" in a.stderr()
        api.cp.kubectl("scale", "-n", NS, "modelserving/web", "--replicas=1")
        api.wait_pods("web", {"web-0-web-0-0"})
        assert b.alive()
    finally:
        if a.alive():
            a.send_signal(signal.SIGCONT)
        a.stop()
        if b is not None:
            b.stop()
