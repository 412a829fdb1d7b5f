"""The router configuration's `sessionSticky` section -> StickySettings.

Kthena's key is `backend` (memory | redis); it only chooses the store of the route-level
affinity (ModelRoute.spec.sessionSticky). Ours: the memory table's size, the Redis
connection, and `routes`: per-route settings keyed "namespace/name" or "name", with the
fields of ModelRoute.spec.sessionSticky. They override the route's own (Kthena's CRD has no
sessionSticky, so in Kubernetes mode this is where it is set). A setting that would be
ignored with the chosen backend is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config.checks import ErrorSink, check_duration, check_enum, check_int, check_mapping, check_str, join_path
from ..config.model import ModelRoute, SessionSticky
from ..config.model_route import parse_route_session_sticky

__all__ = ["DEFAULT_STICKY", "RedisStoreSettings", "StickySettings", "parse_session_sticky"]

_BACKENDS = ("memory", "redis")
_REDIS_KEYS = ("address", "password", "db", "keyPrefix", "timeout", "retryAfter")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_ROUTE_KEY = re.compile(rf"^(?:{_DNS_LABEL}/)?[a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class RedisStoreSettings:
    host: str
    port: int
    password: str | None = None
    db: int = 0
    key_prefix: str = "kthena:session:"
    timeout_s: float = 0.1  # connect and each command; past it the request is scheduled normally
    retry_after_s: float = 1.0  # after a failure Redis is left alone this long (no per-request timeouts)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class StickySettings:
    backend: str = "memory"
    max_entries: int = 100_000  # memory: the table's size, one table per router (all its workers)
    redis: RedisStoreSettings | None = None
    # Per-route settings, "namespace/name" or "name" -> the route's sessionSticky (override).
    routes: Mapping[str, SessionSticky] = field(default_factory=dict)

    @property
    def store_key(self) -> tuple[str, int, RedisStoreSettings | None]:
        """What the store is built from (a change of `routes` keeps the pins)."""
        return (self.backend, self.max_entries, self.redis)

    def for_route(self, route: ModelRoute) -> SessionSticky | None:
        """The route's effective settings: "namespace/name", then "name", then its own spec."""
        if self.routes:
            found = self.routes.get(f"{route.namespace}/{route.name}") or self.routes.get(route.name)
            if found is not None:
                return found
        return route.session_sticky


DEFAULT_STICKY = StickySettings()


def parse_session_sticky(c: ErrorSink, v: Any, path: str = "sessionSticky") -> StickySettings | None:
    """Validate the section; problems go to `c`. None when absent (the defaults apply)."""
    if v is None:
        return None
    m = check_mapping(c, v, path, ("backend", "maxEntries", "redis", "routes"))
    if m is None:
        return None
    backend = "memory" if m.get("backend") is None else check_enum(c, m["backend"], join_path(path, "backend"),
                                                                    _BACKENDS)
    max_entries = check_int(c, m.get("maxEntries"), join_path(path, "maxEntries"), 16, 1 << 26)
    redis: RedisStoreSettings | None = None
    if backend == "redis":
        if m.get("maxEntries") is not None:
            c.err(join_path(path, "maxEntries"), "applies to backend: memory only (Redis bounds itself); remove it")
        if m.get("redis") is None:
            c.err(join_path(path, "redis"), "required with backend: redis ({address: host:port})")
        else:
            redis = _redis(c, m["redis"], join_path(path, "redis"))
    elif backend == "memory" and m.get("redis") is not None:
        c.err(join_path(path, "redis"), "is only used with backend: redis; set backend: redis or remove it")
    routes = _routes(c, m.get("routes"), join_path(path, "routes"))
    if backend is None:
        return None
    return StickySettings(backend, max_entries or DEFAULT_STICKY.max_entries, redis, routes)


def _routes(c: ErrorSink, v: Any, path: str) -> dict[str, SessionSticky]:
    """{"namespace/name" | "name": {sources: [...], sessionAffinitySeconds: N}}"""
    if v is None:
        return {}
    if not isinstance(v, dict):
        c.err(path, f"must be a mapping of route (\"namespace/name\" or \"name\") to its sessionSticky, "
                    f"got {type(v).__name__}")
        return {}
    out: dict[str, SessionSticky] = {}
    for key, spec in v.items():
        p = f"{path}[{key!r}]"
        if not isinstance(key, str) or not _ROUTE_KEY.match(key):
            c.err(p, "the key must be a ModelRoute's \"namespace/name\" or \"name\" (lower-case DNS names)")
            continue
        if spec is None:
            c.err(p, "needs sources (the fields of ModelRoute.spec.sessionSticky); remove the entry to use "
                     "the route's own setting")
            continue
        sticky = parse_route_session_sticky(c, spec, p)
        if sticky is not None:
            out[key] = sticky
    return out


def _redis(c: ErrorSink, v: Any, path: str) -> RedisStoreSettings | None:
    """Problems go to `c` (the caller then refuses the file); values left unset take defaults."""
    m = check_mapping(c, v, path, _REDIS_KEYS, required=("address",))
    if m is None:
        return None
    addr = check_str(c, m.get("address"), join_path(path, "address"))
    if addr is None:
        return None
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        c.err(join_path(path, "address"), f"must be host:port, got {addr!r}")
        return None
    timeout = check_duration(c, m.get("timeout"), join_path(path, "timeout"))
    if timeout is not None and not 0 < timeout <= 10:
        c.err(join_path(path, "timeout"), "must be more than 0 and at most 10s")
    retry_after = check_duration(c, m.get("retryAfter"), join_path(path, "retryAfter"))
    db = check_int(c, m.get("db"), join_path(path, "db"), 0, 15)
    prefix = check_str(c, m.get("keyPrefix"), join_path(path, "keyPrefix"))
    d = RedisStoreSettings(host.strip("[]"), int(port))
    return RedisStoreSettings(
        d.host, d.port, check_str(c, m.get("password"), join_path(path, "password")),
        d.db if db is None else db, d.key_prefix if prefix is None else prefix,
        d.timeout_s if timeout is None else timeout, d.retry_after_s if retry_after is None else retry_after)
