"""Leader election on a real apiserver: of two electors exactly one holds the Lease; the
other takes over when the first releases it or stops renewing (expiry); a replica whose
Lease is taken stops leading at once; a non-holder's status writer writes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import k8s_harness
import kthena_crds
from kthena_router.kube.leader import LeaderElector
from kthena_router.kube.status_writer import StatusWriter
from status_support import API, api_client, build_view, list_objects

NS = "leader-election-test"
TIMING = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.3}


@pytest.fixture(scope="module")
def cluster(control_plane: k8s_harness.ControlPlane) -> Iterator[k8s_harness.ControlPlane]:
    kthena_crds.install(control_plane)
    control_plane.kubectl("create", "namespace", NS)
    try:
        yield control_plane
    finally:
        control_plane.kubectl("delete", "namespace", NS, "--wait=false")


def _lease(cp: k8s_harness.ControlPlane, name: str) -> dict[str, Any]:
    with cp.client() as api:
        r = api.get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}")
        r.raise_for_status()
        return r.json()


async def _until(pred: Any, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _exactly_one_leader_for(a: LeaderElector, b: LeaderElector, seconds: float) -> LeaderElector:
    """Sample both for a while: never two leaders, and one of them leads at the end."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        assert not (a.is_leader and b.is_leader), "two leaders at once"
        await asyncio.sleep(0.02)
    assert a.is_leader != b.is_leader
    return a if a.is_leader else b


async def test_one_leader_release_and_expiry(cluster: k8s_harness.ControlPlane) -> None:
    ca, cb = await api_client(cluster), await api_client(cluster)
    events: list[str] = []
    a = LeaderElector(ca, NS, "router", "replica-a", **TIMING,
                      on_started_leading=lambda: events.append("a+"), on_stopped_leading=lambda: events.append("a-"))
    b = LeaderElector(cb, NS, "router", "replica-b", **TIMING,
                      on_started_leading=lambda: events.append("b+"), on_stopped_leading=lambda: events.append("b-"))
    try:
        a.start(), b.start()
        await _until(lambda: a.is_leader or b.is_leader, 20, "a leader")
        first = await _exactly_one_leader_for(a, b, 2.0)
        other = b if first is a else a
        assert _lease(cluster, "router")["spec"]["holderIdentity"] == first.identity

        # Release on shutdown: the other takes over (without waiting for expiry).
        await first.stop()
        assert not first.is_leader
        assert _lease(cluster, "router")["spec"]["holderIdentity"] in ("", other.identity)
        await _until(lambda: other.is_leader, 10, "takeover after release")
        lease = _lease(cluster, "router")
        assert lease["spec"]["holderIdentity"] == other.identity and lease["spec"]["leaseTransitions"] >= 0

        # A new replica joins and waits; the leader "crashes" (no release): expiry, then takeover.
        cc = await api_client(cluster)
        c = LeaderElector(cc, NS, "router", "replica-c", **TIMING)
        try:
            c.start()
            await _exactly_one_leader_for(other, c, 1.0)
            assert other.is_leader
            await other.stop(release=False)
            assert _lease(cluster, "router")["spec"]["holderIdentity"] == other.identity  # still recorded
            await _until(lambda: c.is_leader, 20, "takeover after expiry")
            lease = _lease(cluster, "router")
            assert lease["spec"]["holderIdentity"] == "replica-c"
        finally:
            await c.stop()
            await cc.close()
        assert _lease(cluster, "router")["spec"]["holderIdentity"] == ""  # released
        assert events.count("a+") + events.count("b+") == 2 and events.count("a-") + events.count("b-") == 2
    finally:
        await a.stop()
        await b.stop()
        await ca.close()
        await cb.close()


async def test_lease_taken_by_another_stops_leading_and_writing(cluster: k8s_harness.ControlPlane) -> None:
    cluster.apply([{"apiVersion": API, "kind": "ModelServer", "metadata": {"name": "srv", "namespace": NS},
                    "spec": {"model": "m", "inferenceEngine": "vLLM", "workloadSelector": {"matchLabels": {"a": "b"}},
                             "workloadPort": {"port": 8000}}}])
    ca, cb = await api_client(cluster), await api_client(cluster)
    a = LeaderElector(ca, NS, "writer", "replica-a", **TIMING)
    b = LeaderElector(cb, NS, "writer", "replica-b", **TIMING)
    wa = StatusWriter(ca, is_leader=lambda: a.is_leader)
    wb = StatusWriter(cb, is_leader=lambda: b.is_leader)
    try:
        a.start()
        await _until(lambda: a.is_leader, 20, "a leads")
        b.start()
        await asyncio.sleep(1.0)
        assert a.is_leader and not b.is_leader

        def rv() -> str:
            with cluster.client() as api:
                r = api.get(f"/apis/{API}/namespaces/{NS}/modelservers/srv")
                return str(r.json()["metadata"]["resourceVersion"])

        # the follower writes nothing, the leader writes
        before = rv()
        rb = await wb.write(build_view(list_objects(cluster, NS), {(NS, "srv"): {"all": 1}}))
        assert rb.written == [] and ("ModelServer", NS, "srv") in rb.skipped and rv() == before
        ra = await wa.write(build_view(list_objects(cluster, NS), {(NS, "srv"): {"all": 1}}))
        assert ra.written == [("ModelServer", NS, "srv")]

        # Someone else takes the Lease (by resourceVersion): a stops leading at its next renew.
        lease = _lease(cluster, "writer")
        lease["spec"]["holderIdentity"] = "intruder"
        with cluster.client() as api:
            r = api.put(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/writer", json=lease)
            assert r.status_code == 200, r.text
        await _until(lambda: not a.is_leader, 5, "a loses the Lease")
        before = rv()
        ra = await wa.write(build_view(list_objects(cluster, NS), {(NS, "srv"): {"all": 2}}))
        assert ra.written == [] and rv() == before
        # the intruder never renews: one of a, b takes over after expiry, and that one writes
        await _until(lambda: a.is_leader or b.is_leader, 20, "takeover of the intruder's Lease")
        leader_writer = wa if a.is_leader else wb
        r2 = await leader_writer.write(build_view(list_objects(cluster, NS), {(NS, "srv"): {"all": 2}}))
        assert r2.written == [("ModelServer", NS, "srv")]
    finally:
        await a.stop()
        await b.stop()
        await ca.close()
        await cb.close()


def test_timings_are_checked() -> None:
    with pytest.raises(ValueError):
        LeaderElector(None, NS, "x", "me", lease_duration=2, renew_deadline=3, retry_period=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LeaderElector(None, NS, "x", "", **TIMING)  # type: ignore[arg-type]
