"""Validate a router configuration file as a worker will use it: load it, then build its
scorer once (the Rust pipeline checks plugin combinations and arguments)."""

from __future__ import annotations

import os

from kthena_router._core import Scorer
from kthena_router.config.errors import ConfigError, ConfigProblem

from .config import RouterConfiguration, SchedulerSettings, load_router_configuration_file

__all__ = ["check_scheduler", "validate_router_configuration"]


def check_scheduler(sc: SchedulerSettings, source: str) -> None:
    """ConfigError naming the file and the scheduler section if Rust refuses the pipeline."""
    try:
        Scorer(list(sc.filters), [(s.name, float(s.weight)) for s in sc.scores], sc.scorer_args())
    except ValueError as exc:
        raise ConfigError([ConfigProblem(source, "", "scheduler", str(exc))]) from None


def validate_router_configuration(path: str | os.PathLike[str]) -> RouterConfiguration:
    rc = load_router_configuration_file(path)
    check_scheduler(rc.scheduler, rc.source)
    return rc
