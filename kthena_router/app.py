"""create_app(): the worker's application (granian factory): an ASGI app that granian
also serves through RSGI (serving.py).

Hot paths (every POST /v1/* except /v1/models) go straight to the Forwarder (ASGI or
RSGI); starlette serves the rest (lifespan, /v1/models, OpenAI-style 404s), where its
Request/Response objects cost nothing that matters.

Per worker process: the config state, route table, endpoint health, round-robin
counters, upstream connection pool and health prober (probes every endpoint every
`health_probe_interval_s`, unless the pod-state hub does it for every worker). With a routerConfiguration (--router-config):
also the scheduler (Rust scorers, in-flight counts, approximate prefix index), the
engine-state scraper and the router configuration's reload (router_config_reload.py).
With several workers the pod-state hub (podstate/, docs/pod-state.md) probes and scrapes
once per pod and relays prefix-index inserts; each worker's own prober and scraper idle
while it is connected and take over when it is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kthena_router.access_log import AccessLog
from kthena_router.config.loader import load_config_file
from kthena_router.config.provider_settings import DEFAULT_PROVIDER_SETTINGS
from kthena_router.config.scale_from_zero import DEFAULT_SCALE_FROM_ZERO
from kthena_router.config.traffic import DEFAULT_TRAFFIC, TrafficSettings
from kthena_router.config.watcher import ConfigWatcher
from kthena_router.config_applier import ConfigApplier
from kthena_router.debug_socket import DebugServer
from kthena_router.endpoints.balancer import Balancer, RoundRobinBalancer
from kthena_router.endpoints.health import HealthProber
from kthena_router.endpoints.registry import EndpointRegistry
from kthena_router.endpoints.selection import EndpointSelector
from kthena_router.engine_state.kv_usage import KvUsagePublisher
from kthena_router.engine_state.scraper import EngineStateScraper
from kthena_router.errors import RequestError, error_body, error_response
from kthena_router.fairness.config import FairnessSettings
from kthena_router.fairness.gate import FairnessGate
from kthena_router.fairness.metrics import FairnessMetrics
from kthena_router.gc_tuning import GcMonitor, freeze_startup_heap
from kthena_router.warmup import WarmupGate
from kthena_router.identity.service import IdentityService
from kthena_router.loop_lag import LoopLagSampler
from kthena_router.metrics import RouterMetrics, ensure_multiprocess
from kthena_router.pd.config import DEFAULT_PD
from kthena_router.pd.pairing import PdPairer
from kthena_router.podstate.link import PodStateLink, SharedScraper
from kthena_router.proxy.forward import Forwarder
from kthena_router.proxy.upstream import H1Pool, UpstreamPool
from kthena_router.ratelimit.limiter import Limiter
from kthena_router.ratelimit.metrics import RateLimitMetrics
from kthena_router.router_config_reload import RouterConfigHolder, RouterConfigReloader
from kthena_router.scheduling.config import load_router_configuration_bytes, load_router_configuration_file
from kthena_router.session import SessionAffinity
from kthena_router.serving import ALL_METHODS, RouterApp
from kthena_router.settings import RouterSettings
from kthena_router.state import RouterState, StateHolder

log = logging.getLogger(__name__)



def pool_pruner(h1: Callable[[], H1Pool],
                external: Callable[[], set[tuple[str, int]]] = set) -> Callable[[RouterState], None]:
    """After a state swap: pod churn must not grow memory, so the upstream pool forgets
    (and closes the idle connections of) every destination that is no longer a target
    (`external`: the ExternalModelProviders' upstreams in use)."""

    def prune(state: RouterState) -> None:
        h1().retain({(ep.ip, ep.port) for ep in EndpointRegistry.unique(state.targets)} | external())

    return prune


async def _models(request: Request) -> Response:
    if request.method not in ("GET", "HEAD"):
        return error_response(405, f"method {request.method} is not allowed on /v1/models")
    auth = request.app.state.forwarder.auth
    if auth is not None:  # the model list is the deployment's inventory: same credentials as inference
        try:
            await auth.authenticate(request.headers)
        except RequestError as err:
            return Response(error_body(err.status, err.message, err.type, err.param, err.code), err.status,
                            dict((k.decode(), v.decode("latin-1")) for k, v in err.headers),
                            media_type="application/json")
    state = request.app.state.holder.current
    if state is None:
        return error_response(503, "router has no configuration loaded yet")
    return Response(state.models_body, media_type="application/json")


async def _not_found(request: Request) -> Response:
    return error_response(404, f"no such endpoint: {request.method} {request.url.path}")


def create_app(settings: RouterSettings | None = None) -> RouterApp:
    """granian factory: settings from the environment (at call time) unless given."""
    if settings is None:
        settings = RouterSettings.from_env()
    ensure_multiprocess(settings.prometheus_dir)
    metrics = RouterMetrics()
    holder = StateHolder()
    pool = UpstreamPool(settings)
    router_config = RouterConfigHolder()

    def traffic() -> TrafficSettings:  # the installed router configuration's, per use
        rc = router_config.current
        return rc.traffic if rc is not None else DEFAULT_TRAFFIC

    registry = EndpointRegistry(traffic=traffic)
    registry.on_gone = metrics.prune_endpoints
    registry.on_stalled = metrics.stalled_attempts
    selector = EndpointSelector(traffic)
    reloader: RouterConfigReloader | None = None
    balancer: Balancer
    if settings.router_config_path:
        # validated by the parent (cli.py); watched and reloaded in the lifespan
        reloader = RouterConfigReloader(settings, metrics, load_router_configuration_file(settings.router_config_path),
                                        holder, selector)
        router_config = reloader.holder

        def installed(rc: Any) -> None:
            state = holder.current
            if state is not None:  # outlier settings
                registry.apply_policies(state.targets)
            identity.install(rc.auth)
            forwarder.fairness = fairness.install(rc.fairness)
            forwarder.zero_hold.on_state(state)  # scaleFromZero may have changed

        reloader.on_install = installed
        balancer = reloader.balancer
    else:
        balancer = RoundRobinBalancer(selector)

    def all_targets() -> list[Any]:
        state = holder.current
        return [] if state is None else registry.unique(state.targets)

    prober = HealthProber(lambda: pool.session, all_targets, settings.health_probe_interval_s,
                          settings.health_probe_timeout_s)
    access_log = AccessLog(settings.access_log, settings.access_log_flush_s) if settings.access_log else None
    rc_holder = router_config
    sticky = SessionAffinity(settings.runtime_dir, metrics,
                             lambda: rc.session_sticky if (rc := rc_holder.current) is not None else None)
    forwarder = Forwarder(settings, holder, pool, balancer, metrics, prober, access_log=access_log, sticky=sticky)
    pd_pairer = forwarder.pd_pairer = PdPairer(  # follows states (after_swap) and, with a reloader, the pd section
        rc.pd if (rc := router_config.current) is not None else DEFAULT_PD, metrics, selector=selector,
        hot_spot_abs=settings.hot_spot_abs, hot_spot_rel=settings.hot_spot_rel, scraped=reloader is not None)
    forwarder.pd_settings = lambda: rc.pd if (rc := router_config.current) is not None else DEFAULT_PD
    limiter = forwarder.limiter = Limiter(RateLimitMetrics(metrics.registry), lambda: (
        rc.rate_limits if (rc := router_config.current) is not None else None), settings.workers)
    identity = IdentityService(settings, metrics.registry, lambda auth: setattr(forwarder, "auth", auth))
    # fair queuing needs the router configuration (its section, the scraped engine state)
    fairness = FairnessGate(FairnessMetrics(metrics.registry), FairnessSettings(enabled=False), settings.workers)
    if router_config.current is not None:
        identity.install(router_config.current.auth)
        forwarder.fairness = fairness.install(router_config.current.fairness)

    def panic(key: tuple[str, str], endpoints: Any) -> None:
        metrics.panic(f"{key[0]}/{key[1]}")
        prober.probe_soon(endpoints)  # the ejected ones whose backoff passed: re-admit early

    selector.on_panic = panic
    applier = ConfigApplier(settings, holder, registry, metrics, traffic())
    external = forwarder.external
    external.provider_settings = lambda: (
        rc.external_providers if (rc := router_config.current) is not None else DEFAULT_PROVIDER_SETTINGS)
    applier.after_swap.append(lambda state: external.on_config(state.config.providers))
    applier.after_swap.append(pool_pruner(lambda: pool.h1, external.live))
    applier.after_swap.append(pd_pairer.on_state)
    forwarder.zero_hold.settings = lambda: (  # scaleFromZero; state installs release held requests
        rc.scale_from_zero if (rc := router_config.current) is not None else DEFAULT_SCALE_FROM_ZERO)
    applier.after_swap.append(forwarder.zero_hold.on_state)
    if reloader is not None:
        reloader.on_traffic = applier.set_traffic
        reloader.pd_pairer = pd_pairer
        kv_usage = KvUsagePublisher(metrics)  # the scraper runs only with a router configuration
        applier.after_swap.append(kv_usage.on_state)
        reloader.snapshot_listeners.append(kv_usage.on_snapshot)
        warmup: WarmupGate | None = WarmupGate(settings, reloader)
        applier.after_swap.append(warmup.on_state)
    else:
        warmup = None
    gc_monitor = GcMonitor(metrics.registry)
    loop_lag = LoopLagSampler(metrics.registry, on_tick=[gc_monitor.flush])

    def health_changed(key: str, healthy: bool) -> None:
        state = holder.current
        if state is None:
            return
        for eps in state.targets.values():
            for ep in eps:
                if ep.key == key:
                    metrics.set_endpoint_healthy(ep.server_label, key, healthy)

    registry.set_health_listener(health_changed)
    link: PodStateLink | None = None
    if settings.pod_state_socket:  # several workers: scraping, probing, inserts via the hub
        link = PodStateLink(settings, holder, prober, lambda: reloader.scheduler if reloader is not None else None,
                            pd_pairer)
        applier.after_swap.append(link.on_state)
        if reloader is not None:  # a reload may build a new scheduler: bind that one too
            link.bind(reloader.scheduler)
            reloader.on_build = link.bind
            reloader.hub_relays = link.relays_inserts
    debug = DebugServer(settings.runtime_dir, {
        "kv_ownership": lambda: reloader.matcher.debug_view() if reloader is not None and reloader.matcher is not None else None,
        "pd": pd_pairer.debug_view,
        "pod_state": lambda: link.debug_view() if link is not None else None,
        "scheduler": lambda: reloader.scheduler.debug_view() if reloader is not None else None,
        "response_ids": lambda: {"count": len(forwarder.response_ids), "limit": forwarder.response_ids.limit},
    })

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        cfg = await asyncio.to_thread(load_config_file, settings.config_path)
        await pool.start()
        tasks: list[asyncio.Task[None]] = []
        loop = asyncio.get_running_loop()
        scraper: EngineStateScraper | None = None
        if reloader is not None:
            scraper = (SharedScraper if settings.pod_state_socket else EngineStateScraper)(
                pool.session, settings.scrape_interval_s)
            await reloader.start(scraper)
            await pd_pairer.start()  # the PD sides' kvcache-aware tokenizers
            applier.on_swap = reloader.on_state
            fairness.follow(scraper, applier)
            tasks.append(loop.create_task(fairness.run()))
        if link is not None and isinstance(scraper, SharedScraper):
            link.attach_scraper(scraper)
        await applier.apply(cfg)
        if link is not None:
            await link.client.connect_first()  # bounded: a hub that is not there means local mode
            link.client.start()
        await identity.start()
        if scraper is not None:
            tasks.append(loop.create_task(scraper.run()))
        watchers: list[ConfigWatcher] = []
        trigger = settings.reload_trigger_path or None
        if settings.watch_config:
            watchers.append(ConfigWatcher(settings.config_path, applier.on_config, applier.on_error,
                                          trigger_path=trigger, initial_digest=cfg.digest))
            if reloader is not None and reloader.holder.current is not None:
                watchers.append(ConfigWatcher(settings.router_config_path, reloader.on_config, reloader.on_error,
                                              trigger_path=trigger, initial_digest=reloader.holder.current.digest,
                                              loader=load_router_configuration_bytes))
            tasks.extend(loop.create_task(w.run()) for w in watchers)
        tasks.append(loop.create_task(applier.refresh_dns_forever()))
        prober.start()
        await debug.start()
        if access_log is not None:
            access_log.start()
        tasks.append(loop.create_task(loop_lag.run()))
        front = None
        if settings.interface == "rust":  # docs/rust-front.md
            from kthena_router.front.bridge import RustFront

            front = RustFront(settings, forwarder)
            front.start()
        freeze_startup_heap()  # everything built so far lives as long as the worker
        gc_monitor.start()  # after the freeze's full collection: pauses while serving only
        try:
            yield
        finally:
            if front is not None:
                front.stop_accepting()
            gc_monitor.stop()
            if warmup is not None:
                await warmup.close()
            await debug.close()
            if link is not None:
                await link.client.close()
            for w in watchers:
                w.stop()
            if scraper is not None:
                scraper.stop()
            if reloader is not None:
                await reloader.close()
            await pd_pairer.close()
            await identity.close()
            for task in tasks:
                task.cancel()
            await prober.stop()
            # granian lets in-flight requests end before lifespan shutdown; this is a bound.
            if front is not None:
                await front.wait_idle(forwarder.idle, settings.drain_grace_s)
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(forwarder.idle.wait(), timeout=settings.drain_grace_s)
            if front is not None:
                front.close()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await pool.close()
            await limiter.close()  # leases back to Redis
            await sticky.close()
            if access_log is not None:
                await access_log.close()

    starlette = Starlette(
        routes=[Route("/v1/models", _models, methods=ALL_METHODS),
                Route("/{path:path}", _not_found, methods=ALL_METHODS)],
        lifespan=lifespan,
    )
    starlette.state.holder = holder
    starlette.state.forwarder = forwarder
    starlette.state.router_config = router_config  # RouterConfigHolder: read .current per request

    return RouterApp(starlette, forwarder, reloader, router_config, identity)
