"""What a fast-path decision derives from the installed state alone, computed once per
(state, route, server) instead of per request (docs/rust-front.md, "Python per request").

Every value here is a function of the `RouterState` (routes, servers, traffic sections,
targets): a config or router-configuration reload installs a new state object (the
applier's `_install`, also for a traffic-only change), and the cache starts empty for
it, so a reload never serves a value of the previous state.
"""

from __future__ import annotations

from typing import Any

from kthena_router.endpoints.registry import EndpointState
from kthena_router.proxy.paths import request_line
from kthena_router.state import RouterState


def _secs(value: float | None) -> float:
    return -1.0 if value is None else float(value)


def host_header(ep: EndpointState) -> tuple[str, str]:
    """("ip:port" to connect to, the Host header) of a plain-HTTP endpoint (upstream.py dest())."""
    name = f"[{ep.ip}]" if ":" in ep.ip else ep.ip
    addr = f"{name}:{ep.port}"
    return addr, (name if ep.port == 80 else addr)


class ServerPlan:
    """A matched (route, server)'s constant part of a plan and its metric labels."""

    __slots__ = ("route_label", "server_label", "extra_headers", "timeouts", "max_buffered")

    def __init__(self, state: RouterState, route: Any, server: Any) -> None:
        self.route_label = f"{route.namespace}/{route.name}"
        self.server_label = f"{server.namespace}/{server.name}"
        self.extra_headers = b"".join(f"{k}: {v}\r\n".encode("latin-1")
                                      for k, v in (server.upstream_headers or {}).items())
        traffic = state.traffic_of(server.key)
        t = traffic.timeouts
        # the order of rust/py/src/front/fast.rs's Timeouts
        self.timeouts = (float(t.connect_s), _secs(t.response_s), _secs(t.first_token_s), _secs(t.idle_s),
                         _secs(t.total_s), float(t.pool_wait_s), float(server.retry_interval_s))
        self.max_buffered = traffic.max_buffered_response_bytes


class PlanCache:
    """ServerPlans, endpoint addresses and request targets of the current state."""

    __slots__ = ("state", "servers", "hosts", "targets")

    def __init__(self) -> None:
        self.state: RouterState | None = None
        self.servers: dict[tuple[int, int], ServerPlan] = {}
        self.hosts: dict[tuple[str, int], tuple[str, str]] = {}
        self.targets: dict[str, str] = {}

    def _follow(self, state: RouterState) -> None:
        if state is not self.state:
            self.state = state  # holds the state: the ids of its routes and servers stay theirs
            self.servers = {}
            self.hosts = {}

    def server(self, state: RouterState, route: Any, server: Any) -> ServerPlan:
        if state is not self.state:
            self._follow(state)
        key = (id(route), id(server))
        plan = self.servers.get(key)
        if plan is None:
            plan = self.servers[key] = ServerPlan(state, route, server)
        return plan

    def host(self, ep: EndpointState) -> tuple[str, str]:
        """host_header(ep), a function of its address (kept while the state is current:
        pod churn does not grow it)."""
        key = (ep.ip, ep.port)
        hh = self.hosts.get(key)
        if hh is None:
            hh = self.hosts[key] = host_header(ep)
        return hh

    def target(self, path: str, query: bytes) -> str:
        """The request target Rust sends upstream (the proxy's request line's)."""
        if query:
            return request_line("POST", path, query)[5:-11].decode("ascii")
        t = self.targets.get(path)
        if t is None:  # paths reaching a decision are the two completion APIs
            t = self.targets[path] = request_line("POST", path, b"")[5:-11].decode("ascii")
        return t
