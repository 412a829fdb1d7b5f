"""YAML (Kthena's ModelRoute / ModelServer / ExternalModelProvider, Secrets, plus our
Endpoints kind) -> RouterConfig.

The orchestrator: splits a source into objects, dispatches each to its kind's parser
(model_route, model_server, endpoint_set, external_provider_parse) and runs the
cross-document checks (route targets exist, provider credentials resolve). Every
problem of a source is collected (not only the first) and raised as one ConfigError
whose lines name file, document and field. Rules mirror Kthena's CRD validation; see
configs/README.md for the format and the decisions taken here.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checks import Ctx, check_list, check_mapping, type_name
from .endpoint_set import parse_endpoint_set
from .external_provider import ExternalProvider
from .external_provider_parse import PendingProvider, SecretDoc, parse_external_provider, parse_secret, \
    resolve_credentials
from .errors import BACKEND_NOT_FOUND, ConfigError, ConfigProblem
from .metadata import parse_metadata
from .model import EndpointSet, ModelRoute, ModelServer, RouteConflict, RouterConfig, route_priority
from .model_route import parse_model_route
from .model_server import parse_model_server
from .yaml_source import decode_config_text, load_yaml_documents, read_config_file

__all__ = ["ConfigError", "ConfigProblem", "load_config_file", "load_config_bytes", "config_from_objects"]

KTHENA_GROUP = "networking.serving.volcano.sh"
OUR_GROUP = "router.kthena.io"
API_KTHENA = f"{KTHENA_GROUP}/v1alpha1"
API_OURS = f"{OUR_GROUP}/v1alpha1"
_KINDS = {"ModelRoute": API_KTHENA, "ModelServer": API_KTHENA, "ExternalModelProvider": API_KTHENA,
          "Endpoints": API_OURS}
_LIST_KINDS = {"ModelRouteList": API_KTHENA, "ModelServerList": API_KTHENA,
               "ExternalModelProviderList": API_KTHENA, "EndpointsList": API_OURS, "SecretList": "v1"}
# Kthena kinds of the networking group that the router does not serve yet: skipped.
_SKIPPED_KTHENA_KINDS: set[str] = set()


def load_config_file(path: str | os.PathLike[str]) -> RouterConfig:
    """Read and validate one config file; raise ConfigError naming every problem."""
    data = read_config_file(path)
    return load_config_bytes(data, source=str(path), base_dir=Path(path).parent)


def load_config_bytes(
    data: bytes | str, source: str = "<string>", base_dir: str | os.PathLike[str] | None = None
) -> RouterConfig:
    """Validate config content. ``base_dir`` resolves relative token-file paths."""
    text, digest = decode_config_text(data, source)
    documents = load_yaml_documents(text, source)
    return config_from_objects(documents, source=source, digest=digest, base_dir=base_dir)


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


@dataclass
class _PendingRoute:
    route: ModelRoute
    ctx: Ctx


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
        self.providers: list[PendingProvider] = []
        self.provider_names: set[tuple[str, str]] = set()
        self.secrets: dict[tuple[str, str], SecretDoc] = {}
        self.secret_labels: dict[tuple[str, str], str] = {}  # every Secret seen -> its document label

    # ---- documents and lists

    def add_document(self, index: int, doc: Any) -> None:
        if doc is None:  # empty document (e.g. a trailing "---")
            return
        label = f"document {index}"
        c = Ctx(self.source, label, self.problems)
        if not isinstance(doc, dict):
            c.err("", f"must be a mapping with apiVersion and kind, got {type_name(doc)}")
            return
        kind = doc.get("kind")
        api = doc.get("apiVersion")
        if kind == "List" or kind in _LIST_KINDS:
            want = "v1" if kind == "List" else _LIST_KINDS[kind]
            if api != want:
                c.err("apiVersion", f"must be {want!r} for kind {kind}, got {api!r}")
                return
            check_mapping(c, doc, "", ("apiVersion", "kind", "metadata", "items"))
            for i, item in enumerate(check_list(c, doc.get("items"), "items")):
                self.add_object(f"{label}, items[{i}]", item)
            return
        self.add_object(label, doc)

    def add_object(self, label: str, obj: Any) -> None:
        c = Ctx(self.source, label, self.problems)
        if not isinstance(obj, dict):
            c.err("", f"must be a mapping with apiVersion and kind, got {type_name(obj)}")
            return
        kind, api = obj.get("kind"), obj.get("apiVersion")
        if not isinstance(kind, str) or not kind:
            c.err("kind", "required field is missing (expected ModelRoute, ModelServer or Endpoints)")
            return
        if not isinstance(api, str) or not api:
            c.err("apiVersion", "required field is missing")
            return
        group = api.rpartition("/")[0]
        if kind == "Secret" and api == "v1":
            self.add_secret(c, label, obj)
            return
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

        check_mapping(c, obj, "", ("apiVersion", "kind", "metadata", "spec", "status"), required=("spec",))
        meta = parse_metadata(c, obj.get("metadata"))
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
        elif kind == "ExternalModelProvider":
            self.provider_names.add((meta.namespace, meta.name))
        spec = obj.get("spec")
        if spec is None:
            return
        if kind == "ModelRoute":
            route = parse_model_route(c, meta, spec, order)
            if route is not None:
                self.routes.append(_PendingRoute(route, c))
        elif kind == "ModelServer":
            server = parse_model_server(c, meta, spec, self.base_dir)
            if server is not None:
                self.servers[server.key] = server
        elif kind == "ExternalModelProvider":
            pending = parse_external_provider(c, meta, spec, self.base_dir)
            if pending is not None:
                self.providers.append(pending)
        else:
            eps = parse_endpoint_set(c, meta, spec)
            if eps is not None:
                self.endpoint_sets.append(eps)

    def add_secret(self, c: Ctx, label: str, obj: dict[str, Any]) -> None:
        """A Kubernetes Secret: only a provider's spec.auth.secretRef reads it."""
        meta = parse_metadata(c, obj.get("metadata"))
        if meta is None:
            return
        c.label = f"{label} (Secret {meta.namespace}/{meta.name})"
        key = ("Secret", meta.namespace, meta.name)
        if key in self.seen:
            c.err("metadata.name", f"duplicate Secret {meta.namespace}/{meta.name} (first defined in {self.seen[key]})")
            return
        self.seen[key] = c.label
        self.secret_labels[(meta.namespace, meta.name)] = c.label
        secret = parse_secret(c, meta, obj)
        if secret is not None:
            self.secrets[(meta.namespace, meta.name)] = secret

    # ---- cross-document checks

    def finish(self, digest: str) -> RouterConfig:
        providers: dict[tuple[str, str], ExternalProvider] = {}
        for pp in self.providers:
            resolved = resolve_credentials(pp, self.secrets, self.secret_labels)
            if resolved is not None:
                providers[resolved.key] = resolved
        for pr in self.routes:
            r = pr.route
            for i, rule in enumerate(r.rules):
                for j, t in enumerate(rule.targets):
                    tp = f"spec.rules[{i}].targetModels[{j}]"
                    if t.external_model_provider_name is not None:
                        name = t.external_model_provider_name
                        if (r.namespace, name) not in self.provider_names:
                            pr.ctx.err(f"{tp}.externalModelProviderName",
                                       f"ExternalModelProvider {name!r} not found in namespace {r.namespace!r}",
                                       BACKEND_NOT_FOUND)
                        elif r.lora_adapters:
                            pr.ctx.err(f"{tp}.externalModelProviderName",
                                       "a route with loraAdapters cannot target an ExternalModelProvider "
                                       "(LoRA adapters are served by in-cluster engines only)")
                    elif (r.namespace, t.model_server_name) not in self.server_names:
                        pr.ctx.err(
                            f"{tp}.modelServerName",
                            f"ModelServer {t.model_server_name!r} not found in namespace {r.namespace!r}",
                            BACKEND_NOT_FOUND,
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
            providers=providers,
        )
        warnings = self.warnings + _conflict_warnings(routes)
        for s in cfg.servers.values():
            if not cfg.endpoints_of(s):
                warnings.append(
                    f"{self.source}: ModelServer {s.namespace}/{s.name}: no endpoint matches "
                    f"workloadSelector.matchLabels {s.match_labels}"
                )
        return dataclasses.replace(cfg, warnings=tuple(warnings), route_conflicts=tuple(_route_conflicts(routes)))


Claims = dict[str, list[ModelRoute]]


def _claims(routes: tuple[ModelRoute, ...], *, own_name_as_adapter: bool) -> tuple[Claims, Claims]:
    """The routes claiming each name, in config order: as modelName, and as LoRA adapter
    (a route's adapter named like its own modelName only with `own_name_as_adapter`)."""
    claims: Claims = {}
    lora_claims: Claims = {}
    for r in routes:
        if r.model_name:
            claims.setdefault(r.model_name, []).append(r)
        for a in r.lora_adapters:
            if own_name_as_adapter or a != r.model_name:
                lora_claims.setdefault(a, []).append(r)
    return claims, lora_claims


def _route_conflicts(routes: tuple[ModelRoute, ...]) -> list[RouteConflict]:
    """Every (route, name) where another route is tried first (RouteTable's order)."""
    claims, lora_claims = _claims(routes, own_name_as_adapter=False)
    out: list[RouteConflict] = []
    for lora, table in ((False, claims), (True, lora_claims)):
        for name, rs in table.items():
            rs = sorted(rs, key=route_priority)
            owner = rs[0]
            shadowed = lora and name in claims
            if shadowed:  # a modelName route owns the name: every adapter claim loses
                owner = min(claims[name], key=route_priority)
                losers = rs
            else:
                losers = rs[1:]
            for r in losers:
                out.append(RouteConflict(r.namespace, r.name, name, lora, (owner.namespace, owner.name), shadowed))
    return out


def _conflict_warnings(routes: tuple[ModelRoute, ...]) -> list[str]:
    """Describe names claimed by more than one route (the order RouteTable tries them)."""
    claims, lora_claims = _claims(routes, own_name_as_adapter=True)
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
