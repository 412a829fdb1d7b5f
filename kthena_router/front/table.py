"""What the Rust front decides on its own thread (docs/rust-front.md, "The decision in Rust").

Without auth and fair queuing, a completion whose model's first rule has no header, URI or
body-model predicate, and whose targets are all plain-HTTP ModelServers with endpoints (not
PD, no token limit, no session stickiness), needs nothing from Python but the balancer's
choice. With the plain round-robin balancer that is a rotation; with a router
configuration's scheduler (prefix-cache and the other Scorer plugins; not the ones whose
per-request work is Python's, Scheduler.front_eligible) it is the prefix match and the
Scorer, which the front reads and feeds in place (the same Rust objects Python's decisions
use). This module installs those models and servers in the front (`Front.install`), tells
it which servers are calm (every endpoint usable and none on trial: then the choice over
all of them is exactly the balancer's) and the worker's admission figures. Everything
else, and every server with an endpoint in trouble, is decided by Python per request as
before, with the full semantics (ejections, trials, stalls, panic threshold).

The front reports each of its decisions afterwards (`Dispatched`); `Installed` maps the
indices in that report back to this state's objects. A few earlier installs are kept for
reports still queued when a new state arrives.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from kthena_router.endpoints.balancer import RoundRobinBalancer
from kthena_router.endpoints.registry import EndpointState
from kthena_router.front.plan_cache import PlanCache, ServerPlan
from kthena_router.identity.model import ANONYMOUS
from kthena_router.proxy.forward import Forwarder
from kthena_router.router_config_reload import SwitchingBalancer
from kthena_router.routing.table import RouteMatch
from kthena_router.scheduling.scheduler import Scheduler
from kthena_router.state import RouterState

log = logging.getLogger(__name__)

KEEP_INSTALLS = 8
# how often calm flags follow time-driven health changes (stalls judged, ejections over)
SYNC_INTERVAL_S = 0.05


class Installed:
    """One installed table: per model (name, per target (match, plan, endpoints)), the
    endpoint tuples of its servers in the order the front knows them, and the scheduler
    the front decides with (None: round-robin)."""

    __slots__ = ("version", "models", "servers", "scheduler")

    def __init__(self, version: int, scheduler: Scheduler | None) -> None:
        self.version = version
        self.models: list[tuple[str, list[tuple[RouteMatch, ServerPlan, tuple[EndpointState, ...]]]]] = []
        self.servers: list[tuple[EndpointState, ...]] = []
        self.scheduler = scheduler


def _calm(eps: tuple[EndpointState, ...], now: float) -> bool:
    for ep in eps:
        h = ep.health
        if h.trial or not h.usable(now):
            return False
    return True


class FrontTable:
    """Per worker: keeps the front's table in step with the state and endpoint health."""

    def __init__(self, forwarder: Forwarder, core: Any, plans: PlanCache) -> None:
        self.fw = forwarder
        self.core = core
        self.plans = plans
        self.state: RouterState | None = None
        self.sched_key: tuple[int, int] = (0, 0)  # the scheduler and KV-matcher generation installed with
        self.current: Installed | None = None
        self.installs: dict[int, Installed] = {}
        self.version = 0
        self.flags: list[bool] = []
        self.admission: tuple[int, int] = (-1, -1)
        self.dirty = False  # an attempt failed since the last sync: health may have changed
        # a new state (new endpoints: a Terminating pod gone) reaches the front before the
        # next request, not at the next wake-up
        forwarder.holder.listeners.append(self.on_state)
        balancer = forwarder.executor.balancer
        if type(balancer) is SwitchingBalancer:  # a reload's new scheduler: before the next request too
            balancer.swap_listeners.append(lambda: self.on_state(forwarder.holder.current))

    def on_state(self, state: RouterState) -> None:
        if self.current is not None or self.enabled():
            self.sync(-1)

    def enabled(self) -> bool:
        fw = self.fw
        if not fw.settings.front_table or fw.auth is not None or fw.fairness is not None:
            return False
        return type(fw.executor.balancer) is RoundRobinBalancer or self.scheduler() is not None

    def scheduler(self) -> Scheduler | None:
        """The router configuration's scheduler, when the front can decide with it."""
        b = self.fw.executor.balancer
        if type(b) is SwitchingBalancer and type(b.inner) is Scheduler and b.inner.front_eligible():
            return b.inner
        return None

    def _sched_key(self) -> tuple[int, int]:
        sched = self.scheduler()
        if sched is None:
            return (0, 0)
        m = sched.kv_matcher
        return (id(sched), m.generation if m is not None else 0)

    def sync(self, live: int) -> None:
        """After each wake-up (cheap unless the state changed or an attempt failed) and every
        SYNC_INTERVAL_S. `live`: the fast-path requests Python accounts for."""
        fw = self.fw
        state = fw.holder.current
        if state is None or not self.enabled():
            if self.current is not None:
                self.core.uninstall()
                self.current, self.state = None, None
            return
        if state is not self.state or self._sched_key() != self.sched_key:
            try:
                self._install(state)
            except Exception:  # Python decides everything for this state; not retried per wake-up
                log.exception("rust front: installing the decision table failed; Python decides")
                self.core.uninstall()
                self.state, self.current = state, None
            self.dirty = True
        if live < 0:  # from on_state: the admission figures follow at the next wake-up
            self.health()
            return
        admission = (state.traffic.admission.max_in_flight_per_worker,
                     max(0, fw.in_flight - live - fw.zero_hold.held))
        if admission != self.admission:
            self.admission = admission
            self.core.admission(*admission)
        if self.dirty:
            self.health()

    def health(self) -> None:
        """Pushes the calm flags when they changed."""
        self.dirty = False
        inst = self.current
        if inst is None:
            return
        now = time.monotonic()
        flags = [_calm(eps, now) for eps in inst.servers]
        if flags != self.flags:
            self.flags = flags
            self.core.calm(inst.version, flags)

    def _plain_server(self, state: RouterState, match: Any) -> tuple[EndpointState, ...] | None:
        if type(match) is not RouteMatch:
            return None
        fw = self.fw
        server = match.server
        eps = state.targets.get(server.key)
        if not eps or any(ep.ssl for ep in eps) or (state.pd and state.pd.get(server.key) is not None):
            return None
        if fw.limiter is not None and fw.limiter.plan(match.route, ANONYMOUS) is not None:
            return None
        if fw.sticky.for_route(match.route) is not None:
            return None
        return eps

    def _install(self, state: RouterState) -> None:
        self.version += 1
        sched = self.scheduler()
        self.sched_key = self._sched_key()
        inst = Installed(self.version, sched)
        models: list[tuple[str, list[tuple[int, int]], int, bytes | None, list[int]]] = []
        servers: list[tuple[Any, ...]] = []
        index: dict[Any, int] = {}
        views: dict[Any, Any] = {}
        default_retry = self.fw.settings.default_retry_endpoints
        balancer = self.fw.executor.balancer
        rr = balancer if sched is None and type(balancer) is RoundRobinBalancer else None
        for name, is_lora, rule in state.table.first_rules():
            if rule.headers or rule.uri is not None or rule.body_model not in (None, name):
                continue
            if is_lora and sched is not None:
                continue  # an adapter's id and seed: Python's
            targets: list[tuple[RouteMatch, ServerPlan, tuple[EndpointState, ...]]] = []
            for m in rule.matches:
                eps = self._plain_server(state, m)
                if eps is None:
                    break
                if sched is not None:
                    key = m.server.key
                    if key not in views:
                        views[key] = sched.front_view(key, eps)
                    if views[key] is None:
                        break
                if is_lora:
                    m = RouteMatch(m.route, m.rule, m.server, name, True)
                targets.append((m, self.plans.server(state, m.route, m.server), eps))
            else:
                # the body's model as the engine needs it (decide.py: rewrite); per-target
                # names would need a splice per pick: Python's
                up = targets[0][0].upstream_model if targets else None
                if up is None or any(t[0].upstream_model != up for t in targets):
                    continue
                cum = rule.cum if rule.cum is not None else list(range(1, len(targets) + 1))
                refs = []
                for m, plan, eps in targets:
                    key = m.server.key
                    if key not in index:
                        index[key] = len(servers)
                        inst.servers.append(eps)
                        hosts = [self.plans.host(ep) for ep in eps]
                        retry = m.server.retry_attempts
                        servers.append(([a for a, _ in hosts], [h for _, h in hosts], -1 if retry is None else retry,
                                        default_retry, plan.extra_headers, plan.timeouts, plan.max_buffered,
                                        views.get(key), None if rr is None else rr.rotation(key)))
                    refs.append(index[key])
                rewrite = None if is_lora or up == name else orjson.dumps(up)
                # the prefix seed of RequestInfo.model (decide.py): the server's model, else the upstream name
                seeds = [0 if sched is None else sched.front_seed(m.server.model or m.upstream_model)
                         for m, _, _ in targets]
                models.append((name, list(zip(cum, refs, strict=True)), rule.total, rewrite, seeds))
                inst.models.append((name, targets))
        self.core.install(inst.version, models, servers, None if sched is None else sched.front_prefix())
        self.flags = [False] * len(servers)
        self.state, self.current = state, inst
        self.installs[inst.version] = inst
        for v in [v for v in self.installs if v <= inst.version - KEEP_INSTALLS]:
            del self.installs[v]
