"""The Python half of the Rust front end's fast path (docs/rust-front.md).

`FastPath.decide` runs once per chat/text completion that reached the Rust front: it
reuses the proxy pipeline's pieces (headers, body parse, route match, balancer pick,
model rewrite) and either hands Rust a plan (endpoints in attempt order, body, headers,
timeouts) or sends the request down the slow path, where granian runs the whole app.
The choice is conservative: anything the fast path does not implement (auth, rate
limits, fair queuing, session stickiness, PD two-hop, external providers, scale-from-zero
holds, TLS upstreams, admission shedding, every error) goes slow.

`FastPath.done` does the bookkeeping of proxy/executor.py and the relays for a request
Rust has finished: balancer release, health and outlier feedback, the request, TTFT,
TPOT and token metrics. Everything here runs on the worker's asyncio loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from prometheus_client import Counter

from kthena_router.access_log import AccessRecord
from kthena_router.endpoints.health import Failure
from kthena_router.endpoints.registry import EndpointState
from kthena_router.errors import ERROR_TYPES, RequestError
from kthena_router.front.batch import MetricBatch
from kthena_router.front.plan_cache import PlanCache, ServerPlan
from kthena_router.front.report_children import ReportCache
from kthena_router.front.table import FrontTable
from kthena_router.identity.model import ANONYMOUS
from kthena_router.proxy.body import needs_usage_injection, parse_body, rewrite
from kthena_router.proxy.executor import with_fallbacks
from kthena_router.proxy.forward import Forwarder
from kthena_router.proxy.headers import RequestHeaders
from kthena_router.proxy.paths import resolve
from kthena_router.routing.table import ExternalMatch, RouteMatch, RouteNotFound
from kthena_router.scheduling.request import RequestInfo
from kthena_router.state import RouterState

log = logging.getLogger(__name__)

# codes of rust/py/src/front/fast.rs
_FAILURES: tuple[Failure | None, ...] = (None, Failure.CONNECT, Failure.TIMEOUT, Failure.DIED, Failure.HTTP_5XX,
                                         Failure.INVALID)
_OK, _CONNECT, _TIMEOUT, _DIED, _HTTP_5XX, _INVALID = range(6)
_E_NONE, _E_CLIENT, _E_AFTER_FIRST, _E_4XX, _E_FAILED, _E_TOO_LARGE, _E_POOL = range(7)
_ERROR_TYPES = {_E_NONE: "", _E_CLIENT: "client_disconnect", _E_AFTER_FIRST: "upstream_error_after_first_byte",
                _E_4XX: "upstream_4xx"}


class _Live:
    """A fast-path request between its plan and its end. Attempts are accounted as Rust
    reports them: `begun` is the attempt whose health `pending` is open (-1: none),
    `finished` how many attempts have their outcome recorded."""

    __slots__ = ("order", "info", "pending", "begun", "answered", "finished", "downstream", "gauge", "model",
                 "path_label", "route_label", "server_label", "request_id", "stream", "counted")

    def __init__(self, order: list[EndpointState], info: RequestInfo | None, pending: Any, downstream: Any,
                 gauge: Any, model: str, path_label: str, plan: ServerPlan, request_id: str,
                 stream: bool) -> None:
        self.order = order
        self.info = info
        self.pending = pending
        self.begun = 0
        self.answered = False
        self.finished = 0
        self.downstream = downstream
        self.gauge = gauge
        self.model = model
        self.path_label = path_label
        self.route_label = plan.route_label
        self.server_label = plan.server_label
        self.request_id = request_id
        self.stream = stream
        self.counted = 0  # output events already counted per endpoint while the stream ran


class FastPath:
    """Per worker; `core` is the _core.Front answering decisions."""

    def __init__(self, forwarder: Forwarder, core: Any) -> None:
        self.fw = forwarder
        self.core = core
        self.balancer = forwarder.executor.balancer
        self.metrics = forwarder.metrics
        self.live: dict[int, _Live] = {}
        decisions = Counter("kthena_router_front_decisions_total",
                            "--interface rust: completions the front end sent down the fast path (Rust relays) "
                            "or the slow path (the full app)", ["decision"], registry=self.metrics.registry)
        self.n_fast = decisions.labels("fast")
        self.n_slow = decisions.labels("slow")
        self.n_front = Counter("kthena_router_front_table_decisions_total",
                               "fast-path requests the Rust front decided itself from its table, without "
                               "asking Python (also counted as decision=fast)", registry=self.metrics.registry)
        # counter, gauge and histogram writes merged per loop iteration (front/batch.py): a
        # request ending in the same batch as the next one starts costs no gauge write; the
        # scheduler's per-request writes join them
        self.batch = MetricBatch()
        self.metrics.deferred = self.batch
        self.tasks: set[asyncio.Task[None]] = set()  # decisions awaiting the scheduler's prepare()
        self.plans = PlanCache()  # per state: labels, timeouts, addresses
        self.reports = ReportCache(self.metrics)  # per label set: the children done() writes
        self.table = FrontTable(forwarder, core, self.plans)  # what the front decides alone
        self._labels = {True: resolve("POST", "/v1/chat/completions").label,
                        False: resolve("POST", "/v1/completions").label}

    def _add(self, child: Any, value: float) -> None:
        self.batch.add(child, value)

    def flush(self) -> None:
        """Writes the batched metric changes now (prometheus multiprocess files)."""
        self.batch.flush()

    def close(self) -> None:
        """The front is gone: writes go straight to prometheus again; states stop reaching it."""
        self.batch.flush()
        listeners = self.fw.holder.listeners
        if self.table.on_state in listeners:
            listeners.remove(self.table.on_state)
        if self.metrics.deferred is self.batch:
            self.metrics.deferred = None

    # --- decision -----------------------------------------------------------------------

    def decide(self, rid: int, path: str, query: bytes, headers: list[tuple[str, str]], raw: bytes) -> None:
        """Answer Rust for request `rid`: fast (a plan), or slow."""
        fw = self.fw
        state = fw.holder.current
        if state is None or fw.auth is not None or fw.fairness is not None:
            self._slow(rid)
            return
        limit = state.traffic.admission.max_in_flight_per_worker
        if limit and fw.in_flight - fw.zero_hold.held >= limit:
            self._slow(rid)  # the full pipeline sheds (503 + Retry-After)
            return
        hdrs = RequestHeaders(headers)
        if hdrs.refusal is not None or hdrs.content_type.startswith("multipart/"):
            self._slow(rid)
            return
        try:
            api = resolve("POST", path)
            body = parse_body(raw, path)
            match = state.table.match(body.model, path, hdrs.by_name, fw.rng)
        except (RequestError, RouteNotFound):
            self._slow(rid)  # the full pipeline answers the error
            return
        if not self._plain(state, match):
            self._slow(rid)
            return
        assert isinstance(match, RouteMatch)
        server = match.server
        targets = state.targets.get(server.key, ())
        info = None
        if self.balancer.needs_request_info:
            info = RequestInfo(hdrs.request_id, path, body.obj, server.model or match.upstream_model,
                               body.model if match.is_lora else "", body.model)
            needed = getattr(self.balancer, "prepare_needed", None)
            if needed is not None and not needed(info):
                # nothing to await (no KV-event matcher in play): decide now, no task
                self._plan(rid, path, query, hdrs, api.label, body, match, state, targets, info)
                return
            task = asyncio.get_running_loop().create_task(
                self._prepared(rid, path, query, hdrs, api.label, body, match, state, targets, info))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            return
        self._plan(rid, path, query, hdrs, api.label, body, match, state, targets, None)

    def _slow(self, rid: int) -> None:
        self._add(self.n_slow, 1)
        self.core.slow(rid)

    def _plain(self, state: RouterState, match: RouteMatch | ExternalMatch) -> bool:
        """Whether the matched route needs nothing but a balancer pick and a relay."""
        if type(match) is ExternalMatch:
            return False
        fw = self.fw
        server = match.server
        if not state.targets.get(server.key):
            return False  # scale-from-zero hold or 503: the full pipeline
        if state.pd and state.pd.get(server.key) is not None:
            return False
        if fw.limiter is not None and fw.limiter.plan(match.route, ANONYMOUS) is not None:
            return False
        return fw.sticky.for_route(match.route) is None

    async def _prepared(self, rid: int, path: str, query: bytes, hdrs: RequestHeaders, label: str, body: Any,
                        match: RouteMatch, state: RouterState, targets: tuple[EndpointState, ...],
                        info: RequestInfo) -> None:
        try:
            await self.balancer.prepare(info)
            self._plan(rid, path, query, hdrs, label, body, match, state, targets, info)
        except Exception:
            log.exception("fast-path decision failed; slow path")
            self._slow(rid)

    def _plan(self, rid: int, path: str, query: bytes, hdrs: RequestHeaders, label: str, body: Any,
              match: RouteMatch, state: RouterState, targets: tuple[EndpointState, ...],
              info: RequestInfo | None) -> None:
        fw = self.fw
        server = match.server
        candidates = self.balancer.candidates(server.key, targets, info)
        if not candidates:
            self._slow(rid)  # 503 and probes: the full pipeline
            return
        if server.retry_attempts is not None:
            attempts = 1 + server.retry_attempts
            if attempts > len(candidates):
                candidates = with_fallbacks(candidates, targets)
        else:
            attempts = min(fw.settings.default_retry_endpoints, len(candidates))
        now = time.monotonic()
        usable = [ep for ep in candidates if ep.health.usable(now)] or candidates
        order = [usable[i % len(usable)] for i in range(attempts)]
        if any(ep.ssl for ep in order):
            self._slow(rid)
            return
        inject = needs_usage_injection(body)
        payload = rewrite(body, None if match.is_lora else match.upstream_model, inject)
        plans = self.plans
        plan = plans.server(state, match.route, server)
        block = hdrs.upstream + plan.extra_headers if plan.extra_headers else hdrs.upstream
        host = plans.host
        if len(order) == 1:
            addr, hh = host(order[0])
            addrs, hosts = [addr], [hh]
        else:
            pairs = [host(ep) for ep in order]
            addrs, hosts = [a for a, _ in pairs], [h for _, h in pairs]
        # prefill-cost matched this request: its pending prefill work ends at the first event
        first_token = body.stream and info is not None and info.matched is not None
        if not self.core.fast(rid, addrs, hosts, plans.target(path, query), block, payload, body.stream, inject,
                              plan.timeouts, plan.max_buffered, hdrs.request_id, first_token):
            return  # the client left while we decided: nothing started
        self._register(rid, order, info, body.model, label, plan, hdrs.request_id, body.stream, None)

    def _register(self, rid: int, order: list[EndpointState], info: RequestInfo | None, model: str, label: str,
                  plan: ServerPlan, request_id: str, stream: bool, sent: float | None,
                  front: tuple[Any, ...] | None = None) -> None:
        """A fast-path request is under way: gauges, in-flight counts, the first attempt's
        health record (sent at `sent`, monotonic; None: now). `front`: the front's scheduler
        decision (scheduler, server key, match s, schedule s, best share, pending blocks), half
        accounted."""
        fw = self.fw
        batch = self.batch
        batch.add(self.n_fast, 1)
        ep = order[0]
        downstream = self.metrics.downstream(model)
        batch.add(downstream, 1)
        gauge = self.metrics.upstream(plan.route_label, plan.server_label, ep.key)
        batch.add(gauge, 1)
        if front is None:
            self.balancer.dispatched(ep, info)
        else:
            self.balancer.front_dispatched(front[0], front[1], ep, info, *front[2:])
        fw.in_flight += 1
        fw.idle.clear()
        self.live[rid] = _Live(order, info, ep.health.begin(sent), downstream, gauge, model, label, plan,
                               request_id, stream)

    def decided(self, rid: int, version: int, model: int, target: int, order: list[int], stream: bool, chat: bool,
                request_id: str, age: float, sched: tuple[Any, int, float, float, float, float] | None = None) -> None:
        """The front decided request `rid` itself (front/table.py), `age` seconds ago; `sched`:
        its scheduler decision's (hashes, prompt bytes, match s, schedule s, best share, blocks
        added to the endpoint's pending prefill work or -1)."""
        inst = self.table.installs.get(version)
        if inst is None:  # more installs since than are kept: cannot happen within a wake-up or two
            log.error("rust front: request %d decided on table %d, no longer known", rid, version)
            return
        name, targets = inst.models[model]
        match, plan, eps = targets[target]
        self.batch.add(self.n_front, 1)
        label = self._labels[chat]
        info = front = None
        if sched is not None and inst.scheduler is not None:
            hashes, prompt_bytes, match_s, schedule_s, best, pending = sched
            server = match.server
            path = "/v1/chat/completions" if chat else "/v1/completions"
            info = RequestInfo(request_id, path, None, server.model or match.upstream_model, "", name)
            info.hashes, info.prompt_bytes = hashes, prompt_bytes
            front = (inst.scheduler, server.key, match_s, schedule_s, best, pending)
        self._register(rid, [eps[i] for i in order], info, name, label, plan, request_id, stream,
                       time.monotonic() - age, front)

    # --- completion ---------------------------------------------------------------------

    def _pending(self, live: _Live, k: int) -> Any:
        """The open health record of attempt k; a retry Rust ran is dispatched here."""
        if live.begun != k:
            ep = live.order[k]
            self.metrics.retry(live.server_label)
            self.balancer.dispatched(ep, live.info)
            self._add(live.gauge, -1)
            live.gauge = self.metrics.upstream(live.route_label, live.server_label, ep.key)
            self._add(live.gauge, 1)
            live.pending = ep.health.begin()
            live.begun = k
            live.answered = False
        return live.pending

    def _finish(self, live: _Live, k: int, code: int, error: int, last: bool, att_ttft: float | None,
                tpot: float | None) -> None:
        pending = self._pending(live, k)
        ep = live.order[k]
        failure = _FAILURES[code] if code < len(_FAILURES) else Failure.DIED
        if last and error == _E_CLIENT and code == _OK:
            ep.health.abandon(pending)
        else:
            if not live.answered and (code in (_OK, _HTTP_5XX, _INVALID) or (last and error == _E_AFTER_FIRST)):
                ep.health.first_byte(pending)
            ep.health.finish(pending, failure)
        if failure is not None:
            self.metrics.upstream_error(live.server_label, ep.key, failure.value)
            self.table.dirty = True
        self.balancer.finished(ep, att_ttft, tpot, live.info)
        live.begun = -1
        live.finished = k + 1

    def first_byte(self, rid: int, attempts: list[tuple[int, int]]) -> None:
        """An attempt's response head arrived (as in proxy/executor.py): it is no longer waiting
        (stall tracking); the attempts that failed before it get their outcome."""
        live = self.live.get(rid)
        if live is None or not attempts:
            return
        k = len(attempts) - 1
        for j in range(live.finished, k):
            self._finish(live, j, attempts[j][1], _E_NONE, False, None, None)
        live.order[k].health.first_byte(self._pending(live, k))
        live.answered = True

    def first_token(self, rid: int) -> None:
        """A stream's first event reached the front (asked for prefill-cost): the answering
        attempt's prefill is done."""
        live = self.live.get(rid)
        if live is not None and live.info is not None:
            live.info.prefilled()

    def progress(self, rid: int, endpoint: int, events: int) -> None:
        """A running stream's events since its last report count as output tokens of its
        endpoint now (the final usage settles the count at its end, as relay_sse.py does)."""
        live = self.live.get(rid)
        if live is None or not 0 <= endpoint < len(live.order):
            return
        live.counted += events
        signal = self.metrics._signal_families()[0]
        self.batch.add(self.metrics._child(signal, (live.server_label, live.order[endpoint].key, "output")), events)

    def done(self, rid: int, status: int, error: int, attempts: list[tuple[int, int]], duration: float,
             ttft: float, att_ttft: float, tpot: float, prompt: int, completion: int, events: int) -> None:
        live = self.live.pop(rid, None)
        if live is None:
            return
        fw = self.fw
        metrics = self.metrics
        balancer = self.balancer
        fw.in_flight -= 1
        if fw.in_flight == 0:
            fw.idle.set()
        self._add(live.downstream, -1)
        order = live.order
        if not attempts:
            order[0].health.abandon(live.pending)
            balancer.finished(order[0], None, None, live.info)
        last = len(attempts) - 1
        for k in range(live.finished, len(attempts)):
            ok = k == last
            self._finish(live, k, attempts[k][1], error, ok, att_ttft if ok and att_ttft >= 0 else None,
                         tpot if ok and tpot >= 0 else None)
        self._add(live.gauge, -1)
        endpoint = order[attempts[-1][0]].key if attempts else order[0].key
        if error == _E_TOO_LARGE:
            metrics.upstream_error(live.server_label, endpoint, "response_too_large")
        error_type = _ERROR_TYPES.get(error)  # else a router error: its status's type
        if error_type is None:
            error_type = ERROR_TYPES.get(status, "error")
        model, path_label = live.model, live.path_label
        # metrics.observe_request/_ttft/_tokens/_tpot and observe_endpoint_tokens, batched
        batch = self.batch
        children = self.reports.get((model, path_label, live.route_label, live.server_label, endpoint, status,
                                     error_type))
        batch.add(children.requests, 1)
        batch.observe(children.duration, duration)
        if ttft >= 0:
            batch.observe(children.ttft(), ttft)
        p = prompt if prompt >= 0 else None
        c = completion if completion >= 0 else None
        if (p is not None or c is not None) and not children.signals:
            metrics._signal_families()  # registered at the first usage report, zero or not
            children.signals = True
        if p:
            by_model, by_endpoint = children.tokens("input")
            batch.add(by_model, p)
            batch.add(by_endpoint, p)
            if live.info is not None:
                balancer.observe_prompt_tokens(live.info, p)
        if c:
            by_model, by_endpoint = children.tokens("output")
            batch.add(by_model, c)
            if c > live.counted:  # what progress reports counted while the stream ran
                batch.add(by_endpoint, c - live.counted)
        if tpot >= 0:
            batch.observe(children.tpot(), tpot)
        if fw.access_log is not None:
            fw.access_log.write(AccessRecord(
                live.request_id, "POST", path_label, stream=live.stream, route=live.route_label,
                server=live.server_label, model=model, endpoint=endpoint, status=status, error_type=error_type,
                attempts=len(attempts), ttft_ms=round(ttft * 1000, 3) if ttft >= 0 else None,
                duration_ms=round(duration * 1000, 3), prompt_tokens=p, completion_tokens=c))

    def abandon_all(self) -> None:
        """The front is closing: requests it still had end without an outcome."""
        for rid in list(self.live):
            self.done(rid, 499, _E_CLIENT, [], 0.0, -1.0, -1.0, -1.0, -1, -1, 0)
