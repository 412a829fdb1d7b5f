"""The router in Kubernetes mode against the real apiserver (cluster-wide watch, admin
credentials): routes and servers from CRs, endpoints from pods whose status the test writes
(pod IPs 127.0.0.x, one simulator each, all on the same workloadPort), weight changes under
load, bad edits and conflicting routes, graceful pod removal, an apiserver restart."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import harness
import k8s_harness
from kube_crds import install_crds
from kube_router_env import Cluster, endpoints, eventually, metric, route, server, start_engine, start_kube_router, \
    wait_model

NS = "kube-router-main"
IPS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


@pytest.fixture(scope="module")
def env(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    install_crds(control_plane)
    log_dir = tmp_path_factory.mktemp("kube-router")
    cluster = Cluster(control_plane, NS)
    cluster.create_namespace()
    port = harness.free_port()
    sims = [start_engine(ip, port, log_dir, itl_ms=20) for ip in IPS]
    router = None
    try:
        router = start_kube_router(log_dir, control_plane.kubeconfig)
        yield {"cluster": cluster, "router": router, "sims": sims, "port": port, "log_dir": log_dir}
    finally:
        if router is not None:
            router.stop()
        for s in sims:
            s.stop()
        cluster.delete_namespace()
        cluster.close()


def _chat(client: Any, model: str) -> str:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    return r.choices[0].message.content


def test_routes_servers_and_pods_serve_requests(env: dict[str, Any]) -> None:
    c: Cluster = env["cluster"]
    router: harness.Router = env["router"]
    port = env["port"]
    c.create(server("pool", {"app": "pool"}, port, NS))
    c.create(route("pool", "pool-model", [("pool", None)], NS))
    c.pod("pool-0", IPS[0], {"app": "pool"})
    c.pod("pool-1", IPS[1], {"app": "pool"})
    c.pod("pool-unready", IPS[2], {"app": "pool"}, ready=False)
    wait_model(router, "pool-model")
    sims = env["sims"]
    for s in sims:
        s.reset_requests()
    eventually(lambda: endpoints(router, "pool") == {IPS[0], IPS[1]}, what="both ready pods in the config")
    client = router.openai()
    for _ in range(8):
        assert _chat(client, "pool-model")
    got = [s.received()[0] for s in sims]
    assert got[0] == 4 and got[1] == 4 and got[2] == 0, got  # round robin over the two ready pods
    assert router.readyz().status_code == 200
    assert metric(router, "kthena_router_kube_synced") == 1


def test_weight_change_under_load_fails_no_request(env: dict[str, Any]) -> None:
    c: Cluster = env["cluster"]
    router: harness.Router = env["router"]
    port = env["port"]
    sims = env["sims"]
    c.create(server("wa", {"app": "wa"}, port, NS))
    c.create(server("wb", {"app": "wb"}, port, NS))
    c.create(route("canary", "canary", [("wa", 100), ("wb", 0)], NS))
    c.pod("wa-0", IPS[0], {"app": "wa"})
    c.pod("wb-0", IPS[1], {"app": "wb"})
    wait_model(router, "canary")
    eventually(lambda: endpoints(router, "wb") == {IPS[1]}, what="wb's pod")
    errors: list[BaseException] = []
    done = [0]
    stop = threading.Event()

    def load() -> None:
        client = router.openai()
        while not stop.is_set():
            try:
                stream = client.chat.completions.create(model="canary", messages=[{"role": "user", "content": "x"}],
                                                        max_tokens=5, stream=True)
                text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
                assert text
                done[0] += 1
            except BaseException as exc:  # noqa: BLE001 - every failure counts
                errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        eventually(lambda: done[0] >= 10, what="load running")
        for s in sims:
            s.reset_requests()
        c.patch("ModelRoute", "canary", {"spec": {"rules": [{"name": "default", "targetModels": [
            {"modelServerName": "wa", "weight": 0}, {"modelServerName": "wb", "weight": 100}]}]}})
        # eventually every new request goes to wb
        def moved() -> bool:
            a0 = sims[0].received()[0]
            b0 = sims[1].received()[0]
            n = done[0]
            eventually(lambda: done[0] >= n + 6, what="more requests")
            return sims[0].received()[0] == a0 and sims[1].received()[0] > b0
        eventually(moved, 30, what="traffic moved to wb")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors[:3]


def test_bad_edit_keeps_last_good_and_conflicting_routes_oldest_wins(env: dict[str, Any]) -> None:
    c: Cluster = env["cluster"]
    router: harness.Router = env["router"]
    port = env["port"]
    sims = env["sims"]
    c.create(server("keep", {"app": "keep"}, port, NS))
    c.create(route("keep", "keep", [("keep", None)], NS))
    c.pod("keep-0", IPS[2], {"app": "keep"})
    wait_model(router, "keep")
    client = router.openai()
    eventually(lambda: bool(_try(client, "keep")), what="keep served")
    # a bad edit the CRD lets through but the router refuses (kvConnector on an SGLang server:
    # it would have no effect) -> the last good version stays, the problem is reported
    c.patch("ModelServer", "keep", {"spec": {"inferenceEngine": "SGLang", "kvConnector": {"type": "nixl"}}})
    eventually(lambda: metric(router, "kthena_router_kube_invalid_objects", kind="ModelServer") >= 1,
               what="invalid ModelServer counted")
    assert "invalid ModelServer kube-router-main/keep" in router.process.stderr()
    assert "spec.kvConnector" in router.process.stderr()
    # a brand-new invalid object is left out, the others keep working
    c.create(route("broken", "broken", [("does-not-exist", None)], NS))
    eventually(lambda: metric(router, "kthena_router_kube_invalid_objects", kind="ModelRoute") >= 1,
               what="invalid ModelRoute counted")
    sims[2].reset_requests()
    assert _chat(client, "keep")
    assert sims[2].received()[0] == 1
    assert router.readyz().status_code == 200
    # conflicting routes: a newer route claiming "keep" does not take it over (oldest wins)
    c.create(server("usurper", {"app": "usurper"}, port, NS))
    c.pod("usurper-0", IPS[0], {"app": "usurper"})
    c.create(route("usurper", "keep", [("usurper", None)], NS))
    eventually(lambda: endpoints(router, "usurper") == {IPS[0]}
               and '"usurper"' in router.admin_get("/debug/config_dump").text, what="usurper route applied")
    for s in sims:
        s.reset_requests()
    for _ in range(4):
        assert _chat(client, "keep")
    assert sims[2].received()[0] == 4 and sims[0].received()[0] == 0
    # repaired: valid again
    c.patch("ModelServer", "keep", {"spec": {"inferenceEngine": "vLLM", "kvConnector": None}})
    c.delete("ModelRoute", "broken")
    eventually(lambda: metric(router, "kthena_router_kube_invalid_objects", kind="ModelServer") == 0
               and metric(router, "kthena_router_kube_invalid_objects", kind="ModelRoute") == 0, what="valid again")


def _try(client: Any, model: str) -> str | None:
    try:
        return _chat(client, model)
    except Exception:
        return None


def test_terminating_pod_drains_and_stopped_engine_ends_open_streams(env: dict[str, Any]) -> None:
    c: Cluster = env["cluster"]
    router: harness.Router = env["router"]
    port = env["port"]
    sims = env["sims"]
    c.create(server("drain", {"app": "drain"}, port, NS))
    c.create(route("drain", "drain", [("drain", None)], NS))
    c.pod("drain-a", IPS[0], {"app": "drain"})
    wait_model(router, "drain")
    client = router.openai()
    eventually(lambda: bool(_try(client, "drain")), what="drain served")
    results: dict[str, Any] = {}

    def stream(name: str, max_tokens: int) -> None:
        chunks, finish = [], None
        try:
            s = client.chat.completions.create(model="drain", messages=[{"role": "user", "content": name}],
                                               max_tokens=max_tokens, stream=True)
            for ch in s:
                if ch.choices:
                    chunks.append(ch.choices[0].delta.content or "")
                    finish = ch.choices[0].finish_reason or finish
            results[name] = ("ok", len(chunks), finish)
        except Exception as exc:  # the SDK raises on an SSE error event
            results[name] = ("error", len(chunks), repr(exc))

    sims[0].reset_requests()
    # medium: ~3 s at 20 ms per token; long: ~60 s
    threads = {n: threading.Thread(target=stream, args=(n, t)) for n, t in (("medium", 150), ("long", 3000))}
    for t in threads.values():
        t.start()
    eventually(lambda: sims[0].received()[0] == 2, what="both streams on drain-a")
    c.pod("drain-b", IPS[1], {"app": "drain"})
    c.delete_pod("drain-a", grace=60)  # Terminating: stays until deleted with grace 0
    eventually(lambda: endpoints(router, "drain") == {IPS[1]}, what="drain-a replaced by drain-b")
    sims[0].reset_requests()
    sims[1].reset_requests()
    for _ in range(4):
        assert _chat(client, "drain")
    assert sims[0].received()[0] == 0 and sims[1].received()[0] == 4  # no new request to the Terminating pod
    threads["medium"].join(30)
    assert results["medium"][0] == "ok" and results["medium"][2] == "length", results  # finished normally
    assert threads["long"].is_alive()
    # the engine goes away (killed: a SIGTERM'd simulator would end its streams with finish_reason
    # "abort" as vLLM does): only the stream still open ends, with an error event
    sims[0].stop(signal.SIGKILL)
    c.delete_pod("drain-a", grace=0)
    threads["long"].join(30)
    assert results["long"][0] == "error" and results["long"][1] > 0, results
    assert _chat(client, "drain")
    env["sims"][0] = start_engine(IPS[0], port, env["log_dir"], itl_ms=20)  # for later tests


def test_apiserver_restart_keeps_serving_and_resumes(env: dict[str, Any],
                                                     control_plane: k8s_harness.ControlPlane) -> None:
    c: Cluster = env["cluster"]
    router: harness.Router = env["router"]
    port = env["port"]
    c.create(server("steady", {"app": "steady"}, port, NS))
    c.create(route("steady", "steady", [("steady", None)], NS))
    c.pod("steady-0", IPS[1], {"app": "steady"})
    wait_model(router, "steady")
    client = router.openai()
    eventually(lambda: bool(_try(client, "steady")), what="steady served")
    control_plane.kill_apiserver()
    try:
        eventually(lambda: metric(router, "kthena_router_kube_watch_errors_total", reason="unavailable") > 0,
                   what="watch errors while the apiserver is down")
        for _ in range(5):  # the last state keeps serving
            assert _chat(client, "steady")
        assert router.readyz().status_code == 200
    finally:
        control_plane.restart_apiserver()
    c.api.close()
    c.api = control_plane.client()
    c.create(route("after", "after-restart", [("steady", None)], NS))
    wait_model(router, "after-restart", timeout=90)
    assert _chat(client, "after-restart")
    assert "steady" in {m.id for m in client.models.list().data}


def test_readyz_not_ready_before_the_first_sync(env: dict[str, Any], tmp_path: Path) -> None:
    """A router whose apiserver is unreachable is alive but not ready, and says why."""
    bad = tmp_path / "kubeconfig"
    dead = harness.free_port()
    bad.write_text(env["cluster"].cp.kubeconfig.read_text().replace(f":{env['cluster'].cp.port}", f":{dead}"))
    router = start_kube_router(tmp_path, bad, wait=False)
    try:
        eventually(lambda: _answers(router), 60, what="admin server up")
        r = router.readyz()
        assert r.status_code == 503
        assert "first Kubernetes sync" in r.json()["reason"]
        eventually(lambda: "unreachable" in router.readyz().json()["reason"], what="reason names the failure")
        assert router.admin_get("/healthz").status_code == 200
    finally:
        router.stop()


def _answers(router: harness.Router) -> bool:
    try:
        router.readyz()
        return True
    except Exception:
        return False
