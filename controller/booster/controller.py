"""The ModelBooster controller's parts, run by controller.manager.Manager beside the
ModelServing controller under the same Lease: its own informers (always running, warm caches)
and queue; workers only on the leader; writes through the shared Writer."""

from __future__ import annotations

import asyncio

from kthena_router.kube.client import KubeApi

from controller.kubeapi import Writer
from controller.workqueue import WorkQueue, run_worker

from .common import Images
from .informers import BoosterInformers, Key
from .reconciler import BoosterReconciler

__all__ = ["BoosterController", "Images"]


class BoosterController:
    def __init__(self, api: KubeApi, namespace: str, writer: Writer, images: Images = Images()) -> None:
        self.queue: WorkQueue[Key] = WorkQueue()
        self.informers = BoosterInformers(api, namespace, self.queue.add)
        self.reconciler = BoosterReconciler(self.informers, writer, images)

    @property
    def synced(self) -> bool:
        return self.informers.synced

    def run_informers(self) -> asyncio.Task[None]:
        return asyncio.create_task(self.informers.run(), name="booster informers")

    def start_workers(self, workers: int) -> list[asyncio.Task[None]]:
        for key in list(self.informers.boosters.store):
            self.queue.add(key)
        return [asyncio.create_task(run_worker(self.queue, self.reconciler.reconcile), name=f"booster worker {i}")
                for i in range(max(1, workers))]

    def stop(self) -> None:
        self.queue.shut_down()
