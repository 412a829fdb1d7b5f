"""Settings of the experimental Rust front end (--interface rust, docs/rust-front.md)."""

from __future__ import annotations

import pytest

from kthena_router.cli import build_parser, settings_from_args
from kthena_router.settings import RouterSettings, SettingsError


def test_rust_interface_and_its_threads() -> None:
    s = settings_from_args(build_parser().parse_args(
        ["--config", "c.yaml", "--interface", "rust", "--front-threads", "2", "--runtime-dir", "/tmp/rt"]))
    s.validate()
    assert s.interface == "rust" and s.front_threads == 2
    assert s.front_socket_path == "/tmp/rt/granian.sock"


def test_front_threads_without_the_rust_interface_is_refused() -> None:
    with pytest.raises(SettingsError, match="--interface rust only"):
        RouterSettings(config_path="c.yaml", front_threads=2).validate()
    with pytest.raises(SettingsError, match="front_threads must be >= 1"):
        RouterSettings(config_path="c.yaml", interface="rust", front_threads=0).validate()
    with pytest.raises(SettingsError, match="rsgi, asgi or rust"):
        RouterSettings(config_path="c.yaml", interface="h3").validate()
