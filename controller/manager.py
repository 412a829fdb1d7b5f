"""Wires the controller: informers always run (a warm cache for a quick takeover); the
workers run only while this replica holds the Lease, and a replica that loses it exits
(as Kubernetes' own controllers do), so two replicas never act at once."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

from kthena_router.kube.client import KubeApi
from kthena_router.kube.leader import LeaderElector

from .autoscaler.controller import PERIOD_S, AutoscalerController
from .booster.controller import BoosterController, Images
from .capabilities import VolcanoWatch
from .events import EventRecorder
from .expectations import Expectations
from .gang_sync import GangSync
from .informers import Informers, Key
from .kubeapi import Writer
from .metrics import ControllerMetrics, ProbeServer
from .reconciler import Reconciler
from .workqueue import WorkQueue, run_worker

__all__ = ["AutoscalerConfig", "LeaseConfig", "Manager"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeConfig:
    """Probe and metrics endpoints (0: that one is off; equal ports share one server)."""
    host: str = "127.0.0.1"
    health_port: int = 0
    metrics_port: int = 0


@dataclass(frozen=True)
class AutoscalerConfig:
    """The AutoscalingPolicy controller (controller/autoscaler/controller.py)."""
    dry_run: bool = False  # log and report decisions, write no replicas
    period_s: float = PERIOD_S  # seconds between two rounds of a policy
    scrape_timeout_s: float = 3.0
    router_metrics_urls: tuple[str, ...] = ()  # routers' /metrics pages: router: metrics, wake signal


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class _Part(Protocol):
    """A controller run beside the ModelServing one (ModelBooster, autoscaler)."""

    @property
    def synced(self) -> bool: ...

    def start_workers(self, workers: int) -> list[asyncio.Task[None]]: ...


class Manager:
    def __init__(self, api: KubeApi, *, namespace: str = "", workers: int = 2,
                 lease: LeaseConfig | None = None, serve: ServeConfig | None = None,
                 exit_after_writes: int = 0, booster: Images | None = Images(),
                 autoscaler: AutoscalerConfig | None = AutoscalerConfig()) -> None:
        """`lease`: leader election (None: act at once, e.g. a single replica); `booster`: the
        ModelBooster controller's images (None: do not run it); `autoscaler`: the
        AutoscalingPolicy controller's settings (None: do not run it)."""
        self.api = api
        self.workers = max(1, workers)
        self.lost = asyncio.Event()
        self._started = asyncio.Event()
        self.elector: LeaderElector | None = None
        if lease is not None:
            self.elector = LeaderElector(
                api.api, lease.namespace, lease.name, lease.identity, lease_duration=lease.lease_duration,
                renew_deadline=lease.renew_deadline, retry_period=lease.retry_period,
                on_started_leading=self._started.set, on_stopped_leading=self.lost.set)
        elector = self.elector
        self.queue: WorkQueue[Key] = WorkQueue()
        self.informers = Informers(api, namespace, self.queue.add)
        is_leader = (lambda: elector.is_leader) if elector is not None else (lambda: True)
        self.metrics = ControllerMetrics()
        self.writer = Writer(api, is_leader, on_write=self.metrics.write, exit_after_writes=exit_after_writes)
        expectations = Expectations()
        # Events have their own Writer: best effort, written by a background task, so they stay
        # out of the reconciles' write count (--exit-after-writes) while obeying leadership.
        self.events = EventRecorder(Writer(api, is_leader, on_write=self.metrics.write),
                                    on_drop=self.metrics.events_dropped.inc)
        self.informers.on_owned_event = expectations.observe
        # Volcano's PodGroup CRD, watched: a change re-queues every ModelServing.
        self.volcano = VolcanoWatch(api, namespace, self.queue.add, self._requeue_all)
        self.reconciler = Reconciler(self.informers, self.writer, expectations,
                                     gang=GangSync(self.volcano, self.writer, expectations), events=self.events)
        self.booster = BoosterController(api, namespace, self.writer, booster) if booster is not None else None
        # the autoscaler reads the ModelServings and pods from the informers above
        self.autoscaler = (AutoscalerController(api, namespace, self.writer, self.informers,
                                                dry_run=autoscaler.dry_run, period_s=autoscaler.period_s,
                                                scrape_timeout_s=autoscaler.scrape_timeout_s,
                                                router_urls=autoscaler.router_metrics_urls)
                           if autoscaler is not None else None)
        self._informers_task: asyncio.Task[object] | None = None
        self.probes: ProbeServer | None = None
        if serve is not None and (serve.health_port or serve.metrics_port):
            self.probes = ProbeServer(self.metrics, serve.host, serve.health_port, serve.metrics_port,
                                      self._ready, self._alive, self._refresh_gauges)

    def _requeue_all(self) -> None:
        for key in list(self.informers.modelservings.store):
            self.queue.add(key)

    # --- probes and gauges ----------------------------------------------------------------
    def _alive(self) -> bool:
        t = self._informers_task
        return t is not None and not t.done()

    def _ready(self) -> tuple[bool, str]:
        if not self._synced():
            return False, "caches not synced"
        return True, "leader" if self._leading() else "standby (caches synced)"

    def _synced(self) -> bool:
        """The ModelServing controller's caches. The ModelBooster controller's and the
        autoscaler's are waited for on their own (_start_when_synced): a cluster without their
        CRDs still gets ModelServings served."""
        return self.informers.synced and self.volcano.synced

    def _leading(self) -> bool:
        return self._started.is_set() and not self.lost.is_set() and \
            (self.elector is None or self.elector.is_leader)

    def _refresh_gauges(self) -> None:
        m = self.metrics
        m.leader.set(1 if self._leading() else 0)
        m.synced.set(1 if self.informers.synced else 0)
        m.queue_depth.set(len(self.queue))
        m.queue_in_process.set(len(self.queue.processing))
        for r in self.informers.reflectors:
            m.cached.labels(r.resource.name).set(len(r.store))

    async def _start_when_synced(self, part: _Part, what: str, crds: str, tasks: list[asyncio.Task[object]]) -> None:
        """Start `part`'s workers (the ModelBooster controller, the autoscaler) once its own
        caches are synced; a WARNING after 30 s names the CRDs it needs."""
        warn_at: float | None = asyncio.get_running_loop().time() + 30.0
        while not part.synced:
            await asyncio.sleep(0.05)
            if warn_at is not None and asyncio.get_running_loop().time() > warn_at:
                warn_at = None
                log.warning("%s caches not synced after 30 s (are the %s CRDs installed?); it waits, "
                            "ModelServings are served", what, crds)
        log.info("%s caches synced; starting %d workers", what, self.workers)
        tasks += part.start_workers(self.workers)

    async def run(self) -> int:
        """Until cancelled (0 after a clean stop) or leadership is lost (returns 1); 2 when the
        probe/metrics ports cannot be bound."""
        self._informers_task = asyncio.create_task(self.informers.run(), name="informers")
        tasks: list[asyncio.Task[object]] = [self._informers_task,
                                             asyncio.create_task(self.volcano.run(), name="volcano"),
                                             asyncio.create_task(self.events.run(), name="events")]
        if self.booster is not None:
            tasks.append(self.booster.run_informers())
        if self.autoscaler is not None:
            tasks.append(self.autoscaler.run_informers())
        try:
            if self.probes is not None:
                try:
                    await self.probes.start()
                except OSError as exc:  # the port is taken, or the address is not ours
                    log.error("cannot serve probes/metrics on %s ports %s: %s", self.probes.host,
                              self.probes.ports, exc)
                    return 2
            if self.elector is None:
                self._started.set()
            if self.elector is not None:
                self.elector.start()
                log.info("%s: waiting for the Lease %s/%s", self.elector.identity, self.elector.namespace,
                         self.elector.name)
                await self._started.wait()
            while not self._synced():
                await asyncio.sleep(0.05)
            log.info("caches synced (%d ModelServings, %d pods, %d Services); starting %d workers",
                     len(self.informers.modelservings.store), len(self.informers.pods.store),
                     len(self.informers.services.store), self.workers)
            for key in list(self.informers.modelservings.store):
                self.queue.add(key)
            handler = self.metrics.wrap(self.reconciler.reconcile)
            tasks += [asyncio.create_task(run_worker(self.queue, handler), name=f"worker {i}")
                      for i in range(self.workers)]
            if self.booster is not None:
                tasks.append(asyncio.create_task(
                    self._start_when_synced(self.booster, "ModelBooster", "ModelBooster, ModelServer, ModelRoute and "
                                            "AutoscalingPolicy", tasks), name="booster start"))
            if self.autoscaler is not None:
                tasks.append(asyncio.create_task(
                    self._start_when_synced(self.autoscaler, "autoscaler", "AutoscalingPolicy", tasks),
                    name="autoscaler start"))
            await self.lost.wait()
            log.error("leader election lost; exiting")
            return 1
        finally:
            self.queue.shut_down()
            if self.booster is not None:
                self.booster.stop()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.autoscaler is not None:
                await self.autoscaler.stop()
            if self.elector is not None:
                await self.elector.stop(release=not self.lost.is_set())
            if self.probes is not None:
                await self.probes.stop()
