"""The ModelServer, the ModelRoute and the optional AutoscalingPolicy of a ModelBooster (Kthena's
convert/model_server.go, model_route.go and, from its older releases, autoscaling.go)."""

from __future__ import annotations

import json
from typing import Any

from . import common as c
from . import names
from .common import ConvertError, Obj

LABEL_ROLE = "modelserving.volcano.sh/role"
LABEL_GROUP = "modelserving.volcano.sh/group-name"

# vLLM kv_connector -> ModelServer kvConnector.type
KV_CONNECTORS = {"MooncakeConnector": "mooncake", "MooncakeConnectorV1": "mooncake", "NixlConnector": "nixl",
                 "LMCacheConnectorV1": "lmcache"}
_KV_ROLES = {"prefill": ("kv_producer", "kv_both"), "decode": ("kv_consumer", "kv_both")}
ENGINES = {"vLLM": "vLLM", "vLLMDisaggregated": "vLLM", "SGLang": "SGLang", "SGLangDisaggregated": "SGLang"}
DISAGGREGATED = ("vLLMDisaggregated", "SGLangDisaggregated")


def _worker_connector(i: int, worker: Obj) -> tuple[str, str] | None:
    """(connector name, kvConnector type) from a worker's kv-transfer-config, None without one."""
    kind = str(worker.get("type") or "server")
    raw = c.config_of(worker).get("kv-transfer-config")
    if raw is None:
        return None
    where = f"spec.backend.workers[{i}].config.kv-transfer-config"
    if not isinstance(raw, str):
        raise ConvertError(where, f"must be a JSON string, got {type(raw).__name__}")
    try:
        cfg = json.loads(raw)
    except ValueError as exc:
        raise ConvertError(where, f"invalid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ConvertError(where, "must be a JSON object")
    name = cfg.get("kv_connector")
    if not isinstance(name, str) or not name:
        raise ConvertError(where, "kv-transfer-config is set but kv_connector is missing")
    if name not in KV_CONNECTORS:
        raise ConvertError(where, f"unsupported kv_connector {name!r} (supported: {', '.join(sorted(KV_CONNECTORS))})")
    role = cfg.get("kv_role")
    if not isinstance(role, str) or not role:
        raise ConvertError(where, "kv-transfer-config is set but kv_role is missing")
    if role not in _KV_ROLES.get(kind, ()):
        raise ConvertError(where, f"invalid kv_role {role!r} for a {kind} worker, expected one of "
                                  f"[{', '.join(_KV_ROLES.get(kind, ()))}]")
    return name, KV_CONNECTORS[name]


def kv_connector(backend: Obj) -> Obj | None:
    """The ModelServer's kvConnector of a vLLM PD backend: both workers must name the same
    connector (or neither: KV transfer is optional)."""
    found: dict[str, tuple[str, str] | None] = {}
    for i, w in enumerate(backend.get("workers") or []):
        kind = str(w.get("type") or "server")
        if kind in ("prefill", "decode"):
            if kind in found:
                raise ConvertError(f"spec.backend.workers[{i}].type", f"a second {kind} worker (at most one)")
            found[kind] = _worker_connector(i, w)
    p, d = found.get("prefill"), found.get("decode")
    if p is None and d is None:
        return None
    if p is None or d is None:
        have, miss = ("decode", "prefill") if p is None else ("prefill", "decode")
        raise ConvertError("spec.backend.workers", f"the {have} worker sets kv_connector {(p or d)[0]!r} "  # type: ignore[index]
                                                   f"but the {miss} worker has no kv-transfer-config; prefill and "
                                                   "decode must configure the same kv connector")
    if p[1] != d[1]:
        raise ConvertError("spec.backend.workers", f"kv_connector mismatch between prefill ({p[0]!r}) and decode "
                                                   f"({d[0]!r}) workers")
    return {"type": p[1]}


def served_model_name(booster: Obj) -> str:
    for w in booster["spec"]["backend"].get("workers") or []:
        if str(w.get("type") or "server") in ("server", "decode"):
            v = c.config_of(w).get("served-model-name")
            if isinstance(v, str):
                return v
    return booster["metadata"]["name"]


def model_server(booster: Obj) -> Obj:
    backend = booster["spec"]["backend"]
    btype = backend["type"]
    meta = booster["metadata"]
    selector: Obj = {"matchLabels": {names.LABEL_MODEL_UID: str(meta.get("uid") or "")}}
    if btype in DISAGGREGATED:
        selector["pdGroup"] = {"groupKey": LABEL_GROUP, "prefillLabels": {LABEL_ROLE: "prefill"},
                               "decodeLabels": {LABEL_ROLE: "decode"}}
    spec: Obj = {"model": served_model_name(booster), "inferenceEngine": ENGINES[btype], "workloadSelector": selector,
                 "workloadPort": {"port": c.engine_port(backend)},
                 "trafficPolicy": {"retry": {"attempts": 5, "retryInterval": "0s"}}}
    if btype == "vLLMDisaggregated":
        kv = kv_connector(backend)
        if kv is not None:
            spec["kvConnector"] = kv
    return {"apiVersion": names.NETWORKING_API, "kind": "ModelServer",
            "metadata": {"name": names.backend_resource_name(meta["name"], backend["name"]),
                         "namespace": meta.get("namespace"),
                         "labels": names.labels(booster, backend["name"], names.revision(spec)),
                         "ownerReferences": [names.owner_ref(booster)]},
            "spec": spec}


def model_route(booster: Obj) -> Obj:
    meta = booster["metadata"]
    spec_in = booster["spec"]
    rule: Obj = {"name": "default"}
    if spec_in.get("modelMatch") is not None:
        rule["modelMatch"] = spec_in["modelMatch"]
    rule["targetModels"] = [{"modelServerName": names.backend_resource_name(meta["name"],
                                                                             spec_in["backend"]["name"])}]
    spec = {"modelName": spec_in.get("name") or meta["name"], "rules": [rule]}
    return {"apiVersion": names.NETWORKING_API, "kind": "ModelRoute",
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace"),
                         "labels": names.labels(booster, "", names.revision(spec)),
                         "ownerReferences": [names.owner_ref(booster)]},
            "spec": spec}


_AUTOSCALING_KEYS = ("minReplicas", "maxReplicas", "tolerancePercent", "metrics", "behavior", "metricSources")


def autoscaling_request(booster: Obj) -> Obj | None:
    """The annotation's settings, checked (None: no AutoscalingPolicy wanted)."""
    raw = ((booster["metadata"].get("annotations") or {}).get(names.ANNOTATION_AUTOSCALING))
    if raw is None:
        return None
    where = f"metadata.annotations[{names.ANNOTATION_AUTOSCALING}]"
    try:
        req: Any = json.loads(raw)
    except ValueError as exc:
        raise ConvertError(where, f"not JSON: {exc}") from None
    if not isinstance(req, dict):
        raise ConvertError(where, "must be a JSON object")
    unknown = sorted(set(req) - set(_AUTOSCALING_KEYS))
    if unknown:
        raise ConvertError(where, f"unknown field(s) {', '.join(unknown)} (known: {', '.join(_AUTOSCALING_KEYS)})")
    for k in ("minReplicas", "maxReplicas"):
        if not isinstance(req.get(k), int) or isinstance(req.get(k), bool) or req[k] < 0:
            raise ConvertError(f"{where}.{k}", "required, a whole number >= 0")
    if req["maxReplicas"] < max(1, req["minReplicas"]):
        raise ConvertError(f"{where}.maxReplicas", f"must be >= 1 and >= minReplicas ({req['minReplicas']})")
    if not isinstance(req.get("metrics"), list) or not req["metrics"]:
        raise ConvertError(f"{where}.metrics", "required: at least one {name, targetValue}")
    for i, m in enumerate(req["metrics"]):
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not m["name"]:
            raise ConvertError(f"{where}.metrics[{i}].name", "required")
    if booster["spec"]["backend"]["type"] in DISAGGREGATED:
        raise ConvertError(where, "the generated AutoscalingPolicy scales whole ServingGroups (homogeneousTarget); "
                                  "for a disaggregated backend write an AutoscalingPolicy with disaggregatedTarget")
    return req


def autoscaling_policy(booster: Obj, req: Obj) -> Obj:
    """An AutoscalingPolicy scaling the generated ModelServing (homogeneousTarget): its metrics
    read from the entry pods of the `leader` role unless the annotation gives metricSources."""
    meta = booster["metadata"]
    backend = booster["spec"]["backend"]
    target = names.backend_resource_name(meta["name"], backend["name"])
    sources = req.get("metricSources") or {
        m["name"]: {"pod": {"name": m["name"], "labelSelector": {"matchLabels": {LABEL_ROLE: "leader"}}}}
        for m in req["metrics"]}
    spec: Obj = {k: req[k] for k in ("tolerancePercent", "metrics", "behavior") if k in req}
    spec["homogeneousTarget"] = {"target": {"targetRef": {"kind": "ModelServing", "name": target},
                                            "metricSources": sources},
                                 "minReplicas": req["minReplicas"], "maxReplicas": req["maxReplicas"]}
    return {"apiVersion": names.WORKLOAD_API, "kind": "AutoscalingPolicy",
            "metadata": {"name": target, "namespace": meta.get("namespace"),
                         "labels": names.labels(booster, backend["name"], names.revision(spec)),
                         "ownerReferences": [names.owner_ref(booster)]},
            "spec": spec}
