"""`--interface auto` (the default): which interface serves the public port.

The Rust front end relays completions without Python per chunk, but a request it cannot
take on its fast path pays a second hop (front -> granian's unix socket). Auth and fair
queuing send every request down that path, so a router configured with either at start
runs granian on the port directly (rsgi); every other configuration gets the front
(docs/rust-front.md, "The default").
"""

from __future__ import annotations

import logging

import msgspec

from kthena_router.settings import RouterSettings, SettingsError

log = logging.getLogger(__name__)


def choose(auth: bool, fairness: bool) -> tuple[str, str]:
    """(interface, why) for a router configuration with or without auth / fair queuing."""
    if auth:
        return "rsgi", "auth is configured (every request would take the Rust front's slow path)"
    if fairness:
        return "rsgi", "fair queuing is configured (every request would take the Rust front's slow path)"
    return "rust", "no auth and no fair queuing"


def resolve_interface(settings: RouterSettings) -> RouterSettings:
    """Settings with `auto` replaced by the interface the startup router configuration suits.
    A later reload that adds auth or fair queuing keeps the interface (correct, at the slow
    path's cost); restart to change it."""
    if settings.interface != "auto":
        return settings
    auth = fairness = False
    if settings.router_config_path:
        from kthena_router.scheduling.config import load_router_configuration_file

        rc = load_router_configuration_file(settings.router_config_path)
        auth, fairness = rc.auth is not None, rc.fairness is not None and rc.fairness.enabled
    interface, why = choose(auth, fairness)
    if interface != "rust" and settings.front_threads != 1:  # never accepted and then ignored
        raise SettingsError(f"--front-threads applies to the Rust front end, and --interface auto chose "
                            f"{interface}: {why}")
    if interface != "rust" and not settings.front_table:
        raise SettingsError(f"--front-table off applies to the Rust front end, and --interface auto chose "
                            f"{interface}: {why}")
    log.info("--interface auto: %s (%s)", interface, why)
    return msgspec.structs.replace(settings, interface=interface)
