"""ModelBooster -> the objects it generates (pure): a ModelServing, a ModelServer, a ModelRoute
and, when the booster's `booster.kthena.io/autoscaling` annotation asks, an AutoscalingPolicy.

`validate` applies the rules the CRD schema cannot express (Kthena checks them in its
validating webhook); `build` raises ConvertError naming the field when the booster cannot
be converted."""

from __future__ import annotations

import json
import posixpath

from . import common as c
from . import names, networking, sglang, vllm
from .common import ConvertError, Images, Obj

_TEMPLATES = {"vLLM": vllm.serving, "vLLMDisaggregated": vllm.disaggregated, "SGLang": sglang.serving,
              "SGLangDisaggregated": sglang.disaggregated}
_SINGLE = ("vLLM", "SGLang")


def validate(booster: Obj) -> list[ConvertError]:
    """Every cross-field problem (Kthena's webhook rules and ours), each naming its field."""
    errs: list[ConvertError] = []
    backend = (booster.get("spec") or {}).get("backend") or {}
    btype = backend.get("type")
    workers = backend.get("workers") or []
    bp = "spec.backend"
    if btype not in _TEMPLATES:
        errs.append(ConvertError(f"{bp}.type", f"unsupported backend type {btype!r} "
                                               f"(supported: {', '.join(_TEMPLATES)})"))
        return errs
    kinds = [str(w.get("type") or "server") for w in workers]
    if btype in _SINGLE:
        if len(workers) != 1:
            errs.append(ConvertError(f"{bp}.workers", f"if backend type is {btype!r}, there must be exactly one "
                                                      f"worker (found {len(workers)})"))
        elif kinds[0] != "server":
            errs.append(ConvertError(f"{bp}.workers[0].type", f"if backend type is {btype!r}, the worker type "
                                                              f"must be 'server', not {kinds[0]!r}"))
    else:
        for i, k in enumerate(kinds):
            if k not in ("prefill", "decode"):
                errs.append(ConvertError(f"{bp}.workers[{i}].type", f"if backend type is {btype!r}, all workers "
                                                                    f"must be 'prefill' or 'decode', not {k!r}"))
        for k in ("prefill", "decode"):
            n = kinds.count(k)
            if n != 1:
                errs.append(ConvertError(f"{bp}.workers", f"a {btype} backend needs exactly one {k} worker "
                                                          f"(found {n})"))
    for i, w in enumerate(workers):
        image = w.get("image") or ""
        if image and (not image.strip() or any(ch.isspace() for ch in image)):
            errs.append(ConvertError(f"{bp}.workers[{i}].image", f"invalid container image reference {image!r}: "
                                                                 "it cannot contain whitespace"))
        if not image:
            errs.append(ConvertError(f"{bp}.workers[{i}].image", "required: the engine image"))
        if "config" in w and w["config"] is not None and not isinstance(w["config"], dict):
            errs.append(ConvertError(f"{bp}.workers[{i}].config", "must be an object of engine arguments"))
    for check in (c.engine_port, c.cache_volume):
        try:
            check(backend)
        except ConvertError as exc:
            errs.append(exc)
    errs += _pvc_rules(backend)
    if btype == "vLLMDisaggregated":
        try:
            networking.kv_connector(backend)
        except ConvertError as exc:
            errs.append(exc)
    if btype == "SGLangDisaggregated":
        for i, w in enumerate(workers):
            raw = c.config_of(w).get("disaggregation-bootstrap-port")
            if raw is not None and (isinstance(raw, bool) or not str(raw).isdigit() or not 1 <= int(str(raw)) <= 65535):
                errs.append(ConvertError(f"{bp}.workers[{i}].config.disaggregation-bootstrap-port",
                                         f"invalid port {raw!r}"))
            if c.config_of(w).get("kv-transfer-config") is not None:
                errs.append(ConvertError(f"{bp}.workers[{i}].config.kv-transfer-config",
                                         "a vLLM setting: SGLang transfers KV with --disaggregation-transfer-backend"))
    try:
        networking.autoscaling_request(booster)
    except ConvertError as exc:
        errs.append(exc)
    return errs


def _pvc_rules(backend: Obj) -> list[ConvertError]:
    """A pvc:// model is read through the cache mount: cacheURI must be that PVC (Kthena's webhook)."""
    model = str(backend.get("modelURI") or "")
    cache = str(backend.get("cacheURI") or "")
    if not model.startswith("pvc://"):
        return []
    if not cache.startswith("pvc://"):
        return [ConvertError("spec.backend.cacheURI", "when modelURI uses pvc://, cacheURI must also use pvc:// "
                                                      "(the downloader sees only the cache volume): set cacheURI to "
                                                      "pvc://<claimName> and modelURI to "
                                                      "pvc:///<claimName>/<path-to-model>")]
    rest = model[len("pvc://"):]
    if ".." in rest.split("/"):
        return [ConvertError("spec.backend.modelURI", "pvc:// modelURI must not contain '..' path segments")]
    claim = cache[len("pvc://"):].strip("/")
    if not claim or "/" in claim:
        return [ConvertError("spec.backend.cacheURI", "pvc:// cacheURI must name one PVC claim (pvc://<claimName>)")]
    source = posixpath.normpath("/" + rest.lstrip("/"))
    mount = "/" + claim
    if source != mount and not source.startswith(mount + "/"):
        return [ConvertError("spec.backend.modelURI", f"PVC source path {source!r} is not reachable via the cacheURI "
                                                      f"mount {mount!r}: use pvc:///{claim}/<path-to-model>")]
    return []


def serving_revision(backend: Obj) -> str:
    """The revision label: a hash of the backend without replica counts (scaling is not an
    update of the pods; Kthena hashes the whole backend)."""
    stripped = {k: v for k, v in backend.items() if k != "replicas"}
    stripped["workers"] = [{k: v for k, v in w.items() if k != "replicas"} for w in backend.get("workers") or []]
    return names.revision(stripped)


def build(booster: Obj, images: Images = Images()) -> list[Obj]:
    """The generated objects, in creation order. Raises the first ConvertError of `validate`."""
    errs = validate(booster)
    if errs:
        raise errs[0]
    backend = booster["spec"]["backend"]
    out = [_TEMPLATES[backend["type"]](booster, images, serving_revision(backend)),
           networking.model_server(booster), networking.model_route(booster)]
    req = networking.autoscaling_request(booster)
    if req is not None:
        out.append(networking.autoscaling_policy(booster, req))
    return json.loads(json.dumps(out))  # no shared sub-objects between containers and templates
