"""A cluster with only the ModelServing CRD (no ModelBooster, ModelServer, ModelRoute or
AutoscalingPolicy CRDs): the controller still serves ModelServings (the ModelBooster
controller waits for its caches on its own) and is ready. Its own control plane: the
session one has every CRD."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

import harness
import k8s_harness
from controller_support import Api, modelserving, start_controller, template
from k8s_crds import install_crds

NS = "controller-minimal"


@pytest.fixture(scope="module")
def minimal_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[k8s_harness.ControlPlane]:
    cp = k8s_harness.ControlPlane(k8s_harness.testbin_dir(), tmp_path_factory.mktemp("k8s-minimal"),
                                  controller_manager=False).start()
    try:
        install_crds(cp, only=("ModelServing",))
        cp.kubectl("create", "namespace", NS)
        yield cp
    finally:
        cp.stop()


def test_modelservings_are_served_without_the_booster_crds(minimal_plane: k8s_harness.ControlPlane,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    with minimal_plane.client() as http:
        assert http.get("/apis/workload.serving.volcano.sh/v1alpha1/modelboosters").status_code == 404
    port = harness.free_port()
    ctl = start_controller(minimal_plane, NS, tmp_path_factory.mktemp("controller"), "ctl-minimal", port=port)
    api = Api(minimal_plane, NS)
    try:
        roles = [{"name": "web", "replicas": 1, "workerReplicas": 0, "entryTemplate": template("w:1")}]
        minimal_plane.apply([modelserving("lone", NS, 2, roles)])
        api.wait_pods("lone", {"lone-0-web-0-0", "lone-1-web-0-0"})
        api.wait_status("lone", replicas=2)
        ready = harness.wait_until(lambda: (r := httpx.get(f"http://{harness.HOST}:{port}/readyz", timeout=5))
                                   .status_code == 200 and r, 20, what="/readyz 200")
        assert ready.text == "leader"
        assert ctl.alive(), ctl.tail()
    finally:
        api.close()
        ctl.stop()
