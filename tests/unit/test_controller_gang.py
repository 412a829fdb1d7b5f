"""Volcano gang scheduling, the pure part (controller/gang.py, quantity.py, capabilities'
CRD check): the PodGroup of a ServingGroup for several role mixes, the merge patch that
brings one in line, the pods' annotations, resource quantities as Go prints them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controller import gang
from controller.capabilities import crd_capabilities
from controller.quantity import canonical, parse

UID = "11111111-2222-3333-4444-555555555555"


def container(name: str, **requests: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": f"{name}:1"}
    if requests:
        c["resources"] = {"requests": dict(requests), "limits": {"cpu": "64"}}
    return c


def tpl(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    return {"spec": spec}


def ms(roles: list[dict[str, Any]], *, annotations: dict[str, str] | None = None, scheduler: str | None = None,
       **template: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "llm", "namespace": "ns", "uid": UID, "generation": 3}
    if annotations:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"replicas": 2, "template": {"roles": copy.deepcopy(roles), **template}}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "workload.serving.volcano.sh/v1alpha1", "kind": "ModelServing", "metadata": meta,
            "spec": spec}


SINGLE = [{"name": "web", "replicas": 3, "entryTemplate": tpl(container("e", cpu="500m", memory="1Gi"),
                                                                  init=[container("i", cpu="8")])}]
PD = [
    {"name": "prefill", "replicas": 2, "workerReplicas": 1,
     "entryTemplate": tpl(container("p", cpu="2", memory="4Gi", **{"nvidia.com/gpu": "1"})),
     "workerTemplate": tpl(container("pw", cpu="1", memory="512Mi", **{"nvidia.com/gpu": "1"}))},
    {"name": "decode", "replicas": 4, "workerReplicas": 2,
     "entryTemplate": tpl(container("d", cpu="250m"), container("sidecar", cpu="250m", memory="100M")),
     "workerTemplate": tpl(container("dw", cpu="1", **{"nvidia.com/gpu": "2"}))},
]


def test_single_role_podgroup_whole_object() -> None:
    pg = gang.render_podgroup(ms(SINGLE), "llm-1", subgroups=False)
    assert pg == {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {
            "name": "llm-1", "namespace": "ns",
            "labels": {"modelserving.volcano.sh/name": "llm", "modelserving.volcano.sh/group-name": "llm-1"},
            "annotations": {"scheduling.k8s.io/group-name": "llm-1"},
            "ownerReferences": [{"apiVersion": "workload.serving.volcano.sh/v1alpha1", "kind": "ModelServing",
                                 "name": "llm", "uid": UID, "controller": True}],
        },
        # 3 replicas x 1 pod; requests of containers only (the init container's 8 CPUs are not
        # counted, as Kthena's aggregateResources); 3 x 500m = 1500m, 3 x 1Gi = 3Gi.
        "spec": {"minMember": 3, "minResources": {"cpu": "1500m", "memory": "3Gi"}},
    }


def test_prefill_decode_with_workers_and_subgroups() -> None:
    pg = gang.render_podgroup(ms(PD), "llm-0", subgroups=True)
    spec = pg["spec"]
    # prefill: 2 x (1 + 1) = 4 pods; decode: 4 x (1 + 2) = 12 pods
    assert spec["minMember"] == 16
    # cpu: prefill 2x2 + 2x1 = 6; decode 4x(250m+250m) + 4x2x1 = 10 -> 16
    # memory: 2x4Gi + 2x512Mi = 9Gi, + 4x100M: 10063676416 bytes, BinarySI (the first term's
    # format) and a whole number of Ki -> "9827809Ki", as Go prints it
    # gpu: 2x1 + 2x1 + 4x2x2 = 20
    assert 9 * 2 ** 30 + 400_000_000 == 9827809 * 1024
    assert spec["minResources"] == {"cpu": "16", "memory": "9827809Ki", "nvidia.com/gpu": "20"}
    assert spec["subGroupPolicy"] == [
        {"name": "prefill",
         "labelSelector": {"matchLabels": {"modelserving.volcano.sh/name": "llm", "modelserving.volcano.sh/role": "prefill"}},
         "matchLabelKeys": ["modelserving.volcano.sh/role-id"], "subGroupSize": 2, "minSubGroups": 2},
        {"name": "decode",
         "labelSelector": {"matchLabels": {"modelserving.volcano.sh/name": "llm", "modelserving.volcano.sh/role": "decode"}},
         "matchLabelKeys": ["modelserving.volcano.sh/role-id"], "subGroupSize": 3, "minSubGroups": 4},
    ]
    assert "queue" not in spec and "networkTopology" not in spec


def test_min_role_replicas_limits_members_resources_and_subgroups() -> None:
    m = ms(PD, gangPolicy={"minRoleReplicas": {"decode": 1, "prefill": 5}})  # prefill 5 > replicas 2: capped
    members, resources = gang.requirements(m)
    assert members == 2 * 2 + 1 * 3
    # cpu 2x2 + 2x1 + 1x(250m + 250m) + 1x2x1 = 8.5; memory 9Gi + 100M, not a whole Ki
    assert resources == {"cpu": "8500m", "memory": str(9 * 2 ** 30 + 100_000_000), "nvidia.com/gpu": "8"}
    subs = gang.render_podgroup(m, "llm-0", subgroups=True)["spec"]["subGroupPolicy"]
    assert [(s["name"], s["subGroupSize"], s["minSubGroups"]) for s in subs] == [("prefill", 2, 2), ("decode", 3, 1)]


def test_role_absent_from_min_role_replicas_counts_all_and_zero_is_allowed() -> None:
    m = ms(PD, gangPolicy={"minRoleReplicas": {"prefill": 0}})
    assert gang.requirements(m)[0] == 0 + 4 * 3
    m = ms(PD, gangPolicy={"minRoleReplicas": {"prefill": 0, "decode": 0}})
    pg = gang.render_podgroup(m, "llm-0", subgroups=False)
    # minMember 0 is left out (Go's omitempty); the resources of zero replicas read as "0"
    assert pg["spec"] == {"minResources": {"cpu": "0", "memory": "0", "nvidia.com/gpu": "0"}}


def test_worker_replicas_without_worker_template_are_not_counted() -> None:
    roles = [{"name": "r", "replicas": 2, "workerReplicas": 3, "entryTemplate": tpl(container("e", cpu="1"))}]
    assert gang.requirements(ms(roles)) == (2, {"cpu": "2"})


def test_queue_and_network_topology() -> None:
    m = ms(PD, annotations={"scheduling.volcano.sh/queue-name": "gpu-q", "other": "x"},
           networkTopology={"groupPolicy": {"mode": "hard", "highestTierAllowed": 2},
                            "rolePolicy": {"mode": "soft", "highestTierName": "rack"}})
    spec = gang.render_podgroup(m, "llm-0", subgroups=True)["spec"]
    assert spec["queue"] == "gpu-q"
    assert spec["networkTopology"] == {"mode": "hard", "highestTierAllowed": 2}
    assert all(s["networkTopology"] == {"mode": "soft", "highestTierName": "rack"} for s in spec["subGroupPolicy"])
    no_sub = gang.render_podgroup(m, "llm-0", subgroups=False)["spec"]
    assert "subGroupPolicy" not in no_sub and no_sub["networkTopology"] == {"mode": "hard", "highestTierAllowed": 2}
    only_role = ms(PD, networkTopology={"rolePolicy": {"mode": "hard", "highestTierAllowed": 1}})
    spec = gang.render_podgroup(only_role, "llm-0", subgroups=True)["spec"]
    assert "networkTopology" not in spec and spec["subGroupPolicy"][0]["networkTopology"]["highestTierAllowed"] == 1


def test_only_the_volcano_scheduler_uses_podgroups() -> None:
    assert gang.wants_podgroups(ms(SINGLE))  # the default scheduler is volcano
    assert gang.wants_podgroups(ms(SINGLE, scheduler="volcano"))
    assert not gang.wants_podgroups(ms(SINGLE, scheduler="default-scheduler"))


def _stored(pg: dict[str, Any], **spec_defaults: Any) -> dict[str, Any]:
    """The PodGroup as the apiserver returns it: resourceVersion, the CRD's defaults."""
    out = copy.deepcopy(pg)
    out["metadata"]["resourceVersion"] = "42"
    out["spec"] = {**spec_defaults, **out["spec"]}
    for s in out["spec"].get("subGroupPolicy") or []:
        s.setdefault("subGroupSize", 1)
        s.setdefault("minSubGroups", 0)
    return out


def test_patch_none_when_in_line_with_server_defaults() -> None:
    m = ms(PD, networkTopology={"groupPolicy": {"highestTierAllowed": 2}, "rolePolicy": {"highestTierAllowed": 1}})
    stored = _stored(gang.render_podgroup(m, "llm-0", subgroups=True), queue="default")
    stored["spec"]["networkTopology"]["mode"] = "hard"
    for s in stored["spec"]["subGroupPolicy"]:
        s["networkTopology"]["mode"] = "hard"
    stored["spec"]["minResources"]["cpu"] = 16  # an int-or-string written as an integer elsewhere
    assert gang.podgroup_patch(stored, m, subgroups=True) is None


def test_patch_carries_only_changed_fields() -> None:
    m = ms(PD)
    stored = _stored(gang.render_podgroup(m, "llm-0", subgroups=True), queue="default")
    scaled = copy.deepcopy(m)
    scaled["spec"]["template"]["roles"][1]["replicas"] = 5
    patch = gang.podgroup_patch(stored, scaled, subgroups=True)
    assert patch is not None
    assert patch["metadata"] == {"resourceVersion": "42"}
    assert set(patch["spec"]) == {"minMember", "minResources", "subGroupPolicy"}
    assert patch["spec"]["minMember"] == 4 + 15
    assert patch["spec"]["subGroupPolicy"][1]["minSubGroups"] == 5
    # without the CRD's subGroupPolicy the field is never touched
    patch = gang.podgroup_patch(stored, scaled, subgroups=False)
    assert patch is not None and set(patch["spec"]) == {"minMember", "minResources"}


def test_patch_removes_what_went_away() -> None:
    m = ms(PD, annotations={"scheduling.volcano.sh/queue-name": "q1"},
           networkTopology={"groupPolicy": {"mode": "soft", "highestTierName": "rack"}})
    stored = _stored(gang.render_podgroup(m, "llm-0", subgroups=False))
    plain = ms(PD)
    plain["spec"]["template"]["roles"][1]["workerTemplate"]["spec"]["containers"][0]["resources"]["requests"].pop(
        "nvidia.com/gpu")
    plain["spec"]["template"]["roles"][0]["entryTemplate"]["spec"]["containers"][0]["resources"]["requests"].pop(
        "nvidia.com/gpu")
    plain["spec"]["template"]["roles"][0]["workerTemplate"]["spec"]["containers"][0]["resources"]["requests"].pop(
        "nvidia.com/gpu")
    patch = gang.podgroup_patch(stored, plain, subgroups=False)
    assert patch is not None
    assert patch["spec"]["queue"] is None  # merge patch null: back to the CRD default ("default")
    assert patch["spec"]["networkTopology"] is None
    assert patch["spec"]["minResources"] == {"nvidia.com/gpu": None}  # only the key that changed
    assert "minMember" not in patch["spec"]
    # a topology that changes keys: the old key is nulled
    tier = ms(PD, annotations={"scheduling.volcano.sh/queue-name": "q1"},
              networkTopology={"groupPolicy": {"mode": "soft", "highestTierAllowed": 1}})
    patch = gang.podgroup_patch(stored, tier, subgroups=False)
    assert patch is not None and patch["spec"] == {
        "networkTopology": {"mode": "soft", "highestTierAllowed": 1, "highestTierName": None}}


def test_patch_of_min_member_to_zero() -> None:
    m = ms(PD)
    stored = _stored(gang.render_podgroup(m, "llm-0", subgroups=False), queue="default")
    zero = ms(PD, gangPolicy={"minRoleReplicas": {"prefill": 0, "decode": 0}})
    patch = gang.podgroup_patch(stored, zero, subgroups=False)
    assert patch is not None and patch["spec"]["minMember"] == 0


def test_pod_annotations() -> None:
    pod = {"metadata": {"name": "llm-0-decode-3-1", "annotations": {"a": "b"},
                        "labels": {"modelserving.volcano.sh/group-name": "llm-0",
                                   "modelserving.volcano.sh/role-id": "decode-3"}}}
    gang.annotate_pod(pod)
    assert pod["metadata"]["annotations"] == {"a": "b", "scheduling.k8s.io/group-name": "llm-0",
                                              "volcano.sh/task-spec": "decode-3"}


def _crd(subgroups: bool, established: bool = True, version: str = "v1beta1") -> dict[str, Any]:
    props: dict[str, Any] = {"minMember": {"type": "integer"}}
    if subgroups:
        props["subGroupPolicy"] = {"type": "array"}
    return {"metadata": {"name": "podgroups.scheduling.volcano.sh"},
            "spec": {"versions": [{"name": version, "served": True, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object", "properties": props}}}}}]},
            "status": {"conditions": [{"type": "Established", "status": "True" if established else "False"}]}}


def test_crd_capabilities() -> None:
    assert crd_capabilities(_crd(True)).podgroups and crd_capabilities(_crd(True)).subgroups
    caps = crd_capabilities(_crd(False))
    assert caps.podgroups and not caps.subgroups
    assert not crd_capabilities(None).podgroups and "not installed" in crd_capabilities(None).detail
    assert not crd_capabilities(_crd(True, established=False)).podgroups
    assert not crd_capabilities(_crd(True, version="v1alpha1")).podgroups


@pytest.mark.parametrize("text,want", [
    ("1", "1"), ("500m", "500m"), ("0.5", "500m"), ("1.5Gi", "1536Mi"), ("1024Mi", "1Gi"), ("1500", "1500"),
    ("1024", "1024"), ("100M", "100M"), ("1e3", "1e3"), (".5", "500m"), ("2k", "2k"), ("0", "0"),
    ("0.0000000001", "1n"), ("12Ki", "12Ki"), (3, "3"), ("1.5", "1500m"), ("-2", "-2"),
])
def test_quantity_canonical(text: str | int, want: str) -> None:
    assert canonical(parse(text)) == want


def test_quantity_sums_keep_the_first_format() -> None:
    assert canonical(parse("2") + parse("500m")) == "2500m"
    assert canonical(parse("1Gi") + parse("512Mi")) == "1536Mi"
    assert canonical(parse("1Gi") + parse("1M")) == str(2 ** 30 + 10 ** 6)  # BinarySI, not a whole Ki
    assert canonical(parse("1M") + parse("1Gi")) == "1074741824"
    assert canonical(parse("0") * 1 + parse("1Gi")) == "1Gi"  # a zero term takes the next one's format
    assert canonical(parse("500m") * 2) == "1"
    with pytest.raises(ValueError):
        parse("1.5 Gi")
