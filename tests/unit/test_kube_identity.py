"""Kubernetes mode's status flags: the Lease's namespace and the holder identity are filled in
at startup from the pod's environment (downward API), the flags win, --no-status skips it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kthena_router.cli import build_parser, main, settings_from_args
from kthena_router.settings import DEFAULT_LEASE_NAME, RouterSettings


def _settings(tmp_path: Path, *argv: str) -> RouterSettings:
    return settings_from_args(build_parser().parse_args(["--kubernetes", "--kubeconfig", str(tmp_path / "kc"),
                                                         *argv]))


def test_defaults_from_the_pod_environment(tmp_path: Path) -> None:
    base = RouterSettings(config_path="", kubernetes=True, namespace="watched")
    s = base.with_kube_identity({"POD_NAMESPACE": "kthena-system", "POD_NAME": "kthena-router-abc"},
                                sa_namespace_file=str(tmp_path / "none"))
    assert (s.lease_name, s.lease_namespace, s.leader_identity) == (DEFAULT_LEASE_NAME, "kthena-system",
                                                                    "kthena-router-abc")
    # in a pod without the downward API: the service account's namespace file
    (tmp_path / "ns").write_text("from-token\n")
    s = base.with_kube_identity({}, sa_namespace_file=str(tmp_path / "ns"))
    assert s.lease_namespace == "from-token"
    # outside a pod: the watched namespace, else default; a unique identity per process
    s = base.with_kube_identity({}, sa_namespace_file=str(tmp_path / "none"))
    assert s.lease_namespace == "watched" and s.leader_identity
    other = base.with_kube_identity({}, sa_namespace_file=str(tmp_path / "none"))
    assert other.leader_identity != s.leader_identity
    s = RouterSettings(config_path="", kubernetes=True).with_kube_identity({}, str(tmp_path / "none"))
    assert s.lease_namespace == "default"


def test_flags_win_and_no_status_skips_the_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "env-ns")
    monkeypatch.setenv("POD_NAME", "env-pod")
    s = _settings(tmp_path, "--status-lease-name", "mine", "--status-lease-namespace", "ns1",
                  "--leader-identity", "me")
    assert (s.kube_status, s.lease_name, s.lease_namespace, s.leader_identity) == (True, "mine", "ns1", "me")
    s = _settings(tmp_path)
    assert (s.lease_namespace, s.leader_identity) == ("env-ns", "env-pod")
    s = _settings(tmp_path, "--no-status")
    assert not s.kube_status and s.lease_namespace == "" and s.leader_identity == ""


def test_status_flags_need_kubernetes_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("")
    assert main(["--config", str(cfg), "--no-status"]) == 2
    assert "need --kubernetes" in capsys.readouterr().err
    assert main(["--kubernetes", "--kubeconfig", str(cfg), "--status-lease-name", ""]) == 2
    assert "Lease needs a name" in capsys.readouterr().err
