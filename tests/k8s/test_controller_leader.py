"""Two controller processes share the Lease: the second does nothing while the first holds it
(even when the first is frozen, until the Lease expires), then takes over and reconciles; the
first, thawed, finds its Lease taken and exits without acting.

The order is checked from the cluster, not from sleeps: a watch records every version of the
Lease (holderIdentity, acquireTime, renewTime) and every pod write, ordered by resourceVersion
(one etcd: its global revision). Every pod write lies in the tenure of the replica that made
it (counted by each replica's kthena_controller_api_writes_total), the second replica's first
write comes after the Lease version that made it the holder, and its acquireTime is at least
leaseDurationSeconds after the first holder's last renewTime."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

import harness
import k8s_harness
from controller_support import Api, Watch, controller_metric, modelserving, start_controller, template
from k8s_crds import install_crds

NS = "controller-leader"
LEASE = "lease.kthena.controller-manager"
ROLES = [{"name": "web", "replicas": 1, "workerReplicas": 0, "entryTemplate": template("w:1")}]
TIMING = (6.0, 4.0, 0.3)  # duration, renew deadline, retry period
WRITES = "kthena_controller_api_writes_total"


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


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _pod_writes(port: int) -> float:
    return controller_metric(port, WRITES, resource="pods")


def _tenures(lease: Watch) -> list[tuple[str, int, dict[str, Any]]]:
    """(holder, resourceVersion of the version that made it the holder, that spec), in order;
    releases (an empty holder) end a tenure."""
    out: list[tuple[str, int, dict[str, Any]]] = []
    for _, rv, obj in lease.events:
        spec = obj["spec"]
        holder = spec.get("holderIdentity") or ""
        if not out or out[-1][0] != holder:
            out.append((holder, rv, spec))
    return out


def test_second_replica_waits_for_the_lease(api: Api, tmp_path_factory: pytest.TempPathFactory) -> None:
    logs = tmp_path_factory.mktemp("leader")
    lease_w = Watch(api.cp, f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases")
    pods_w = Watch(api.cp, f"/api/v1/namespaces/{NS}/pods")
    port_a, port_b = harness.free_ports(2)
    a = start_controller(api.cp, NS, logs, "ctl-a", TIMING, port=port_a)
    b = None
    try:
        harness.wait_until(lambda: _holder(api) == "ctl-a", 30, what="ctl-a holds the Lease")
        b = start_controller(api.cp, NS, logs, "ctl-b", TIMING, port=port_b)
        harness.wait_until(lambda: "waiting for the Lease" in b.stderr(), 30, what="ctl-b waiting")
        api.cp.apply([modelserving("web", NS, 1, ROLES)])
        api.wait_pods("web", {"web-0-web-0-0"})
        api.wait_status("web", replicas=1)
        assert "starting" not in b.stderr() and _holder(api) == "ctl-a"
        # the standby is ready (synced caches, a warm spare) but neither leads nor writes
        harness.wait_until(lambda: httpx.get(f"http://{harness.HOST}:{port_b}/readyz", timeout=5).status_code
                           == 200, 30, what="ctl-b ready as a standby")
        assert httpx.get(f"http://{harness.HOST}:{port_b}/readyz", timeout=5).text.startswith("standby")
        assert controller_metric(port_b, "kthena_controller_leader") == 0
        assert controller_metric(port_b, WRITES) == 0
        assert controller_metric(port_a, "kthena_controller_leader") == 1
        writes_a = _pod_writes(port_a)
        assert writes_a == 1

        # Freeze the leader: it holds the Lease but cannot act; ctl-b must not act either.
        a.send_signal(signal.SIGSTOP)
        api.cp.kubectl("scale", "-n", NS, "modelserving/web", "--replicas=2")
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            holder = _holder(api)
            pods = set(api.pods("web"))
            if holder != "ctl-a":
                break  # the Lease expired already (a slow machine): the checks below still hold
            assert pods == {"web-0-web-0-0"}, "a replica acted without holding the Lease"
            assert controller_metric(port_b, WRITES) == 0
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
        writes_b = _pod_writes(port_b)
        harness.wait_until(lambda: sum(1 for t, _, _ in pods_w.events if t != "MODIFIED") == writes_a + writes_b,
                           30, what="the watch saw every pod write")
    finally:
        if a.alive():
            a.send_signal(signal.SIGCONT)
        a.stop()
        if b is not None:
            b.stop()
        lease_w.close()
        pods_w.close()

    # --- the order, from the Lease's versions and the pod writes' resourceVersions ---------
    tenures = [t for t in _tenures(lease_w) if t[0]]
    assert [h for h, _, _ in tenures] == ["ctl-a", "ctl-b"], _tenures(lease_w)
    (_, rv_a, spec_a), (_, rv_b, spec_b) = tenures
    assert spec_b["leaseTransitions"] == spec_a.get("leaseTransitions", 0) + 1
    last_a_renew = max(_time(obj["spec"]["renewTime"]) for _, rv, obj in lease_w.events
                       if rv < rv_b and obj["spec"].get("holderIdentity") == "ctl-a")
    # ctl-b waited a full lease duration after the last renewal it could have seen
    assert (_time(spec_b["acquireTime"]) - last_a_renew).total_seconds() >= spec_a["leaseDurationSeconds"]
    writes = [(rv, t, obj["metadata"]["name"]) for t, rv, obj in pods_w.events if t in ("ADDED", "DELETED")]
    first_a = [w for w in writes if rv_a < w[0] < rv_b]
    after_b = [w for w in writes if w[0] > rv_b]
    assert not [w for w in writes if w[0] < rv_a], "a pod write before anyone held the Lease"
    assert len(first_a) == writes_a and len(after_b) == writes_b, (writes, rv_a, rv_b)
    assert [t for _, t, _ in after_b] == ["ADDED", "DELETED"] and after_b[0][2] == "web-1-web-0-0"
