"""create_app(): the worker's ASGI application (granian factory).

Hot paths (every POST /v1/* except /v1/models) go straight to the Forwarder, a raw ASGI
callable; starlette serves the rest (lifespan, /v1/models, OpenAI-style 404s), where its
Request/Response objects cost nothing that matters.

Per worker process: the config state, route table, endpoint health, round-robin
counters, upstream connection pool and health prober (every worker probes every
endpoint every `health_probe_interval_s`). With a routerConfiguration (--router-config):
also the scheduler (Rust scorers, in-flight counts, approximate prefix index) and the
engine-state scraper (every worker scrapes every endpoint every `scrape_interval_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kthena_router import worker_status
from kthena_router.config.errors import ConfigError
from kthena_router.config.loader import load_config_file
from kthena_router.config.model import RouterConfig
from kthena_router.config.watcher import ConfigWatcher
from kthena_router.endpoints.balancer import Balancer, RoundRobinBalancer
from kthena_router.endpoints.health import EjectionPolicy, HealthProber
from kthena_router.endpoints.registry import EndpointRegistry
from kthena_router.engine_state.scraper import EngineStateScraper
from kthena_router.errors import error_response
from kthena_router.gc_tuning import GcMonitor, freeze_startup_heap
from kthena_router.loop_lag import LoopLagSampler
from kthena_router.metrics import RouterMetrics, ensure_multiprocess
from kthena_router.proxy.forward import Forwarder, Receive, Scope, Send
from kthena_router.proxy.upstream import UpstreamPool
from kthena_router.routing.table import RouteTable
from kthena_router.kv_events import EventSource
from kthena_router.scheduling.config import KvCacheAwareArgs, load_router_configuration_file
from kthena_router.scheduling.kv_matcher import KvAwareMatcher, event_source
from kthena_router.scheduling.scheduler import Scheduler
from kthena_router.settings import RouterSettings
from kthena_router.state import RouterState, StateHolder, build_state

log = logging.getLogger(__name__)

DNS_REFRESH_S = 30.0


class ConfigApplier:
    """Turns a loaded RouterConfig into the worker's current state (initial load and reloads)."""

    def __init__(self, settings: RouterSettings, holder: StateHolder, registry: EndpointRegistry,
                 metrics: RouterMetrics) -> None:
        self.settings = settings
        self.holder = holder
        self.registry = registry
        self.metrics = metrics
        self.on_swap: Callable[[RouterState], None] | None = None  # after every state swap
        self._tasks: set[asyncio.Task[None]] = set()

    def _install(self, state: RouterState) -> None:
        self.holder.swap(state)
        if self.on_swap is not None:
            self.on_swap(state)

    async def apply(self, cfg: RouterConfig) -> None:
        table = RouteTable.build(cfg)  # first: a table error keeps the old state
        await self.registry.resolve_names(cfg)
        self._swap(cfg, table)

    def _swap(self, cfg: RouterConfig, table: RouteTable) -> None:
        targets = self.registry.build(cfg)
        self._install(build_state(cfg, table, targets))
        for eps in targets.values():
            for ep in eps:
                self.metrics.set_endpoint_healthy(ep.server_label, ep.key, ep.health.healthy)
        self.metrics.config_reload(True)
        worker_status.report_applied(self.settings, cfg.digest)

    def on_config(self, cfg: RouterConfig) -> None:
        """ConfigWatcher callback (sync): swap now, or after DNS resolution of new names."""
        try:
            table = RouteTable.build(cfg)
        except Exception as exc:  # the loader validated; this is a bug, keep the old state
            log.exception("cannot build the route table; keeping the previous config")
            self._failed(str(exc))
            return
        if not self.registry.has_names(cfg):
            self._swap(cfg, table)
            return
        task = asyncio.get_running_loop().create_task(self._resolve_then_swap(cfg, table))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resolve_then_swap(self, cfg: RouterConfig, table: RouteTable) -> None:
        await self.registry.resolve_names(cfg)
        self._swap(cfg, table)

    def on_error(self, err: ConfigError) -> None:
        self._failed(str(err))

    def _failed(self, message: str) -> None:
        self.metrics.config_reload(False)
        worker_status.report_failed(self.settings, message)

    async def refresh_dns_forever(self) -> None:
        """Re-resolve endpoint names; rebuild the state when an answer changed."""
        while True:
            await asyncio.sleep(DNS_REFRESH_S)
            state = self.holder.current
            if state is None or not self.registry.has_names(state.config):
                continue
            try:
                await self.registry.resolve_names(state.config)
                targets = self.registry.build(state.config)
                keys = {k: tuple(ep.key for ep in v) for k, v in targets.items()}
                if keys != {k: tuple(ep.key for ep in v) for k, v in state.targets.items()}:
                    self._install(build_state(state.config, state.table, targets))
            except Exception:
                log.exception("DNS refresh failed")


def _scheduler_sync(scheduler: Scheduler, scraper: EngineStateScraper,
                    matcher: KvAwareMatcher | None = None) -> Callable[[RouterState], None]:
    """After a state swap: reconcile scorers/index, scrape exactly the live endpoints and
    (kvcache-aware) subscribe to exactly their KV-event streams."""

    def on_swap(state: RouterState) -> None:
        scheduler.sync(state.targets)
        live: dict[str, tuple[str, str, str]] = {}
        for key, eps in state.targets.items():
            flavour = state.config.servers[key].inference_engine
            for ep in eps:
                live.setdefault(ep.key, (ep.key, ep.base_url, flavour))
        scraper.set_endpoints(live.values())
        if matcher is not None:
            matcher.set_endpoints(_kv_sources(state, scheduler, matcher.args))

    return on_swap


def _kv_sources(state: RouterState, scheduler: Scheduler, args: KvCacheAwareArgs) -> dict[str, tuple[int, EventSource]]:
    """Endpoint key -> (scheduler id, KV-event source from the endpoint's labels)."""
    out: dict[str, tuple[int, EventSource]] = {}
    for key, eps in state.targets.items():
        labels = {(e.address, e.port): e.labels for e in state.config.endpoints_of(state.config.servers[key])}
        for ep in eps:
            ep_id = scheduler.endpoint_id(ep.key)
            src = event_source(ep.ip, labels.get((ep.host, ep.port), {}), args)
            if ep_id is not None and src is not None and ep.key not in out:
                out[ep.key] = (ep_id, src)
    return out


# Every method reaches our handlers, so that wrong ones get OpenAI-style JSON, not starlette's text.
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"]


async def _models(request: Request) -> Response:
    if request.method not in ("GET", "HEAD"):
        return error_response(405, f"method {request.method} is not allowed on /v1/models")
    state = request.app.state.holder.current
    if state is None:
        return error_response(503, "router has no configuration loaded yet")
    return Response(state.models_body, media_type="application/json")


async def _not_found(request: Request) -> Response:
    return error_response(404, f"no such endpoint: {request.method} {request.url.path}")


def create_app(settings: RouterSettings | None = None) -> Any:
    """granian factory: settings from the environment (at call time) unless given."""
    if settings is None:
        settings = RouterSettings.from_env()
    ensure_multiprocess(settings.prometheus_dir)
    metrics = RouterMetrics()
    holder = StateHolder()
    registry = EndpointRegistry(ejection=EjectionPolicy(settings.eject_base_s, settings.eject_max_s))
    pool = UpstreamPool(settings)
    scheduler: Scheduler | None = None
    matcher: KvAwareMatcher | None = None
    balancer: Balancer
    if settings.router_config_path:
        # validated by the parent (cli.py); read once per worker, no reload (as Kthena)
        router_cfg = load_router_configuration_file(settings.router_config_path)
        balancer = scheduler = Scheduler(router_cfg.scheduler, metrics, hot_spot_abs=settings.hot_spot_abs,
                                         hot_spot_rel=settings.hot_spot_rel)
        kv_args = router_cfg.scheduler.args.get("kvcache-aware")
        if scheduler.kv_aware and isinstance(kv_args, KvCacheAwareArgs):
            matcher = KvAwareMatcher(kv_args, metrics)
            scheduler.set_kv_matcher(matcher)
    else:
        balancer = RoundRobinBalancer()

    def all_targets() -> list[Any]:
        state = holder.current
        return [] if state is None else registry.unique(state.targets)

    prober = HealthProber(lambda: pool.session, all_targets, settings.health_probe_interval_s,
                          settings.health_probe_timeout_s)
    forwarder = Forwarder(settings, holder, pool, balancer, metrics, prober)
    gc_monitor = GcMonitor(metrics.registry)
    loop_lag = LoopLagSampler(metrics.registry, on_tick=[gc_monitor.flush])
    applier = ConfigApplier(settings, holder, registry, metrics)

    def health_changed(key: str, healthy: bool) -> None:
        state = holder.current
        if state is None:
            return
        for eps in state.targets.values():
            for ep in eps:
                if ep.key == key:
                    metrics.set_endpoint_healthy(ep.server_label, key, healthy)

    registry.set_health_listener(health_changed)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        cfg = await asyncio.to_thread(load_config_file, settings.config_path)
        await pool.start()
        tasks: list[asyncio.Task[None]] = []
        loop = asyncio.get_running_loop()
        scraper: EngineStateScraper | None = None
        if scheduler is not None:
            scraper = EngineStateScraper(pool.session, settings.scrape_interval_s, on_update=scheduler.on_snapshot)
            applier.on_swap = _scheduler_sync(scheduler, scraper, matcher)
        if matcher is not None:
            for err in await asyncio.to_thread(matcher.tokenizers.load_all):
                log.warning("kvcache-aware: %s (prefix-cache matching is used for that model)", err)
        await applier.apply(cfg)
        if scraper is not None:
            tasks.append(loop.create_task(scraper.run()))
        watcher: ConfigWatcher | None = None
        if settings.watch_config:
            watcher = ConfigWatcher(settings.config_path, applier.on_config, applier.on_error,
                                    trigger_path=settings.reload_trigger_path or None,
                                    initial_digest=cfg.digest)
            tasks.append(loop.create_task(watcher.run()))
        tasks.append(loop.create_task(applier.refresh_dns_forever()))
        prober.start()
        tasks.append(loop.create_task(loop_lag.run()))
        freeze_startup_heap()  # everything built so far lives as long as the worker
        gc_monitor.start()  # after the freeze's full collection: pauses while serving only
        try:
            yield
        finally:
            gc_monitor.stop()
            if watcher is not None:
                watcher.stop()
            if scraper is not None:
                scraper.stop()
            if matcher is not None:
                await matcher.close()
            for task in tasks:
                task.cancel()
            await prober.stop()
            # granian lets in-flight requests end before lifespan shutdown; this is a bound.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(forwarder.idle.wait(), timeout=settings.drain_grace_s)
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await pool.close()

    async def _kv_ownership(request: Request) -> Response:
        """This worker's KV-event ownership table (tests, debugging; O(entries))."""
        if matcher is None:
            return error_response(404, "kvcache-aware is not enabled")
        return JSONResponse(matcher.debug_view())

    starlette = Starlette(
        routes=[Route("/v1/models", _models, methods=_ALL_METHODS),
                Route("/debug/kv_ownership", _kv_ownership, methods=["GET"]),
                Route("/{path:path}", _not_found, methods=_ALL_METHODS)],
        lifespan=lifespan,
    )
    starlette.state.holder = holder

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path.startswith("/v1/") and path != "/v1/models":
                await forwarder(scope, receive, send)
                return
        await starlette(scope, receive, send)

    app.forwarder = forwarder  # type: ignore[attr-defined]  # for in-process tests
    app.scheduler = scheduler  # type: ignore[attr-defined]
    return app
