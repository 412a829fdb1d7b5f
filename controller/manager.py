"""Wires the controller: informers always run (a warm cache for a quick takeover); the
workers run only while this replica holds the Lease, and a replica that loses it exits
(as Kubernetes' own controllers do), so two replicas never act at once."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from kthena_router.kube.client import KubeApi
from kthena_router.kube.leader import LeaderElector

from .booster.controller import BoosterController, Images
from .expectations import Expectations
from .informers import Informers, Key
from .kubeapi import Writer
from .reconciler import Reconciler
from .workqueue import WorkQueue, run_worker

__all__ = ["LeaseConfig", "Manager"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class Manager:
    def __init__(self, api: KubeApi, *, namespace: str = "", workers: int = 2,
                 lease: LeaseConfig | None = None, booster: Images | None = Images()) -> None:
        """`lease`: leader election (None: act at once, e.g. a single replica); `booster`: the
        ModelBooster controller's images (None: do not run it)."""
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
        self.writer = Writer(api, is_leader)
        self.reconciler = Reconciler(self.informers, self.writer, Expectations())
        self.booster = BoosterController(api, namespace, self.writer, booster) if booster is not None else None

    async def run(self) -> int:
        """Until cancelled (0 after a clean stop) or leadership is lost (returns 1)."""
        tasks: list[asyncio.Task[object]] = [asyncio.create_task(self.informers.run(), name="informers")]
        if self.booster is not None:
            tasks.append(self.booster.run_informers())
        try:
            if self.elector is not None:
                self.elector.start()
                log.info("%s: waiting for the Lease %s/%s", self.elector.identity, self.elector.namespace,
                         self.elector.name)
                await self._started.wait()
            while not (self.informers.synced and (self.booster is None or self.booster.synced)):
                await asyncio.sleep(0.05)
            log.info("caches synced (%d ModelServings, %d pods, %d Services); starting %d workers",
                     len(self.informers.modelservings.store), len(self.informers.pods.store),
                     len(self.informers.services.store), self.workers)
            for key in list(self.informers.modelservings.store):
                self.queue.add(key)
            tasks += [asyncio.create_task(run_worker(self.queue, self.reconciler.reconcile), name=f"worker {i}")
                      for i in range(self.workers)]
            if self.booster is not None:
                tasks += self.booster.start_workers(self.workers)
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
            if self.elector is not None:
                await self.elector.stop(release=not self.lost.is_set())
