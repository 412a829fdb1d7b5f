"""Dispatch to an ExternalModelProvider: a third-party OpenAI- or Anthropic-compatible API.

forward.py hands over a request whose route target is a provider (routing.table's
`ExternalMatch`) after authentication and rate-limit admission, which apply as for pods.
What differs from the one-hop path to pods:

- no scheduler, balancer, PD, LoRA, session stickiness or fair queuing: one upstream, the
  provider's baseURL (its host resolved per worker, re-resolved in the background every
  DNS_TTL_S; the first address is used, IPv4 first);
- only the provider type's paths (PROVIDER_PATHS; anything else is a 400 naming them);
  the path is joined to the base URL as Kthena does (config.external_provider.upstream_path);
- headers: an allow-list of the client's (content type, tracing, Anthropic's version and
  beta headers) plus spec.headers and the provider's credential, so the client's own
  credentials (Authorization, x-api-key, cookies) never leave the router;
- HTTPS with certificate verification (the router configuration's externalProviders.caFile
  or the system store) unless spec.insecureSkipVerify; the same HTTP/1.1 pool as pods;
- timeouts: traffic.timeouts with externalProviders' overrides; retries (the same provider,
  before the first byte only) only when externalProviders.retry asks for them. A 5xx, a
  connect or TLS failure answers 502 (504 on a timeout) naming the provider; a 4xx from
  the provider is passed on, with the credential redacted should the provider echo it.

Metrics and the access log label these requests with model_server "external:<ns>/<name>"
and endpoint "<host>:<port>" (the families' label sets are unchanged).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

from kthena_router.config.external_provider import ANTHROPIC, PROVIDER_PATHS, ExternalProvider, upstream_path
from kthena_router.config.provider_settings import DEFAULT_PROVIDER_SETTINGS, ExternalProvidersSettings, \
    ProviderSettings
from kthena_router.config.traffic import Timeouts, TrafficSettings
from kthena_router.endpoints.balancer import NoFeedback
from kthena_router.endpoints.health import EndpointHealth, Failure, HealthProber
from kthena_router.endpoints.registry import EndpointState
from kthena_router.errors import RequestError
from kthena_router.metrics import RouterMetrics
from kthena_router.proxy.body import ParsedBody, needs_usage_injection, rewrite
from kthena_router.proxy.executor import Executor
from kthena_router.proxy.paths import request_line
from kthena_router.proxy.downstream import Downstream, Watch
from kthena_router.proxy.relay import Exchange
from kthena_router.proxy.sse import StreamEnd
from kthena_router.proxy.upstream import UpstreamPool
from kthena_router.routing.table import ExternalMatch
from kthena_router.settings import RouterSettings

log = logging.getLogger(__name__)

__all__ = ["DNS_TTL_S", "ExternalDispatcher"]

DNS_TTL_S = 30.0
_RESOLVE_TIMEOUT_S = 10.0
# The client's headers that go on to a provider (Kthena's allow-list), by provider type.
_FORWARD = frozenset({"content-type", "accept", "traceparent", "tracestate", "baggage", "x-b3-traceid",
                      "x-b3-spanid", "x-b3-parentspanid", "x-b3-sampled", "x-b3-flags"})
_FORWARD_BY_TYPE = {ANTHROPIC: _FORWARD | {"anthropic-version", "anthropic-beta"}}
_FIXED = b"accept-encoding: identity\r\nuser-agent: kthena-router\r\n"




class _Target:
    """One provider's upstream in this worker: address, TLS, the fixed header lines."""

    __slots__ = ("provider", "ep", "health", "ssl", "ca_pem", "resolved_at", "refresh", "fixed", "forward",
                 "static", "redact", "timeouts_key", "timeouts", "paths")

    def __init__(self, provider: ExternalProvider, ssl_ctx: ssl.SSLContext, ca_pem: str | None) -> None:
        self.provider = provider
        self.ssl = ssl_ctx
        self.ca_pem = ca_pem  # the trust store it was built for (a router-config reload may change it)
        self.health = EndpointHealth()  # required by the attempt; a provider is never ejected
        self.ep: EndpointState | None = None
        self.resolved_at = 0.0
        self.refresh: asyncio.Task[None] | None = None
        self.static = frozenset(provider.headers)
        self.forward = _FORWARD_BY_TYPE.get(provider.provider_type, _FORWARD) - self.static
        lines = [_FIXED]
        lines.extend(f"{k}: {v}\r\n".encode("latin-1") for k, v in provider.headers.items())
        auth = provider.auth_header()
        if auth is not None:
            lines.append(auth[0] + b": " + auth[1] + b"\r\n")
        self.fixed = b"".join(lines)
        self.redact = provider.credential.encode("latin-1") if provider.credential else b""
        self.timeouts_key: tuple[Any, ...] = ()
        self.timeouts = Timeouts()
        self.paths = {p: upstream_path(provider, p) for p in PROVIDER_PATHS[provider.provider_type]}

    def set_address(self, ip: str) -> None:
        p = self.provider
        if self.ep is None or self.ep.ip != ip:
            self.ep = EndpointState(p.host_port, ip, p.port, p.host, "https", self.ssl, self.health, {}, p.label)

    def timeouts_for(self, traffic: TrafficSettings, ps: ProviderSettings) -> Timeouts:
        key = (id(traffic), id(ps))
        if key != self.timeouts_key:
            self.timeouts = ps.effective_timeouts(traffic.defaults.timeouts)
            self.timeouts_key = key
        return self.timeouts


class _Redacting(Downstream):
    """x.down for a provider with a credential: the key never reaches the client, even if
    the provider echoes it in an error body."""

    __slots__ = ("inner", "secret")

    def __init__(self, inner: Downstream, secret: bytes) -> None:
        super().__init__()
        self.inner = inner
        self.secret = secret

    def _clean(self, body: bytes) -> bytes:
        if body and self.secret in body:
            log.warning("an external provider echoed the router's credential; redacted")
            return body.replace(self.secret, b"[redacted]")
        return body

    async def read_body(self, declared: int | None, limit: int) -> bytes:
        return await self.inner.read_body(declared, limit)

    def arm(self) -> Watch:
        return self.inner.arm()

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        await self.inner.respond(status, headers, self._clean(body))

    async def begin(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        await self.inner.begin(status, headers)

    async def send(self, data: bytes) -> None:
        await self.inner.send(self._clean(data))

    async def end(self, data: bytes = b"") -> None:
        await self.inner.end(self._clean(data))


class ExternalDispatcher(Executor):
    """Per worker: the attempts of requests to providers (the executor's attempt and relays,
    with one target and no balancer)."""

    def __init__(self, settings: RouterSettings, pool: UpstreamPool, metrics: RouterMetrics,
                 prober: HealthProber,
                 provider_settings: Callable[[], ExternalProvidersSettings] = lambda: DEFAULT_PROVIDER_SETTINGS,
                 ) -> None:
        super().__init__(settings, pool, NoFeedback(), metrics, prober)  # type: ignore[arg-type]
        self.provider_settings = provider_settings  # the installed router configuration's section
        self._targets: dict[tuple[str, str], _Target] = {}
        self._ssl: dict[tuple[bool, str | None], ssl.SSLContext] = {}

    # --- per request -----------------------------------------------------------------

    async def run(self, x: Exchange, body: ParsedBody, match: ExternalMatch,  # type: ignore[override]
                  traffic: TrafficSettings, headers: Mapping[str, str], query: bytes) -> None:
        """Deliver the provider's response to the client, or raise RequestError (nothing sent)."""
        p = match.provider
        route = match.route
        x.route_label = f"{route.namespace}/{route.name}"
        x.server_label = p.label
        ps = self.provider_settings().for_provider(p.namespace, p.name)
        target = self._target(p, ps)
        path = target.paths.get(x.path)
        if path is None or not isinstance(body, ParsedBody):
            served = ", ".join(sorted(PROVIDER_PATHS[p.provider_type]))
            raise RequestError(400, f"{x.path} is not served by ExternalModelProvider {p.namespace}/{p.name} "
                                    f"(providerType {p.provider_type} serves {served})",
                               type_="invalid_request_error", code="unsupported_path")
        await self._address(target)
        ep = target.ep
        assert ep is not None
        x.endpoint_label = ep.key
        x.stream = body.stream
        x.inject = inject = needs_usage_injection(body) and x.stream_end is StreamEnd.DONE
        payload = rewrite(body, match.upstream_model, inject)
        fwd = target.forward
        lines = [f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items() if k in fwd]
        if "content-type" not in headers:
            lines.append(b"content-type: application/json\r\n")
        lines.append(b"x-request-id: " + x.request_id.encode("latin-1") + b"\r\n")
        tail = b"".join(lines) + target.fixed + b"content-length: " + str(len(payload)).encode() + b"\r\n\r\n"
        head = request_line("POST", path, query)
        if target.redact:
            x.down = _Redacting(x.down, target.redact)
        loop = asyncio.get_running_loop()
        x.apply_limits(target.timeouts_for(traffic, ps), traffic.defaults.max_buffered_response_bytes, loop.time())
        last = None
        tried = 0
        for attempt in range(1 + ps.retry_attempts):
            if attempt:
                if x.deadline is not None and loop.time() + ps.retry_interval_s >= x.deadline:
                    break
                self.metrics.retry(x.server_label)
                if ps.retry_interval_s > 0:
                    await asyncio.sleep(ps.retry_interval_s)
            tried += 1
            last = await self.tracked_attempt(x, ep, head, tail, payload, None)
            if last is None:
                return
            if x.committed:
                return
        assert last is not None
        what = f"ExternalModelProvider {p.namespace}/{p.name}"
        if last.failure is Failure.TIMEOUT:
            raise RequestError(504, f"{what} timed out: {last.detail} ({tried} attempt(s))", code=504)
        raise RequestError(502, f"{what} request failed ({last.detail}; {tried} attempt(s))", code=502)

    # --- targets ---------------------------------------------------------------------

    def _target(self, p: ExternalProvider, ps: ProviderSettings) -> _Target:
        """The provider's target, rebuilt when a reload changed the provider or its trust store."""
        old = self._targets.get(p.key)
        if old is not None and old.ca_pem == ps.ca_pem and (old.provider is p or old.provider == p):
            old.provider = p
            return old
        t = _Target(p, self._ssl_context(p.insecure_skip_verify, ps.ca_pem), ps.ca_pem)
        if old is not None and old.provider.host == p.host and old.ep is not None:  # keep the address
            t.resolved_at = old.resolved_at
            t.set_address(old.ep.ip)
        self._targets[p.key] = t
        return t

    def _ssl_context(self, insecure: bool, ca_pem: str | None) -> ssl.SSLContext:
        key = (insecure, None if insecure else ca_pem)
        ctx = self._ssl.get(key)
        if ctx is None:
            if insecure:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            else:
                ctx = ssl.create_default_context(cadata=ca_pem) if ca_pem else ssl.create_default_context()
            ctx.set_alpn_protocols(["http/1.1"])
            self._ssl[key] = ctx  # one per trust store: reloads keep pooled connections
        return ctx

    async def _address(self, t: _Target) -> None:
        """The target's address: at once for an IP literal, else the last DNS answer
        (refreshed in the background when older than DNS_TTL_S)."""
        host = t.provider.host
        if t.ep is not None:
            if not _is_ip(host) and time.monotonic() - t.resolved_at > DNS_TTL_S and t.refresh is None:
                t.refresh = asyncio.get_running_loop().create_task(self._refresh(t))
            return
        if _is_ip(host):
            t.set_address(host)
            return
        ips = await self._resolve(host)
        if not ips:
            p = t.provider
            raise RequestError(502, f"ExternalModelProvider {p.namespace}/{p.name}: cannot resolve its host "
                                    f"{host!r}", code=502)
        t.resolved_at = time.monotonic()
        t.set_address(ips[0])

    async def _refresh(self, t: _Target) -> None:
        try:
            ips = await self._resolve(t.provider.host)
            if ips:
                t.resolved_at = time.monotonic()
                if t.ep is None or t.ep.ip not in ips:
                    t.set_address(ips[0])
        finally:
            t.refresh = None

    @staticmethod
    async def _resolve(host: str) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(loop.getaddrinfo(host, None, type=socket.SOCK_STREAM),
                                           _RESOLVE_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as exc:
            log.warning("cannot resolve external provider host %s: %s", host, exc)
            return []
        return sorted({str(info[4][0]) for info in infos}, key=lambda ip: (":" in ip, ip))

    # --- state installs ---------------------------------------------------------------

    def on_config(self, providers: Mapping[tuple[str, str], ExternalProvider]) -> None:
        """After a route-config install: forget providers that left it."""
        for key in [k for k in self._targets if k not in providers]:
            t = self._targets.pop(key)
            if t.refresh is not None:
                t.refresh.cancel()

    def live(self) -> set[tuple[str, int]]:
        """(ip, port) of every provider upstream in use, for the pool's pruning."""
        return {(t.ep.ip, t.ep.port) for t in self._targets.values() if t.ep is not None}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True

