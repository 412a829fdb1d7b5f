"""Real control planes (etcd, kube-apiserver, kube-controller-manager) for the whole run,
with the project's CRDs (configs/crds) installed.

- `control_plane`: Kthena's CRDs only (the one most tests share).
- `volcano_control_plane`: a second one that also has Volcano's PodGroup and Queue CRDs
  (configs/crds/volcano), started only when a test asks for it.
- `controller_cluster`: module-scoped and parametrized over both, so the ModelServing
  controller modules that request it run once without Volcano (plain pods, the
  GangScheduling condition False) and once with it (a PodGroup per ServingGroup, annotated
  pods). Such a module overrides `control_plane` with it (`cluster_fixture` below)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import k8s_crds
import k8s_harness
import volcano_crds


def _plane(tmp_path_factory: pytest.TempPathFactory, name: str, volcano: bool) -> Iterator[k8s_harness.ControlPlane]:
    bin_dir = k8s_harness.testbin_dir()  # raises (a failure, not a skip) when it cannot be built
    cp = k8s_harness.ControlPlane(bin_dir, tmp_path_factory.mktemp(name)).start()
    try:
        k8s_crds.install_crds(cp)
        if volcano:
            volcano_crds.install(cp)
            cp.volcano = True
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def plain_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[k8s_harness.ControlPlane]:
    yield from _plane(tmp_path_factory, "k8s", volcano=False)


@pytest.fixture(scope="session")
def control_plane(plain_control_plane: k8s_harness.ControlPlane) -> k8s_harness.ControlPlane:
    return plain_control_plane


@pytest.fixture(scope="session")
def volcano_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[k8s_harness.ControlPlane]:
    yield from _plane(tmp_path_factory, "k8s-volcano", volcano=True)


@pytest.fixture(scope="module", params=["without-volcano", "with-volcano"])
def controller_cluster(request: pytest.FixtureRequest) -> k8s_harness.ControlPlane:
    name = "volcano_control_plane" if request.param == "with-volcano" else "plain_control_plane"
    return request.getfixturevalue(name)
