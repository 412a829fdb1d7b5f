"""ModelServer -> resolved upstream targets ("ip:port"), with DNS re-resolution.

Each endpoint address of the config is resolved (IP literals as is, DNS names through
the event loop's getaddrinfo, every address returned becomes a target). Health objects
are kept per "ip:port" key in the registry, so an endpoint that stays across a config
reload or a DNS refresh keeps its health state; keys that disappear are dropped (and
reported to `on_gone`, which prunes their metric children).

Outlier-detection settings (traffic.outlierDetection, per ModelServer) apply per health
object. An endpoint listed by several ModelServers has one health object (it is one
engine), judged by the settings of the first of those servers in (namespace, name) order;
each server still applies its own panic threshold to its endpoint set.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable, Iterable, Mapping

from kthena_router.config.model import ModelServer, RouterConfig
from kthena_router.config.traffic import DEFAULT_TRAFFIC, OutlierDetection, TrafficSettings
from kthena_router.endpoints.health import EndpointHealth

log = logging.getLogger(__name__)

ServerKey = tuple[str, str]


class EndpointState:
    """One upstream target of one ModelServer; `health` is shared by every server using it."""

    __slots__ = ("key", "ip", "port", "host", "base_url", "ssl", "server_hostname", "health",
                 "probe_headers", "server_label", "labels", "bootstrap_port")

    def __init__(self, key: str, ip: str, port: int, host: str, scheme: str,
                 ssl_ctx: ssl.SSLContext | bool | None, health: EndpointHealth,
                 probe_headers: Mapping[str, str], server_label: str,
                 labels: Mapping[str, str] | None = None, bootstrap_port: int | None = None) -> None:
        self.key = key
        self.ip = ip
        self.port = port
        self.host = host  # configured name, for Host and TLS SNI
        netloc = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        self.base_url = f"{scheme}://{netloc}"
        self.ssl = ssl_ctx
        # TLS to a DNS name: connect to the resolved IP, verify the configured name.
        self.server_hostname = host if scheme == "https" and host != ip else None
        self.health = health
        self.probe_headers = dict(probe_headers)
        self.server_label = server_label
        self.labels: Mapping[str, str] = labels or {}  # the endpoint's (pod's) labels: PD roles and groups
        self.bootstrap_port = bootstrap_port  # SGLang PD prefill engines (None: 8998)

    def __repr__(self) -> str:
        return f"EndpointState({self.key})"


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def _ssl_for(server: ModelServer, insecure_ctx: ssl.SSLContext) -> ssl.SSLContext | bool | None:
    if server.protocol != "https":
        return None
    return insecure_ctx if server.tls_insecure_skip_verify else True


class EndpointRegistry:
    """Builds the per-server target lists; owns the per-key health objects (per worker)."""

    def __init__(self, on_health_change: Callable[[str, bool], None] | None = None,
                 traffic: TrafficSettings | Callable[[], TrafficSettings] = DEFAULT_TRAFFIC) -> None:
        # the installed settings (a callable follows router-configuration reloads)
        self._traffic = traffic if callable(traffic) else (lambda: traffic)
        self._health: dict[str, EndpointHealth] = {}
        self.on_gone: Callable[[set[str]], None] | None = None  # keys that left the config
        self.on_stalled: Callable[[str, int], None] | None = None  # (key, attempts judged stalled)
        self._dns: dict[str, list[str]] = {}  # name -> resolved IPs (last good answer)
        self._on_change = on_health_change
        self._insecure = ssl.create_default_context()
        self._insecure.check_hostname = False
        self._insecure.verify_mode = ssl.CERT_NONE

    def set_health_listener(self, on_change: Callable[[str, bool], None]) -> None:
        """Called with (key, healthy) on every health transition (for the metric)."""
        self._on_change = on_change

    def _notify(self, key: str, healthy: bool) -> None:
        if self._on_change is not None:
            self._on_change(key, healthy)

    def _stalled(self, key: str, n: int) -> None:
        if self.on_stalled is not None:
            self.on_stalled(key, n)

    def _health_of(self, key: str, policy: OutlierDetection) -> EndpointHealth:
        health = self._health.get(key)
        if health is None:
            health = EndpointHealth(lambda ok, k=key: self._notify(k, ok), policy)
            health.on_stalled = lambda n, k=key: self._stalled(k, n)
            self._health[key] = health
        else:
            health.set_policy(policy)
        return health

    async def resolve_names(self, cfg: RouterConfig) -> None:
        """Resolve every DNS name of the config (keeps the last good answer on failure)."""
        names = {ep.address for eps in cfg.endpoint_sets for ep in eps.endpoints if not _is_ip(ep.address)}
        if names:
            await asyncio.gather(*(self._resolve(n) for n in names))

    async def _resolve(self, name: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(loop.getaddrinfo(name, None, type=socket.SOCK_STREAM), 10)
        except (OSError, asyncio.TimeoutError) as exc:
            log.warning("cannot resolve endpoint name %s: %s", name, exc)
            return
        ips = sorted({info[4][0] for info in infos})
        if ips:
            self._dns[name] = ips

    def build(self, cfg: RouterConfig) -> dict[ServerKey, tuple[EndpointState, ...]]:
        """Targets of every ModelServer of `cfg` (call resolve_names first for DNS names)."""
        out: dict[ServerKey, tuple[EndpointState, ...]] = {}
        live: set[str] = set()
        policies: dict[str, OutlierDetection] = {}  # endpoint key -> its (first) server's settings
        traffic = self._traffic()
        for key, server in sorted(cfg.servers.items()):
            scheme = "https" if server.protocol == "https" else "http"
            ssl_ctx = _ssl_for(server, self._insecure)
            label = f"{server.namespace}/{server.name}"
            policy = traffic.for_server(server.namespace, server.name, None).outlier
            targets: list[EndpointState] = []
            seen: set[str] = set()
            for ep in cfg.endpoints_of(server):
                port = ep.port if ep.port is not None else server.port
                ips = [ep.address] if _is_ip(ep.address) else self._dns.get(ep.address, [])
                for ip in ips:
                    ep_key = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
                    if ep_key in seen:
                        continue
                    seen.add(ep_key)
                    live.add(ep_key)
                    health = self._health_of(ep_key, policies.setdefault(ep_key, policy))
                    targets.append(EndpointState(ep_key, ip, port, ep.address, scheme, ssl_ctx,
                                                 health, server.upstream_headers, label, ep.labels,
                                                 ep.bootstrap_port))
            out[key] = tuple(targets)
        gone = set(self._health) - live
        for key in gone:
            del self._health[key]
        if gone and self.on_gone is not None:
            self.on_gone(gone)
        return out

    def apply_policies(self, targets: Mapping[ServerKey, Iterable[EndpointState]]) -> None:
        """Re-read the outlier settings (after a router-configuration reload), as build does."""
        traffic = self._traffic()
        done: set[str] = set()
        for (ns, name), eps in sorted(targets.items()):
            policy = traffic.for_server(ns, name, None).outlier
            for ep in eps:
                if ep.key not in done:
                    done.add(ep.key)
                    ep.health.set_policy(policy)

    def has_names(self, cfg: RouterConfig) -> bool:
        return any(not _is_ip(ep.address) for eps in cfg.endpoint_sets for ep in eps.endpoints)

    @staticmethod
    def unique(targets: Mapping[ServerKey, Iterable[EndpointState]]) -> list[EndpointState]:
        """One target per key (for probing)."""
        seen: dict[str, EndpointState] = {}
        for eps in targets.values():
            for ep in eps:
                seen.setdefault(ep.key, ep)
        return list(seen.values())
