"""Kthena's routerConfiguration file -> a typed, frozen SchedulerSettings model.

Accepted shapes (both load unchanged):
  * the plain YAML Kthena's router reads (the ConfigMap key mounted as a file):
    ``scheduler: {pluginConfig: [...], plugins: {Filter: ..., Score: ...}}``, ``auth``,
    ``sessionSticky``;
  * the ConfigMap manifest itself (``kind: ConfigMap``, YAML under ``data.routerConfiguration``,
    as Kthena's Helm chart ships it); other documents of a multi-document file are skipped.

Differences from Kthena, all deliberate (Kthena logs and carries on with a silently
broken pipeline; we name the file, document and field instead):
  * unknown plugin names, a non-filter plugin under ``Filter``, duplicate entries, negative
    weights and wrongly typed arguments are errors;
  * ``session-affinity`` and ``cost-aware`` are refused when enabled (not implemented yet);
  * a configured ``auth`` (issuer, audiences, jwksUri) is refused (JWT is not enforced yet;
    an empty placeholder loads), and ``sessionSticky`` only with ``backend: memory``;
  * a Score entry without ``weight`` gets weight 1 (Kthena: 0, i.e. the plugin does nothing);
  * non-positive integer arguments fall back to the default with a warning (as Kthena, which
    is silent); unknown argument keys and unknown top-level keys are warnings (Kthena ignores
    them), so configs written for newer Kthena versions still load.
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
from ..config.traffic import DEFAULT_TRAFFIC, TrafficSettings, parse_traffic
# Same YAML and value rules as the route config (helpers take any collector with .err()).
from ..config.checks import check_list as _list, type_name as _type_name
from ..config.yaml_source import StrictLoader as _StrictLoader, decode_config_text, yaml_problem as _yaml_problem

__all__ = [
    "AuthConfig", "EmptyArgs", "KvCacheAwareArgs", "LeastLatencyArgs", "LeastRequestArgs",
    "PluginArgs", "PrefixCacheArgs", "RouterConfiguration", "SchedulerSettings", "ScorePlugin",
    "CONFIGMAP_KEY", "FILTER_PLUGINS", "SCORE_PLUGINS", "REFUSED_PLUGINS",
    "load_router_configuration_file", "load_router_configuration_bytes", "router_configuration_from_object",
]

CONFIGMAP_KEY = "routerConfiguration"  # data key of Kthena's kthena-router-config ConfigMap
SCORE_PLUGINS = ("random", "round-robin", "least-request", "least-latency", "gpu-usage",
                 "prefix-cache", "kvcache-aware", "lora-affinity")
FILTER_PLUGINS = ("least-request", "lora-affinity")  # Kthena's filter registry
REFUSED_PLUGINS = {
    "session-affinity": "session-affinity (sticky sessions by header) is not supported yet",
    "cost-aware": "cost-aware (token-budget reservations) is not supported yet",
}
_ALL_NAMES = SCORE_PLUGINS + tuple(REFUSED_PLUGINS)


# --------------------------------------------------------------------------- model


@dataclass(frozen=True, slots=True)
class EmptyArgs:
    """random, round-robin, gpu-usage, lora-affinity take no arguments."""


@dataclass(frozen=True, slots=True)
class LeastRequestArgs:
    max_waiting_requests: int = 10  # Kthena's default; the filter keeps waiting < this


@dataclass(frozen=True, slots=True)
class LeastLatencyArgs:
    ttft_tpot_weight_factor: float = 0.5  # Kthena's default; 1 = TTFT only, 0 = TPOT only


@dataclass(frozen=True, slots=True)
class PrefixCacheArgs:
    block_size_to_hash: int = 64  # bytes per block (Kthena: 64 = 16 tokens x ~4 bytes)
    # Ours: 2048 blocks = 128 KiB of prompt (Kthena: 128 = 8 KiB, too short for RAG/agents;
    # matching is one Rust call, so longer chains cost little).
    max_blocks_to_match: int = 2048
    # None (absent) = ours: each endpoint's capacity follows its engine's KV capacity.
    # Set (Kthena: 50000): that many entries per endpoint.
    max_hash_cache_size: int | None = None
    # None (absent) = ours: every matching endpoint is scored (Kthena: the top 5).
    top_k_matches: int | None = None
    # Ours: a request no endpoint holds (best match < half the prompt) scores each
    # endpoint by the room in its index instead of 0, so new prefixes go where the least
    # prefix content lives (SGLang's cache-aware router places misses on its smallest tree).
    balance_misses: bool = False


@dataclass(frozen=True, slots=True)
class KvCacheAwareArgs:
    block_size_to_hash: int = 16  # tokens per block: must equal the engines' block size
    max_blocks_to_match: int = 8192  # ours: 128k tokens at 16 (Kthena: 128 = 2k tokens)
    # Kthena's remote /tokenize ports: parsed and kept, unused (we tokenize locally).
    vllm_tokenizer_port: int | None = None
    sglang_tokenizer_port: int | None = None
    # Ours: served model name -> tokenizer.json (absolute; relative paths in the file are
    # resolved against the config file's directory; a directory means <dir>/tokenizer.json).
    tokenizers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    tokenizer_chunk_chars: int = 4096  # prefix-cache granularity of the tokenizer cache
    tokenizer_cache_tokens: int = 2_000_000  # per model and worker; ~9 bytes each (ids + chunk text)
    # Ours: the engines' PYTHONHASHSEED (vLLM's NONE_HASH); engines must run with
    # --prefix-caching-hash-algo sha256_cbor and this fixed seed for exact matching.
    hash_seed: str = "0"
    # Ours: where an endpoint publishes KV events unless its labels say otherwise
    # (kthena.io/kv-events-port, kthena.io/kv-events-replay-port); vLLM's defaults.
    kv_events_port: int = 5557
    kv_events_replay_port: int = 5558


PluginArgs = EmptyArgs | LeastRequestArgs | LeastLatencyArgs | PrefixCacheArgs | KvCacheAwareArgs


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
        """`pluginConfig` in the shape `_core.Scorer(args=...)` takes: Kthena's argument
        names, resolved values (None = absent, left out)."""
        out: dict[str, dict[str, object]] = {}
        for name, a in self.args.items():
            kv = {k: v for k, v in _kthena_items(a) if v is not None and k in _SCORER_KEYS}
            if kv:
                out[name] = kv
        return out

    def enabled(self, name: str) -> bool:
        return name in self.filters or any(s.name == name for s in self.scores)


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Kthena's ``auth`` (JWT). Not enforced yet, so only an empty placeholder loads: a
    configured issuer, audience or JWKS URI is refused at load (the router would run open)."""

    issuer: str = ""
    audiences: tuple[str, ...] = ()
    jwks_uri: str = ""


@dataclass(frozen=True, slots=True)
class RouterConfiguration:
    scheduler: SchedulerSettings
    auth: AuthConfig | None
    # Kthena's sessionSticky: only selects the store of route-level session affinity
    # (refused in ModelRoute), so the in-memory store is accepted and nothing else.
    session_sticky: Mapping[str, Any] | None
    source: str
    digest: str  # sha256 hex of the file bytes
    warnings: tuple[str, ...]
    traffic: TrafficSettings = DEFAULT_TRAFFIC  # ours: timeouts, outlier detection, admission


# Our pipeline when the file has no `scheduler` (Kthena's Helm chart default).
DEFAULT_FILTERS = ("least-request",)
DEFAULT_SCORES = (ScorePlugin("least-request", 1.0), ScorePlugin("gpu-usage", 1.0),
                  ScorePlugin("least-latency", 1.0), ScorePlugin("prefix-cache", 1.0))


# --------------------------------------------------------------------------- arguments

# Kthena argument name -> (our field, kind); kind: "pos_int" | "port" | "unit_float" | ...
_ArgSpec = dict[str, tuple[str, str]]
_ARG_SPECS: dict[str, tuple[type, _ArgSpec]] = {
    "least-request": (LeastRequestArgs, {"maxWaitingRequests": ("max_waiting_requests", "pos_int")}),
    "least-latency": (LeastLatencyArgs, {"TTFTTPOTWeightFactor": ("ttft_tpot_weight_factor", "unit_float")}),
    "prefix-cache": (PrefixCacheArgs, {
        "blockSizeToHash": ("block_size_to_hash", "pos_int"),
        "maxBlocksToMatch": ("max_blocks_to_match", "pos_int"),
        "maxHashCacheSize": ("max_hash_cache_size", "pos_int"),
        "topKMatches": ("top_k_matches", "pos_int"),
        "balanceMisses": ("balance_misses", "bool"),
    }),
    "kvcache-aware": (KvCacheAwareArgs, {
        "blockSizeToHash": ("block_size_to_hash", "pos_int"),
        "maxBlocksToMatch": ("max_blocks_to_match", "pos_int"),
        "vllmTokenizerPort": ("vllm_tokenizer_port", "port"),
        "sglangTokenizerPort": ("sglang_tokenizer_port", "port"),
        "tokenizers": ("tokenizers", "paths"),
        "tokenizerChunkChars": ("tokenizer_chunk_chars", "pos_int"),
        "tokenizerCacheTokens": ("tokenizer_cache_tokens", "pos_int"),
        "hashSeed": ("hash_seed", "str"),
        "kvEventsPort": ("kv_events_port", "port"),
        "kvEventsReplayPort": ("kv_events_replay_port", "port"),
    }),
}
for _n in ("random", "round-robin", "gpu-usage", "lora-affinity"):
    _ARG_SPECS[_n] = (EmptyArgs, {})


# Arguments the Rust Scorer reads; the others configure tokenization or are unused.
_SCORER_KEYS = frozenset(("maxWaitingRequests", "TTFTTPOTWeightFactor", "blockSizeToHash",
                          "maxBlocksToMatch", "maxHashCacheSize", "topKMatches"))


def _kthena_items(a: PluginArgs) -> list[tuple[str, Any]]:
    spec = next(s for cls, s in _ARG_SPECS.values() if cls is type(a))
    return [(k, getattr(a, f)) for k, (f, _) in spec.items()]


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
            c.warn(p, f"unknown field, ignored{_hint(str(k), known)}")
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


def _arg_value(c: _Ctx, v: Any, path: str, kind: str) -> tuple[bool, Any]:
    """(ok, value); ok=False with a warning means: use the default."""
    if kind in ("pos_int", "port"):
        if isinstance(v, bool) or not isinstance(v, int):
            c.err(path, f"must be an integer, got {_type_name(v)} {v!r}")
            return False, None
        hi = 65535 if kind == "port" else None
        if v <= 0 or (hi is not None and v > hi):
            c.warn(path, f"{v} is out of range, the default is used (as Kthena does)")
            return False, None
        return True, v
    if kind == "unit_float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            c.err(path, f"must be a number, got {_type_name(v)} {v!r}")
            return False, None
        if not 0.0 <= float(v) <= 1.0:  # NaN fails too; Kthena rejects the file here as well
            c.err(path, f"must be a finite number between 0 and 1, got {v!r}")
            return False, None
        return True, float(v)
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
    # "paths": model name -> tokenizer.json
    if not isinstance(v, dict):
        c.err(path, f"must be a mapping of model name to tokenizer.json path, got {_type_name(v)}")
        return False, None
    out: dict[str, str] = {}
    for model, p in v.items():
        if not isinstance(model, str) or not model:
            c.err(path, f"model names must be non-empty strings, got {model!r}")
            continue
        mp = f'{path}["{model}"]'
        s = _str(c, p, mp)
        if s is None:
            continue
        resolved = (c.base_dir / os.path.expanduser(s)).resolve()
        if resolved.is_dir():
            resolved = resolved / "tokenizer.json"
        out[model] = str(resolved)  # existence is checked when the tokenizer is loaded
    return True, MappingProxyType(out)


def _plugin_args(c: _Ctx, name: str, raw: Any, path: str) -> PluginArgs | None:
    cls, spec = _ARG_SPECS[name]
    m = _mapping(c, raw, path, tuple(spec))
    if m is None:
        return None
    kwargs: dict[str, Any] = {}
    for key, value in m.items():
        if key in spec and value is not None:
            our, kind = spec[key]
            ok, val = _arg_value(c, value, f"{path}.{key}", kind)
            if ok:
                kwargs[our] = val
    return cls(**kwargs)


def _scheduler(c: _Ctx, v: Any) -> SchedulerSettings | None:
    m = _mapping(c, v, "scheduler", ("pluginConfig", "plugins"))
    if m is None:
        return None
    args: dict[str, PluginArgs] = {n: cls() for n, (cls, _) in _ARG_SPECS.items()}
    raw_args: dict[str, Mapping[str, Any]] = {}
    for i, item in enumerate(_list(c, m.get("pluginConfig"), "scheduler.pluginConfig")):
        p = f"scheduler.pluginConfig[{i}]"
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
        if name not in _ARG_SPECS:
            c.err(f"{p}.name", f"unknown plugin {name!r}{_hint(name, SCORE_PLUGINS)}")
            continue
        raw = im.get("args")
        raw_args[name] = MappingProxyType(dict(raw)) if isinstance(raw, dict) else MappingProxyType({})
        a = _plugin_args(c, name, raw, f"{p}.args")
        if a is not None:
            args[name] = a

    plugins = m.get("plugins")
    if "plugins" not in m or plugins is None:
        filters, scores, f_dis, s_dis = DEFAULT_FILTERS, DEFAULT_SCORES, (), ()
    else:
        filters, scores, f_dis, s_dis = _plugins(c, plugins)
    return SchedulerSettings(filters, scores, MappingProxyType(args), MappingProxyType(raw_args), f_dis, s_dis)


def _plugins(c: _Ctx, v: Any) -> tuple[tuple[str, ...], tuple[ScorePlugin, ...], tuple[str, ...], tuple[str, ...]]:
    pm = _mapping(c, v, "scheduler.plugins", ("Filter", "Score"))
    if pm is None:
        return (), (), (), ()
    fp = "scheduler.plugins.Filter"
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

    sp = "scheduler.plugins.Score"
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


def _auth(c: _Ctx, v: Any) -> AuthConfig | None:
    if v is None:
        return None
    m = _mapping(c, v, "auth", ("issuer", "audiences", "jwksUri"))
    if m is None:
        return None
    vals: dict[str, str] = {}
    for k in ("issuer", "jwksUri"):
        x = m.get(k)
        if x is not None and not isinstance(x, str):
            c.err(f"auth.{k}", f"must be a string, got {_type_name(x)} {x!r}")
        vals[k] = x if isinstance(x, str) else ""
    auds: list[str] = []
    for i, a in enumerate(_list(c, m.get("audiences"), "auth.audiences")):
        if isinstance(a, str):
            auds.append(a)
        else:
            c.err(f"auth.audiences[{i}]", f"must be a string, got {_type_name(a)} {a!r}")
    auth = AuthConfig(vals["issuer"], tuple(a for a in auds if a), vals["jwksUri"])
    configured = [k for k, x in (("issuer", auth.issuer), ("audiences", auth.audiences),
                                 ("jwksUri", auth.jwks_uri)) if x]
    if configured:
        c.err(f"auth.{configured[0]}", "JWT authentication (auth) is not supported yet; remove the auth "
              "section (the router refuses settings it would ignore, and would run open)")
    return auth


_STICKY_BACKENDS = ("memory",)


def _session_sticky(c: _Ctx, v: Any) -> Mapping[str, Any] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        c.err("sessionSticky", f"must be a mapping, got {_type_name(v)}")
        return None
    for k in v:
        if k != "backend":
            c.err(f"sessionSticky.{k}", "is not supported yet (only sessionSticky.backend: memory is); "
                  "remove this field (the router refuses settings it would ignore)")
    backend = v.get("backend", "memory")
    if backend not in _STICKY_BACKENDS:
        c.err("sessionSticky.backend", f"only the in-memory store is supported yet, got {backend!r}; "
              "use backend: memory")
    return MappingProxyType({"backend": backend})


def router_configuration_from_object(
    obj: Any, source: str, digest: str, base_dir: str | os.PathLike[str] | None = None, document: str = "",
) -> RouterConfiguration:
    """Validate one decoded routerConfiguration mapping (not the ConfigMap wrapper)."""
    c = _Ctx(source, document, Path(base_dir) if base_dir is not None else Path.cwd())
    m = _mapping(c, obj, "", ("scheduler", "auth", "sessionSticky", "traffic"))
    scheduler: SchedulerSettings | None = None
    auth = None
    sticky = None
    traffic = DEFAULT_TRAFFIC
    if m is not None:
        scheduler = _scheduler(c, m.get("scheduler"))
        traffic = parse_traffic(c, m.get("traffic"))
        auth = _auth(c, m.get("auth"))
        sticky = _session_sticky(c, m.get("sessionSticky"))
    if c.problems or scheduler is None:
        raise ConfigError(c.problems or [ConfigProblem(source, document, "", "invalid configuration")])
    return RouterConfiguration(scheduler, auth, sticky, source, digest, tuple(c.warnings), traffic)


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

