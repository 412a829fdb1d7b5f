"""One proxied request: validate, route, build the upstream request, hand it to the executor.

The attempts (retry before the first byte) are executor.py's, the response bodies the
relays' (relay.py). This module owns what is about the client's request: the path
allow-list (paths.py), headers forwarded upstream and returned to the client
(headers.py), the body, the route match, pinning to the engine that stored a Responses
API response (by_id.py), the mapping of every failure to an OpenAI-style error, and the
access-log line.

The client side is a `Downstream` (downstream.py: ASGI or granian's RSGI), so nothing
past this module knows the server interface. Client disconnect: a watch armed before any
wait cancels the request task when the client goes, which closes the upstream
connection (the engine sees the disconnect and aborts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Callable
from typing import Any

from kthena_router.config.traffic import Admission, ServerTraffic
from kthena_router.access_log import AccessLog, AccessRecord
from kthena_router.endpoints.balancer import Balancer
from kthena_router.endpoints.health import HealthProber
from kthena_router.endpoints.registry import EndpointState
from kthena_router.errors import RequestError
from kthena_router.fairness.gate import FairnessGate
from kthena_router.identity.authenticate import Authenticator
from kthena_router.identity.model import ANONYMOUS, Identity
from kthena_router.metrics import RouterMetrics
from kthena_router.pd.config import DEFAULT_PD, PdSettings
from kthena_router.pd.connectors import HopBodies
from kthena_router.pd.dispatch import PdDispatcher
from kthena_router.pd.metrics import PdMetrics
from kthena_router.pd.pairing import PdPairer
from kthena_router.pd.topology import PdTopology
from kthena_router.proxy.body import CHAT_PATH, COMPLETIONS_PATH, ClientDisconnected, needs_usage_injection, \
    parse_body, rewrite
from kthena_router.proxy.by_id import pinned_endpoint, stored_at
from kthena_router.proxy.executor import Executor
from kthena_router.proxy.external import ExternalDispatcher
from kthena_router.proxy.headers import RequestHeaders, response_headers
from kthena_router.proxy.paths import RESPONSES_PATH, ApiPath, label_of, request_line, resolve
from kthena_router.proxy.downstream import AsgiDownstream, Downstream, RsgiDownstream, Watch
from kthena_router.proxy.relay import Exchange, Message, Receive, Scope, Send
from kthena_router.proxy.response_ids import ResponseIds, StoredAt
from kthena_router.proxy.sse import StreamEnd
from kthena_router.proxy.upstream import Response, UpstreamPool
from kthena_router.proxy.zero_hold import ZeroHold
from kthena_router.ratelimit.limiter import Limiter
from kthena_router.routing.table import ExternalMatch, RouteMatch, RouteNotFound
from kthena_router.scheduling.request import RequestInfo
from kthena_router.session import Pin, SessionAffinity
from kthena_router.settings import RouterSettings
from kthena_router.state import RouterState, StateHolder

log = logging.getLogger(__name__)

__all__ = ["Forwarder", "Message", "Receive", "Scope", "Send"]

_OTHER_LABEL = "/v1/other"  # "path" metric label of refused paths


class Forwarder:
    """The hot path: an ASGI callable for every proxied /v1/* request."""

    def __init__(self, settings: RouterSettings, holder: StateHolder, pool: UpstreamPool,
                 balancer: Balancer, metrics: RouterMetrics, prober: HealthProber,
                 executor: Executor | None = None, access_log: AccessLog | None = None,
                 sticky: SessionAffinity | None = None) -> None:
        self.settings = settings
        self.response_ids = ResponseIds(settings.response_id_cache_size)
        self.access_log = access_log
        self.holder = holder
        self.metrics = metrics
        self.executor = executor or Executor(settings, pool, balancer, metrics, prober)
        self.external = ExternalDispatcher(settings, pool, metrics, prober)  # ExternalModelProvider targets
        self.needs_info = balancer.needs_request_info
        self.limiter: Limiter | None = None  # token rate limits (app.py sets it)
        self.sticky = sticky or SessionAffinity(settings.runtime_dir, metrics, lambda: None)
        self.auth: Authenticator | None = None  # set by the identity service when auth is configured
        self.fairness: FairnessGate | None = None  # set while the router configuration enables fair queuing
        # requests held while their ModelServer has no endpoint (scaleFromZero); app.py wires its
        # settings and the state installs that release them
        self.zero_hold = ZeroHold(metrics, settings.workers)
        # prefill/decode servers (kthena_router/pd): pairing, the `pd` section, the two-hop dispatch
        self.pd_pairer: PdPairer | None = None  # set by app.create_app
        self.pd_settings: Callable[[], PdSettings] = lambda: DEFAULT_PD
        self.pd = PdDispatcher(settings, self.executor, pool, metrics, PdMetrics(metrics.registry))
        # Weighted route splits; per worker. A fixed seed makes a 1-worker run reproducible.
        self.rng = random.Random(settings.route_seed)
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI."""
        await self.serve(scope["method"], scope["path"], scope.get("query_string", b""),
                         RequestHeaders.from_asgi(scope["headers"]), AsgiDownstream(receive, send))

    async def rsgi(self, scope: Any, proto: Any) -> None:
        """granian RSGI (scope.query_string is str there)."""
        query = scope.query_string
        await self.serve(scope.method, scope.path, query.encode("latin-1") if query else b"",
                         RequestHeaders(scope.headers.items()), RsgiDownstream(proto))

    async def serve(self, method: str, path: str, query: bytes, hdrs: RequestHeaders, down: Downstream) -> None:
        t0 = time.perf_counter()
        state = self.holder.current
        if state is not None:
            admission = state.traffic.admission
            # requests waiting in the fair queue are bounded by its maxQueueLength, not here
            fq = self.fairness
            busy = self.in_flight - self.zero_hold.held  # held ones are bounded by scaleFromZero.maxPending
            if fq is not None:
                busy -= fq.waiters
            if admission.max_in_flight_per_worker and busy >= admission.max_in_flight_per_worker:
                await self._shed(method, path, down, admission, t0)
                return
        self.in_flight += 1
        self.idle.clear()
        req = _Request(self, method, path, query, hdrs, t0, down)
        try:
            await req.run()
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()

    async def _shed(self, method: str, path: str, down: Downstream, admission: Admission, t0: float) -> None:
        """Over the admission limit: 503 + Retry-After before reading the body, so that
        memory does not grow with the queue."""
        retry_after = str(max(1, math.ceil(admission.retry_after_s))).encode()
        err = RequestError(503, f"the router is overloaded ({self.in_flight} requests in flight in this "
                                f"worker, limit {admission.max_in_flight_per_worker}); retry after "
                                f"{retry_after.decode()}s", code="overloaded")
        with contextlib.suppress(Exception):
            await down.error(err, [(b"retry-after", retry_after)])
        self.metrics.observe_request("", label_of(method, path, _OTHER_LABEL), 503, "overloaded", "", "", "",
                                     time.perf_counter() - t0)


class _Request(Exchange):
    """State of one request; methods are the steps of Forwarder's hot path."""

    __slots__ = ("fw", "method", "query", "hdrs", "fwd_headers", "header_map", "response_headers", "watch", "api",
                 "identity", "pin")

    def __init__(self, fw: Forwarder, method: str, path: str, query: bytes, hdrs: RequestHeaders, t0: float,
                 down: Downstream) -> None:
        super().__init__(fw.metrics, t0, path, _OTHER_LABEL)
        self.down = down
        self.fw = fw
        self.method = method
        self.query = query
        self.hdrs = hdrs
        self.header_map = hdrs.by_name
        self.request_id = hdrs.request_id
        self.fwd_headers = hdrs.upstream  # forwarded header lines, CRLF-terminated, x-request-id last
        self.response_headers: list[tuple[bytes, bytes]] = [(b"x-request-id", self.request_id.encode("latin-1"))]
        self.watch: Watch | None = None
        self.api: ApiPath | None = None
        self.identity: Identity = ANONYMOUS
        self.pin: Pin | None = None  # session stickiness (kthena_router.session)

    # --- entry ----------------------------------------------------------------------

    async def run(self) -> None:
        hdrs = self.hdrs
        down = self.down
        watch: Watch | None = None
        downstream = None
        try:
            try:
                if self.fw.auth is not None:  # before the body is read: a refused client sends no more
                    self.identity = await self.fw.auth.authenticate(self.header_map)
                if hdrs.refusal is not None:
                    raise hdrs.refusal
                api = self.api = resolve(self.method, self.path)
                self.path_label = api.label
                self.stream_end = api.stream_end
                if hdrs.content_type.startswith("multipart/"):
                    raise RequestError(415, f"{self.path} takes a JSON body (application/json), "
                                            "not multipart/form-data")
                raw = await down.read_body(hdrs.content_length(), self.fw.settings.max_body_bytes)
                state = self.fw.holder.current
                if state is None:
                    raise RequestError(503, "router has no configuration loaded yet")
                if api.response_id:  # no body to route by: the stored response's model does
                    body: Any = _ById(raw, stored_at(self.fw.response_ids, api.response_id, "response_id").model)
                else:
                    body = parse_body(raw, self.path)
                match = self._match(state, api, body)
                external = type(match) is ExternalMatch  # a third-party API: no pods (proxy/external.py)
                targets = () if external else state.targets.get(match.server.key, ())
                self.model_label = body.model
                downstream = self.fw.metrics.downstream(body.model)
                downstream.inc()
                # Armed before any wait (hold, Redis): a client that leaves while we wait cancels us.
                watch = self.watch = down.arm()
                # no endpoint at all: scaled to zero? (a stored response went with its engine: no wait)
                if not targets and not external and not api.response_id:
                    state, match = await self._hold_for_zero(state, api, body, match)
                    external = type(match) is ExternalMatch
                    targets = () if external else state.targets.get(match.server.key, ())
                pinned = None if external else self._pinned(api, body, targets)
                limiter = self.fw.limiter
                if limiter is not None and (plan := limiter.plan(match.route, self.identity)) is not None:
                    self.rl = await plan.admit(self, body, self.identity)  # 429 / 400 / 503
                # After admission: a refused request costs no session-store round trip.
                if pinned is None and not external and (sticky := self.fw.sticky.for_route(match.route)) is not None:
                    self.pin = await self.fw.sticky.lookup(
                        match.route, self.header_map, hdrs.cookie_headers(), self.query,
                        self.identity.claims, targets, sticky)
                if type(match) is ExternalMatch:
                    await self.fw.external.run(self, body, match, state.traffic, self.header_map,
                                               self.query)
                else:
                    await self._forward(body, match, targets, pinned, state.traffic_of(match.server.key),
                                        state.pd.get(match.server.key) if state.pd else None)
            except RequestError as err:
                self.status = err.status
                self.error_type = err.type
                if not self.committed:
                    self.last_send()
                    await down.error(err, self.response_headers)
        except ClientDisconnected:
            # While reading the body. granian reports invalid chunk framing the same way as a
            # client that left: answer 400 (if the client is gone, the send is a no-op), so
            # a present client never gets granian's text/plain 500.
            self.status, self.error_type = 400, "incomplete_body"
            if not self.committed:
                self.last_send()
                with contextlib.suppress(Exception):
                    await down.error(RequestError(400, "request body incomplete or malformed "
                                                             "(invalid chunked framing or connection closed)"),
                                     self.response_headers)
        except asyncio.CancelledError:
            if watch is None or not watch.fired:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            self.status, self.error_type = 499, "client_disconnect"
        except Exception:
            log.exception("unexpected error on %s", self.path)
            self.status, self.error_type = 500, "internal_error"
            if not self.committed:
                try:
                    await down.error(RequestError(500, "internal router error"), self.response_headers)
                except Exception:
                    pass
        finally:
            if watch is not None:
                watch.close()
            if downstream is not None:
                downstream.dec()
            if self.rl is not None:
                self.rl.settle(self)
            duration = time.perf_counter() - self.t0
            self.fw.metrics.observe_request(
                self.model_label, self.path_label, self.status, self.error_type, self.route_label,
                self.server_label, self.endpoint_label, duration)
            if self.response_id is not None and self.status == 200:
                self.fw.response_ids.put(self.response_id, StoredAt(self.endpoint_label, self.model_label))
            if self.fw.access_log is not None:
                self._log_access(duration)

    def _match(self, state: RouterState, api: ApiPath, body: Any) -> RouteMatch | ExternalMatch:
        try:
            return state.table.match(body.model, RESPONSES_PATH if api.response_id else self.path,
                                     self.header_map, self.fw.rng)
        except RouteNotFound as exc:
            raise RequestError(404, exc.message, param="model") from None

    async def _hold_for_zero(self, state: RouterState, api: ApiPath, body: Any,
                             match: RouteMatch) -> tuple[RouterState, RouteMatch | ExternalMatch]:
        """The ModelServer has no endpoint: with scaleFromZero holding on, wait for a state in
        which the request's (re-matched) target has one, up to the hold timeout (proxy/zero_hold.py).
        Off: return as is (the executor answers 503 as before)."""
        zh = self.fw.zero_hold
        server = match.server
        hs = zh.settings_for(server)
        if not hs.enabled:
            return state, match
        label = f"{server.namespace}/{server.name}"
        deadline = asyncio.get_running_loop().time() + hs.hold_timeout_s
        with zh.hold(server, label, body.model, hs) as held:
            while await held.next_change(deadline):
                state = self.fw.holder.current or state
                match = self._match(state, api, body)
                if type(match) is ExternalMatch or state.targets.get(match.server.key):
                    return state, match
        raise RequestError(503, f"model `{body.model}` has no replicas: ModelServer {label} has no endpoint and "
                                f"none appeared within the hold timeout ({hs.hold_timeout_s:g}s, "
                                "scaleFromZero.holdTimeout)", code="no_replicas")

    def last_send(self) -> None:
        """From here on the response completes; a disconnect seen now must not cancel us
        (granian's ASGI receive() also reports http.disconnect once the response is done)."""
        if self.watch is not None:
            self.watch.finished = True

    def _pinned(self, api: ApiPath, body: Any, targets: tuple[EndpointState, ...]) -> EndpointState | None:
        """The engine that stored the response this request refers to, if it refers to one."""
        if api.response_id:
            at = stored_at(self.fw.response_ids, api.response_id, "response_id")
            return pinned_endpoint(targets, at, api.response_id, "response_id")
        if api.stream_end is StreamEnd.RESPONSES:
            prev = body.obj.get("previous_response_id")
            if prev is not None:
                at = stored_at(self.fw.response_ids, prev, "previous_response_id")
                return pinned_endpoint(targets, at, prev, "previous_response_id")
        return None

    def _log_access(self, duration: float) -> None:
        assert self.fw.access_log is not None
        ttft = self.ttft
        self.fw.access_log.write(AccessRecord(
            self.request_id, self.method, self.path_label, stream=self.stream, route=self.route_label,
            server=self.server_label, model=self.model_label, endpoint=self.endpoint_label, status=self.status,
            error_type=self.error_type, attempts=self.attempts,
            ttft_ms=None if ttft is None else round(ttft * 1000, 3), duration_ms=round(duration * 1000, 3),
            prompt_tokens=self.att_prompt_tokens, completion_tokens=self.completion_tokens))

    # --- forwarding -------------------------------------------------------------------

    async def _forward(self, body: Any, match: RouteMatch, targets: tuple[EndpointState, ...],
                       pinned: EndpointState | None, traffic: ServerTraffic, topo: PdTopology | None) -> None:
        fw = self.fw
        server = match.server
        self.route_label = f"{match.route.namespace}/{match.route.name}"
        self.server_label = f"{server.namespace}/{server.name}"
        self.stream = body.stream
        # usage injection: only APIs whose streams carry a usage chunk (chat, completions)
        self.inject = inject = needs_usage_injection(body) and self.stream_end is StreamEnd.DONE
        upstream_model = None if match.is_lora else match.upstream_model
        # PD servers: generation takes two hops (kthena_router/pd); their other APIs (tokenize,
        # embeddings, ...) go to a decode endpoint; the Responses API is refused (see _pd_two_hop).
        two_hop = topo is not None and self._pd_two_hop(body, topo)
        if topo is not None and not two_hop:
            targets = topo.decode
        info = None
        if (fw.needs_info or two_hop) and pinned is None:  # the pairer always gets it
            info = RequestInfo(self.request_id, self.path, body.obj, server.model or match.upstream_model,
                               body.model if match.is_lora else "", body.model)
        headers = self.fwd_headers
        if server.upstream_headers:
            headers += b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in server.upstream_headers.items())
        # request line and headers except Host (per endpoint), then the body's length
        head = request_line(self.method, self.path, self.query)
        preferred = None if self.pin is None else self.pin.preferred
        if two_hop:
            assert topo is not None
            size = len(body.raw)
            bodies = HopBodies(body, topo.connector, upstream_model, inject)
            settings = fw.pd_settings().for_server(server.namespace, server.name)

            async def deliver() -> None:
                assert topo is not None and fw.pd_pairer is not None
                await fw.pd.run(self, fw.pd_pairer, bodies, match, topo, info, head, headers, traffic, settings,
                                preferred)
        else:
            payload = body.raw if isinstance(body, _ById) else rewrite(body, upstream_model, inject)
            size = len(payload)
            tail = headers + b"content-length: " + str(len(payload)).encode() + b"\r\n\r\n"

            async def deliver() -> None:
                await fw.executor.run(self, match, targets, info, head, tail, payload, traffic, pinned, preferred)
        gate = fw.fairness
        if gate is None or isinstance(body, _ById):
            await deliver()
            return
        ident = self.identity
        slot = await gate.acquire(server.key, self.server_label, self.route_label, targets,
                                  ident.tenant or ident.user, ident.priority, size)
        try:
            await deliver()
        finally:
            gate.release(slot, self.att_prompt_tokens, self.completion_tokens)

    def _pd_two_hop(self, body: Any, topo: PdTopology) -> bool:
        """Whether this request to a PD server takes the two hops (generation APIs)."""
        if self.path == CHAT_PATH or self.path == COMPLETIONS_PATH:
            return True
        if self.stream_end is StreamEnd.RESPONSES or isinstance(body, _ById):
            # kv_transfer_params / bootstrap fields are not part of the Responses API
            raise RequestError(400, f"{self.path} is not served by prefill/decode ModelServer {self.server_label}: "
                                    "only /v1/chat/completions and /v1/completions are disaggregated",
                               code="pd_unsupported_api")
        return False

    def start_headers(self, resp: Response) -> list[tuple[bytes, bytes]]:
        if self.pin is not None and resp.status < 400:  # the endpoint that answers, after any retry
            self.fw.sticky.record(self.pin, self.endpoint_label)
        out = response_headers(resp.raw_headers)
        out.extend(self.response_headers)
        return out


class _ById:
    """The body-less request of GET /v1/responses/{id} (or its cancel), routed by the stored model."""

    __slots__ = ("raw", "obj", "model", "stream", "client_wants_usage")

    def __init__(self, raw: bytes, model: str) -> None:
        self.raw = raw
        self.obj: dict[str, Any] = {}
        self.model = model
        self.stream = False
        self.client_wants_usage = False
