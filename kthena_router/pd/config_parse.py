"""Parser of the router configuration's `pd` section (the model is pd/config.py).

`pd.decode` and `pd.prefill` are Kthena scheduler mappings (`plugins` / `pluginConfig`),
parsed by the `scheduler` section's own parser, so a mistake is named like
`pd.prefill.plugins.Score.enabled[0].name`. A side without `plugins` gets its default
pipeline (DECODE_DEFAULT / PREFILL_DEFAULT), not the `scheduler` section's.
"""

from __future__ import annotations

from functools import cache
from types import MappingProxyType
from typing import Any, Protocol

from kthena_router.config.checks import check_duration, check_int, type_name
from kthena_router.config.model import DEFAULT_NAMESPACE
from kthena_router.scheduling import config as sc

from .config import DEFAULT_PD, PdServerSettings, PdSettings

__all__ = ["DECODE_DEFAULT", "PREFILL_DEFAULT", "parse_pd", "side_settings"]

# (Filter.enabled, Score.enabled) of a side written without `plugins`. Decode: the engine
# that holds the request for its whole generation should be the least loaded with the most
# free KV. Prefill: the one that already computed the prompt's prefix, among the not busy.
DECODE_DEFAULT = (("least-request",), (sc.ScorePlugin("least-request", 1.0), sc.ScorePlugin("gpu-usage", 1.0)))
PREFILL_DEFAULT = (("least-request",), (sc.ScorePlugin("prefix-cache", 1.0), sc.ScorePlugin("least-request", 1.0)))
SIDES = {"decode": DECODE_DEFAULT, "prefill": PREFILL_DEFAULT}

_TOP = ("decode", "prefill", "prefillTimeout", "minUncachedTokens", "servers")
_SERVER = ("prefillTimeout", "minUncachedTokens")
# Needs a KV-event subscription per endpoint (kv_matcher.py), wired for the `scheduler`
# section only: refused here rather than silently scored as prefix-cache.
_UNSUPPORTED = {"kvcache-aware": "not supported in the pd section yet (use prefix-cache)"}


class _Collector(Protocol):
    def err(self, path: str, message: str) -> None: ...
    def warn(self, path: str, message: str) -> None: ...


def parse_pd(c: _Collector, v: Any, path: str = "pd") -> PdSettings:
    """Validate the `pd` mapping; problems go to `c` (naming `pd.<field>`). Absent: DEFAULT_PD."""
    if v is None:
        return DEFAULT_PD
    m = sc._mapping(c, v, path, _TOP)  # type: ignore[arg-type]
    if m is None:
        return DEFAULT_PD
    sides = {}
    for side, default in SIDES.items():
        p = f"{path}.{side}"
        sides[side] = sc._scheduler(c, m.get(side), p, default)  # type: ignore[arg-type]
        _refuse_unsupported(c, m.get(side), p)
    defaults = _server(c, m, path, PdServerSettings(), only=_SERVER)
    servers: dict[str, PdServerSettings] = {}
    raw = m.get("servers")
    if raw is not None and not isinstance(raw, dict):
        c.err(f"{path}.servers", f"must be a mapping of ModelServer name to settings, got {type_name(raw)}")
        raw = None
    for name, sv in (raw or {}).items():
        p = f"{path}.servers.{name}"
        if not isinstance(name, str) or not name or name.count("/") > 1 or name.startswith("/") or name.endswith("/"):
            c.err(p, "key must be a ModelServer name or namespace/name")
            continue
        key = name if "/" in name else f"{DEFAULT_NAMESPACE}/{name}"
        if key in servers:
            c.err(p, f"duplicate entry for ModelServer {key} (\"name\" means {DEFAULT_NAMESPACE}/name)")
            continue
        if sc._mapping(c, sv, p, _SERVER) is None:  # type: ignore[arg-type]
            continue
        servers[key] = _server(c, sv or {}, p, defaults, only=_SERVER)
    return PdSettings(sides["decode"], sides["prefill"], defaults, MappingProxyType(servers))


def _server(c: _Collector, m: dict[str, Any], path: str, base: PdServerSettings,
            only: tuple[str, ...]) -> PdServerSettings:
    """`base` with prefillTimeout / minUncachedTokens of `m` applied (unset fields inherit)."""
    timeout = base.prefill_timeout_s
    if m.get("prefillTimeout") is not None:
        t = check_duration(c, m["prefillTimeout"], f"{path}.prefillTimeout")
        if t is not None and t <= 0:
            c.err(f"{path}.prefillTimeout", f"must be greater than 0, got {m['prefillTimeout']!r}")
        elif t is not None:
            timeout = t
    elif "prefillTimeout" in m:
        c.err(f"{path}.prefillTimeout", "must be a duration string like \"60s\", got null")
    tokens = base.min_uncached_tokens
    if m.get("minUncachedTokens") is not None:
        n = check_int(c, m["minUncachedTokens"], f"{path}.minUncachedTokens", 0)
        if n is not None:
            tokens = n
    elif "minUncachedTokens" in m:
        c.err(f"{path}.minUncachedTokens", "must be an integer >= 0, got null")
    return PdServerSettings(timeout, tokens)


def _refuse_unsupported(c: _Collector, raw: Any, path: str) -> None:
    plugins = raw.get("plugins") if isinstance(raw, dict) else None
    if not isinstance(plugins, dict):
        return
    for kind in ("Filter", "Score"):
        section = plugins.get(kind)
        enabled = section.get("enabled") if isinstance(section, dict) else None
        for i, item in enumerate(enabled if isinstance(enabled, list) else ()):
            name = item.get("name") if isinstance(item, dict) else item
            p = f"{path}.plugins.{kind}.enabled[{i}]" + (".name" if isinstance(item, dict) else "")
            if isinstance(name, str) and name in _UNSUPPORTED:
                c.err(p, f"{name!r} is {_UNSUPPORTED[name]}")


@cache
def _default_side(side: str) -> sc.SchedulerSettings:
    got = sc._scheduler(_Strict(), None, f"pd.{side}", SIDES[side])  # type: ignore[arg-type]
    assert got is not None
    return got


class _Strict:
    def err(self, path: str, message: str) -> None:  # pragma: no cover - the defaults are valid
        raise AssertionError(f"{path}: {message}")

    def warn(self, path: str, message: str) -> None:  # pragma: no cover
        raise AssertionError(f"{path}: {message}")


def side_settings(pd: PdSettings, side: str) -> sc.SchedulerSettings:
    """The pipeline of `side` ("decode" | "prefill"), its default when unset (DEFAULT_PD)."""
    got = pd.decode if side == "decode" else pd.prefill
    return got if got is not None else _default_side(side)
