"""Pieces shared by the engine templates: engine arguments from `config`, the engine port, the
model cache volume and path, the downloader init container, the engine env (Kthena's
model-booster-controller convert/model_serving.go, utils/, env/)."""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from . import names

Obj = dict[str, Any]

DEFAULT_ENGINE_PORT = 8000
DEFAULT_RUNTIME_PORT = 8100
# Kthena mounts an emptyDir at "" when cacheURI is unset, which the apiserver rejects in a pod;
# we mount it here instead.
DEFAULT_CACHE_PATH = "/cache"
XPU_RESOURCES = ("nvidia.com/gpu", "huawei.com/ascend-1980")
DOWNLOADER_ENV = ("ENDPOINT", "HF_ENDPOINT", "MS_TOKEN", "MS_REVISION")


class ConvertError(ValueError):
    """A ModelBooster that cannot be converted: `field` is the path of the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Images:
    downloader: str = names.DEFAULT_DOWNLOADER_IMAGE
    runtime: str = names.DEFAULT_RUNTIME_IMAGE


def workers_by_type(backend: Obj) -> dict[str, Obj]:
    return {str(w.get("type") or "server"): w for w in backend.get("workers") or []}


def config_of(worker: Obj) -> Obj:
    cfg = worker.get("config")
    return cfg if isinstance(cfg, dict) else {}


def _arg_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    if value is None:
        return ""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)  # Kthena prints Go's map[...]


def engine_args(config: Obj, skip: tuple[str, ...] = ()) -> list[str]:
    """`--key value` per config entry in key order, `_` in keys turned into `-`; an empty
    string (or null) gives the bare flag (e.g. trust-remote-code: "")."""
    out: list[str] = []
    for key in sorted(config):
        if key in skip:
            continue
        out.append("--" + key.replace("_", "-"))
        text = _arg_value(config[key])
        if text:
            out.append(text)
    return out


def shell_join(words: list[str]) -> str:
    """Kthena joins with spaces (a JSON argument loses its quotes in bash); we quote."""
    return " ".join(shlex.quote(w) for w in words)


def engine_port(backend: Obj) -> int:
    port: int | None = None
    for i, w in enumerate(backend.get("workers") or []):
        if str(w.get("type") or "server") not in ("server", "prefill", "decode"):
            continue
        this = DEFAULT_ENGINE_PORT
        raw = config_of(w).get("port")
        if raw is not None:
            try:
                this = int(str(raw))
            except ValueError:
                this = 0
            if not 1 <= this <= 65535 or isinstance(raw, bool):
                raise ConvertError(f"spec.backend.workers[{i}].config.port", f"invalid port {raw!r}")
        if port is not None and port != this:
            raise ConvertError(f"spec.backend.workers[{i}].config.port",
                               f"workers use different engine ports: {port} and {this}")
        port = this
    return port or DEFAULT_ENGINE_PORT


def env_value(backend: Obj, name: str) -> str | None:
    for e in backend.get("env") or []:
        if e.get("name") == name:
            return str(e.get("value") or "")
    return None


def env_int(backend: Obj, name: str, default: int) -> int:
    raw = env_value(backend, name)
    try:
        return int(raw) if raw is not None else default
    except ValueError:
        return default


def env_bool(backend: Obj, name: str) -> bool:
    return (env_value(backend, name) or "").strip().lower() in ("1", "t", "true")


def cache_path(cache_uri: str) -> str:
    """The mount path of the cache volume: pvc://claim -> /claim, hostpath:///tmp/x -> /tmp/x."""
    if not cache_uri:
        return DEFAULT_CACHE_PATH
    u = urlsplit(cache_uri)
    s = (u.netloc + u.path).strip("/")
    return "/" + s if u.scheme and s else ""


def model_subdir(model_uri: str) -> str:
    """The md5 of modelURI: each source downloads into its own directory of the cache."""
    return "/" + hashlib.md5(model_uri.encode()).hexdigest()


def model_path(backend: Obj) -> str:
    return cache_path(str(backend.get("cacheURI") or "")) + model_subdir(str(backend["modelURI"]))


def volume_name(backend: Obj) -> str:
    return f"{backend['name']}-weights"


def cache_volume(backend: Obj) -> Obj:
    uri = str(backend.get("cacheURI") or "")
    name = volume_name(backend)
    if not uri:
        return {"name": name, "emptyDir": {}}
    if uri.startswith("pvc://"):
        claim = uri[len("pvc://"):].strip("/")
        if not claim:
            raise ConvertError("spec.backend.cacheURI", f"invalid cacheURI {uri!r}: must include a PVC claim name")
        return {"name": name, "persistentVolumeClaim": {"claimName": claim}}
    if uri.startswith("hostpath://"):
        path = cache_path(uri)
        if not path:
            raise ConvertError("spec.backend.cacheURI", f"invalid cacheURI {uri!r}: must include a host path")
        return {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}
    raise ConvertError("spec.backend.cacheURI", f"unsupported cacheURI {uri!r} (pvc:// or hostpath://)")


def cache_mount(backend: Obj) -> Obj:
    return {"name": volume_name(backend), "mountPath": cache_path(str(backend.get("cacheURI") or ""))}


def downloader(booster: Obj, images: Images) -> Obj:
    """The init container that fetches modelURI (hf:// ms:// s3:// obs:// pvc://) into the cache:
    `--source <modelURI> --output-dir <cache path>/<md5(modelURI)>`, with the backend's ENDPOINT,
    HF_ENDPOINT, MS_TOKEN, MS_REVISION env and its envFrom (credentials)."""
    backend = booster["spec"]["backend"]
    env = []
    for name in DOWNLOADER_ENV:
        for e in backend.get("env") or []:
            # Kthena keeps only entries with a literal value; a valueFrom (a Secret) is kept too
            if e.get("name") == name and (e.get("value") or e.get("valueFrom")):
                env.append(e)
                break
    c: Obj = {"name": f"{booster['metadata']['name']}-model-downloader", "image": images.downloader,
              "args": ["--source", backend["modelURI"], "--output-dir", model_path(backend)]}
    if env:
        c["env"] = env
    if backend.get("envFrom"):
        c["envFrom"] = backend["envFrom"]
    c["volumeMounts"] = [cache_mount(backend)]
    return c


def _field_env(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _ref_env(name: str, kind: str, obj_name: str) -> Obj:
    return {"name": name, "valueFrom": {kind: {"name": obj_name, "key": name, "optional": True}}}


def engine_env(backend: Obj, engine_vars: list[Obj], *extra: Obj) -> list[Obj]:
    """The backend's env, then the pod's name and namespace, the engine's own variables,
    the optional Redis settings (redis-config / redis-secret), then `extra`."""
    return [*(backend.get("env") or []), _field_env("POD_NAME", "metadata.name"),
            _field_env("NAMESPACE", "metadata.namespace"), *engine_vars,
            _ref_env("REDIS_HOST", "configMapKeyRef", "redis-config"),
            _ref_env("REDIS_PORT", "configMapKeyRef", "redis-config"),
            _ref_env("REDIS_PASSWORD", "secretKeyRef", "redis-secret"), *extra]


def pod_ip_env(name: str) -> Obj:
    return _field_env(name, "status.podIP")


def runtime_container(booster: Obj, images: Images, engine: str, port: int, env: list[Obj],
                      env_from: bool) -> Obj:
    """Kthena's runtime sidecar (metrics translation, LoRA): port RUNTIME_PORT (8100)."""
    backend = booster["spec"]["backend"]
    rport = env_int(backend, "RUNTIME_PORT", DEFAULT_RUNTIME_PORT)
    url = env_value(backend, "RUNTIME_URL") or f"http://localhost:{port}"
    metrics = env_value(backend, "RUNTIME_METRICS_PATH") or "/metrics"
    c: Obj = {"name": "runtime", "image": images.runtime, "ports": [{"containerPort": rport}], "env": env}
    if env_from and backend.get("envFrom"):
        c["envFrom"] = backend["envFrom"]
    c["args"] = ["--port", str(rport), "--engine", engine, "--engine-base-url", url, "--engine-metrics-path",
                 metrics, "--pod", "$(POD_NAME).$(NAMESPACE)", "--model", booster["metadata"]["name"]]
    return c


def device_count(worker: Obj) -> int:
    limits = (worker.get("resources") or {}).get("limits") or {}
    total = 0
    for r in XPU_RESOURCES:
        if r in limits:
            try:
                total += int(float(str(limits[r])))
            except ValueError:
                pass
    return total


def has_gpu(workers: dict[str, Obj]) -> bool:
    for w in workers.values():
        v = ((w.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
        try:
            if v is not None and float(str(v)) > 0:
                return True
        except ValueError:
            pass
    return False


def pod_spec(booster: Obj, worker: Obj, **fields: Any) -> Obj:
    """Pod-level fields every template sets: runtimeClassName, affinity, tolerations."""
    backend = booster["spec"]["backend"]
    spec: Obj = {}
    if backend.get("runtimeClassName"):
        spec["runtimeClassName"] = backend["runtimeClassName"]
    spec["affinity"] = worker.get("affinity") or {}
    if worker.get("tolerations"):
        spec["tolerations"] = worker["tolerations"]
    spec.update(fields)
    return spec


def serving_meta(booster: Obj, rev: str) -> Obj:
    backend = booster["spec"]["backend"]
    meta = booster["metadata"]
    return {"name": names.backend_resource_name(meta["name"], backend["name"]), "namespace": meta.get("namespace"),
            "labels": names.labels(booster, backend["name"], rev), "ownerReferences": [names.owner_ref(booster)]}
