"""Kthena's routerConfiguration file -> a typed, frozen SchedulerSettings model.

Accepted shapes (both load unchanged):
  * the plain YAML Kthena's router reads (the ConfigMap key mounted as a file):
    ``scheduler: {pluginConfig: [...], plugins: {Filter: ..., Score: ...}}``, ``auth``,
    ``sessionSticky`` (kthena_router/session/config.py: backend memory or redis);
  * the ConfigMap manifest itself (``kind: ConfigMap``, YAML under ``data.routerConfiguration``,
    as Kthena's Helm chart ships it); other documents of a multi-document file are skipped.

Differences from Kthena, all deliberate (Kthena logs and carries on with a silently
broken pipeline; we name the file, document and field instead):
  * unknown plugin names, a non-filter plugin under ``Filter``, duplicate entries, negative
    weights and wrongly typed arguments are errors;
  * ``session-affinity`` and ``cost-aware`` are refused when enabled (not implemented yet);
  * ``auth`` (Kthena's issuer, audiences, jwksUri, and ours) is parsed and enforced by
    kthena_router/identity (an empty placeholder loads and leaves auth off);
  * a Score entry without ``weight`` gets weight 1 (Kthena: 0, i.e. the plugin does nothing);
  * out-of-range arguments (Kthena silently uses the default for its integers), unknown
    argument keys and unknown fields are errors (Kthena ignores them; a setting accepted and
    then dropped is worse than a config that does not load).
  * ``random`` next to other score plugins is dropped with a warning, as in Kthena.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from ..config.errors import ConfigError, ConfigProblem
from ..config.provider_settings import DEFAULT_PROVIDER_SETTINGS, ExternalProvidersSettings, \
    parse_external_providers
from ..config.scale_from_zero import DEFAULT_SCALE_FROM_ZERO, ScaleFromZeroSettings, parse_scale_from_zero
from ..config.traffic import DEFAULT_TRAFFIC, TrafficSettings, parse_traffic
from ..ratelimit.config import DEFAULT_RATE_LIMITS, RateLimitSettings, parse_rate_limits
from ..shared_index.config import SharedIndexSettings, parse_shared_index
from ..fairness.config import FairnessSettings, parse_fairness
from ..identity.config import AuthConfig, parse_auth
from ..pd.config import DEFAULT_PD, PdSettings
# Same YAML and value rules as the route config (helpers take any collector with .err()).
from ..config.checks import check_list as _list, type_name as _type_name
from ..config.yaml_source import StrictLoader as _StrictLoader, decode_config_text, yaml_problem as _yaml_problem
from ..session.config import StickySettings, parse_session_sticky
from .exact_auto import DEFAULT_KV_EVENTS, KvEventsSettings, parse_kv_events
from .plugins import (FILTER_PLUGINS, PLUGINS, PREFIX_PLUGINS, REFUSED_PLUGINS, SCORE_PLUGINS, ArgSpec, arg_default,
                      args_class)

__all__ = [
    "AuthConfig", "EmptyArgs", "KvCacheAwareArgs", "LeastLatencyArgs", "LeastRequestArgs",
    "PluginArgs", "PrefixCacheArgs", "PrefixHashBoundedArgs", "RouterConfiguration", "SchedulerSettings", "ScorePlugin",
    "CONFIGMAP_KEY", "FILTER_PLUGINS", "SCORE_PLUGINS", "REFUSED_PLUGINS",
    "load_router_configuration_file", "load_router_configuration_bytes", "router_configuration_from_object",
]

CONFIGMAP_KEY = "routerConfiguration"  # data key of Kthena's kthena-router-config ConfigMap
# Plugin names, roles and argument specs come from the Rust registry (.plugins).
_ALL_NAMES = SCORE_PLUGINS + tuple(REFUSED_PLUGINS)


# --------------------------------------------------------------------------- model


# Resolved pluginConfig arguments. Field names, order and defaults are the registry's
# (rust/core/src/policies, documented there); args_class checks that they match. A plugin
# without a class here gets one generated from its specs.


@dataclass(frozen=True, slots=True)
class EmptyArgs:
    """random, round-robin, gpu-usage, lora-affinity take no arguments."""


@dataclass(frozen=True, slots=True)
class LeastRequestArgs:
    max_waiting_requests: int = arg_default("least-request", "maxWaitingRequests")


@dataclass(frozen=True, slots=True)
class LeastLatencyArgs:
    ttft_tpot_weight_factor: float = arg_default("least-latency", "TTFTTPOTWeightFactor")


@dataclass(frozen=True, slots=True)
class PrefixCacheArgs:
    block_size_to_hash: int = arg_default("prefix-cache", "blockSizeToHash")
    max_blocks_to_match: int = arg_default("prefix-cache", "maxBlocksToMatch")
    max_hash_cache_size: int | None = arg_default("prefix-cache", "maxHashCacheSize")
    top_k_matches: int | None = arg_default("prefix-cache", "topKMatches")
    balance_misses: bool = arg_default("prefix-cache", "balanceMisses")
    evicted_hint_slots: int = arg_default("prefix-cache", "evictedHintSlots")


@dataclass(frozen=True, slots=True)
class KvCacheAwareArgs:
    block_size_to_hash: int = arg_default("kvcache-aware", "blockSizeToHash")
    max_blocks_to_match: int = arg_default("kvcache-aware", "maxBlocksToMatch")
    vllm_tokenizer_port: int | None = arg_default("kvcache-aware", "vllmTokenizerPort")
    sglang_tokenizer_port: int | None = arg_default("kvcache-aware", "sglangTokenizerPort")
    tokenizers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    tokenizer_chunk_chars: int = arg_default("kvcache-aware", "tokenizerChunkChars")
    tokenizer_cache_tokens: int = arg_default("kvcache-aware", "tokenizerCacheTokens")
    hash_seed: str = arg_default("kvcache-aware", "hashSeed")
    kv_events_port: int = arg_default("kvcache-aware", "kvEventsPort")
    kv_events_replay_port: int = arg_default("kvcache-aware", "kvEventsReplayPort")


@dataclass(frozen=True, slots=True)
class PrefixHashBoundedArgs:
    block_size_to_hash: int = arg_default("prefix-hash-bounded", "blockSizeToHash")
    prefix_key_blocks: int = arg_default("prefix-hash-bounded", "prefixKeyBlocks")
    load_factor: float = arg_default("prefix-hash-bounded", "loadFactor")


PluginArgs = EmptyArgs | LeastRequestArgs | LeastLatencyArgs | PrefixCacheArgs | KvCacheAwareArgs | \
    PrefixHashBoundedArgs


@dataclass(frozen=True, slots=True)
class ScorePlugin:
    name: str
    weight: float


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    filters: tuple[str, ...]
    scores: tuple[ScorePlugin, ...]
    # Resolved arguments of every known plugin (defaults where absent), enabled or not.
    args: Mapping[str, PluginArgs]
    raw_args: Mapping[str, Mapping[str, Any]]  # pluginConfig as written
    filters_disabled: tuple[str, ...] = ()  # parsed, kept; no effect (as in Kthena)
    scores_disabled: tuple[str, ...] = ()

    def scorer_args(self) -> dict[str, dict[str, object]]:
        """`pluginConfig` in the shape `_core.Scorer(args=...)` takes: the numeric and boolean
        arguments by Kthena's names, resolved values (None = absent, left out). The scorer
        checks those its policies read and accepts the router's (registry reader "router")."""
        out: dict[str, dict[str, object]] = {}
        for name, a in self.args.items():
            kv = {s.name: v for s in PLUGINS[name].args
                  if s.kind in ("int", "float", "bool") and (v := getattr(a, s.field)) is not None}
            if kv:
                out[name] = kv
        return out

    def enabled(self, name: str) -> bool:
        return name in self.filters or any(s.name == name for s in self.scores)


@dataclass(frozen=True, slots=True)
class RouterConfiguration:
    scheduler: SchedulerSettings
    auth: AuthConfig | None
    # Kthena's sessionSticky: the store of route-level session affinity (kthena_router.session)
    session_sticky: StickySettings | None
    source: str
    digest: str  # sha256 hex of the file bytes
    warnings: tuple[str, ...]
    traffic: TrafficSettings = DEFAULT_TRAFFIC  # ours: timeouts, outlier detection, admission
    rate_limits: RateLimitSettings = DEFAULT_RATE_LIMITS  # ours: rateLimits (kthena_router/ratelimit)
    fairness: FairnessSettings | None = None  # ours: fair queuing (None: section absent, off)
    pd: PdSettings = DEFAULT_PD  # ours: prefill/decode pairing and hops (kthena_router/pd)
    # ours: trust store, timeouts and retries of ExternalModelProviders (config/provider_settings.py)
    external_providers: ExternalProvidersSettings = DEFAULT_PROVIDER_SETTINGS
    # ours: holding requests for a ModelServer with zero endpoints (config/scale_from_zero.py)
    scale_from_zero: ScaleFromZeroSettings = DEFAULT_SCALE_FROM_ZERO
    # ours: prefix ownership shared by router replicas through Redis (kthena_router/shared_index)
    shared_index: SharedIndexSettings | None = None
    # ours: exact KV-event matching for prefix-cache pipelines (scheduling/exact_auto.py)
    kv_events: KvEventsSettings = DEFAULT_KV_EVENTS


# Our pipeline when the file has no `scheduler` (Kthena's Helm chart default).
DEFAULT_FILTERS = ("least-request",)
DEFAULT_SCORES = (ScorePlugin("least-request", 1.0), ScorePlugin("gpu-usage", 1.0),
                  ScorePlugin("least-latency", 1.0), ScorePlugin("prefix-cache", 1.0))


# --------------------------------------------------------------------------- arguments

_DECLARED: dict[str, type] = {"least-request": LeastRequestArgs, "least-latency": LeastLatencyArgs,
                              "prefix-cache": PrefixCacheArgs, "kvcache-aware": KvCacheAwareArgs,
                              "prefix-hash-bounded": PrefixHashBoundedArgs}
_ARG_CLASSES: dict[str, type] = {
    n: args_class(n, _DECLARED.get(n)) if p.args else EmptyArgs for n, p in PLUGINS.items()}


# --------------------------------------------------------------------------- loader


@dataclass
class _Ctx:
    file: str
    document: str
    base_dir: Path
    problems: list[ConfigProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def err(self, path: str, message: str) -> None:
        self.problems.append(ConfigProblem(self.file, self.document, path, message))

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(str(ConfigProblem(self.file, self.document, path, message)))


def _hint(name: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"


def _mapping(c: _Ctx, v: Any, path: str, known: tuple[str, ...]) -> dict[str, Any] | None:
    if v is None:
        return {}
    if not isinstance(v, dict):
        c.err(path, f"must be a mapping, got {_type_name(v)}")
        return None
    for k in v:
        if k not in known:
            p = f"{path}.{k}" if path else str(k)
            # refused, not ignored: a setting the router would silently drop is worse than a
            # config that does not load (a typo, or a field of a newer Kthena we lack)
            c.err(p, f"unknown field{_hint(str(k), known)}")
    return v


def _str(c: _Ctx, v: Any, path: str) -> str | None:
    if not isinstance(v, str) or not v:
        c.err(path, f"must be a non-empty string, got {_type_name(v)} {v!r}")
        return None
    return v


def _plugin_name(c: _Ctx, v: Any, path: str, allowed: tuple[str, ...], role: str) -> str | None:
    name = _str(c, v, path)
    if name is None:
        return None
    if name in REFUSED_PLUGINS:
        c.err(path, f"plugin {name!r} is refused: {REFUSED_PLUGINS[name]}; remove it from the list")
        return None
    if name not in allowed:
        if name in _ALL_NAMES:
            c.err(path, f"{name!r} is not a {role} plugin ({role} plugins: {', '.join(allowed)})")
        else:
            c.err(path, f"unknown plugin {name!r}{_hint(name, allowed)}")
        return None
    return name


def _bounds(spec: ArgSpec) -> str:
    lo, hi = spec.min, spec.max
    if lo is not None and hi is not None:
        return f"between {lo:g} and {hi:g}"
    return f">= {lo:g}" if lo is not None else f"<= {hi:g}" if hi is not None else "finite"


def _in_range(c: _Ctx, v: int | float, path: str, spec: ArgSpec, what: str) -> bool:
    lo = spec.min if spec.min is not None else float("-inf")
    hi = spec.max if spec.max is not None else float("inf")
    if lo <= v <= hi and v == v and abs(v) != float("inf"):  # NaN and infinities fail too
        return True
    c.err(path, f"must be {what} {_bounds(spec)}, got {v!r}")
    return False


def _arg_value(c: _Ctx, v: Any, path: str, spec: ArgSpec) -> tuple[bool, Any]:
    """(ok, value) by the registry's spec; ok=False means an error was recorded."""
    kind = spec.kind
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            c.err(path, f"must be an integer, got {_type_name(v)} {v!r}")
            return False, None
        return (True, v) if _in_range(c, v, path, spec, "an integer") else (False, None)
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            c.err(path, f"must be a number, got {_type_name(v)} {v!r}")
            return False, None
        return (True, float(v)) if _in_range(c, v, path, spec, "a finite number") else (False, None)
    if kind == "bool":
        if not isinstance(v, bool):
            c.err(path, f"must be true or false, got {_type_name(v)} {v!r}")
            return False, None
        return True, v
    if kind == "str":
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            c.err(path, f"must be a string, got {_type_name(v)} {v!r}")
            return False, None
        return True, str(v)  # YAML may read a numeric seed as an int
    # "map": name -> string; with spec.paths, model name -> tokenizer.json
    what = "of model name to tokenizer.json path" if spec.paths else "of names to strings"
    if not isinstance(v, dict):
        c.err(path, f"must be a mapping {what}, got {_type_name(v)}")
        return False, None
    out: dict[str, str] = {}
    for key, p in v.items():
        if not isinstance(key, str) or not key:
            c.err(path, f"{'model names' if spec.paths else 'keys'} must be non-empty strings, got {key!r}")
            continue
        s = _str(c, p, f'{path}["{key}"]')
        if s is None:
            continue
        if spec.paths:
            resolved = (c.base_dir / os.path.expanduser(s)).resolve()
            if resolved.is_dir():
                resolved = resolved / "tokenizer.json"
            s = str(resolved)  # existence is checked when the tokenizer is loaded
        out[key] = s
    return True, MappingProxyType(out)


def _plugin_args(c: _Ctx, name: str, raw: Any, path: str) -> PluginArgs | None:
    specs = PLUGINS[name].args
    m = _mapping(c, raw, path, tuple(s.name for s in specs))
    if m is None:
        return None
    kwargs: dict[str, Any] = {}
    for key, value in m.items():
        spec = PLUGINS[name].arg(key)
        if spec is not None and value is not None:
            ok, val = _arg_value(c, value, f"{path}.{key}", spec)
            if ok:
                kwargs[spec.field] = val
    return _ARG_CLASSES[name](**kwargs)  # type: ignore[no-any-return]


def _scheduler(c: _Ctx, v: Any, path: str = "scheduler",
               default: tuple[tuple[str, ...], tuple[ScorePlugin, ...]] = (DEFAULT_FILTERS, DEFAULT_SCORES),
               ) -> SchedulerSettings | None:
    """A Kthena scheduler mapping at `path` (`scheduler`, or `pd.decode` / `pd.prefill`);
    `default`: (filters, scores) when it has no `plugins`."""
    m = _mapping(c, v, path, ("pluginConfig", "plugins"))
    if m is None:
        return None
    args: dict[str, PluginArgs] = {n: cls() for n, cls in _ARG_CLASSES.items()}
    raw_args: dict[str, Mapping[str, Any]] = {}
    for i, item in enumerate(_list(c, m.get("pluginConfig"), f"{path}.pluginConfig")):
        p = f"{path}.pluginConfig[{i}]"
        im = _mapping(c, item, p, ("name", "args"))
        if im is None:
            continue
        name = _str(c, im.get("name"), f"{p}.name")
        if name is None:
            continue
        if name in raw_args:
            c.err(f"{p}.name", f"duplicate pluginConfig for {name!r}")
            continue
        if name in REFUSED_PLUGINS:
            c.warn(f"{p}.name", f"arguments of {name!r} are ignored: {REFUSED_PLUGINS[name]}")
            continue
        if name not in PLUGINS:
            c.err(f"{p}.name", f"unknown plugin {name!r}{_hint(name, SCORE_PLUGINS)}")
            continue
        raw = im.get("args")
        raw_args[name] = MappingProxyType(dict(raw)) if isinstance(raw, dict) else MappingProxyType({})
        a = _plugin_args(c, name, raw, f"{p}.args")
        if a is not None:
            args[name] = a

    plugins = m.get("plugins")
    if "plugins" not in m or plugins is None:
        (filters, scores), f_dis, s_dis = default, (), ()
    else:
        filters, scores, f_dis, s_dis = _plugins(c, plugins, f"{path}.plugins")
    return SchedulerSettings(filters, scores, MappingProxyType(args), MappingProxyType(raw_args), f_dis, s_dis)


def _plugins(c: _Ctx, v: Any, path: str = "scheduler.plugins",
             ) -> tuple[tuple[str, ...], tuple[ScorePlugin, ...], tuple[str, ...], tuple[str, ...]]:
    pm = _mapping(c, v, path, ("Filter", "Score"))
    if pm is None:
        return (), (), (), ()
    fp = f"{path}.Filter"
    fm = _mapping(c, pm.get("Filter"), fp, ("enabled", "disabled")) or {}
    filters: list[str] = []
    for i, item in enumerate(_list(c, fm.get("enabled"), f"{fp}.enabled")):
        name = _plugin_name(c, item, f"{fp}.enabled[{i}]", FILTER_PLUGINS, "filter")
        if name is not None:
            if name in filters:
                c.err(f"{fp}.enabled[{i}]", f"duplicate filter plugin {name!r}")
            else:
                filters.append(name)
    f_dis = tuple(str(x) for x in _list(c, fm.get("disabled"), f"{fp}.disabled"))

    sp = f"{path}.Score"
    sm = _mapping(c, pm.get("Score"), sp, ("enabled", "disabled")) or {}
    scores: list[ScorePlugin] = []
    for i, item in enumerate(_list(c, sm.get("enabled"), f"{sp}.enabled")):
        p = f"{sp}.enabled[{i}]"
        im = _mapping(c, item, p, ("name", "weight"))
        if im is None:
            continue
        name = _plugin_name(c, im.get("name"), f"{p}.name", SCORE_PLUGINS, "score")
        weight = im.get("weight")
        if weight is None:
            c.warn(f"{p}.weight", "absent: weight 1 is used (Kthena would use 0, disabling the plugin)")
            weight = 1
        elif isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            c.err(f"{p}.weight", f"must be a number >= 0, got {_type_name(weight)} {weight!r}")
            continue
        if name is None:
            continue
        if any(s.name == name for s in scores):
            c.err(f"{p}.name", f"duplicate score plugin {name!r}")
            continue
        scores.append(ScorePlugin(name, float(weight)))
    if len(scores) > 1 and any(s.name == "random" for s in scores):
        c.warn(f"{sp}.enabled", "'random' is dropped: it is used alone, not mixed with other score plugins (as Kthena)")
        scores = [s for s in scores if s.name != "random"]
    s_dis: list[str] = []
    for item in _list(c, sm.get("disabled"), f"{sp}.disabled"):
        s_dis.append(str(item.get("name")) if isinstance(item, dict) else str(item))
    return tuple(filters), tuple(scores), f_dis, tuple(s_dis)




def router_configuration_from_object(
    obj: Any, source: str, digest: str, base_dir: str | os.PathLike[str] | None = None, document: str = "",
) -> RouterConfiguration:
    """Validate one decoded routerConfiguration mapping (not the ConfigMap wrapper)."""
    c = _Ctx(source, document, Path(base_dir) if base_dir is not None else Path.cwd())
    from ..pd.config_parse import parse_pd, with_kv_events  # it imports this module (the scheduler-section parser)

    m = _mapping(c, obj, "", ("scheduler", "auth", "sessionSticky", "traffic", "rateLimits", "fairness", "pd",
                              "externalProviders", "scaleFromZero", "sharedPrefixIndex", "kvEvents"))
    scheduler: SchedulerSettings | None = None
    auth = None
    sticky = None
    traffic = DEFAULT_TRAFFIC
    rate_limits = DEFAULT_RATE_LIMITS
    fairness = None
    pd = DEFAULT_PD
    external = DEFAULT_PROVIDER_SETTINGS
    scale_from_zero = DEFAULT_SCALE_FROM_ZERO
    shared_index = None
    kv_events = DEFAULT_KV_EVENTS
    if m is not None:
        scheduler = _scheduler(c, m.get("scheduler"))
        traffic = parse_traffic(c, m.get("traffic"))
        auth = parse_auth(c, m.get("auth"), c.base_dir)
        sticky = parse_session_sticky(c, m.get("sessionSticky"))
        rate_limits = parse_rate_limits(c, m.get("rateLimits"))
        fairness = parse_fairness(c, m.get("fairness"))
        pd = parse_pd(c, m.get("pd"))
        external = parse_external_providers(c, m.get("externalProviders"), c.base_dir)
        scale_from_zero = parse_scale_from_zero(c, m.get("scaleFromZero"))
        shared_index = parse_shared_index(c, m.get("sharedPrefixIndex"))
        kv_events = parse_kv_events(c, m.get("kvEvents"))
        pd = with_kv_events(pd, scheduler, kv_events)  # the PD sides' exact matching
        if shared_index is not None and scheduler is not None \
                and not any(scheduler.enabled(n) for n in PREFIX_PLUGINS):
            c.err("sharedPrefixIndex", f"needs one of {', '.join(PREFIX_PLUGINS)} in scheduler.plugins.Score.enabled "
                  "(without one no prompt is hashed, so there is nothing to share)")
    if c.problems or scheduler is None:
        raise ConfigError(c.problems or [ConfigProblem(source, document, "", "invalid configuration")])
    return RouterConfiguration(scheduler, auth, sticky, source, digest, tuple(c.warnings), traffic,
                               rate_limits=rate_limits, fairness=fairness, pd=pd, external_providers=external,
                               scale_from_zero=scale_from_zero, shared_index=shared_index,
                               kv_events=kv_events)


def _load_yaml(text: str, source: str, document: str, first_index: int = 1) -> list[Any]:
    docs: list[Any] = []
    try:
        for d in yaml.load_all(text, Loader=_StrictLoader):
            docs.append(d)
    except yaml.YAMLError as e:
        p = _yaml_problem(source, first_index + len(docs), e)
        raise ConfigError([ConfigProblem(source, document or p.document, "", p.message)]) from None
    return docs


def _is_configmap(d: Any) -> bool:
    return isinstance(d, dict) and d.get("kind") == "ConfigMap" and isinstance(d.get("data"), dict)


def load_router_configuration_bytes(
    data: bytes | str, source: str = "<string>", base_dir: str | os.PathLike[str] | None = None
) -> RouterConfiguration:
    text, digest = decode_config_text(data, source)
    docs = _load_yaml(text, source, "")
    maps = [(i, d) for i, d in enumerate(docs, start=1) if _is_configmap(d) and CONFIGMAP_KEY in d["data"]]
    if len(maps) > 1:
        raise ConfigError([ConfigProblem(source, f"document {i}", f"data.{CONFIGMAP_KEY}",
                                         "more than one ConfigMap carries a router configuration")
                           for i, _ in maps[1:]])
    if maps:
        i, cm = maps[0]
        meta = cm.get("metadata") if isinstance(cm.get("metadata"), dict) else {}
        doc = f"document {i} (ConfigMap {meta.get('namespace', 'default')}/{meta.get('name', '?')}) data.{CONFIGMAP_KEY}"
        inner = cm["data"][CONFIGMAP_KEY]
        if not isinstance(inner, str):
            raise ConfigError([ConfigProblem(source, f"document {i}", f"data.{CONFIGMAP_KEY}",
                                             f"must be a string holding YAML, got {_type_name(inner)}")])
        inner_docs = [d for d in _load_yaml(inner, source, doc) if d is not None]
        if len(inner_docs) > 1:
            raise ConfigError([ConfigProblem(source, doc, "", "must hold a single YAML document")])
        return router_configuration_from_object(inner_docs[0] if inner_docs else {}, source, digest, base_dir, doc)
    present = [(i, d) for i, d in enumerate(docs, start=1) if d is not None]
    if len(present) > 1:
        raise ConfigError([ConfigProblem(source, f"document {present[1][0]}", "",
                                         "a router configuration file holds one document "
                                         f"(or a ConfigMap with data.{CONFIGMAP_KEY})")])
    if present and _is_configmap(present[0][1]):
        raise ConfigError([ConfigProblem(source, f"document {present[0][0]}", "data",
                                         f"this ConfigMap has no {CONFIGMAP_KEY!r} key")])
    i, obj = present[0] if present else (1, {})
    return router_configuration_from_object(obj, source, digest, base_dir, f"document {i}")


def load_router_configuration_file(path: str | os.PathLike[str]) -> RouterConfiguration:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError([ConfigProblem(str(path), "", "", f"cannot read file: {e.strerror or e}")]) from None
    return load_router_configuration_bytes(data, source=str(path), base_dir=p.parent)

