"""Kubernetes mode's pure part: watched objects -> file mode's documents -> RouterConfig,
per-object validation with the last good version kept (kthena_router.kube.assemble)."""

from __future__ import annotations

from typing import Any

from kthena_router.config.loader import load_config_bytes
from kthena_router.kube.assemble import BOOTSTRAP_PORT_ANNOTATION, Assembler, Snapshot, pod_ready, trim_object, \
    trim_pod

API = "networking.serving.volcano.sh/v1alpha1"


def cr(kind: str, name: str, spec: dict[str, Any], *, ns: str = "t", ts: str = "2026-01-01T00:00:00Z",
       gen: int = 1) -> dict[str, Any]:
    return trim_object({"apiVersion": API, "kind": kind, "metadata": {
        "name": name, "namespace": ns, "uid": f"uid-{name}", "generation": gen, "resourceVersion": "7",
        "creationTimestamp": ts, "managedFields": [{"manager": "x"}]}, "spec": spec, "status": {"x": 1}})


def route(name: str, model: str, targets: list[tuple[str, int]], **kw: Any) -> dict[str, Any]:
    return cr("ModelRoute", name, {"modelName": model, "rules": [
        {"name": "r", "targetModels": [{"modelServerName": s, "weight": w} for s, w in targets]}]}, **kw)


def server(name: str, labels: dict[str, str], port: int = 8000, gen: int = 1, **spec: Any) -> dict[str, Any]:
    return cr("ModelServer", name, {"model": "m", "inferenceEngine": spec.pop("engine", "vLLM"),
                                    "workloadSelector": {"matchLabels": labels, **spec},
                                    "workloadPort": {"port": port}}, gen=gen)


def pod(name: str, ip: str, labels: dict[str, str], *, ready: bool = True, terminating: bool = False,
        ns: str = "t", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels, "annotations": annotations or {}}
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return trim_pod({"metadata": meta, "status": {"phase": "Running", "podIP": ip, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}})


def snap(*objs: dict[str, Any], pods: tuple[dict[str, Any], ...] = ()) -> Snapshot:
    by_kind: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
    for o in objs:
        by_kind.setdefault(o["kind"], {})[(o["metadata"]["namespace"], o["metadata"]["name"])] = o
    return Snapshot(by_kind, {}, {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods})


def test_pod_readiness() -> None:
    assert pod("a", "10.0.0.1", {})["ready"]
    assert not pod("a", "10.0.0.1", {}, ready=False)["ready"]
    assert not pod("a", "10.0.0.1", {}, terminating=True)["ready"]
    assert not pod_ready({"status": {"phase": "Pending", "podIP": "10.0.0.1",
                                     "conditions": [{"type": "Ready", "status": "True"}]}})


def test_endpoints_from_ready_selected_pods_and_same_config_as_the_rendered_file() -> None:
    a = Assembler()
    pods = (pod("p1", "10.0.0.1", {"app": "a"}), pod("p2", "10.0.0.2", {"app": "a"}, ready=False),
            pod("p3", "10.0.0.3", {"app": "a"}, terminating=True), pod("p4", "10.0.0.4", {"app": "other"}),
            pod("p5", "10.0.0.5", {"app": "a"}, ns="elsewhere"))
    asm = a.assemble(snap(route("r", "m", [("s", 1)]), server("s", {"app": "a"}, port=9000), pods=pods))
    cfg = asm.view.config
    s = cfg.servers[("t", "s")]
    assert [(e.address, e.port) for e in cfg.endpoints_of(s)] == [("10.0.0.1", 9000)]
    assert asm.view.ready_endpoints == {("t", "s"): {"all": 1}}
    assert not asm.view.problems
    assert asm.view.objects[("ModelServer", "t", "s")].uid == "uid-s"
    assert asm.view.objects[("ModelRoute", "t", "r")].generation == 1
    # the workers load the rendered text: the same config, the same digest
    loaded = load_config_bytes(asm.text, source="file")
    assert loaded.digest == cfg.digest
    assert loaded.endpoints_of(loaded.servers[("t", "s")]) == cfg.endpoints_of(s)
    assert b"managedFields" not in asm.text and b"uid-" not in asm.text


def test_pd_labels_and_bootstrap_annotation() -> None:
    pg = {"pdGroup": {"groupKey": "g", "prefillLabels": {"role": "prefill"}, "decodeLabels": {"role": "decode"}}}
    pods = (pod("pre", "10.0.0.1", {"app": "pd", "role": "prefill", "g": "1"},
                annotations={BOOTSTRAP_PORT_ANNOTATION: "9100"}),
            pod("dec", "10.0.0.2", {"app": "pd", "role": "decode", "g": "1"}),
            pod("bad", "10.0.0.3", {"app": "pd", "role": "prefill", "g": "1"},
                annotations={BOOTSTRAP_PORT_ANNOTATION: "nope"}))
    asm = Assembler().assemble(snap(route("r", "m", [("pd", 1)]), server("pd", {"app": "pd"}, engine="SGLang", **pg),
                                    pods=pods))
    eps = {e.address: e for e in asm.view.config.endpoints_of(asm.view.config.servers[("t", "pd")])}
    assert eps["10.0.0.1"].bootstrap_port == 9100 and eps["10.0.0.1"].labels["role"] == "prefill"
    assert eps["10.0.0.3"].bootstrap_port is None
    assert asm.view.ready_endpoints[("t", "pd")] == {"all": 3, "prefill": 2, "decode": 1}
    assert len(asm.pod_problems) == 1 and "Pod t/bad" in asm.pod_problems[0]


def test_invalid_object_is_left_out_and_the_others_stay() -> None:
    asm = Assembler().assemble(snap(route("good", "m", [("s", 1)]), server("s", {"app": "a"}),
                                    server("broken", {"app": "b"}, port=70000)))
    assert set(asm.view.config.servers) == {("t", "s")}
    assert [r.name for r in asm.view.config.routes] == ["good"]
    msg = asm.view.problems[("ModelServer", "t", "broken")]
    assert "spec.workloadPort.port" in msg
    assert ("ModelServer", "t", "broken") in asm.view.objects


def test_bad_edit_keeps_the_last_good_version_then_recovers() -> None:
    a = Assembler()
    a.assemble(snap(route("r", "m", [("s", 1)]), server("s", {"app": "a"}, port=8000)))
    bad = server("s", {"app": "a"}, port=0, gen=2)
    asm = a.assemble(snap(route("r", "m", [("s", 1)]), bad))
    assert asm.view.config.servers[("t", "s")].port == 8000  # last good version served
    assert "spec.workloadPort.port" in asm.view.problems[("ModelServer", "t", "s")]
    assert asm.view.objects[("ModelServer", "t", "s")].generation == 2  # status names the new generation
    asm = a.assemble(snap(route("r", "m", [("s", 1)]), server("s", {"app": "a"}, port=8100, gen=3)))
    assert asm.view.config.servers[("t", "s")].port == 8100 and not asm.view.problems


def test_route_to_a_missing_server_is_reported_and_deleted_objects_are_forgotten() -> None:
    a = Assembler()
    asm = a.assemble(snap(route("r", "m", [("s", 1)]), route("orphan", "x", [("nope", 1)]), server("s", {})))
    assert "not found" in asm.view.problems[("ModelRoute", "t", "orphan")]
    assert [r.name for r in asm.view.config.routes] == ["r"]
    # the server goes: its route is refused (its last good version too), nothing else breaks
    asm = a.assemble(snap(route("r", "m", [("s", 1)])))
    assert not asm.view.config.routes and ("ModelRoute", "t", "r") in asm.view.problems
    assert ("ModelServer", "t", "s") not in a.last_good


def test_conflicting_routes_oldest_wins_order() -> None:
    asm = Assembler().assemble(snap(route("young", "m", [("s", 1)], ts="2026-02-01T00:00:00Z"),
                                    route("old", "m", [("s", 1)], ts="2025-01-01T00:00:00Z"), server("s", {})))
    assert any("tried in this order: t/old, t/young" in w for w in asm.view.config.warnings)


def test_problem_details_give_the_status_its_reasons() -> None:
    from kthena_router.config.errors import BACKEND_NOT_FOUND
    from kthena_router.kube.status import desired_statuses

    a = Assembler()
    asm = a.assemble(snap(route("r", "m", [("s", 1)]), route("orphan", "x", [("nope", 1)]), server("s", {}),
                          server("broken", {"app": "b"}, port=70000)))
    orphan = ("ModelRoute", "t", "orphan")
    assert [p.reason for p in asm.view.problem_details[orphan]] == [BACKEND_NOT_FOUND]
    assert [p.field for p in asm.view.problem_details[("ModelServer", "t", "broken")]] == ["spec.workloadPort.port"]
    assert set(asm.view.problem_details) == set(asm.view.problems)
    st = desired_statuses(asm.view)
    conds = {c.type: c for c in st[orphan].conditions}
    assert (conds["Accepted"].status, conds["Accepted"].reason) == ("False", "UnresolvedRefs")
    assert (conds["ResolvedRefs"].status, conds["ResolvedRefs"].reason) == ("False", BACKEND_NOT_FOUND)
    assert "targetModels[0]" in conds["ResolvedRefs"].message
    # a bad edit of r while its server goes: its last good version is refused too (missing backend)
    bad = route("r", "m", [("s", -1)], gen=2)
    asm = a.assemble(snap(bad))
    details = asm.view.problem_details[("ModelRoute", "t", "r")]
    assert any(p.reason == BACKEND_NOT_FOUND and "last good version is refused too" in p.message for p in details)
    assert any(p.reason != BACKEND_NOT_FOUND for p in details)  # the edit's own problem
