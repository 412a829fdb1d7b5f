"""Expectations overlay the controller's unseen writes on a stale cache; and the dependency
rule: kthena_router never imports the controller."""

from __future__ import annotations

import ast
from pathlib import Path

from controller.expectations import Expectations
from controller.planner import plan
from controller.revision import serving_revision

KEY = ("ns1", "web")
# the revision of the ModelServing below (pods at another revision would be rolled)
REVISION = serving_revision([{"name": "web", "replicas": 1, "workerReplicas": 0,
                              "entryTemplate": {"spec": {"containers": []}}}])


def pod(name: str, uid: str, group: str = "web-0") -> dict:
    return {"metadata": {"name": name, "uid": uid, "labels": {"modelserving.volcano.sh/group-name": group,
                                                              "modelserving.volcano.sh/role": "web",
                                                              "modelserving.volcano.sh/role-id": "web-0",
                                                              "modelserving.volcano.sh/revision": REVISION}},
            "status": {"phase": "Pending"}}


def test_unseen_deletes_and_creates_are_overlaid_until_the_cache_agrees() -> None:
    t = [0.0]
    e = Expectations(ttl=10, clock=lambda: t[0])
    cache = [pod("web-0-web-0-0", "u0", "web-0"), pod("web-1-web-0-0", "u1", "web-1"), pod("web-2-web-0-0", "u2", "web-2")]
    e.deleted(KEY, "pods", "u2")
    new = pod("web-3-web-0-0", "u3", "web-3")
    e.created(KEY, "pods", new)
    seen = e.overlay(KEY, "pods", cache)
    assert [p["metadata"]["uid"] for p in seen] == ["u0", "u1", "u3"]
    # a stale cache does not make the planner delete a second group or recreate the new one
    ms = {"metadata": {"name": "web", "namespace": "ns1", "uid": "x"},
          "spec": {"replicas": 3, "template": {"roles": [{"name": "web", "replicas": 1, "workerReplicas": 0,
                                                          "entryTemplate": {"spec": {"containers": []}}}]}}}
    p = plan(ms, seen, [])
    assert p.delete_pods == [] and p.create_pods == []
    # the cache catches up: expectations are dropped
    cache = cache[:2] + [new]
    assert e.overlay(KEY, "pods", cache) == cache and e.pending(KEY) == 0


def test_expectations_expire() -> None:
    t = [0.0]
    e = Expectations(ttl=10, clock=lambda: t[0])
    e.deleted(KEY, "pods", "u0")
    e.created(KEY, "pods", pod("web-1-web-0-0", "u1"))
    cache = [pod("web-0-web-0-0", "u0")]
    assert e.overlay(KEY, "pods", cache) != cache
    t[0] = 11
    assert e.overlay(KEY, "pods", cache) == cache and e.pending(KEY) == 0


def test_router_never_imports_the_controller() -> None:
    root = Path(__file__).resolve().parents[2] / "kthena_router"
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            assert not any(n == "controller" or n.startswith("controller.") for n in names), path


def test_a_created_object_seen_by_an_event_is_not_overlaid_after_a_foreign_delete() -> None:
    """Created, seen by the watch (ADDED), deleted by someone else (DELETED), all before the
    next reconcile: that reconcile must see it missing, not overlaid as present for the ttl."""
    from controller.expectations import Expectations
    e = Expectations(ttl=300.0, clock=lambda: 0.0)
    owner = ("ns", "ms")
    made = {"metadata": {"name": "p-0", "uid": "u1"}}
    e.created(owner, "pods", made)
    e.observe(owner, "pods", {"metadata": {"name": "p-0", "uid": "other"}})  # another incarnation
    assert [o["metadata"]["name"] for o in e.overlay(owner, "pods", [])] == ["p-0"]
    e.observe(owner, "pods", {"metadata": {"name": "p-0", "uid": "u1"}})
    assert e.overlay(owner, "pods", []) == []
