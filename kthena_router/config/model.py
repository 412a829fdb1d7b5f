"""Typed router configuration, shared by file mode and (later) Kubernetes mode.

Objects are immutable and built only by ``config.loader`` (or, later, the Kubernetes
watcher), which validates them first: code here trusts its inputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .external_provider import ExternalProvider

DEFAULT_NAMESPACE = "default"
DEFAULT_PORT = 8000  # vLLM's default; used when a ModelServer has no workloadPort
DEFAULT_SESSION_AFFINITY_SECONDS = 10800  # Kthena's, when sessionAffinitySeconds is unset
DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port default
SGLANG_BOOTSTRAP = "bootstrap"  # ModelServer.pd_connector of SGLang servers


@dataclass(frozen=True, slots=True)
class StringMatch:
    """Exactly one of exact / prefix / regex (checked by the loader).

    Semantics follow Kthena (Go): a missing value matches as the empty string
    (``http.Header.Get``), and ``regex`` is an unanchored search (``regexp.MatchString``).
    """

    exact: str | None = None
    prefix: str | None = None
    regex: str | None = None
    _pattern: re.Pattern[str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.regex is not None and self._pattern is None:
            object.__setattr__(self, "_pattern", re.compile(self.regex))

    def matches(self, value: str | None) -> bool:
        if value is None:
            value = ""
        if self.exact is not None:
            return value == self.exact
        if self.prefix is not None:
            return value.startswith(self.prefix)
        if self._pattern is not None:
            return self._pattern.search(value) is not None
        return True


@dataclass(frozen=True, slots=True)
class TargetModel:
    model_server_name: str | None  # exactly one of this and external_model_provider_name
    weight: int | None = None  # None = unweighted (all targets of a rule alike)
    external_model_provider_name: str | None = None  # a third-party API (config.external_provider)


@dataclass(frozen=True, slots=True)
class RouteRule:
    name: str
    headers: dict[str, StringMatch]  # lower-case header names
    uri: StringMatch | None
    body_model: str | None
    targets: tuple[TargetModel, ...]


@dataclass(frozen=True, slots=True)
class RateLimit:
    unit: str  # second|minute|hour|day|month
    input_tokens_per_unit: int | None = None
    output_tokens_per_unit: int | None = None
    global_redis_address: str | None = None


@dataclass(frozen=True, slots=True)
class SessionKeySource:
    type: str  # Header | Query | Cookie | JWTClaim
    name: str  # header names lower-case; query keys, cookie and claim names as written


@dataclass(frozen=True, slots=True)
class SessionSticky:
    """Kthena's ModelRoute.spec.sessionSticky (proposal): the first non-empty source is the key."""

    sources: tuple[SessionKeySource, ...]
    affinity_seconds: int = DEFAULT_SESSION_AFFINITY_SECONDS


@dataclass(frozen=True, slots=True)
class ModelRoute:
    namespace: str
    name: str
    model_name: str | None
    lora_adapters: tuple[str, ...]
    rules: tuple[RouteRule, ...]
    rate_limit: RateLimit | None  # Kthena's spec.rateLimit, enforced by kthena_router.ratelimit
    creation_timestamp: datetime | None
    order: int  # position among all objects of the source, for conflict resolution
    parent_refs: tuple[dict[str, Any], ...] = ()  # no effect: file mode has one listener for every route
    session_sticky: SessionSticky | None = None  # enforced by kthena_router.session


@dataclass(frozen=True, slots=True)
class PDGroup:
    group_key: str
    prefill_labels: dict[str, str]
    decode_labels: dict[str, str]


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: str  # IP or DNS name (re-resolved by endpoints.registry)
    port: int | None  # None = the ModelServer's workloadPort
    labels: dict[str, str]
    # SGLang PD: the prefill engine's bootstrap server port (None = SGLang's default, 8998).
    # File mode: the endpoint's `bootstrapPort`; Kubernetes mode: a pod annotation.
    bootstrap_port: int | None = None


@dataclass(frozen=True, slots=True)
class EndpointSet:
    """Our own kind ``Endpoints``: the pods of file mode."""

    namespace: str
    name: str
    endpoints: tuple[Endpoint, ...]


@dataclass(frozen=True, slots=True)
class ModelServer:
    namespace: str
    name: str
    model: str | None
    inference_engine: str  # "vLLM" | "SGLang"
    match_labels: dict[str, str]
    pd_group: PDGroup | None  # set: prefill/decode pairs, two-hop dispatch (kthena_router.pd)
    port: int
    protocol: str  # "http" | "https"
    timeout_s: float | None  # None = no first-byte timeout
    retry_attempts: int | None  # None: no trafficPolicy.retry (router default: distinct endpoints)
    retry_interval_s: float
    # From annotations; repr=False keeps bearer tokens out of logs and tracebacks.
    upstream_headers: dict[str, str] = field(default_factory=dict, repr=False)
    tls_insecure_skip_verify: bool = False
    kv_connector: str | None = None  # spec.kvConnector.type as written (None: unset)
    creation_timestamp: datetime | None = None

    @property
    def pd_connector(self) -> str:
        """How the two hops of a PD server talk: Kthena's defaults when kvConnector is unset
        (`http` for vLLM; SGLang engines always use their bootstrap protocol)."""
        if self.inference_engine == "SGLang":
            return SGLANG_BOOTSTRAP
        return self.kv_connector or "http"

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def route_priority(route: ModelRoute) -> tuple[Any, ...]:
    """Sort key of routes claiming one model name: lower = tried first.

    Oldest creationTimestamp, then namespace/name; routes without a timestamp come
    after those with one, in source order.
    """
    ts = route.creation_timestamp
    if ts is not None:
        return (0, ts.timestamp(), route.namespace, route.name, route.order)
    return (1, 0.0, "", "", route.order)


@dataclass(frozen=True, slots=True)
class RouteConflict:
    """A route that is not tried first for a name it claims (Kubernetes status: ModelNameConflict)."""

    namespace: str
    name: str
    claimed: str  # the modelName or LoRA adapter name
    lora: bool  # the claim comes from spec.loraAdapters
    owner: tuple[str, str]  # (namespace, name) of the route tried first for that name
    # True: the owner claims it as a modelName and this route as an adapter, so this route
    # never serves that name; False: this route serves what the owner's rules leave unmatched.
    shadowed: bool = False


@dataclass(frozen=True, slots=True)
class RouterConfig:
    routes: tuple[ModelRoute, ...]  # in source order
    servers: dict[tuple[str, str], ModelServer]  # (namespace, name) -> server
    endpoint_sets: tuple[EndpointSet, ...]
    source: str  # file path (or "<string>", or a Kubernetes description)
    digest: str  # sha256 hex of the source bytes
    warnings: tuple[str, ...] = ()  # non-fatal findings, e.g. route conflicts
    # ExternalModelProviders by (namespace, name), credentials resolved (repr=False inside)
    providers: dict[tuple[str, str], ExternalProvider] = field(default_factory=dict)
    route_conflicts: tuple[RouteConflict, ...] = ()  # the losers of each claimed name (see loader)

    def endpoints_of(self, server: ModelServer) -> list[Endpoint]:
        """Endpoints of the server's namespace whose labels include its matchLabels.

        Like a Kubernetes label selector, empty matchLabels select every endpoint of the
        namespace. Ports default to the server's workloadPort; duplicates are dropped.
        """
        selector = server.match_labels.items()
        out: list[Endpoint] = []
        seen: set[tuple[str, int]] = set()
        for eps in self.endpoint_sets:
            if eps.namespace != server.namespace:
                continue
            for ep in eps.endpoints:
                if not all(ep.labels.get(k) == v for k, v in selector):
                    continue
                port = ep.port if ep.port is not None else server.port
                if (ep.address, port) in seen:
                    continue
                seen.add((ep.address, port))
                out.append(ep if ep.port == port else Endpoint(ep.address, port, ep.labels, ep.bootstrap_port))
        return out
