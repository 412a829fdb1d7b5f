"""Parser of the router configuration's `pd` section (the model is pd/config.py).

`pd.decode` and `pd.prefill` are Kthena scheduler mappings (`plugins` / `pluginConfig`),
parsed by the `scheduler` section's own parser, so a mistake is named like
`pd.prefill.plugins.Score.enabled[0].name`. A side without `plugins` gets its default
pipeline (DECODE_DEFAULT / PREFILL_DEFAULT), not the `scheduler` section's.

Exact KV-event matching (docs/kv-exact-default.md, "PD sides"): a side that lists
`kvcache-aware`, or scores `prefix-cache` under `kvEvents.exactMatching: auto`, follows the
KV events of its own engines (pd/pairing.py). Its kvcache-aware arguments (tokenizers,
hashSeed, ...) are the side's own `pluginConfig` entry, else the `scheduler` section's, so
tokenizers are configured once (with_kv_events, applied after the whole file is parsed).
"""

from __future__ import annotations

from functools import cache
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Protocol

from kthena_router.config.checks import check_duration, check_int, type_name
from kthena_router.config.model import DEFAULT_NAMESPACE
from kthena_router.scheduling import config as sc

from kthena_router.scheduling.exact_auto import KvEventsSettings

from .config import DEFAULT_PD, PdServerSettings, PdSettings

__all__ = ["DECODE_DEFAULT", "PREFILL_DEFAULT", "parse_pd", "side_settings", "with_kv_events"]

KV_AWARE = "kvcache-aware"

# (Filter.enabled, Score.enabled) of a side written without `plugins`. Decode: the engine
# that holds the request for its whole generation should be the least loaded with the most
# free KV. Prefill: the one that already computed the prompt's prefix, among the not busy.
DECODE_DEFAULT = (("least-request",), (sc.ScorePlugin("least-request", 1.0), sc.ScorePlugin("gpu-usage", 1.0)))
PREFILL_DEFAULT = (("least-request",), (sc.ScorePlugin("prefix-cache", 1.0), sc.ScorePlugin("least-request", 1.0)))
SIDES = {"decode": DECODE_DEFAULT, "prefill": PREFILL_DEFAULT}

_TOP = ("decode", "prefill", "prefillTimeout", "minUncachedTokens", "servers")
_SERVER = ("prefillTimeout", "minUncachedTokens")


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


def with_kv_events(pd: PdSettings, scheduler: sc.SchedulerSettings | None, kv_events: KvEventsSettings) -> PdSettings:
    """`pd` with the file's kvEvents section, and each side that has no `kvcache-aware`
    pluginConfig entry of its own given the `scheduler` section's (when that has one):
    the matcher of a side (listed or automatic) then uses the same tokenizers and hash
    seed. A side without `plugins` is materialized from its default for that."""
    own = scheduler.args.get(KV_AWARE) if scheduler is not None and KV_AWARE in scheduler.raw_args else None
    sides: dict[str, sc.SchedulerSettings | None] = {"decode": pd.decode, "prefill": pd.prefill}
    if own is not None:
        for side in sides:
            got = side_settings(pd, side)
            if KV_AWARE not in got.raw_args and got.args.get(KV_AWARE) != own:
                sides[side] = replace(got, args=MappingProxyType({**got.args, KV_AWARE: own}))
    if sides == {"decode": pd.decode, "prefill": pd.prefill} and kv_events == pd.kv_events:
        return pd  # nothing to add (an absent section stays DEFAULT_PD)
    return replace(pd, decode=sides["decode"], prefill=sides["prefill"], kv_events=kv_events)
