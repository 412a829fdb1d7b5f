"""When the supervisor runs a pod-state hub, and where its socket goes."""

from __future__ import annotations

from pathlib import Path

from kthena_router.podstate.process import SOCKET_NAME, with_hub_socket
from kthena_router.settings import RouterSettings


def settings(tmp: Path, **kw: object) -> RouterSettings:
    return RouterSettings(config_path="routes.yaml", runtime_dir=str(tmp), **kw)  # type: ignore[arg-type]


def test_one_worker_or_off_runs_no_hub(tmp_path: Path) -> None:
    assert with_hub_socket(settings(tmp_path, workers=1)).pod_state_socket == ""
    assert with_hub_socket(settings(tmp_path, workers=4, pod_state="off")).pod_state_socket == ""


def test_several_workers_get_a_socket_in_the_runtime_dir(tmp_path: Path) -> None:
    assert with_hub_socket(settings(tmp_path, workers=2)).pod_state_socket == str(tmp_path / SOCKET_NAME)


def test_a_deep_runtime_dir_gets_a_short_private_socket_dir(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    path = Path(with_hub_socket(settings(deep, workers=2)).pod_state_socket)
    try:
        assert len(str(path).encode()) <= 100 and path.name == SOCKET_NAME
        assert path.parent.stat().st_mode & 0o777 == 0o700  # mkdtemp: the router's user only
    finally:
        path.parent.rmdir()
