"""YAML (Kthena's ModelRoute / ModelServer, plus our Endpoints kind) -> RouterConfig.

Every problem of a source is collected (not only the first) and raised as one
ConfigError whose lines name file, document and field. Rules mirror Kthena's CRD
validation; see configs/README.md for the format and the decisions taken here.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import ipaddress
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from .duration import parse_duration
from .errors import ConfigError, ConfigProblem
from .model import (
    DEFAULT_NAMESPACE,
    DEFAULT_PORT,
    Endpoint,
    EndpointSet,
    ModelRoute,
    ModelServer,
    PDGroup,
    RateLimit,
    RouteRule,
    RouterConfig,
    StringMatch,
    TargetModel,
    route_priority,
)

__all__ = ["ConfigError", "ConfigProblem", "load_config_file", "load_config_bytes", "config_from_objects"]

log = logging.getLogger(__name__)

KTHENA_GROUP = "networking.serving.volcano.sh"
OUR_GROUP = "router.kthena.io"
API_KTHENA = f"{KTHENA_GROUP}/v1alpha1"
API_OURS = f"{OUR_GROUP}/v1alpha1"
_KINDS = {"ModelRoute": API_KTHENA, "ModelServer": API_KTHENA, "Endpoints": API_OURS}
_LIST_KINDS = {"ModelRouteList": API_KTHENA, "ModelServerList": API_KTHENA, "EndpointsList": API_OURS}
# Kthena kinds of the networking group that the router does not serve yet: skipped.
_SKIPPED_KTHENA_KINDS = {"ExternalModelProvider"}

ANN_PREFIX = "router.kthena.io/"
ANN_TOKEN_FILE = ANN_PREFIX + "upstream-token-file"
ANN_TOKEN_ENV = ANN_PREFIX + "upstream-token-env"
ANN_TLS_SKIP = ANN_PREFIX + "tls-insecure-skip-verify"
_ANNOTATIONS = (ANN_TOKEN_FILE, ANN_TOKEN_ENV, ANN_TLS_SKIP)

MAX_LORA_ADAPTERS = 10
MAX_RULES = 16
MAX_TARGETS = 16
_RATE_UNITS = ("second", "minute", "hour", "day", "month")
_ENGINES = ("vLLM", "SGLang")
_PROTOCOLS = ("http", "https")
_KV_CONNECTORS = ("http", "lmcache", "nixl", "mooncake")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?)*\.?$"
)

_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """Safe loader (C parser when available) that rejects duplicate mapping keys,
    which PyYAML would otherwise resolve silently to the last value."""


def _construct_mapping(loader: Any, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, (str, int, float, bool)) and key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
            )
        if isinstance(key, (str, int, float, bool)):
            seen[key] = True
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)  # type: ignore[arg-type]


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


# --------------------------------------------------------------------------- entry points


def load_config_file(path: str | os.PathLike[str]) -> RouterConfig:
    """Read and validate one config file; raise ConfigError naming every problem."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError([ConfigProblem(str(path), "", "", f"cannot read file: {e.strerror or e}")]) from None
    return load_config_bytes(data, source=str(path), base_dir=p.parent)


def decode_config_text(data: bytes | str, source: str) -> tuple[str, str]:
    """(UTF-8 text, sha256 hex digest of the bytes) of a config file's content."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        return raw.decode("utf-8"), hashlib.sha256(raw).hexdigest()
    except UnicodeDecodeError as e:
        raise ConfigError([ConfigProblem(source, "", "", f"not UTF-8 text (byte {e.start})")]) from None


def load_config_bytes(
    data: bytes | str, source: str = "<string>", base_dir: str | os.PathLike[str] | None = None
) -> RouterConfig:
    """Validate config content. ``base_dir`` resolves relative token-file paths."""
    text, digest = decode_config_text(data, source)
    documents: list[Any] = []
    try:
        for doc in yaml.load_all(text, Loader=_StrictLoader):
            documents.append(doc)
    except yaml.YAMLError as e:
        raise ConfigError([_yaml_problem(source, len(documents) + 1, e)]) from None
    return config_from_objects(documents, source=source, digest=digest, base_dir=base_dir)


def _yaml_problem(source: str, doc_index: int, e: yaml.YAMLError) -> ConfigProblem:
    mark = getattr(e, "problem_mark", None)
    what = " ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return ConfigProblem(source, f"document {doc_index}", "", f"YAML syntax error at {where}{what}")


def config_from_objects(
    documents: Iterable[Any],
    source: str,
    digest: str,
    base_dir: str | os.PathLike[str] | None = None,
) -> RouterConfig:
    """Build a RouterConfig from decoded documents (YAML or, later, Kubernetes objects)."""
    b = _Builder(source, Path(base_dir) if base_dir is not None else Path.cwd())
    for index, doc in enumerate(documents, start=1):
        b.add_document(index, doc)
    return b.finish(digest)


# --------------------------------------------------------------------------- one document


@dataclass
class _Ctx:
    """Problem collector for one object; ``label`` names the document."""

    file: str
    label: str
    problems: list[ConfigProblem]

    def err(self, path: str, message: str) -> None:
        self.problems.append(ConfigProblem(self.file, self.label, path, message))


def _join(path: str, key: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}.{key}" if path else key
    return f'{path}["{key}"]'


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(v), type(v).__name__)


def _mapping(
    c: _Ctx, v: Any, path: str, known: Iterable[str], required: Iterable[str] = ()
) -> dict[str, Any] | None:
    if not isinstance(v, dict):
        c.err(path, f"must be a mapping, got {_type_name(v)}")
        return None
    known = tuple(known)
    for k in v:
        if not isinstance(k, str):
            c.err(path, f"keys must be strings, got {_type_name(k)} {k!r}")
        elif k not in known:
            hint = difflib.get_close_matches(k, known, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else f" (known fields: {', '.join(known)})"
            c.err(_join(path, k), f"unknown field{extra}")
    for k in required:
        if v.get(k) is None:
            c.err(_join(path, k), "required field is missing")
    return v


def _str(c: _Ctx, v: Any, path: str, *, allow_empty: bool = False) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        c.err(path, f"must be a string, got {_type_name(v)} {v!r}")
        return None
    if not allow_empty and not v:
        c.err(path, "must not be empty")
        return None
    return v


def _int(c: _Ctx, v: Any, path: str, lo: int, hi: int | None = None) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        c.err(path, f"must be an integer, got {_type_name(v)} {v!r}")
        return None
    if v < lo or (hi is not None and v > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        c.err(path, f"must be {bound}, got {v}")
        return None
    return v


def _enum(c: _Ctx, v: Any, path: str, allowed: tuple[str, ...]) -> str | None:
    s = _str(c, v, path)
    if s is not None and s not in allowed:
        c.err(path, f"must be one of {', '.join(allowed)}, got {s!r}")
        return None
    return s


def _list(c: _Ctx, v: Any, path: str) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        c.err(path, f"must be a list, got {_type_name(v)}")
        return []
    return v


def _labels(c: _Ctx, v: Any, path: str) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        c.err(path, f"must be a mapping of strings, got {_type_name(v)}")
        return {}
    out: dict[str, str] = {}
    for k, val in v.items():
        p = _join(path, str(k))
        if not isinstance(k, str) or not k:
            c.err(p, "label names must be non-empty strings")
        elif not isinstance(val, str):
            c.err(p, f"must be a string (quote it in YAML), got {_type_name(val)} {val!r}")
        else:
            out[k] = val
    return out


def _string_match(c: _Ctx, v: Any, path: str) -> StringMatch | None:
    m = _mapping(c, v, path, ("exact", "prefix", "regex"))
    if m is None:
        return None
    set_keys = [k for k in ("exact", "prefix", "regex") if m.get(k) is not None]
    if len(set_keys) != 1:
        c.err(path, f"exactly one of exact, prefix, regex must be set, got {len(set_keys)}")
        return None
    k = set_keys[0]
    s = _str(c, m[k], _join(path, k), allow_empty=True)
    if s is None:
        return None
    if k == "regex":
        try:
            re.compile(s)
        except re.error as e:
            c.err(_join(path, k), f"invalid regular expression {s!r}: {e}")
            return None
    return StringMatch(**{k: s})


def _duration(c: _Ctx, v: Any, path: str) -> float | None:
    if v is None:
        return None
    if not isinstance(v, str):
        c.err(path, f"must be a duration string like \"30s\" or \"1m30s\", got {_type_name(v)} {v!r}")
        return None
    try:
        seconds = parse_duration(v)
    except ValueError as e:
        c.err(path, str(e))
        return None
    if seconds < 0:
        c.err(path, f"must not be negative, got {v!r}")
        return None
    return seconds


def _timestamp(c: _Ctx, v: Any, path: str) -> datetime | None:
    if v is None:
        return None
    if isinstance(v, str):
        try:
            v = datetime.fromisoformat(v)
        except ValueError:
            c.err(path, f"must be an RFC 3339 timestamp like 2025-01-31T12:00:00Z, got {v!r}")
            return None
    if not isinstance(v, datetime):
        c.err(path, f"must be an RFC 3339 timestamp, got {_type_name(v)} {v!r}")
        return None
    return v if v.tzinfo is not None else v.replace(tzinfo=timezone.utc)


# --------------------------------------------------------------------------- the builder


@dataclass
class _Meta:
    name: str
    namespace: str
    annotations: dict[str, str]
    creation_timestamp: datetime | None


@dataclass
class _PendingRoute:
    route: ModelRoute
    ctx: _Ctx


class _Builder:
    def __init__(self, source: str, base_dir: Path):
        self.source = source
        self.base_dir = base_dir
        self.problems: list[ConfigProblem] = []
        self.warnings: list[str] = []
        self.order = 0
        self.routes: list[_PendingRoute] = []
        self.servers: dict[tuple[str, str], ModelServer] = {}
        self.endpoint_sets: list[EndpointSet] = []
        self.seen: dict[tuple[str, str, str], str] = {}  # (kind, ns, name) -> document label
        # Every named ModelServer, valid or not: an invalid one is reported once, not
        # again as "not found" by each route that targets it.
        self.server_names: set[tuple[str, str]] = set()

    # ---- documents and lists

    def add_document(self, index: int, doc: Any) -> None:
        if doc is None:  # empty document (e.g. a trailing "---")
            return
        label = f"document {index}"
        c = _Ctx(self.source, label, self.problems)
        if not isinstance(doc, dict):
            c.err("", f"must be a mapping with apiVersion and kind, got {_type_name(doc)}")
            return
        kind = doc.get("kind")
        api = doc.get("apiVersion")
        if kind == "List" or kind in _LIST_KINDS:
            want = "v1" if kind == "List" else _LIST_KINDS[kind]
            if api != want:
                c.err("apiVersion", f"must be {want!r} for kind {kind}, got {api!r}")
                return
            _mapping(c, doc, "", ("apiVersion", "kind", "metadata", "items"))
            for i, item in enumerate(_list(c, doc.get("items"), "items")):
                self.add_object(f"{label}, items[{i}]", item)
            return
        self.add_object(label, doc)

    def add_object(self, label: str, obj: Any) -> None:
        c = _Ctx(self.source, label, self.problems)
        if not isinstance(obj, dict):
            c.err("", f"must be a mapping with apiVersion and kind, got {_type_name(obj)}")
            return
        kind, api = obj.get("kind"), obj.get("apiVersion")
        if not isinstance(kind, str) or not kind:
            c.err("kind", "required field is missing (expected ModelRoute, ModelServer or Endpoints)")
            return
        if not isinstance(api, str) or not api:
            c.err("apiVersion", "required field is missing")
            return
        group = api.rpartition("/")[0]
        if kind in _KINDS:
            if api != _KINDS[kind]:
                c.label = f"{label} ({kind})"
                c.err("apiVersion", f"must be {_KINDS[kind]!r} for kind {kind}, got {api!r}")
                return
        elif group == KTHENA_GROUP and kind in _SKIPPED_KTHENA_KINDS:
            self.warnings.append(f"{self.source}: {label}: kind {kind} is not supported by this router yet; ignored")
            return
        elif group in (KTHENA_GROUP, OUR_GROUP):
            hint = difflib.get_close_matches(kind, list(_KINDS), n=1)
            extra = f" (did you mean {hint[0]}?)" if hint else ""
            c.err("kind", f"unknown kind {kind!r} for apiVersion {api!r}{extra}")
            return
        else:
            # Other Kubernetes objects (Deployment, ModelServing, ...) may share a manifest.
            self.warnings.append(f"{self.source}: {label}: {api} {kind} is not a router object; ignored")
            return

        _mapping(c, obj, "", ("apiVersion", "kind", "metadata", "spec", "status"), required=("spec",))
        meta = self._metadata(c, obj.get("metadata"))
        if meta is None:
            return
        c.label = f"{label} ({kind} {meta.namespace}/{meta.name})"
        order = self.order
        self.order += 1
        key = (kind, meta.namespace, meta.name)
        if key in self.seen:
            c.err("metadata.name", f"duplicate {kind} {meta.namespace}/{meta.name} (first defined in {self.seen[key]})")
            return
        self.seen[key] = label
        if kind == "ModelServer":
            self.server_names.add((meta.namespace, meta.name))
        spec = obj.get("spec")
        if spec is None:
            return
        if kind == "ModelRoute":
            route = self._route(c, meta, spec, order)
            if route is not None:
                self.routes.append(_PendingRoute(route, c))
        elif kind == "ModelServer":
            server = self._server(c, meta, spec)
            if server is not None:
                self.servers[server.key] = server
        else:
            eps = self._endpoints(c, meta, spec)
            if eps is not None:
                self.endpoint_sets.append(eps)

    def _metadata(self, c: _Ctx, v: Any) -> _Meta | None:
        if v is None:
            c.err("metadata", "required field is missing (metadata.name names the object)")
            return None
        if not isinstance(v, dict):
            c.err("metadata", f"must be a mapping, got {_type_name(v)}")
            return None
        # Other metadata (labels, uid, managedFields, ...) is accepted and ignored, so
        # that `kubectl get -o yaml` output loads as it is.
        before = len(c.problems)
        name = _str(c, v.get("name"), "metadata.name")
        if v.get("name") is None:
            c.err("metadata.name", "required field is missing")
        namespace = _str(c, v.get("namespace"), "metadata.namespace") or DEFAULT_NAMESPACE
        annotations = _labels(c, v.get("annotations"), "metadata.annotations")
        _labels(c, v.get("labels"), "metadata.labels")
        ts = _timestamp(c, v.get("creationTimestamp"), "metadata.creationTimestamp")
        if name is None or len(c.problems) > before:
            return None
        return _Meta(name, namespace, annotations, ts)

    # ---- ModelRoute

    def _route(self, c: _Ctx, meta: _Meta, v: Any, order: int) -> ModelRoute | None:
        spec = _mapping(c, v, "spec", ("modelName", "loraAdapters", "parentRefs", "rules", "rateLimit"))
        if spec is None:
            return None
        before = len(c.problems)
        model_name = _str(c, spec.get("modelName"), "spec.modelName", allow_empty=True) or None
        adapters: list[str] = []
        raw_adapters = _list(c, spec.get("loraAdapters"), "spec.loraAdapters")
        if len(raw_adapters) > MAX_LORA_ADAPTERS:
            c.err("spec.loraAdapters", f"at most {MAX_LORA_ADAPTERS} adapters, got {len(raw_adapters)}")
        for i, a in enumerate(raw_adapters):
            s = _str(c, a, f"spec.loraAdapters[{i}]")
            if s is not None and s not in adapters:
                adapters.append(s)
        if model_name is None and not adapters and not raw_adapters:
            c.err("spec", "modelName or loraAdapters must be set")
        parent_refs = tuple(p for p in _list(c, spec.get("parentRefs"), "spec.parentRefs") if isinstance(p, dict))
        raw_rules = spec.get("rules")
        rules: list[RouteRule] = []
        if raw_rules is None:
            c.err("spec.rules", "required field is missing (at least one rule)")
        else:
            lst = _list(c, raw_rules, "spec.rules")
            if isinstance(raw_rules, list) and not lst:
                c.err("spec.rules", "at least one rule is required")
            if len(lst) > MAX_RULES:
                c.err("spec.rules", f"at most {MAX_RULES} rules, got {len(lst)}")
            for i, r in enumerate(lst):
                rule = self._rule(c, r, f"spec.rules[{i}]")
                if rule is not None:
                    rules.append(rule)
        rate_limit = self._rate_limit(c, spec.get("rateLimit"), "spec.rateLimit")
        if len(c.problems) > before:
            return None
        return ModelRoute(
            namespace=meta.namespace,
            name=meta.name,
            model_name=model_name,
            lora_adapters=tuple(adapters),
            rules=tuple(rules),
            rate_limit=rate_limit,
            creation_timestamp=meta.creation_timestamp,
            order=order,
            parent_refs=parent_refs,
        )

    def _rule(self, c: _Ctx, v: Any, path: str) -> RouteRule | None:
        r = _mapping(c, v, path, ("name", "modelMatch", "targetModels"), required=("targetModels",))
        if r is None:
            return None
        before = len(c.problems)
        name = _str(c, r.get("name"), _join(path, "name"), allow_empty=True) or ""
        headers: dict[str, StringMatch] = {}
        uri: StringMatch | None = None
        body_model: str | None = None
        mm_path = _join(path, "modelMatch")
        mm = r.get("modelMatch")
        if mm is not None and _mapping(c, mm, mm_path, ("headers", "uri", "body")) is not None:
            raw_headers = mm.get("headers")
            hp = _join(mm_path, "headers")
            if raw_headers is not None:
                if not isinstance(raw_headers, dict):
                    c.err(hp, f"must be a mapping of header name to match, got {_type_name(raw_headers)}")
                else:
                    for hname, hm in raw_headers.items():
                        p = _join(hp, str(hname))
                        if not isinstance(hname, str) or not hname:
                            c.err(p, "header names must be non-empty strings")
                            continue
                        sm = _string_match(c, hm, p)
                        if hname.lower() in headers:
                            c.err(p, "duplicate header name (header names are case-insensitive)")
                        elif sm is not None:
                            headers[hname.lower()] = sm
            if mm.get("uri") is not None:
                uri = _string_match(c, mm["uri"], _join(mm_path, "uri"))
            if mm.get("body") is not None:
                bp = _join(mm_path, "body")
                body = _mapping(c, mm["body"], bp, ("model",))
                if body is not None:
                    body_model = _str(c, body.get("model"), _join(bp, "model"))
        targets = self._targets(c, r.get("targetModels"), _join(path, "targetModels"))
        if len(c.problems) > before or targets is None:
            return None
        return RouteRule(name=name, headers=headers, uri=uri, body_model=body_model, targets=targets)

    def _targets(self, c: _Ctx, v: Any, path: str) -> tuple[TargetModel, ...] | None:
        if v is None:
            return None  # reported as a missing required field
        lst = _list(c, v, path)
        if not isinstance(v, list):
            return None
        if not 1 <= len(lst) <= MAX_TARGETS:
            c.err(path, f"must have 1 to {MAX_TARGETS} targets, got {len(lst)}")
            return None
        out: list[TargetModel] = []
        for j, t in enumerate(lst):
            tp = f"{path}[{j}]"
            m = _mapping(c, t, tp, ("modelServerName", "weight"), required=("modelServerName",))
            if m is None:
                continue
            name = _str(c, m.get("modelServerName"), _join(tp, "modelServerName"))
            weight = _int(c, m.get("weight"), _join(tp, "weight"), 0, 100)
            if name is not None and (m.get("weight") is None or weight is not None):
                out.append(TargetModel(name, weight))
        if len(out) != len(lst):
            return None
        weighted = [t.weight is not None for t in out]
        if any(weighted) and not all(weighted):
            missing = weighted.index(False)
            c.err(
                f"{path}[{missing}].weight",
                "weights must be set on all targets of a rule or on none "
                "(Kubernetes would default a missing weight to 100: write it explicitly)",
            )
            return None
        if all(weighted) and sum(t.weight or 0 for t in out) == 0:
            c.err(path, "all weights are 0: this rule could never route a request")
            return None
        return tuple(out)

    def _rate_limit(self, c: _Ctx, v: Any, path: str) -> RateLimit | None:
        if v is None:
            return None
        m = _mapping(c, v, path, ("inputTokensPerUnit", "outputTokensPerUnit", "unit", "global"))
        if m is None:
            return None
        inp = _int(c, m.get("inputTokensPerUnit"), _join(path, "inputTokensPerUnit"), 1, 2**32 - 1)
        out = _int(c, m.get("outputTokensPerUnit"), _join(path, "outputTokensPerUnit"), 1, 2**32 - 1)
        unit = "second" if m.get("unit") is None else _enum(c, m.get("unit"), _join(path, "unit"), _RATE_UNITS)
        redis_addr: str | None = None
        if m.get("global") is not None:
            gp = _join(path, "global")
            g = _mapping(c, m["global"], gp, ("redis",))
            if g is not None and g.get("redis") is not None:
                rp = _join(gp, "redis")
                r = _mapping(c, g["redis"], rp, ("address",), required=("address",))
                if r is not None:
                    redis_addr = _str(c, r.get("address"), _join(rp, "address"))
        return RateLimit(unit=unit or "second", input_tokens_per_unit=inp, output_tokens_per_unit=out,
                         global_redis_address=redis_addr)

    # ---- ModelServer

    def _server(self, c: _Ctx, meta: _Meta, v: Any) -> ModelServer | None:
        spec = _mapping(
            c, v, "spec",
            ("model", "inferenceEngine", "workloadSelector", "workloadPort", "trafficPolicy", "kvConnector"),
            required=("inferenceEngine", "workloadSelector"),
        )
        if spec is None:
            return None
        before = len(c.problems)
        model = _str(c, spec.get("model"), "spec.model")
        if model is not None and len(model) > 256:
            c.err("spec.model", "at most 256 characters")
        engine = _enum(c, spec.get("inferenceEngine"), "spec.inferenceEngine", _ENGINES)
        match_labels: dict[str, str] = {}
        pd_group: PDGroup | None = None
        if spec.get("workloadSelector") is not None:
            ws = _mapping(c, spec["workloadSelector"], "spec.workloadSelector", ("matchLabels", "pdGroup"))
            if ws is not None:
                match_labels = _labels(c, ws.get("matchLabels"), "spec.workloadSelector.matchLabels")
                if ws.get("pdGroup") is not None:
                    pp = "spec.workloadSelector.pdGroup"
                    pg = _mapping(c, ws["pdGroup"], pp, ("groupKey", "prefillLabels", "decodeLabels"),
                                  required=("groupKey", "prefillLabels", "decodeLabels"))
                    if pg is not None:
                        gk = _str(c, pg.get("groupKey"), pp + ".groupKey")
                        pd_group = PDGroup(
                            group_key=gk or "",
                            prefill_labels=_labels(c, pg.get("prefillLabels"), pp + ".prefillLabels"),
                            decode_labels=_labels(c, pg.get("decodeLabels"), pp + ".decodeLabels"),
                        )
        port, protocol = DEFAULT_PORT, "http"
        if spec.get("workloadPort") is not None:
            wp = _mapping(c, spec["workloadPort"], "spec.workloadPort", ("port", "protocol"), required=("port",))
            if wp is not None:
                port = _int(c, wp.get("port"), "spec.workloadPort.port", 1, 65535) or port
                if wp.get("protocol") is not None:
                    protocol = _enum(c, wp["protocol"], "spec.workloadPort.protocol", _PROTOCOLS) or protocol
        timeout_s: float | None = None
        attempts: int | None = None  # None: no retry policy given (router default applies)
        interval = 0.1
        if spec.get("trafficPolicy") is not None:
            tp = _mapping(c, spec["trafficPolicy"], "spec.trafficPolicy", ("timeout", "retry"))
            if tp is not None:
                timeout_s = _duration(c, tp.get("timeout"), "spec.trafficPolicy.timeout")
                if tp.get("retry") is not None:
                    rp = "spec.trafficPolicy.retry"
                    r = _mapping(c, tp["retry"], rp, ("attempts", "retryInterval"))
                    if r is not None:
                        attempts = _int(c, r.get("attempts"), rp + ".attempts", 0)
                        iv = _duration(c, r.get("retryInterval"), rp + ".retryInterval")
                        interval = interval if iv is None else iv
        kv: str | None = None
        if spec.get("kvConnector") is not None:
            kp = "spec.kvConnector"
            k = _mapping(c, spec["kvConnector"], kp, ("type",))
            if k is not None:
                kv = "http" if k.get("type") is None else _enum(c, k["type"], kp + ".type", _KV_CONNECTORS)
        headers, skip_verify = self._annotations(c, meta.annotations)
        if len(c.problems) > before or engine is None:
            return None
        return ModelServer(
            namespace=meta.namespace,
            name=meta.name,
            model=model,
            inference_engine=engine,
            match_labels=match_labels,
            pd_group=pd_group,
            port=port,
            protocol=protocol,
            timeout_s=timeout_s,
            retry_attempts=attempts,
            retry_interval_s=interval,
            upstream_headers=headers,
            tls_insecure_skip_verify=skip_verify,
            kv_connector=kv,
            creation_timestamp=meta.creation_timestamp,
        )

    def _annotations(self, c: _Ctx, ann: Mapping[str, str]) -> tuple[dict[str, str], bool]:
        for k in ann:
            if k.startswith(ANN_PREFIX) and k not in _ANNOTATIONS:
                hint = difflib.get_close_matches(k, _ANNOTATIONS, n=1)
                extra = f" (did you mean {hint[0]!r}?)" if hint else f" (known: {', '.join(_ANNOTATIONS)})"
                c.err(_join("metadata.annotations", k), f"unknown router annotation{extra}")
        token: str | None = None
        f_path, env = ann.get(ANN_TOKEN_FILE), ann.get(ANN_TOKEN_ENV)
        if f_path is not None and env is not None:
            c.err(_join("metadata.annotations", ANN_TOKEN_ENV), f"set only one of {ANN_TOKEN_FILE} and {ANN_TOKEN_ENV}")
        elif f_path is not None:
            p = _join("metadata.annotations", ANN_TOKEN_FILE)
            full = Path(f_path) if os.path.isabs(f_path) else self.base_dir / f_path
            try:
                token = full.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as e:
                c.err(p, f"cannot read token file {str(full)!r}: {getattr(e, 'strerror', None) or e}")
            else:
                if not token:
                    c.err(p, f"token file {str(full)!r} is empty")
                    token = None
        elif env is not None:
            p = _join("metadata.annotations", ANN_TOKEN_ENV)
            token = os.environ.get(env)
            if not token:
                c.err(p, f"environment variable {env!r} is not set or empty")
                token = None
        if token is not None and ("\n" in token or "\r" in token):
            c.err(_join("metadata.annotations", ANN_TOKEN_FILE if f_path else ANN_TOKEN_ENV),
                  "token must be a single line")
            token = None
        skip = False
        raw_skip = ann.get(ANN_TLS_SKIP)
        if raw_skip is not None:
            if raw_skip.lower() not in ("true", "false"):
                c.err(_join("metadata.annotations", ANN_TLS_SKIP), f'must be "true" or "false", got {raw_skip!r}')
            skip = raw_skip.lower() == "true"
        return ({"Authorization": f"Bearer {token}"} if token else {}), skip

    # ---- Endpoints (our kind)

    def _endpoints(self, c: _Ctx, meta: _Meta, v: Any) -> EndpointSet | None:
        spec = _mapping(c, v, "spec", ("endpoints",), required=("endpoints",))
        if spec is None:
            return None
        before = len(c.problems)
        out: list[Endpoint] = []
        for i, e in enumerate(_list(c, spec.get("endpoints"), "spec.endpoints")):
            p = f"spec.endpoints[{i}]"
            m = _mapping(c, e, p, ("address", "port", "labels"), required=("address",))
            if m is None:
                continue
            addr = _str(c, m.get("address"), p + ".address")
            if addr is not None and not _valid_address(addr):
                c.err(p + ".address", f"must be an IP address or DNS name without scheme or port, got {addr!r}")
                addr = None
            port = _int(c, m.get("port"), p + ".port", 1, 65535)
            labels = _labels(c, m.get("labels"), p + ".labels")
            if addr is not None:
                out.append(Endpoint(address=addr, port=port, labels=labels))
        if len(c.problems) > before:
            return None
        return EndpointSet(namespace=meta.namespace, name=meta.name, endpoints=tuple(out))

    # ---- cross-document checks

    def finish(self, digest: str) -> RouterConfig:
        for pr in self.routes:
            r = pr.route
            for i, rule in enumerate(r.rules):
                for j, t in enumerate(rule.targets):
                    if (r.namespace, t.model_server_name) not in self.server_names:
                        pr.ctx.err(
                            f"spec.rules[{i}].targetModels[{j}].modelServerName",
                            f"ModelServer {t.model_server_name!r} not found in namespace {r.namespace!r}",
                        )
        if self.problems:
            raise ConfigError(self.problems)
        routes = tuple(pr.route for pr in self.routes)
        cfg = RouterConfig(
            routes=routes,
            servers=dict(self.servers),
            endpoint_sets=tuple(self.endpoint_sets),
            source=self.source,
            digest=digest,
        )
        warnings = self.warnings + _conflict_warnings(routes)
        for s in cfg.servers.values():
            if not cfg.endpoints_of(s):
                warnings.append(
                    f"{self.source}: ModelServer {s.namespace}/{s.name}: no endpoint matches "
                    f"workloadSelector.matchLabels {s.match_labels}"
                )
        return dataclasses.replace(cfg, warnings=tuple(warnings))


def _valid_address(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr)
        return True
    except ValueError:
        return bool(_HOSTNAME.match(addr)) and not addr.replace(".", "").isdigit()


def _conflict_warnings(routes: tuple[ModelRoute, ...]) -> list[str]:
    """Describe names claimed by more than one route (the order RouteTable tries them)."""
    claims: dict[str, list[ModelRoute]] = {}
    lora_claims: dict[str, list[ModelRoute]] = {}
    for r in routes:
        if r.model_name:
            claims.setdefault(r.model_name, []).append(r)
        for a in r.lora_adapters:
            lora_claims.setdefault(a, []).append(r)
    out: list[str] = []
    for kind, table in (("model", claims), ("LoRA adapter", lora_claims)):
        for name, rs in table.items():
            if len(rs) > 1:
                rs = sorted(rs, key=route_priority)
                order = ", ".join(f"{r.namespace}/{r.name}" for r in rs)
                out.append(f"{kind} {name!r} is claimed by several ModelRoutes; tried in this order: {order}")
    for name, rs in lora_claims.items():
        if name in claims:
            out.append(
                f"{name!r} is a modelName of {', '.join(f'{r.namespace}/{r.name}' for r in claims[name])} and a "
                f"LoRA adapter of {', '.join(f'{r.namespace}/{r.name}' for r in rs)}: the modelName routes win"
            )
    return out
