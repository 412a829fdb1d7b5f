"""Validate a router configuration file as a worker will use it: load it, then build its
scorer once (the Rust pipeline checks plugin combinations and arguments)."""

from __future__ import annotations

import os

from kthena_router._core import Scorer
from kthena_router.config.errors import ConfigError, ConfigProblem
from kthena_router.pd.config_parse import side_settings

from .config import RouterConfiguration, SchedulerSettings, load_router_configuration_file

__all__ = ["check_scheduler", "validate_router_configuration"]


def check_scheduler(sc: SchedulerSettings, source: str, section: str = "scheduler") -> None:
    """ConfigError naming the file and the section (`scheduler`, `pd.decode`, `pd.prefill`)
    if Rust refuses the pipeline."""
    try:
        Scorer(list(sc.filters), [(s.name, float(s.weight)) for s in sc.scores], sc.scorer_args())
    except ValueError as exc:
        raise ConfigError([ConfigProblem(source, "", section, str(exc))]) from None


def validate_router_configuration(path: str | os.PathLike[str]) -> RouterConfiguration:
    rc = load_router_configuration_file(path)
    check_scheduler(rc.scheduler, rc.source)
    for side in ("decode", "prefill"):
        check_scheduler(side_settings(rc.pd, side), rc.source, f"pd.{side}")
    return rc
