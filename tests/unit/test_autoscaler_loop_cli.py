"""The autoscaler's controller flags."""

from __future__ import annotations

import argparse

import pytest

from controller.cli import _autoscaler, build_parser
from controller.manager import AutoscalerConfig


def _config(*argv: str) -> AutoscalerConfig | None:
    return _autoscaler(build_parser().parse_args(list(argv)), AutoscalerConfig)


def test_defaults_run_the_autoscaler_for_real_every_15s() -> None:
    assert _config() == AutoscalerConfig(dry_run=False, period_s=15.0, scrape_timeout_s=3.0)


def test_dry_run_and_period_and_off() -> None:
    assert _config("--autoscaler-dry-run") == AutoscalerConfig(True, 15.0, 3.0)
    assert _config("--autoscaler-dry-run=false", "--autoscaler-period", "0.5") == AutoscalerConfig(False, 0.5, 3.0)
    assert _config("--autoscaler=false") is None


def test_bad_values() -> None:
    with pytest.raises(ValueError):
        _config("--autoscaler-period", "0")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--autoscaler-dry-run=maybe"])
    assert isinstance(build_parser(), argparse.ArgumentParser)
