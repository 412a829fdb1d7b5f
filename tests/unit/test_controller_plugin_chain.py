"""spec.plugins: Kthena's BuiltIn plugin chain (pure)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from controller.plugins import HookRequest, PluginError, build_chain


def ms(*plugins: dict[str, Any], owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "llm", "namespace": "ns"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                                    "name": owner, "uid": "u"}]
    return {"metadata": meta, "spec": {"plugins": list(plugins)}}


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "env": [{"name": "X", "value": "1"}]}],
                     "initContainers": [{"name": "i"}]}}


def run(m: dict[str, Any], name: str, role: str = "decode", entry: bool = True) -> dict[str, Any]:
    p = pod(name)
    build_chain(m).on_pod_create(HookRequest(m, "llm-0", role, f"{role}-0", entry, p))
    return p


def test_demo_pod_tweaks_sets_runtime_class_annotations_and_appends_env() -> None:
    m = ms({"name": "demo-pod-tweaks", "type": "BuiltIn",
            "config": {"runtimeClassName": "nvidia", "annotations": {"k": "v"}, "env": [{"name": "Y", "value": "2"}]}})
    p = run(m, "llm-0-decode-0-0")
    assert p["spec"]["runtimeClassName"] == "nvidia"
    assert p["metadata"]["annotations"] == {"k": "v"}
    assert p["spec"]["containers"][0]["env"] == [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]
    assert p["spec"]["initContainers"][0]["env"] == [{"name": "Y", "value": "2"}]


def test_scope_limits_roles_and_targets() -> None:
    m = ms({"name": "demo-pod-tweaks", "type": "BuiltIn", "config": {"runtimeClassName": "rc"},
            "scope": {"roles": ["prefill"], "target": "Worker"}})
    assert "runtimeClassName" not in run(m, "llm-0-decode-0-1", "decode", False)["spec"]
    assert "runtimeClassName" not in run(m, "llm-0-prefill-0-0", "prefill", True)["spec"]
    assert run(m, "llm-0-prefill-0-1", "prefill", False)["spec"]["runtimeClassName"] == "rc"


def test_plugins_run_in_list_order() -> None:
    m = ms({"name": "demo-pod-tweaks", "type": "BuiltIn", "config": {"runtimeClassName": "first"}},
           {"name": "demo-pod-tweaks", "type": "BuiltIn", "config": {"runtimeClassName": "second"}})
    assert run(m, "llm-0-decode-0-0")["spec"]["runtimeClassName"] == "second"


def test_lws_labels_only_under_a_leaderworkerset() -> None:
    plain = run(ms({"name": "lws-standard-labels", "type": "BuiltIn"}), "llm-0-decode-0-2", entry=False)
    assert plain["metadata"]["labels"] == {"a": "b"}
    p = run(ms({"name": "lws-standard-labels", "type": "BuiltIn"}, owner="lws1"), "llm-0-decode-0-2", entry=False)
    labels = p["metadata"]["labels"]
    assert labels["leaderworkerset.sigs.k8s.io/name"] == "lws1"
    assert labels["leaderworkerset.sigs.k8s.io/group-index"] == "0"
    assert labels["leaderworkerset.sigs.k8s.io/worker-index"] == "2"
    assert labels["leaderworkerset.sigs.k8s.io/group-key"] == hashlib.sha1(b"lws1-0").hexdigest()


@pytest.mark.parametrize("spec, needle", [
    ({"name": "nope", "type": "BuiltIn"}, "'nope' is not registered"),
    ({"name": "demo-pod-tweaks", "type": "Webhook"}, "unsupported type 'Webhook'"),
    ({"name": "demo-pod-tweaks", "type": "BuiltIn", "config": {"runtimeClass": "x"}}, "unknown field(s) runtimeClass"),
    ({"name": "demo-pod-tweaks", "type": "BuiltIn", "config": {"env": [{"value": "1"}]}}, "env must be a list"),
    ({"name": "demo-pod-tweaks", "type": "BuiltIn", "scope": {"target": "Both"}}, "scope.target must be one of"),
])
def test_a_plugin_that_cannot_run_is_an_error_naming_it(spec: dict[str, Any], needle: str) -> None:
    with pytest.raises(PluginError) as exc:
        build_chain(ms(spec))
    assert needle in str(exc.value) and "spec.plugins[0]" in str(exc.value)


def test_no_plugins_is_an_empty_chain() -> None:
    assert not build_chain({"metadata": {"name": "x"}, "spec": {}})
