"""Fair-queue metrics, registered on the router's registry (multiprocess like the others).

Kthena's families keep their names (`kthena_router_fairness_queue_*`); their label is the
ModelServer (`model_server`, "namespace/name": the queue is per ModelServer, the set of
endpoints that saturates) and the priority class, not Kthena's per-model `user_id="_all"`.
Ours add the tenant, bounded: the first MAX_TENANT_LABELS tenants a worker sees get their
own label value, later ones share "_other"; the anonymous tenant is "_anonymous".
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kthena_router.metric_labels import LabelChildren

MAX_TENANT_LABELS = 100
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class FairnessMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.queue_size = Gauge(
            "kthena_router_fairness_queue_size", "Requests waiting in the fair queue",
            ["model_server", "priority"], multiprocess_mode="livesum", registry=registry)
        self.wait = Histogram(
            "kthena_router_fairness_queue_duration_seconds",
            "Time requests waited in the fair queue before dispatch (queued requests only)",
            ["model_server", "priority"], buckets=WAIT_BUCKETS, registry=registry)
        self.dequeued = Counter(
            "kthena_router_fairness_queue_dequeue_total", "Requests dispatched from the fair queue after waiting",
            ["model_server"], registry=registry)
        self.cancelled = Counter(
            "kthena_router_fairness_queue_cancelled_total",
            "Requests that left the fair queue without dispatch (client gone or max wait)",
            ["model_server"], registry=registry)
        self.in_flight = Gauge(
            "kthena_router_fairness_queue_inflight", "Requests admitted through the fair queue and not finished",
            ["model_server"], multiprocess_mode="livesum", registry=registry)
        self.admitted = Counter(
            "kthena_router_fairness_admitted_total",
            "Requests admitted by the fair queue; path: immediate (not saturated) or queued",
            ["model_server", "tenant", "priority", "path"], registry=registry)
        self.rejected = Counter(
            "kthena_router_fairness_rejected_total",
            "Requests refused or dropped by the fair queue; reason: queue_full, max_wait, client_disconnect",
            ["model_server", "tenant", "priority", "reason"], registry=registry)
        self._tenants: set[str] = set()
        self._child = LabelChildren()

    def tenant_label(self, tenant: str) -> str:
        if not tenant:
            return "_anonymous"
        if tenant in self._tenants:
            return tenant
        if len(self._tenants) < MAX_TENANT_LABELS:
            self._tenants.add(tenant)
            return tenant
        return "_other"

    def set_queue_size(self, server: str, priority: str, n: int) -> None:
        self._child(self.queue_size, server, priority).set(n)

    def set_in_flight(self, server: str, n: int) -> None:
        self._child(self.in_flight, server).set(n)

    def admit(self, server: str, tenant: str, priority: str, waited_s: float | None) -> None:
        self._child(self.admitted, server, tenant, priority, "immediate" if waited_s is None else "queued").inc()
        if waited_s is not None:
            self._child(self.wait, server, priority).observe(waited_s)
            self._child(self.dequeued, server).inc()

    def reject(self, server: str, tenant: str, priority: str, reason: str) -> None:
        self._child(self.rejected, server, tenant, priority, reason).inc()
        if reason != "queue_full":
            self._child(self.cancelled, server).inc()
