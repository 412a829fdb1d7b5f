"""Settings of the Rust front end (--interface rust / auto, docs/rust-front.md)."""

from __future__ import annotations

import os
import shutil

import pytest

from kthena_router.cli import build_parser, settings_from_args
from kthena_router.front.choice import resolve_interface
from kthena_router.settings import RouterSettings, SettingsError


def test_rust_interface_and_its_threads() -> None:
    s = settings_from_args(build_parser().parse_args(
        ["--config", "c.yaml", "--interface", "rust", "--front-threads", "2", "--runtime-dir", "/tmp/rt"]))
    s.validate()
    assert s.interface == "rust" and s.front_threads == 2
    assert s.front_socket_path == "/tmp/rt/granian.sock"


def test_front_threads_without_the_rust_interface_is_refused() -> None:
    with pytest.raises(SettingsError, match="--interface rust \\(or auto\\) only"):
        RouterSettings(config_path="c.yaml", interface="rsgi", front_threads=2).validate()
    RouterSettings(config_path="c.yaml", front_threads=2).validate()  # auto may choose rust
    with pytest.raises(SettingsError, match="front_threads must be >= 1"):
        RouterSettings(config_path="c.yaml", interface="rust", front_threads=0).validate()
    with pytest.raises(SettingsError, match="auto, rsgi, asgi or rust"):
        RouterSettings(config_path="c.yaml", interface="h3").validate()


def _resolved(tmp_path, text: str | None) -> str:
    path = ""
    if text is not None:
        f = tmp_path / "router.yaml"
        f.write_text(text)
        path = str(f)
    return resolve_interface(RouterSettings(config_path="c.yaml", router_config_path=path)).interface


def test_auto_is_the_default_and_picks_the_front_unless_every_request_would_go_slow(tmp_path) -> None:
    assert RouterSettings(config_path="c.yaml").interface == "auto"
    assert build_parser().parse_args(["--config", "c.yaml"]).interface == "auto"
    assert _resolved(tmp_path, None) == "rust"
    assert _resolved(tmp_path, "scheduler:\n  plugins:\n    Score:\n      enabled:\n"
                               "      - {name: prefix-cache, weight: 1}\n") == "rust"
    assert _resolved(tmp_path, "fairness:\n  enabled: false\n") == "rust"
    assert _resolved(tmp_path, "fairness: {}\n") == "rsgi"
    (tmp_path / "keys.yaml").write_text("keys: []\n")
    assert _resolved(tmp_path, "auth:\n  apiKeysFile: keys.yaml\n") == "rsgi"
    explicit = RouterSettings(config_path="c.yaml", interface="asgi")
    assert resolve_interface(explicit) is explicit


def test_granian_socket_moves_to_a_short_dir_when_the_runtime_dir_is_deep(tmp_path) -> None:
    from kthena_router.supervisor import _with_front_socket

    shallow = RouterSettings(config_path="c.yaml", interface="rust", runtime_dir=str(tmp_path))
    assert _with_front_socket(shallow).front_socket_path == str(tmp_path / "granian.sock")
    deep = RouterSettings(config_path="c.yaml", interface="rust", runtime_dir=str(tmp_path / ("d" * 120)))
    path = _with_front_socket(deep).front_socket_path
    shutil.rmtree(os.path.dirname(path))  # the private dir the supervisor removes at exit
    assert path.endswith("/granian.sock") and len(path.encode()) <= 100
    rsgi = RouterSettings(config_path="c.yaml", interface="rsgi", runtime_dir=str(tmp_path / ("d" * 120)))
    assert _with_front_socket(rsgi) is rsgi


def test_front_threads_are_refused_when_auto_chooses_rsgi(tmp_path) -> None:
    rc = tmp_path / "router.yaml"
    rc.write_text("fairness: {}\n")
    settings = RouterSettings(config_path="c.yaml", router_config_path=str(rc), front_threads=2)
    with pytest.raises(SettingsError, match="--front-threads.*chose rsgi.*fair queuing"):
        resolve_interface(settings)


def test_front_table_switch_is_refused_off_the_rust_front(tmp_path) -> None:
    s = settings_from_args(build_parser().parse_args(["--config", "c.yaml", "--front-table", "off"]))
    s.validate()
    assert s.front_table is False
    assert settings_from_args(build_parser().parse_args(["--config", "c.yaml"])).front_table is True
    with pytest.raises(SettingsError, match="front_table.*--interface rust \\(or auto\\) only"):
        RouterSettings(config_path="c.yaml", interface="rsgi", front_table=False).validate()
    rc = tmp_path / "router.yaml"
    rc.write_text("fairness: {}\n")
    with pytest.raises(SettingsError, match="--front-table off.*chose rsgi.*fair queuing"):
        resolve_interface(RouterSettings(config_path="c.yaml", router_config_path=str(rc), front_table=False))
