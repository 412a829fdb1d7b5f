"""Which Events a plan means for its role replicas: Creating and Deleting from what is created
and deleted, Running once per transition (a replica with a pod not ready, or with a missing
worker, is not running; one that comes back is running again)."""

from __future__ import annotations

from typing import Any

from controller.planner import plan
from controller.role_events import RoleEvents
from test_controller_planner import PD, created, ms

KEY = ("ns1", "llm")


def _reasons(events: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    return [(reason, message.split(" in ServingGroup ")[0].removeprefix("Role ")
             + " @" + message.split(" in ServingGroup ")[1].split(" ")[0]) for _, reason, message in events]


def test_creating_then_running_once_per_transition() -> None:
    m = ms(1, PD)
    re = RoleEvents()
    p = plan(m, [], [], {})
    ev = re.step(KEY, p, p.create_pods, [])
    assert _reasons(ev) == [("RoleCreating", "decode/decode-0 @llm-0"), ("RoleCreating", "prefill/prefill-0 @llm-0"),
                            ("RoleCreating", "prefill/prefill-1 @llm-0")]
    assert ev[0] == ("Normal", "RoleCreating", "Role decode/decode-0 in ServingGroup llm-0 is now Creating")
    # every pod but one decode worker ready: prefill replicas run, decode does not
    pods = [created(x, ready=x["metadata"]["name"] != "llm-0-decode-0-2") for x in p.create_pods]
    ev = re.step(KEY, plan(m, pods, [], {}), [], [])
    assert _reasons(ev) == [("RoleRunning", "prefill/prefill-0 @llm-0"), ("RoleRunning", "prefill/prefill-1 @llm-0")]
    assert re.step(KEY, plan(m, pods, [], {}), [], []) == []  # level: nothing new
    pods = [created(x, ready=True) for x in p.create_pods]
    assert _reasons(re.step(KEY, plan(m, pods, [], {}), [], [])) == [("RoleRunning", "decode/decode-0 @llm-0")]
    # a worker gone (not ready or deleted): no longer running; back: Running again
    missing = [x for x in pods if x["metadata"]["name"] != "llm-0-decode-0-1"]
    p2 = plan(m, missing, [], {})
    assert _reasons(re.step(KEY, p2, p2.create_pods, [])) == [("RoleCreating", "decode/decode-0 @llm-0")]
    assert _reasons(re.step(KEY, plan(m, pods, [], {}), [], [])) == [("RoleRunning", "decode/decode-0 @llm-0")]


def test_deleting_on_scale_down_and_forget() -> None:
    re = RoleEvents()
    first = plan(ms(2, PD), [], [], {})
    pods: list[dict[str, Any]] = [created(x, ready=True) for x in first.create_pods]
    re.step(KEY, plan(ms(2, PD), pods, [], {}), [], [])
    down = plan(ms(1, PD), pods, [], {})
    ev = re.step(KEY, down, [], down.delete_pods)
    assert _reasons(ev) == [("RoleDeleting", "decode/decode-0 @llm-1"), ("RoleDeleting", "prefill/prefill-0 @llm-1"),
                            ("RoleDeleting", "prefill/prefill-1 @llm-1")]
    re.forget(KEY)
    running = re.step(KEY, plan(ms(1, PD), [x for x in pods if "-llm-1-" not in x["metadata"]["name"]
                                             and not x["metadata"]["name"].startswith("llm-1-")], [], {}), [], [])
    assert len(running) == 3 and {r for _, r, _ in running} == {"RoleRunning"}  # forgotten: seen afresh
