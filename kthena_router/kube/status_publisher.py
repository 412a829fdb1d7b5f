"""Status in Kubernetes mode: the Lease election and the status writer, fed by the watch.

Every replica watches and builds its ClusterView; only the Lease holder writes status
(docs/kubernetes-status.md). `update` is the KubeSource's on_view hook; `run()` is a task
of the KubeSource's loop sharing its apiserver connection. Cancelling it (the router stops)
releases the Lease, so another replica takes over at its next retry instead of waiting
for the Lease to expire.
"""

from __future__ import annotations

import asyncio
import logging

from kubernetes_asyncio.client import ApiClient

from kthena_router.settings import RouterSettings

from . import metrics as m
from .leader import LeaderElector
from .status_writer import StatusWriter, WriteResult
from .view import ClusterView

__all__ = ["StatusPublisher"]

log = logging.getLogger("kthena_router.kube.status")


class StatusPublisher:
    def __init__(self, api_client: ApiClient, settings: RouterSettings) -> None:
        self.elector = LeaderElector(api_client, settings.lease_namespace, settings.lease_name,
                                     settings.leader_identity, on_started_leading=self._started,
                                     on_stopped_leading=self._stopped)
        self.writer = StatusWriter(api_client, is_leader=lambda: self.elector.is_leader,
                                   on_result=self._count)

    def update(self, view: ClusterView) -> None:
        self.writer.update(view)

    async def run(self) -> None:
        m.STATUS_LEADER.set(0)
        log.info("status: campaigning for Lease %s/%s as %s", self.elector.namespace, self.elector.name,
                 self.elector.identity)
        writer = asyncio.create_task(self.writer.run(), name="kube-status-writer")
        try:
            await self.elector.run()  # cancelled at shutdown: its finally releases the Lease
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            m.STATUS_LEADER.set(0)

    def _started(self) -> None:
        m.STATUS_LEADER.set(1)
        self.writer.kick()  # level-triggered: the new leader rewrites whatever is stale

    def _stopped(self) -> None:
        m.STATUS_LEADER.set(0)

    @staticmethod
    def _count(result: WriteResult) -> None:
        if result.written:
            m.STATUS_WRITES.labels(result="written").inc(len(result.written))
        if result.conflicts:
            m.STATUS_WRITES.labels(result="conflict").inc(result.conflicts)
        if result.errors:
            m.STATUS_WRITES.labels(result="error").inc(len(result.errors))
