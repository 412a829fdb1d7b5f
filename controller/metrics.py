"""The controller's Prometheus metrics and its probe/metrics HTTP server.

One process, one event loop: a private CollectorRegistry (no multiprocess files, unlike the
router's workers) served by aiohttp on --health-port (/healthz, /readyz) and --metrics-port
(/metrics); the same port may serve both.

- /healthz: 200 while the event loop runs and the informers task is alive.
- /readyz: 200 once the caches have synced, on the leader and on a standby alike (a standby
  is a warm spare that takes over at once; no Service routes to the controller, so
  readiness only gates a rolling update of the Deployment: the next replica is replaced
  after this one is synced).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ControllerMetrics", "ProbeServer"]

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.reconciles = Counter("kthena_controller_reconcile_total",
                                  "Reconciles of a ModelServing by result (success, requeue, error)",
                                  ["result"], registry=r)
        self.reconcile_errors = Counter("kthena_controller_reconcile_errors_total",
                                        "Failed reconciles (retried with backoff) by error type", ["type"],
                                        registry=r)
        self.reconcile_duration = Histogram("kthena_controller_reconcile_duration_seconds",
                                            "Duration of one reconcile", buckets=_BUCKETS, registry=r)
        self.writes = Counter("kthena_controller_api_writes_total",
                              "Write requests sent to the API server by verb, resource and HTTP status code",
                              ["verb", "resource", "code"], registry=r)
        self.queue_depth = Gauge("kthena_controller_workqueue_depth",
                                 "Keys waiting in the work queue (not counting delayed or in-process)", registry=r)
        self.queue_in_process = Gauge("kthena_controller_workqueue_in_process",
                                      "Keys being reconciled now", registry=r)
        self.leader = Gauge("kthena_controller_leader", "1 while this replica holds the Lease and acts",
                            registry=r)
        self.synced = Gauge("kthena_controller_caches_synced", "1 once every informer has listed", registry=r)
        self.events_dropped = Counter("kthena_controller_events_dropped_total",
                                      "Kubernetes Events not written because the event queue was full",
                                      registry=r)
        self.cached = Gauge("kthena_controller_cached_objects", "Objects in the informer caches", ["resource"],
                            registry=r)

    def write(self, verb: str, resource: str, code: int) -> None:
        self.writes.labels(verb, resource, str(code)).inc()

    def wrap(self, handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """The reconcile handler, timed and counted (the exception still reaches run_worker)."""
        async def timed(key: Any) -> Any:
            start = time.perf_counter()
            try:
                again = await handler(key)
            except Exception as exc:
                self.reconciles.labels("error").inc()
                self.reconcile_errors.labels(type(exc).__name__).inc()
                raise
            finally:
                self.reconcile_duration.observe(time.perf_counter() - start)
            self.reconciles.labels("success" if again is None else "requeue").inc()
            return again
        return timed


class ProbeServer:
    """aiohttp server for the probes and /metrics. `ready()` -> (ok, reason); `alive()` -> ok."""

    def __init__(self, metrics: ControllerMetrics, host: str, health_port: int, metrics_port: int,
                 ready: Callable[[], tuple[bool, str]], alive: Callable[[], bool],
                 refresh: Callable[[], None] = lambda: None) -> None:
        self.metrics = metrics
        self.host = host
        self.ports = sorted({p for p in (health_port, metrics_port) if p})
        self.health_port, self.metrics_port = health_port, metrics_port
        self._ready, self._alive, self._refresh = ready, alive, refresh
        self._runners: list[web.AppRunner] = []

    def _app(self, health: bool, metrics: bool) -> web.Application:
        app = web.Application()
        if health:
            app.router.add_get("/healthz", self._healthz)
            app.router.add_get("/readyz", self._readyz)
        if metrics:
            app.router.add_get("/metrics", self._metrics)
        return app

    async def _healthz(self, _req: web.Request) -> web.Response:
        return web.Response(text="ok") if self._alive() else web.Response(status=503, text="informers stopped")

    async def _readyz(self, _req: web.Request) -> web.Response:
        ok, reason = self._ready()
        return web.Response(status=200 if ok else 503, text=reason)

    async def _metrics(self, _req: web.Request) -> web.Response:
        self._refresh()
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        for port in self.ports:
            app = self._app(port == self.health_port, port == self.metrics_port)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, self.host, port).start()
            self._runners.append(runner)

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
