"""kube.status: the desired status of each object from a ClusterView, and the merge with a
stored status (lastTransitionTime kept unless the status flips, foreign conditions kept)."""

from __future__ import annotations

from typing import Any

from kthena_router.config.errors import ConfigError
from kthena_router.config.loader import config_from_objects
from kthena_router.kube.status import desired_statuses, merge_status
from kthena_router.kube.view import ClusterView, ObjectMeta

API = "networking.serving.volcano.sh/v1alpha1"
NS = "team"


def _meta(name: str, created: str) -> dict[str, Any]:
    return {"name": name, "namespace": NS, "creationTimestamp": created}


def route(name: str, model: str | None, target: dict[str, str], created: str = "2026-01-01T00:00:00Z",
          lora: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"rules": [{"name": "r", "targetModels": [target]}]}
    if model:
        spec["modelName"] = model
    if lora:
        spec["loraAdapters"] = lora
    return {"apiVersion": API, "kind": "ModelRoute", "metadata": _meta(name, created), "spec": spec}


def server(name: str, pd: bool = False) -> dict[str, Any]:
    ws: dict[str, Any] = {"matchLabels": {"app": name}}
    if pd:
        ws["pdGroup"] = {"groupKey": "group", "prefillLabels": {"role": "prefill"}, "decodeLabels": {"role": "decode"}}
    return {"apiVersion": API, "kind": "ModelServer", "metadata": _meta(name, "2026-01-01T00:00:00Z"),
            "spec": {"model": "m", "inferenceEngine": "vLLM", "workloadSelector": ws}}


def provider(name: str, secret: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"baseURL": "https://api.example.com"}
    if secret:
        spec["auth"] = {"secretRef": {"name": secret, "key": "api-key"}}
    return {"apiVersion": API, "kind": "ExternalModelProvider", "metadata": _meta(name, "2026-01-01T00:00:00Z"),
            "spec": spec}


def view(docs: list[dict[str, Any]], ready: dict[tuple[str, str], dict[str, int]] | None = None,
         generation: int = 3) -> ClusterView:
    """What the watcher builds: objects with a problem left out, the rest loaded again."""
    kept = list(docs)
    problems: dict[Any, str] = {}
    details: dict[Any, tuple[Any, ...]] = {}
    while True:
        try:
            cfg = config_from_objects(kept, source="kubernetes", digest="x")
            break
        except ConfigError as e:
            bad = set()
            for p in e.problems:
                i = int(p.document.split()[1]) - 1
                bad.add(i)
                k = (kept[i]["kind"], NS, kept[i]["metadata"]["name"])
                problems[k] = str(p)
                details[k] = details.get(k, ()) + (p,)
            kept = [d for i, d in enumerate(kept) if i not in bad]
    objects = {(d["kind"], NS, d["metadata"]["name"]): ObjectMeta(API, "uid-" + d["metadata"]["name"], generation, "1")
               for d in docs}
    return ClusterView(cfg, objects, problems, ready or {}, details)


def conds(v: ClusterView, kind: str, name: str) -> dict[str, tuple[str, str]]:
    d = desired_statuses(v)[(kind, NS, name)]
    return {c.type: (c.status, c.reason) for c in d.conditions}


def test_routes_accepted_conflict_and_unresolved() -> None:
    v = view([
        server("srv"),
        route("old", "m", {"modelServerName": "srv"}, created="2026-01-01T00:00:00Z"),
        route("new", "m", {"modelServerName": "srv"}, created="2026-01-02T00:00:00Z"),
        route("missing", "x", {"modelServerName": "nope"}),
        route("bad", "y", {"modelServerName": "srv", "weight": "heavy"}),  # type: ignore[dict-item]
    ])
    assert conds(v, "ModelRoute", "old") == {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}
    assert conds(v, "ModelRoute", "new") == {"Accepted": ("True", "ModelNameConflict"),
                                             "ResolvedRefs": ("True", "ResolvedRefs")}
    new = desired_statuses(v)[("ModelRoute", NS, "new")].conditions[0]
    assert "team/old" in new.message
    assert conds(v, "ModelRoute", "missing") == {"Accepted": ("False", "UnresolvedRefs"),
                                                 "ResolvedRefs": ("False", "BackendNotFound")}
    missing = desired_statuses(v)[("ModelRoute", NS, "missing")].conditions[1]
    assert "'nope' not found" in missing.message and "targetModels[0].modelServerName" in missing.message
    assert conds(v, "ModelRoute", "bad") == {"Accepted": ("False", "Invalid"), "ResolvedRefs": ("Unknown", "Invalid")}


def test_route_to_an_invalid_provider_is_unresolved_and_lora_shadowing_is_a_conflict() -> None:
    v = view([
        server("srv"),
        provider("p", secret="absent"),
        route("ext", "e", {"externalModelProviderName": "p"}),
        route("base", "lora-a", {"modelServerName": "srv"}),
        route("adapters", None, {"modelServerName": "srv"}, lora=["lora-a"]),
    ])
    assert conds(v, "ModelRoute", "ext") == {"Accepted": ("False", "UnresolvedRefs"),
                                             "ResolvedRefs": ("False", "BackendNotFound")}
    assert conds(v, "ModelRoute", "adapters")["Accepted"] == ("True", "ModelNameConflict")
    assert conds(v, "ModelRoute", "base")["Accepted"] == ("True", "Accepted")


def test_servers_ready_counts_and_pd_pairs() -> None:
    docs = [server("plain"), server("idle"), server("pd", pd=True), server("half", pd=True)]
    ready = {(NS, "plain"): {"all": 2}, (NS, "pd"): {"all": 3, "prefill": 2, "decode": 1},
             (NS, "half"): {"all": 2, "prefill": 2, "decode": 0}}
    v = view(docs, ready)
    d = desired_statuses(v)
    assert conds(v, "ModelServer", "plain") == {"Ready": ("True", "EndpointsReady")}
    assert dict(d[("ModelServer", NS, "plain")].fields) == {"readyEndpoints": 2}
    assert conds(v, "ModelServer", "idle") == {"Ready": ("False", "NoReadyEndpoints")}
    assert dict(d[("ModelServer", NS, "idle")].fields) == {"readyEndpoints": 0}
    assert conds(v, "ModelServer", "pd") == {"Ready": ("True", "EndpointsReady")}
    assert dict(d[("ModelServer", NS, "pd")].fields) == {"readyEndpoints": 3, "readyPrefillEndpoints": 2,
                                                         "readyDecodeEndpoints": 1}
    assert conds(v, "ModelServer", "half") == {"Ready": ("False", "NoReadyPair")}
    # the watcher's pair count wins over the role counts
    v2 = view(docs, {**ready, (NS, "pd"): {"all": 3, "prefill": 2, "decode": 1, "pairs": 0}})
    assert conds(v2, "ModelServer", "pd") == {"Ready": ("False", "NoReadyPair")}


def test_providers_follow_kthena_reasons() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "s", "namespace": NS,
                           "labels": {"networking.serving.volcano.sh/external-model-provider-credential": "true"}},
              "stringData": {"api-key": "sk-1"}}
    v = view([provider("open"), provider("keyed", "s"), provider("nosecret", "absent"), secret,
              {**provider("badkey", "s"), "spec": {"baseURL": "https://a.example", "auth": {
                  "secretRef": {"name": "s", "key": "other"}}}},
              {**provider("badurl"), "spec": {"baseURL": "http://plain.example"}}])
    assert conds(v, "ExternalModelProvider", "open") == {"CredentialsResolved": ("True", "CredentialNotRequired"),
                                                         "Ready": ("True", "Ready")}
    assert conds(v, "ExternalModelProvider", "keyed") == {"CredentialsResolved": ("True", "CredentialResolved"),
                                                          "Ready": ("True", "Ready")}
    assert conds(v, "ExternalModelProvider", "nosecret") == {
        "CredentialsResolved": ("False", "CredentialNotFound"), "Ready": ("False", "CredentialNotFound")}
    assert conds(v, "ExternalModelProvider", "badkey") == {
        "CredentialsResolved": ("False", "CredentialKeyNotFound"), "Ready": ("False", "CredentialKeyNotFound")}
    assert conds(v, "ExternalModelProvider", "badurl") == {
        "CredentialsResolved": ("Unknown", "ConfigurationInvalid"), "Ready": ("False", "ConfigurationInvalid")}
    # no credential value anywhere in the status
    for d in desired_statuses(v).values():
        assert all("sk-1" not in c.message for c in d.conditions)


def test_problem_without_details_is_invalid() -> None:
    v = view([server("srv")])
    key = ("ModelServer", NS, "srv")
    v2 = ClusterView(v.config, v.objects, {key: "kubernetes: spec.model: must be a string"})
    assert conds(v2, "ModelServer", "srv") == {"Ready": ("False", "Invalid")}
    assert "spec.model" in desired_statuses(v2)[key].conditions[0].message


def test_merge_keeps_transition_time_unless_status_flips() -> None:
    docs = [server("srv")]
    up = view(docs, {(NS, "srv"): {"all": 1}})
    d = desired_statuses(up)[("ModelServer", NS, "srv")]
    foreign = {"type": "Scheduled", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "T0"}
    first = merge_status({"conditions": [foreign], "other": 1}, d, "T1")
    assert first["observedGeneration"] == 3 and first["other"] == 1 and first["readyEndpoints"] == 1
    assert [c["type"] for c in first["conditions"]] == ["Scheduled", "Ready"]
    ready = first["conditions"][1]
    assert ready == {"type": "Ready", "status": "True", "reason": "EndpointsReady", "message": "1 ready endpoint",
                     "observedGeneration": 3, "lastTransitionTime": "T1"}
    # unchanged: the same dict (a no-op for the writer), time kept
    assert merge_status(first, d, "T2") == first
    # message changes, status does not: no transition
    more = desired_statuses(view(docs, {(NS, "srv"): {"all": 4}}, generation=4))[("ModelServer", NS, "srv")]
    second = merge_status(first, more, "T3")
    assert second["conditions"][1]["lastTransitionTime"] == "T1"
    assert second["conditions"][1]["observedGeneration"] == 4 and second["readyEndpoints"] == 4
    # flip: new time
    down = desired_statuses(view(docs, {}, generation=4))[("ModelServer", NS, "srv")]
    third = merge_status(second, down, "T4")
    assert third["conditions"][1]["status"] == "False" and third["conditions"][1]["lastTransitionTime"] == "T4"


def test_merge_removes_stale_owned_fields_and_duplicate_conditions() -> None:
    d = desired_statuses(view([server("srv")], {(NS, "srv"): {"all": 1}}))[("ModelServer", NS, "srv")]
    stale = {"readyPrefillEndpoints": 5, "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "T0"},
        {"type": "Ready", "status": "False", "lastTransitionTime": "T9"}]}
    merged = merge_status(stale, d, "T1")
    assert "readyPrefillEndpoints" not in merged
    assert [c["lastTransitionTime"] for c in merged["conditions"]] == ["T0"]


def test_loader_lists_route_conflicts_in_priority_order() -> None:
    cfg = config_from_objects([
        server("srv"),
        route("c", "m", {"modelServerName": "srv"}, created="2026-01-03T00:00:00Z"),
        route("a", "m", {"modelServerName": "srv"}, created="2026-01-01T00:00:00Z"),
        route("b", "m", {"modelServerName": "srv"}, created="2026-01-02T00:00:00Z"),
        route("l1", None, {"modelServerName": "srv"}, lora=["ad"], created="2026-01-01T00:00:00Z"),
        route("l2", None, {"modelServerName": "srv"}, lora=["ad"], created="2026-01-02T00:00:00Z"),
    ], source="x", digest="x")
    got = {(c.name, c.claimed, c.lora, c.owner[1], c.shadowed) for c in cfg.route_conflicts}
    assert got == {("b", "m", False, "a", False), ("c", "m", False, "a", False), ("l2", "ad", True, "l1", False)}
