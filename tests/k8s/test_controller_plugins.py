"""spec.plugins on the real apiserver: Kthena's BuiltIn plugins mutate every new pod; a
plugin that cannot run creates no pod and says why in the PluginsApplied condition, and
fixing the spec lets the pods come."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import harness
import k8s_harness
from controller_support import Api, condition, controller_namespace, env, modelserving, template

NS = "controller-plugins"
ROLES = [{"name": "web", "replicas": 1, "workerReplicas": 1, "entryTemplate": template("w:1"),
          "workerTemplate": template("ww:1")}]
TWEAKS = {"name": "demo-pod-tweaks", "type": "BuiltIn",
          "config": {"annotations": {"team": "llm"}, "env": [{"name": "EXTRA", "value": "1"}]},
          "scope": {"target": "Worker"}}


@pytest.fixture(scope="module")
def api(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    with controller_namespace(control_plane, NS, tmp_path_factory.mktemp("controller"), "ctl-plugins") as a:
        yield a


def test_plugins_mutate_the_pods_they_are_scoped_to(api: Api) -> None:
    api.cp.apply([modelserving("tw", NS, 1, ROLES, plugins=[TWEAKS])])
    pods = api.wait_pods("tw", {"tw-0-web-0-0", "tw-0-web-0-1"})
    worker, entry = pods["tw-0-web-0-1"], pods["tw-0-web-0-0"]
    assert worker["metadata"]["annotations"] == {"team": "llm"}
    assert env(worker)["EXTRA"] == "1" and env(worker)["WORKER_INDEX"] == "1"
    assert "EXTRA" not in env(entry) and not (entry["metadata"].get("annotations") or {})
    ms = harness.wait_until(lambda: condition(o := api.ms("tw") or {}, "PluginsApplied") == "True" and o, 20,
                            what="PluginsApplied True")
    assert condition(ms, "PluginsApplied") == "True"


def test_an_unknown_plugin_creates_nothing_until_fixed(api: Api) -> None:
    bad = {"name": "no-such-plugin", "type": "BuiltIn"}
    api.cp.apply([modelserving("bad", NS, 1, ROLES, plugins=[bad])])

    def refused() -> dict | None:
        ms = api.ms("bad") or {}
        c = next((c for c in (ms.get("status") or {}).get("conditions") or [] if c["type"] == "PluginsApplied"), None)
        return c if c and c["status"] == "False" else None
    c = harness.wait_until(refused, 20, what="PluginsApplied False")
    assert c["reason"] == "PluginError" and "'no-such-plugin' is not registered" in c["message"]
    assert api.pods("bad") == {}
    assert api.services("bad")  # the Service needs no plugin: only pods wait
    api.cp.apply([modelserving("bad", NS, 1, ROLES)])  # plugins removed
    api.wait_pods("bad", {"bad-0-web-0-0", "bad-0-web-0-1"})
    ms = harness.wait_until(lambda: (o := api.ms("bad")) and condition(o, "PluginsApplied") is None and o, 20,
                            what="PluginsApplied gone")
    assert condition(ms, "PluginsApplied") is None
