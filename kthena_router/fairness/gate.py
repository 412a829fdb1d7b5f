"""Fair queuing in front of the executor: a request waits for a slot while its ModelServer's
endpoints are saturated, and waiters go in priority-class order, then by the tenants'
virtual token counters (the Rust `_core.FairQueue`, rust/core/src/fairq.rs).

Per worker, one queue per ModelServer. The proxy calls `acquire` before the executor runs
and `release` when the request ends (real prompt and completion tokens settle the
charge). Saturated, for a ModelServer (the `saturation` settings):
- this worker's admitted requests >= `maxInFlight`; or
- >= `maxInFlightPerEndpoint` x healthy endpoints; with `auto`, the learned capacity: per
  endpoint, 1 + the engine's batch capacity (capacity.py: its running count while it
  queues, revised upwards when it runs more with nothing queued), so the engine keeps
  about one request queued; divided among the workers; an endpoint not learned yet sets
  no limit;
- every healthy endpoint reported >= `maxWaitingPerEndpoint` waiting requests at its last
  fresh scrape and no request of this worker finished since (dispatch then follows
  completions until a scrape shows the queues below the threshold).
No healthy endpoint: not saturated (the executor answers 503 rather than a queue that
cannot drain). Bounds: a class's `maxQueueLength` (429 queue_full) and `maxWaitSeconds`
(503 queue_timeout), both with Retry-After. A waiter whose client disconnects is cancelled
with its task and leaves the Rust queue at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from kthena_router import _core
from kthena_router.errors import RequestError

from .capacity import CapacityLearner
from .config import FairnessSettings
from .metrics import FairnessMetrics

log = logging.getLogger(__name__)

__all__ = ["FairnessGate", "Slot"]

_U32 = (1 << 32) - 1
BYTES_PER_TOKEN = 4  # the dispatch estimate of prompt tokens; the real count settles it


class Slot:
    """One admitted request; `release` it exactly once."""

    __slots__ = ("q", "rq", "class_id", "tenant_id", "input_est")

    def __init__(self, q: ModelQueue, rq: Any, class_id: int, tenant_id: int, input_est: int) -> None:
        self.q = q
        self.rq = rq  # the Rust queue that charged it (a reload may replace q.rq)
        self.class_id = class_id
        self.tenant_id = tenant_id
        self.input_est = input_est


class _Waiter:
    __slots__ = ("fut", "ticket", "class_id", "tenant", "tenant_id", "tenant_label", "input_est", "t0", "timer")

    def __init__(self, fut: asyncio.Future[Slot], class_id: int, tenant: str, tenant_id: int, tenant_label: str,
                 input_est: int, t0: float) -> None:
        self.fut = fut
        self.ticket = 0
        self.class_id = class_id
        self.tenant = tenant
        self.tenant_id = tenant_id
        self.tenant_label = tenant_label
        self.input_est = input_est
        self.t0 = t0
        self.timer: asyncio.TimerHandle | None = None


def _new_rust_queue(s: FairnessSettings) -> Any:
    return _core.FairQueue([(c.order, c.weight, c.max_queue_length) for c in s.classes], s.input_weight,
                           s.output_weight, s.token_weight, s.request_weight)


class ModelQueue:
    """One ModelServer's fair queue in this worker."""

    def __init__(self, gate: FairnessGate, label: str) -> None:
        self.gate = gate
        self.label = label
        s = gate.settings
        self.rq = _new_rust_queue(s)
        self.shape = s.queue_shape()
        self.class_names = tuple(c.name for c in s.classes)
        self.ids: dict[str, int] = {}
        self.names: dict[int, str] = {}
        self.free: list[int] = []
        self.waiters: dict[int, _Waiter] = {}
        self.in_flight = 0
        self.in_flight_at_scrape = 0
        self.targets: tuple[Any, ...] = ()
        self.endpoint_keys: frozenset[str] = frozenset()

    def set_targets(self, targets: tuple[Any, ...]) -> None:
        self.targets = targets
        self.endpoint_keys = frozenset(ep.key for ep in targets)

    def intern(self, tenant: str) -> int:
        tid = self.ids.get(tenant)
        if tid is None:
            tid = self.free.pop() if self.free else len(self.ids)
            self.ids[tenant] = tid
            self.names[tid] = tenant
        return tid

    def forget(self, ids: Iterable[int]) -> None:
        for tid in ids:
            name = self.names.pop(tid, None)
            if name is not None:
                del self.ids[name]
                self.free.append(tid)

    # --- saturation ----------------------------------------------------------------------
    def saturated(self) -> bool:
        gate = self.gate
        sat = gate.settings.saturation
        n = self.in_flight
        if sat.max_in_flight is not None and n >= sat.max_in_flight:
            return True
        healthy = [ep for ep in self.targets if ep.health.healthy]
        if not healthy:
            return False
        if sat.max_in_flight_per_endpoint is not None:
            if n >= sat.max_in_flight_per_endpoint * len(healthy):
                return True
        elif sat.learn:
            cap = gate.learned_capacity(healthy)
            if cap is not None and n >= cap:
                return True
        threshold = sat.max_waiting_per_endpoint
        if threshold is not None and n >= self.in_flight_at_scrape:
            waiting = gate.waiting
            return all((w := waiting.get(ep.key)) is not None and w >= threshold for ep in healthy)
        return False

    # --- admission -----------------------------------------------------------------------
    def admitted(self, class_id: int, tenant_id: int, input_est: int) -> Slot:
        self.in_flight += 1
        self.gate.metrics.set_in_flight(self.label, self.in_flight)
        return Slot(self, self.rq, class_id, tenant_id, input_est)

    def pump(self, *, force: bool = False) -> None:
        """Dispatch waiters while the ModelServer is not saturated (all of them: force)."""
        rq = self.rq
        gate = self.gate
        touched: set[int] = set()
        while len(rq) and (force or not self.saturated()):
            ticket = rq.dequeue(gate.now_ms())
            w = self.waiters.pop(ticket, None)
            if w is None:
                continue
            gate.waiters -= 1
            touched.add(w.class_id)
            if w.timer is not None:
                w.timer.cancel()
            if w.fut.done():  # its task is being cancelled (client gone): undo the dispatch charge
                rq.settle(w.class_id, w.tenant_id, -w.input_est, 0, gate.now_ms())
                gate.metrics.reject(self.label, w.tenant_label, self.class_names[w.class_id], "client_disconnect")
                continue
            gate.metrics.admit(self.label, w.tenant_label, self.class_names[w.class_id], gate.clock() - w.t0)
            w.fut.set_result(self.admitted(w.class_id, w.tenant_id, w.input_est))
        for cid in touched:
            self.report_size(cid)

    def drop(self, w: _Waiter, reason: str) -> bool:
        """Take a waiter out (client gone, max wait); False if it was no longer waiting."""
        if self.waiters.pop(w.ticket, None) is None:
            return False
        self.rq.cancel(w.ticket)
        self.gate.waiters -= 1
        if w.timer is not None:
            w.timer.cancel()
        self.gate.metrics.reject(self.label, w.tenant_label, self.class_names[w.class_id], reason)
        self.report_size(w.class_id)
        return True

    def report_size(self, class_id: int) -> None:
        self.gate.metrics.set_queue_size(self.label, self.class_names[class_id], self.rq.class_len(class_id))

    # --- reconfiguration -----------------------------------------------------------------
    def reconfigure(self, s: FairnessSettings) -> None:
        """New settings: bounds apply in place; new classes or costs rebuild the Rust queue
        and move the waiters over in arrival order (counters start afresh)."""
        if s.queue_shape() == self.shape:
            for i, c in enumerate(s.classes):
                self.rq.set_max_len(i, c.max_queue_length)
            return
        old, old_names = self.rq, self.class_names
        for cid in range(len(old_names)):
            self.gate.metrics.set_queue_size(self.label, old_names[cid], 0)
        self.rq, self.shape = _new_rust_queue(s), s.queue_shape()
        self.class_names = tuple(c.name for c in s.classes)
        default = s.class_index(s.default_priority) or 0
        now = self.gate.now_ms()
        for ticket, class_id, _ in old.waiting():
            w = self.waiters.pop(ticket)
            cid = s.class_index(old_names[class_id])
            w.class_id = default if cid is None else cid
            w.ticket = self.rq.enqueue(w.class_id, w.tenant_id, self.gate.tenant_weight(w.tenant), w.input_est, now)
            if w.ticket:
                self.waiters[w.ticket] = w
            else:
                self.gate.waiters -= 1
                if w.timer is not None:
                    w.timer.cancel()
                self.gate.metrics.reject(self.label, w.tenant_label, self.class_names[w.class_id], "queue_full")
                w.fut.set_exception(self.gate.full_error(self, w.class_id))
        for cid in range(len(self.class_names)):
            self.report_size(cid)


class FairnessGate:
    """Per worker: the fair queues of every ModelServer and what saturation is judged on."""

    def __init__(self, metrics: FairnessMetrics, settings: FairnessSettings, workers: int = 1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics = metrics
        self.workers = max(1, workers)
        self.clock = clock
        self.settings = settings
        self.class_ids = {c.name: i for i, c in enumerate(settings.classes)}
        self.queues: dict[tuple[str, str], ModelQueue] = {}
        self.learned = CapacityLearner()  # endpoint -> the engine's batch capacity (auto)
        self.waiting: dict[str, int | None] = {}  # endpoint -> waiting at the last scrape (None: stale)
        self.waiters = 0  # requests waiting in this worker (the Forwarder's admission limit skips them)
        self._unknown_classes: set[str] = set()

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def tenant_weight(self, tenant: str) -> float:
        s = self.settings
        return s.tenant_weights.get(tenant, s.default_tenant_weight)

    # --- configuration and signals -----------------------------------------------------------
    def configure(self, settings: FairnessSettings) -> None:
        self.settings = settings
        self.class_ids = {c.name: i for i, c in enumerate(settings.classes)}
        for q in self.queues.values():
            q.reconfigure(settings)
            q.pump(force=not settings.enabled)

    def install(self, settings: FairnessSettings | None) -> FairnessGate | None:
        """A router configuration was installed: the gate for the proxy, or None when fair
        queuing is off (absent or `enabled: false`; waiters then all go through)."""
        self.configure(settings if settings is not None else FairnessSettings(enabled=False))
        return self if self.settings.enabled else None

    def follow(self, scraper: Any, applier: Any) -> None:
        """Chain onto the engine-state scraper's snapshots and the routing-state installs."""
        prev_update, prev_swap = scraper.on_update, applier.on_swap

        def on_update(snap: Any) -> None:
            if prev_update is not None:
                prev_update(snap)
            self.on_snapshot(snap)

        def on_swap(state: Any) -> None:
            if prev_swap is not None:
                prev_swap(state)
            self.on_state(state.targets)

        scraper.on_update, applier.on_swap = on_update, on_swap

    def learned_capacity(self, healthy: list[Any]) -> int | None:
        total = 0
        learned = self.learned.capacity
        for ep in healthy:
            n = learned.get(ep.key)
            if n is None:
                return None
            total += n + 1
        return math.ceil(total / self.workers)

    def on_snapshot(self, snap: Any) -> None:
        key = snap.key
        waiting, running = snap.waiting, snap.running
        self.waiting[key] = waiting
        self.learned.observe(key, running, waiting)
        for q in self.queues.values():
            if key in q.endpoint_keys:
                q.in_flight_at_scrape = q.in_flight
                q.pump()

    def on_state(self, targets: dict[tuple[str, str], tuple[Any, ...]]) -> None:
        """After a routing-state install: new endpoint sets; forget what left."""
        live = {ep.key for eps in targets.values() for ep in eps}
        self.learned.forget(live)
        for key in [k for k in self.waiting if k not in live]:
            del self.waiting[key]
        for key, q in list(self.queues.items()):
            eps = targets.get(key)
            if eps is None and not q.waiters and not q.in_flight:
                del self.queues[key]
                continue
            q.set_targets(eps or ())
            q.pump()

    def tick(self) -> None:
        """Periodic: dispatch what health or scrape changes allow, forget idle tenants."""
        now = self.now_ms()
        idle_ms = int(self.settings.tenant_idle_s * 1000)
        for q in self.queues.values():
            q.pump()
            q.forget(q.rq.prune(now, idle_ms))

    async def run(self, interval_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.tick()
            except Exception:  # never let the queues stop draining
                log.exception("fair queue tick failed")

    # --- the request path ------------------------------------------------------------------
    def _class_id(self, priority: str, route_key: str) -> int:
        s = self.settings
        if priority:
            cid = self.class_ids.get(priority)
            if cid is not None:
                return cid
            if priority not in self._unknown_classes and len(self._unknown_classes) < 100:
                self._unknown_classes.add(priority)
                log.warning("priority class %r is not in fairness.priorityClasses; such requests get the "
                            "route's default class", priority)
        return self.class_ids[s.route_priority.get(route_key, s.default_priority)]

    def full_error(self, q: ModelQueue, class_id: int) -> RequestError:
        cls = self.settings.classes[class_id]
        retry = str(max(1, math.ceil(self.settings.retry_after_s)))
        return RequestError(429, f"the fair queue of model server `{q.label}` is full for priority class "
                                 f"`{cls.name}` ({cls.max_queue_length} waiting); retry after {retry}s",
                            code="queue_full", headers=[(b"retry-after", retry.encode())])

    def _expire(self, q: ModelQueue, w: _Waiter) -> None:
        if not q.drop(w, "max_wait") or w.fut.done():
            return
        cls = self.settings.classes[w.class_id] if w.class_id < len(self.settings.classes) else None
        retry = str(max(1, math.ceil(self.settings.retry_after_s)))
        name, wait = (cls.name, cls.max_wait_s) if cls is not None else ("?", 0.0)
        w.fut.set_exception(RequestError(
            503, f"no capacity for model server `{q.label}` within the {wait:g}s maxWaitSeconds of priority "
                 f"class `{name}` (the request waited in the fair queue); retry after {retry}s",
            code="queue_timeout", headers=[(b"retry-after", retry.encode())]))

    async def acquire(self, server_key: tuple[str, str], server_label: str, route_key: str,
                      targets: tuple[Any, ...], tenant: str, priority: str, payload_bytes: int) -> Slot:
        """A slot for one request: at once when the ModelServer is not saturated, else after
        waiting in its fair queue. Raises RequestError 429 (queue full) or 503 (max wait)."""
        q = self.queues.get(server_key)
        if q is None:
            q = self.queues[server_key] = ModelQueue(self, server_label)
        if targets is not q.targets:
            q.set_targets(targets)
        class_id = self._class_id(priority, route_key)
        tenant_id = q.intern(tenant)
        weight = self.tenant_weight(tenant)
        input_est = min(payload_bytes // BYTES_PER_TOKEN, _U32)
        rq = q.rq
        if not len(rq) and not q.saturated():
            rq.admit(class_id, tenant_id, weight, input_est, self.now_ms())
            self.metrics.admit(q.label, self.metrics.tenant_label(tenant), q.class_names[class_id], None)
            return q.admitted(class_id, tenant_id, input_est)
        t_label = self.metrics.tenant_label(tenant)
        ticket = rq.enqueue(class_id, tenant_id, weight, input_est, self.now_ms())
        if not ticket:
            self.metrics.reject(q.label, t_label, q.class_names[class_id], "queue_full")
            raise self.full_error(q, class_id)
        loop = asyncio.get_running_loop()
        w = _Waiter(loop.create_future(), class_id, tenant, tenant_id, t_label, input_est, self.clock())
        w.ticket = ticket
        q.waiters[ticket] = w
        self.waiters += 1
        q.report_size(class_id)
        w.timer = loop.call_later(self.settings.classes[class_id].max_wait_s, self._expire, q, w)
        q.pump()  # a slot may have freed between the check and the enqueue's turn
        try:
            return await w.fut
        except asyncio.CancelledError:
            fut = w.fut
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result(), 0, 0)  # admitted just as the client left
            else:
                q.drop(w, "client_disconnect")
            raise

    def release(self, slot: Slot, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """The request ended: settle its real usage and let the next waiter in."""
        q = slot.q
        q.in_flight -= 1
        self.metrics.set_in_flight(q.label, q.in_flight)
        delta = prompt_tokens - slot.input_est if prompt_tokens else 0
        slot.rq.settle(slot.class_id, slot.tenant_id, delta, completion_tokens or 0, self.now_ms())
        q.pump()
