"""One ModelRoute document (Kthena's CRD rules) -> ModelRoute."""

from __future__ import annotations

import re
from typing import Any

from .checks import (
    Ctx,
    ErrorSink,
    check_enum,
    check_int,
    check_list,
    check_mapping,
    check_str,
    check_string_match,
    join_path,
    type_name,
)
from ..api.modelroute import MODEL_ROUTE, RATE_UNITS, SESSION_SOURCE_TYPES
from ..api.schema import node_at
from .metadata import ObjectMeta
from .model import DEFAULT_SESSION_AFFINITY_SECONDS, ModelRoute, RateLimit, RouteRule, SessionKeySource, SessionSticky, StringMatch, TargetModel

__all__ = ["MAX_LORA_ADAPTERS", "MAX_RULES", "MAX_TARGETS", "SESSION_SOURCE_TYPES", "parse_model_route"]

# Field names, enums and bounds come from the API declarations (kthena_router/api), the source
# of the CRD too; tests/unit/test_api_drift.py checks that this parser applies exactly those rules.
_SPEC = MODEL_ROUTE.spec
MAX_LORA_ADAPTERS = node_at(_SPEC, "loraAdapters").max_items or 0
MAX_RULES = node_at(_SPEC, "rules").max_items or 0
MAX_TARGETS = node_at(_SPEC, "rules[].targetModels").max_items or 0
_RATE_UNITS = RATE_UNITS
MAX_SESSION_SOURCES = node_at(_SPEC, "sessionSticky.sources").max_items or 0  # Kthena's proposal
_SPEC_FIELDS = _SPEC.known()
_PARENT_REF = node_at(_SPEC, "parentRefs[]")


def parse_model_route(c: Ctx, meta: ObjectMeta, v: Any, order: int) -> ModelRoute | None:
    spec = check_mapping(c, v, "spec", _SPEC_FIELDS)
    if spec is None:
        return None
    before = len(c.problems)
    model_name = check_str(c, spec.get("modelName"), "spec.modelName", allow_empty=True) or None
    adapters: list[str] = []
    raw_adapters = check_list(c, spec.get("loraAdapters"), "spec.loraAdapters")
    if len(raw_adapters) > MAX_LORA_ADAPTERS:
        c.err("spec.loraAdapters", f"at most {MAX_LORA_ADAPTERS} adapters, got {len(raw_adapters)}")
    for i, a in enumerate(raw_adapters):
        s = check_str(c, a, f"spec.loraAdapters[{i}]")
        if s is not None and s not in adapters:
            adapters.append(s)
    if model_name is None and not adapters and not raw_adapters:
        c.err("spec", "modelName or loraAdapters must be set")
    parent_refs = tuple(p for i, p in enumerate(check_list(c, spec.get("parentRefs"), "spec.parentRefs"))
                        if _parent_ref(c, p, f"spec.parentRefs[{i}]"))
    raw_rules = spec.get("rules")
    rules: list[RouteRule] = []
    if raw_rules is None:
        c.err("spec.rules", "required field is missing (at least one rule)")
    else:
        lst = check_list(c, raw_rules, "spec.rules")
        if isinstance(raw_rules, list) and not lst:
            c.err("spec.rules", "at least one rule is required")
        if len(lst) > MAX_RULES:
            c.err("spec.rules", f"at most {MAX_RULES} rules, got {len(lst)}")
        for i, r in enumerate(lst):
            rule = _rule(c, r, f"spec.rules[{i}]")
            if rule is not None:
                rules.append(rule)
    rate_limit = _rate_limit(c, spec.get("rateLimit"), "spec.rateLimit")  # enforced by kthena_router.ratelimit
    sticky = parse_route_session_sticky(c, spec.get("sessionSticky"), "spec.sessionSticky")
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
        session_sticky=sticky,
    )


def _parent_ref(c: Ctx, v: Any, path: str) -> bool:
    """A Gateway API parent reference: checked as the CRD checks it (no effect in file mode)."""
    m = check_mapping(c, v, path, _PARENT_REF.known(), required=_PARENT_REF.required())
    if m is None:
        return False
    before = len(c.problems)
    for f in _PARENT_REF.properties:
        n, fp = f.node, join_path(path, f.name)
        if n.type == "integer":
            check_int(c, m.get(f.name), fp, n.minimum or 0, n.maximum)
            continue
        s = check_str(c, m.get(f.name), fp, allow_empty=True)
        if s is None:
            continue
        if n.min_length is not None and len(s) < n.min_length or n.max_length is not None and len(s) > n.max_length:
            c.err(fp, f"must be {n.min_length or 0} to {n.max_length} characters long")
        elif n.pattern is not None and not re.search(n.pattern, s):
            c.err(fp, f"must match {n.pattern}")
    return len(c.problems) == before


def _rule(c: Ctx, v: Any, path: str) -> RouteRule | None:
    r = check_mapping(c, v, path, ("name", "modelMatch", "targetModels"), required=("targetModels",))
    if r is None:
        return None
    before = len(c.problems)
    name = check_str(c, r.get("name"), join_path(path, "name"), allow_empty=True) or ""
    headers: dict[str, StringMatch] = {}
    uri: StringMatch | None = None
    body_model: str | None = None
    mm_path = join_path(path, "modelMatch")
    mm = r.get("modelMatch")
    if mm is not None and check_mapping(c, mm, mm_path, ("headers", "uri", "body")) is not None:
        raw_headers = mm.get("headers")
        hp = join_path(mm_path, "headers")
        if raw_headers is not None:
            if not isinstance(raw_headers, dict):
                c.err(hp, f"must be a mapping of header name to match, got {type_name(raw_headers)}")
            else:
                for hname, hm in raw_headers.items():
                    p = join_path(hp, str(hname))
                    if not isinstance(hname, str) or not hname:
                        c.err(p, "header names must be non-empty strings")
                        continue
                    sm = check_string_match(c, hm, p)
                    if hname.lower() in headers:
                        c.err(p, "duplicate header name (header names are case-insensitive)")
                    elif sm is not None:
                        headers[hname.lower()] = sm
        if mm.get("uri") is not None:
            uri = check_string_match(c, mm["uri"], join_path(mm_path, "uri"))
        if mm.get("body") is not None:
            bp = join_path(mm_path, "body")
            body = check_mapping(c, mm["body"], bp, ("model",))
            if body is not None:
                body_model = check_str(c, body.get("model"), join_path(bp, "model"))
    targets = _targets(c, r.get("targetModels"), join_path(path, "targetModels"))
    if len(c.problems) > before or targets is None:
        return None
    return RouteRule(name=name, headers=headers, uri=uri, body_model=body_model, targets=targets)


def _targets(c: Ctx, v: Any, path: str) -> tuple[TargetModel, ...] | None:
    if v is None:
        return None  # reported as a missing required field
    lst = check_list(c, v, path)
    if not isinstance(v, list):
        return None
    if not 1 <= len(lst) <= MAX_TARGETS:
        c.err(path, f"must have 1 to {MAX_TARGETS} targets, got {len(lst)}")
        return None
    out: list[TargetModel] = []
    for j, t in enumerate(lst):
        tp = f"{path}[{j}]"
        m = check_mapping(c, t, tp, ("modelServerName", "externalModelProviderName", "weight"))
        if m is None:
            continue
        # Kthena's CEL rule: exactly one of the two names, non-empty
        server = check_str(c, m.get("modelServerName"), join_path(tp, "modelServerName"), allow_empty=True)
        ext = check_str(c, m.get("externalModelProviderName"), join_path(tp, "externalModelProviderName"),
                        allow_empty=True)
        bad_type = (m.get("modelServerName") is not None and server is None) or \
            (m.get("externalModelProviderName") is not None and ext is None)
        if bool(server) == bool(ext):
            if not bad_type:
                c.err(tp, "exactly one of modelServerName or externalModelProviderName must be set")
            continue
        weight = check_int(c, m.get("weight"), join_path(tp, "weight"), 0, 100)
        if m.get("weight") is None or weight is not None:
            out.append(TargetModel(server or None, weight, ext or None))
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


def _rate_limit(c: Ctx, v: Any, path: str) -> RateLimit | None:
    """rateLimit (Kthena's CRD rules). Enforced by kthena_router.ratelimit (docs/ratelimit.md)."""
    if v is None:
        return None
    m = check_mapping(c, v, path, ("inputTokensPerUnit", "outputTokensPerUnit", "unit", "global"))
    if m is None:
        return None
    inp = check_int(c, m.get("inputTokensPerUnit"), join_path(path, "inputTokensPerUnit"), 1, 2**32 - 1)
    out = check_int(c, m.get("outputTokensPerUnit"), join_path(path, "outputTokensPerUnit"), 1, 2**32 - 1)
    unit = "second" if m.get("unit") is None else check_enum(c, m.get("unit"), join_path(path, "unit"), _RATE_UNITS)
    redis_addr: str | None = None
    if m.get("global") is not None:
        gp = join_path(path, "global")
        g = check_mapping(c, m["global"], gp, ("redis",))
        if g is not None and g.get("redis") is not None:
            rp = join_path(gp, "redis")
            r = check_mapping(c, g["redis"], rp, ("address",), required=("address",))
            if r is not None:
                redis_addr = check_str(c, r.get("address"), join_path(rp, "address"))
                host, sep, port = (redis_addr or "").rpartition(":")
                if redis_addr is not None and not (sep and host and port.isdigit() and 0 < int(port) < 65536):
                    c.err(join_path(rp, "address"), f"must be host:port, got {redis_addr!r}")
                    redis_addr = None
    return RateLimit(unit=unit or "second", input_tokens_per_unit=inp, output_tokens_per_unit=out,
                     global_redis_address=redis_addr)


def parse_route_session_sticky(c: ErrorSink, v: Any, path: str) -> SessionSticky | None:
    """Kthena's proposal: absent or null = off; present = on, with 1..16 sources. Also the
    router configuration's per-route overrides (sessionSticky.routes, session/config.py)."""
    if v is None:
        return None
    m = check_mapping(c, v, path, ("sources", "sessionAffinitySeconds"))
    if m is None:
        return None
    ttl = check_int(c, m.get("sessionAffinitySeconds"), join_path(path, "sessionAffinitySeconds"), 1, 2**31 - 1)
    sp = join_path(path, "sources")
    raw = check_list(c, m.get("sources"), sp)
    if not raw:
        if isinstance(m.get("sources"), list) or m.get("sources") is None:
            c.err(sp, "at least one source is required (type Header, Query, Cookie or JWTClaim, and a name)")
        return None
    if len(raw) > MAX_SESSION_SOURCES:
        c.err(sp, f"at most {MAX_SESSION_SOURCES} sources, got {len(raw)}")
    sources: list[SessionKeySource] = []
    for i, item in enumerate(raw):
        ip = f"{sp}[{i}]"
        im = check_mapping(c, item, ip, ("type", "name"), required=("type", "name"))
        if im is None:
            continue
        kind = check_enum(c, im.get("type"), join_path(ip, "type"), SESSION_SOURCE_TYPES)
        name = check_str(c, im.get("name"), join_path(ip, "name"))
        if kind is not None and name is not None:
            # header names are case-insensitive (the request's are lower-cased); the others are exact
            sources.append(SessionKeySource(kind, name.lower() if kind == "Header" else name))
    if len(sources) != len(raw) or (m.get("sessionAffinitySeconds") is not None and ttl is None):
        return None
    return SessionSticky(tuple(sources), ttl if ttl is not None else DEFAULT_SESSION_AFFINITY_SECONDS)
