"""The router configuration (--router-config) in a worker: installed, read per request,
reloaded like the route config.

- RouterConfigHolder.current is the installed RouterConfiguration. Consumers of its
  sections (scheduler, traffic, ...) read it per request, so a reload reaches them.
- The scheduler (and the kvcache-aware matcher, listed or automatic: kvEvents section,
  scheduling/exact_auto.py) is built from the scheduler section. A reload that changes
  that section (or kvEvents) builds a new one, syncs it with the current endpoints
  and the last engine snapshots, then swaps it in with the configuration in one step (no
  await between); an unchanged section keeps the live scheduler and its learned state.
- A file the router cannot use (invalid, or a pipeline Rust refuses) keeps the old one and
  is reported as a bad route config is: WARNING log, kthena_router_config_reloads_total
  {result="failure"}, the worker status' last_error.
- The PD pairer (`pd_pairer`, set by the app) follows the `pd` section the same way: a
  changed section builds (and checks) new side schedulers, installed with the configuration;
  engine snapshots reach it too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kthena_router import worker_status
from kthena_router.config.errors import ConfigError, ConfigProblem
from kthena_router.config.traffic import TrafficSettings
from kthena_router.endpoints.selection import EndpointSelector
from kthena_router.engine_state.scraper import EngineStateScraper
from kthena_router.engine_state.snapshot import EndpointSnapshot
from kthena_router.kv_events import EventSource
from kthena_router.metrics import RouterMetrics
from kthena_router.scheduling.check import check_scheduler
from kthena_router.scheduling.config import KvCacheAwareArgs, RouterConfiguration, SchedulerSettings
from kthena_router.scheduling.insert_scopes import InsertTargets
from kthena_router.scheduling.exact_auto import DEFAULT_KV_EVENTS, KvEventsSettings
from kthena_router.scheduling.kv_matcher import KvAwareMatcher, event_sources, matcher_for
from kthena_router.scheduling.scheduler import Scheduler
from kthena_router.settings import RouterSettings
from kthena_router.shared_index.sync import SharedIndexMetrics, SharedIndexSync
from kthena_router.state import RouterState, StateHolder

if TYPE_CHECKING:  # pd.pairing imports this module (SwitchingBalancer)
    from kthena_router.pd.pairing import PdBuild, PdPairer

log = logging.getLogger(__name__)

__all__ = ["RouterConfigHolder", "RouterConfigReloader", "Scheduling", "SwitchingBalancer"]


class RouterConfigHolder:
    """The installed RouterConfiguration (None: no --router-config, every section at its
    default). Read it once per request and keep that object to the request's end."""

    __slots__ = ("current",)

    def __init__(self, current: RouterConfiguration | None = None) -> None:
        self.current = current


@dataclass
class Scheduling:
    scheduler: Scheduler
    matcher: KvAwareMatcher | None


def build_scheduling(sc: SchedulerSettings, source: str, settings: RouterSettings,
                     metrics: RouterMetrics, selector: EndpointSelector | None = None,
                     kv_events: KvEventsSettings = DEFAULT_KV_EVENTS) -> Scheduling:
    check_scheduler(sc, source)  # ConfigError naming the file rather than a bare ValueError
    scheduler = Scheduler(sc, metrics, hot_spot_abs=settings.hot_spot_abs, hot_spot_rel=settings.hot_spot_rel,
                          selector=selector)
    matcher = matcher_for(sc, metrics, kv_events)
    if matcher is not None:
        scheduler.set_kv_matcher(matcher)
    return Scheduling(scheduler, matcher)



class SwitchingBalancer:
    """The proxy's balancer with a router configuration: the live Scheduler, replaceable
    by a reload. Attempts dispatched before a swap finish without touching the new
    scheduler, so its in-flight counts start at zero and stay balanced."""

    needs_request_info = True

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self._live: dict[str, int] = {}  # endpoint key -> attempts in flight on `inner`
        self._orphans: dict[str, int] = {}  # attempts in flight on replaced schedulers
        # after each swap (the Rust front's table): nothing decides on the old one once the
        # worker reports the new configuration applied
        self.swap_listeners: list[Callable[[], None]] = []

    def swap(self, new: Scheduler) -> None:
        for key, n in self._live.items():
            self._orphans[key] = self._orphans.get(key, 0) + n
        self.inner, self._live = new, {}
        for listener in self.swap_listeners:
            listener()

    async def prepare(self, info: Any) -> None:
        await self.inner.prepare(info)

    def prepare_needed(self, info: Any) -> bool:
        return self.inner.prepare_needed(info)

    def candidates(self, key: Any, endpoints: Any, info: Any = None) -> list[Any]:
        return self.inner.candidates(key, endpoints, info)

    def dispatched(self, ep: Any, info: Any) -> None:
        self._live[ep.key] = self._live.get(ep.key, 0) + 1
        self.inner.dispatched(ep, info)

    def front_dispatched(self, scheduler: Scheduler, key: Any, ep: Any, info: Any, match_s: float,
                         schedule_s: float, best: float, pending: float = -1.0) -> None:
        """The Rust front dispatched to `ep` with `scheduler` (front/table.py); replaced since:
        its attempt finishes as an orphan."""
        if scheduler is not self.inner:
            self._orphans[ep.key] = self._orphans.get(ep.key, 0) + 1
            return
        self._live[ep.key] = self._live.get(ep.key, 0) + 1
        scheduler.front_dispatched(key, ep, info, match_s, schedule_s, best, pending)

    def finished(self, ep: Any, ttft_s: float | None = None, tpot_s: float | None = None,
                 info: Any = None) -> None:
        key = ep.key
        if self._orphans and _take(self._orphans, key):
            return  # its scheduler is gone
        _take(self._live, key)
        self.inner.finished(ep, ttft_s, tpot_s, info)

    def observe_prompt_tokens(self, info: Any, prompt_tokens: int) -> None:
        self.inner.observe_prompt_tokens(info, prompt_tokens)


def _take(counts: dict[str, int], key: str) -> bool:
    n = counts.get(key, 0)
    if n <= 0:
        return False
    if n == 1:
        del counts[key]
    else:
        counts[key] = n - 1
    return True


def _kv_sources(state: RouterState, scheduler: Scheduler, args: KvCacheAwareArgs,
                labelled_only: bool = False) -> dict[str, tuple[int, EventSource]]:
    """Endpoint key -> (scheduler id, KV-event source from the endpoint's labels); with
    `labelled_only` (automatic exact matching) only endpoints that advertise a stream.
    PD ModelServers' endpoints are left to the PD sides' own matchers (pd/pairing.py):
    this scheduler never routes them."""
    def endpoints() -> Any:
        for key, eps in state.targets.items():
            if key in state.pd:
                continue
            labels = {(e.address, e.port): e.labels for e in state.config.endpoints_of(state.config.servers[key])}
            for ep in eps:
                yield ep.key, ep.ip, labels.get((ep.host, ep.port), {})
    return event_sources(endpoints(), scheduler.endpoint_id, args, labelled_only)


class RouterConfigReloader:
    """Owns the installed router configuration and the scheduling built from it."""

    def __init__(self, settings: RouterSettings, metrics: RouterMetrics, rc: RouterConfiguration,
                 state_holder: StateHolder, selector: EndpointSelector | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.state_holder = state_holder
        self.holder = RouterConfigHolder(rc)
        self.selector = selector  # usable endpoints / panic, shared by every scheduler built here
        self.on_install: Callable[[RouterConfiguration], None] | None = None  # after each install
        # every new Scheduler, before it is synced or installed (the pod-state link binds it)
        self.on_build: Callable[[Scheduler], None] | None = None
        self.scheduling = build_scheduling(rc.scheduler, rc.source, settings, metrics, selector, rc.kv_events)
        self.balancer = SwitchingBalancer(self.scheduling.scheduler)
        self.scraper: EngineStateScraper | None = None
        self.pd_pairer: PdPairer | None = None  # follows the pd section and the engine snapshots
        self.snapshot_listeners: list[Callable[[EndpointSnapshot], None]] = []  # e.g. the KV-usage gauge
        # called with the new traffic section when a reload changes it (re-resolves servers)
        self.on_traffic: Callable[[TrafficSettings], None] | None = None
        self._latest = 0  # ticket of the newest configuration received
        self._tasks: set[asyncio.Task[None]] = set()
        # sharedPrefixIndex: one sync per worker, following the section across reloads
        self.shared_index: SharedIndexSync | None = None
        self._shared_metrics: SharedIndexMetrics | None = None
        self._retired: list[SharedIndexSync] = []
        # whether the pod-state hub relays this pod's inserts to this worker now (app.py)
        self.hub_relays: Callable[[], bool] = lambda: False
        worker_status.report_router_config_applied(settings, rc.digest)

    @property
    def scheduler(self) -> Scheduler:
        return self.scheduling.scheduler

    @property
    def matcher(self) -> KvAwareMatcher | None:
        return self.scheduling.matcher

    # --- wiring (lifespan) ---------------------------------------------------------------
    async def start(self, scraper: EngineStateScraper) -> None:
        self.scraper = scraper
        scraper.on_update = self._on_snapshot
        await self._load_tokenizers(self.scheduling)
        self._follow_shared_index(self.holder.current)

    def _follow_shared_index(self, rc: RouterConfiguration | None) -> None:
        """Start, replace or stop the shared-index sync for the installed configuration and
        point the live scheduler's dispatch hook at it."""
        want = rc.shared_index if rc is not None else None
        cur = self.shared_index
        if cur is not None and (want is None or cur.settings != want):
            self.shared_index = None
            self._retired.append(cur)  # close() finishes it if this task is still running then
            self._spawn(cur.close())
        if want is not None and self.shared_index is None:
            if self._shared_metrics is None:
                self._shared_metrics = SharedIndexMetrics(self.metrics.registry)
            targets = InsertTargets(lambda: self.scheduling.scheduler, lambda: self.pd_pairer)
            self.shared_index = SharedIndexSync(want, targets, self._shared_metrics, self.settings.pod_id.encode(),
                                                lambda: self.hub_relays())
            self.shared_index.start()
        listeners = self.scheduling.scheduler.insert_listeners
        record = self.shared_index.record if self.shared_index is not None else None
        if record is not None:
            listeners["shared-index"] = record
        else:
            listeners.pop("shared-index", None)
        if self.pd_pairer is not None:  # the PD sides share through the same sync
            self.pd_pairer.set_insert_listener("shared-index", record)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_snapshot(self, snap: EndpointSnapshot) -> None:
        self.scheduling.scheduler.on_snapshot(snap)
        if self.pd_pairer is not None:
            self.pd_pairer.on_snapshot(snap)
        for listener in self.snapshot_listeners:
            listener(snap)

    def on_state(self, state: RouterState) -> None:
        """After every routing-state install: reconcile scorers and index, scrape exactly
        the live endpoints and (kvcache-aware) subscribe to exactly their KV-event streams."""
        self._sync(self.scheduling, state)

    def _sync(self, sched: Scheduling, state: RouterState) -> None:
        sched.scheduler.sync(state.targets)
        if self.scraper is not None:
            live: dict[str, tuple[str, str, str]] = {}
            for key, eps in state.targets.items():
                flavour = state.config.servers[key].inference_engine
                for ep in eps:
                    live.setdefault(ep.key, (ep.key, ep.base_url, flavour))
            self.scraper.set_endpoints(live.values())
        if sched.matcher is not None:
            sched.matcher.set_endpoints(_kv_sources(state, sched.scheduler, sched.matcher.args, sched.matcher.auto))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for sync in [*self._retired, *([self.shared_index] if self.shared_index is not None else [])]:
            await sync.close()  # idempotent; the spawned close tasks were cancelled above
        self._retired.clear()
        self.shared_index = None
        if self.scheduling.matcher is not None:
            await self.scheduling.matcher.close()

    # --- reload (ConfigWatcher callbacks) --------------------------------------------------
    def on_config(self, rc: RouterConfiguration) -> None:
        self._latest += 1
        current = self.holder.current
        pd_build = None
        if self.pd_pairer is not None and (current is None or rc.pd != current.pd):
            try:  # synchronous: Scorers only (a side with an unchanged pipeline is kept)
                pd_build = self.pd_pairer.build(rc.pd, rc.source)
            except ConfigError as err:
                log.warning("invalid router configuration, keeping the previous one:\n%s", err)
                self.on_error(err)
                return
        if current is not None and rc.scheduler == current.scheduler and rc.kv_events == current.kv_events:
            self._install(rc, None, pd_build)  # same pipeline: keep the live scheduler and what it learned
            return
        task = asyncio.get_running_loop().create_task(self._rebuild(rc, self._latest, pd_build))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def on_error(self, err: ConfigError) -> None:
        self.metrics.config_reload(False)
        worker_status.report_failed(self.settings, str(err))

    async def _rebuild(self, rc: RouterConfiguration, ticket: int, pd_build: PdBuild | None = None) -> None:
        try:
            new = build_scheduling(rc.scheduler, rc.source, self.settings, self.metrics, self.selector,
                                   rc.kv_events)
        except ConfigError as err:
            log.warning("invalid router configuration, keeping the previous one:\n%s", err)
            self.on_error(err)
            return
        except Exception as exc:  # a bug must not leave the worker without a verdict
            log.exception("cannot build the scheduler of %s; keeping the previous one", rc.source)
            self.on_error(ConfigError([ConfigProblem(rc.source, "", "scheduler", f"internal error: {exc!r}")]))
            return
        if self.on_build is not None:
            self.on_build(new.scheduler)
        await self._load_tokenizers(new)
        if ticket != self._latest:  # a newer configuration arrived meanwhile
            if new.matcher is not None:
                await new.matcher.close()
            return
        old = self._install(rc, new, pd_build)
        if old is not None and old.matcher is not None:
            await old.matcher.close()

    def _install(self, rc: RouterConfiguration, new: Scheduling | None,
                 pd_build: PdBuild | None = None) -> Scheduling | None:
        """Swap in the configuration (and a new scheduling, new PD side schedulers) in one
        step; returns the old scheduling when replaced."""
        old = None
        if pd_build is not None and self.pd_pairer is not None:
            self.pd_pairer.install(pd_build)
        if new is not None:
            state = self.state_holder.current
            if state is not None:
                self._sync(new, state)
            if self.scraper is not None:
                for snap in self.scraper.all().values():
                    new.scheduler.on_snapshot(snap)
            old, self.scheduling = self.scheduling, new
            self.balancer.swap(new.scheduler)
        previous, self.holder.current = self.holder.current, rc
        if self.scraper is not None:  # started (start() follows the first configuration)
            self._follow_shared_index(rc)
        if self.on_traffic is not None and (previous is None or previous.traffic != rc.traffic):
            self.on_traffic(rc.traffic)
        if self.on_install is not None:
            self.on_install(rc)
        self.metrics.config_reload(True)
        worker_status.report_router_config_applied(self.settings, rc.digest)
        log.info("router configuration %s installed (%s)", rc.digest[:12],
                 "new scheduler" if new is not None else "scheduler unchanged")
        return old

    @staticmethod
    async def _load_tokenizers(sched: Scheduling) -> None:
        if sched.matcher is None:
            return
        for err in await asyncio.to_thread(sched.matcher.tokenizers.load_all):
            log.warning("kvcache-aware: %s (prefix-cache matching is used for that model)", err)

