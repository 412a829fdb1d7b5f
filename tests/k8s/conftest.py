"""One real control plane (etcd, kube-apiserver, kube-controller-manager) for the whole run,
with the project's CRDs (configs/crds) installed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import k8s_crds
import k8s_harness


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[k8s_harness.ControlPlane]:
    bin_dir = k8s_harness.testbin_dir()  # raises (a failure, not a skip) when it cannot be built
    cp = k8s_harness.ControlPlane(bin_dir, tmp_path_factory.mktemp("k8s")).start()
    try:
        k8s_crds.install_crds(cp)
        yield cp
    finally:
        cp.stop()
