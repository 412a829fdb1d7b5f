"""Watched objects -> the documents of file mode -> RouterConfig, one invalid object at a time.

Pure logic (no I/O), unit-tested. Kubernetes mode hands the loader (config_from_objects) the
same documents a config file would hold:
- every ModelRoute, ModelServer and ExternalModelProvider (metadata trimmed, status dropped);
- the labelled credential Secrets (Kthena's router reads only those);
- per namespace, one `Endpoints` document (our kind) listing the ready pods that a ModelServer
  of that namespace selects: address = pod IP, port unset (= the server's workloadPort),
  labels = the pod's labels (PD roles), bootstrapPort from the pod annotation
  `router.kthena.io/bootstrap-port`.

One invalid object does not take the others down. The loader reports every problem with the
document it came from; the objects at fault are set aside and the rest is built again:
- an object that was valid before is kept at its last good version (a bad edit changes
  nothing), its problem reported;
- an object never valid (or whose last good version is refused now too, e.g. a route whose
  server was deleted) is left out, its problem reported.
The ClusterView's `problems` names both kinds; the built config is file mode's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from kthena_router.config.errors import ConfigError, ConfigProblem
from kthena_router.config.loader import API_OURS, config_from_objects
from kthena_router.config.model import RouterConfig
from kthena_router.config.external_provider_parse import SECRET_LABEL

from .view import ClusterView, ObjectKey, ObjectMeta

__all__ = ["BOOTSTRAP_PORT_ANNOTATION", "Assembly", "Assembler", "Snapshot", "pod_ready", "trim_object",
           "trim_pod", "trim_secret", "render"]

BOOTSTRAP_PORT_ANNOTATION = "router.kthena.io/bootstrap-port"
KINDS = ("ModelRoute", "ModelServer", "ExternalModelProvider")
ENDPOINTS_NAME = "kubernetes-pods"  # the generated Endpoints document of each namespace
_DOC_INDEX = re.compile(r"^document (\d+)")
_Dumper: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

Key = tuple[str, str]


def _meta(obj: Mapping[str, Any], extra: tuple[str, ...] = ()) -> dict[str, Any]:
    m = obj.get("metadata") or {}
    keep = ("name", "namespace", "labels", "annotations", "creationTimestamp", *extra)
    return {k: m[k] for k in keep if m.get(k) is not None}


def trim_object(obj: dict[str, Any]) -> dict[str, Any]:
    """A custom object as stored: what the loader reads plus what the status writer needs."""
    out = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
           "metadata": _meta(obj, ("uid", "generation", "resourceVersion"))}
    if "spec" in obj:
        out["spec"] = obj["spec"]
    return out


def trim_secret(obj: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(obj)}
    for k in ("type", "data", "stringData"):
        if obj.get(k) is not None:
            out[k] = obj[k]
    return out


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, condition Ready=True, an IP, and not Terminating (no new requests while it drains)."""
    meta = pod.get("metadata") or {}
    st = pod.get("status") or {}
    if meta.get("deletionTimestamp") or st.get("phase") != "Running" or not st.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or ())


def trim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod as stored: identity, labels, our annotation, readiness and IP (pods are many)."""
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    out_meta = {k: meta[k] for k in ("name", "namespace", "labels") if meta.get(k) is not None}
    if BOOTSTRAP_PORT_ANNOTATION in ann:
        out_meta["annotations"] = {BOOTSTRAP_PORT_ANNOTATION: ann[BOOTSTRAP_PORT_ANNOTATION]}
    return {"metadata": out_meta, "ready": pod_ready(pod), "ip": (pod.get("status") or {}).get("podIP") or "",
            "terminating": bool(meta.get("deletionTimestamp"))}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The watched stores: kind -> (namespace, name) -> trimmed object."""

    objects: Mapping[str, Mapping[Key, dict[str, Any]]]  # "ModelRoute" | "ModelServer" | "ExternalModelProvider"
    secrets: Mapping[Key, dict[str, Any]]
    pods: Mapping[Key, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Assembly:
    view: ClusterView
    text: bytes  # the rendered documents (YAML), what the workers load; view.config.digest is its sha256
    pod_problems: tuple[str, ...] = ()  # pods with an unusable annotation (used with the default)
    dropped: tuple[str, ...] = field(default=())  # generated documents refused (should not happen)


def _selects(labels: Mapping[str, str], pod_labels: Mapping[str, str]) -> bool:
    return all(pod_labels.get(k) == v for k, v in labels.items())


def _server_selectors(doc: Mapping[str, Any]) -> dict[str, str] | None:
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return None
    ws = spec.get("workloadSelector")
    if ws is None:
        return {}
    ml = ws.get("matchLabels") if isinstance(ws, dict) else None
    if ml is None:
        return {}
    return {str(k): str(v) for k, v in ml.items()} if isinstance(ml, dict) else None


def endpoints_docs(servers: list[dict[str, Any]], pods: Mapping[Key, dict[str, Any]]) -> tuple[list[dict[str, Any]],
                                                                                              list[str]]:
    """One Endpoints document per namespace: its ready pods that some ModelServer selects."""
    selectors: dict[str, list[dict[str, str]]] = {}
    for s in servers:
        sel = _server_selectors(s)
        if sel is not None:
            ns = (s.get("metadata") or {}).get("namespace") or "default"
            selectors.setdefault(ns, []).append(sel)
    by_ns: dict[str, list[dict[str, Any]]] = {}
    problems: list[str] = []
    for (ns, name), pod in sorted(pods.items()):
        if not pod.get("ready") or ns not in selectors:
            continue
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if not any(_selects(sel, labels) for sel in selectors[ns]):
            continue
        ep: dict[str, Any] = {"address": pod["ip"], "labels": dict(labels)}
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(BOOTSTRAP_PORT_ANNOTATION)
        if raw is not None:
            try:
                port = int(str(raw).strip())
                if not 1 <= port <= 65535:
                    raise ValueError
                ep["bootstrapPort"] = port
            except ValueError:
                problems.append(f"Pod {ns}/{name}: annotation {BOOTSTRAP_PORT_ANNOTATION}={raw!r} is not a port "
                                "(1..65535); SGLang's default bootstrap port is used")
        by_ns.setdefault(ns, []).append(ep)
    docs = [{"apiVersion": API_OURS, "kind": "Endpoints", "metadata": {"name": ENDPOINTS_NAME, "namespace": ns},
             "spec": {"endpoints": eps}} for ns, eps in sorted(by_ns.items())]
    return docs, problems


def render(docs: list[dict[str, Any]]) -> bytes:
    header = b"# Rendered by kthena-router from the Kubernetes cluster (docs/kubernetes.md); do not edit.\n"
    return header + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=True, default_flow_style=False).encode()


def _problem_text(problems: list[Any]) -> str:
    return "; ".join(f"{p.field}: {p.message}" if p.field else p.message for p in problems)


class Assembler:
    """Keeps each object's last good version between syncs."""

    def __init__(self, source: str = "kubernetes") -> None:
        self.source = source
        self.last_good: dict[ObjectKey, dict[str, Any]] = {}

    def assemble(self, snap: Snapshot) -> Assembly:
        current: dict[ObjectKey, dict[str, Any]] = {}
        for kind in KINDS:
            for (ns, name), obj in snap.objects.get(kind, {}).items():
                current[(kind, ns, name)] = obj
        chosen: dict[ObjectKey, dict[str, Any]] = dict(current)
        problems: dict[ObjectKey, list[str]] = {}
        details: dict[ObjectKey, list[ConfigProblem]] = {}  # the same, structured (status reasons)
        secrets = {k: s for k, s in snap.secrets.items()
                   if ((s.get("metadata") or {}).get("labels") or {}).get(SECRET_LABEL[0]) == SECRET_LABEL[1]}
        dropped: list[str] = []
        pod_problems: list[str] = []
        for _ in range(len(current) + len(secrets) + 8):
            keys = sorted(chosen)
            crs = [_for_loader(chosen[k]) for k in keys]
            servers = [chosen[k] for k in keys if k[0] == "ModelServer"]
            eps, pod_problems = endpoints_docs(servers, snap.pods)
            sec_keys = sorted(secrets)
            docs = crs + [secrets[k] for k in sec_keys] + eps
            owners: list[tuple[str, Any]] = ([("cr", k) for k in keys] + [("secret", k) for k in sec_keys]
                                             + [("eps", d["metadata"]["namespace"]) for d in eps])
            text = render(docs)
            digest = hashlib.sha256(text).hexdigest()
            try:
                cfg = config_from_objects(docs, source=self.source, digest=digest)
            except ConfigError as err:
                if not self._set_aside(err, owners, chosen, current, secrets, problems, details, dropped):
                    raise  # a problem no object can be blamed for: keep the previous state
                continue
            break
        else:  # pragma: no cover - every round removes or replaces an object
            raise RuntimeError("kubernetes config assembly did not converge")
        for k in chosen:
            if chosen[k] is current.get(k):  # valid as it is now (else: served at its last good version)
                self.last_good[k] = chosen[k]
        for k in list(self.last_good):
            if k not in current:  # deleted from the cluster: nothing to fall back to any more
                del self.last_good[k]
        metas = {k: _object_meta(o) for k, o in current.items()}
        ready = _ready_endpoints(cfg)
        view = ClusterView(config=cfg, objects=metas, problems={k: "; ".join(v) for k, v in problems.items()},
                           ready_endpoints=ready, problem_details={k: tuple(v) for k, v in details.items()})
        return Assembly(view, text, tuple(pod_problems), tuple(dropped))

    def _set_aside(self, err: ConfigError, owners: list[tuple[str, Any]], chosen: dict[ObjectKey, dict[str, Any]],
                   current: Mapping[ObjectKey, dict[str, Any]], secrets: dict[Key, dict[str, Any]],
                   problems: dict[ObjectKey, list[str]], details: dict[ObjectKey, list[ConfigProblem]],
                   dropped: list[str]) -> bool:
        by_owner: dict[int, list[Any]] = {}
        for p in err.problems:
            m = _DOC_INDEX.match(p.document)
            if m is None or not 1 <= int(m.group(1)) <= len(owners):
                return False
            by_owner.setdefault(int(m.group(1)) - 1, []).append(p)
        for idx, probs in by_owner.items():
            what, key = owners[idx]
            text = _problem_text(probs)
            if what == "cr":
                obj = chosen[key]
                fallback = self.last_good.get(key)
                if obj is current.get(key):
                    problems.setdefault(key, []).append(text)
                    details.setdefault(key, []).extend(probs)
                    if fallback is not None and fallback is not obj and fallback != obj:
                        chosen[key] = fallback  # a bad edit: keep serving the last good version
                        continue
                else:  # the last good version is refused too (e.g. its target is gone)
                    problems.setdefault(key, []).append(f"its last good version is refused too: {text}")
                    details.setdefault(key, []).extend(
                        replace(p, message=f"its last good version is refused too: {p.message}") for p in probs)
                del chosen[key]
            elif what == "secret":
                dropped.append(f"Secret {key[0]}/{key[1]}: {text}")
                del secrets[key]
            else:  # generated from pods: built from valid data, so this is a bug
                dropped.append(f"Endpoints of namespace {key}: {text}")
                return False
        return True


def _for_loader(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("uid", "generation", "resourceVersion")}
    return {**obj, "metadata": meta}


def _object_meta(obj: Mapping[str, Any]) -> ObjectMeta:
    m = obj.get("metadata") or {}
    return ObjectMeta(api_version=str(obj.get("apiVersion") or ""), uid=str(m.get("uid") or ""),
                      generation=int(m.get("generation") or 0), resource_version=str(m.get("resourceVersion") or ""))


def _ready_endpoints(cfg: RouterConfig) -> dict[tuple[str, str], dict[str, int]]:
    out: dict[tuple[str, str], dict[str, int]] = {}
    for key, server in cfg.servers.items():
        eps = cfg.endpoints_of(server)
        counts = {"all": len(eps)}
        pg = server.pd_group
        if pg is not None:
            counts["prefill"] = sum(1 for e in eps if _selects(pg.prefill_labels, e.labels))
            counts["decode"] = sum(1 for e in eps if _selects(pg.decode_labels, e.labels))
        out[key] = counts
    return out
