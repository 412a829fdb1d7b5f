"""The pod-state hub's own Prometheus metrics.

The hub is a child of the supervisor started after PROMETHEUS_MULTIPROC_DIR was set, so
its values go to files of its own pid in that directory and the admin server's /metrics
aggregates them with the workers' (admin.py). Gauges are `livesum`: one hub per pod, and
a dead hub's files are dropped by the supervisor when it restarts the hub (process.py),
while its counters stay summed (totals over the pod's life, restarts included). The
restart counter itself is the supervisor's (`HubRestarts`).
"""

from __future__ import annotations

import struct

from prometheus_client import CollectorRegistry, Counter, Gauge

from . import wire

__all__ = ["HubMetrics", "HubRestarts", "count_records"]

_KLEN, _COUNT = struct.Struct("<H"), struct.Struct("<I")
FRAME_KINDS = {wire.INSERTS: "inserts", wire.SNAPSHOT: "snapshot", wire.PROBES: "probes", wire.KV: "kv"}


def count_records(payload: bytes) -> int:
    """Insert records in an INSERTS payload (headers only: the hub never decodes hashes)."""
    pos, end, n = 0, len(payload), 0
    while pos + 2 <= end:
        (klen,) = _KLEN.unpack_from(payload, pos)
        pos += 2 + klen
        if pos + 4 > end:
            break
        (count,) = _COUNT.unpack_from(payload, pos)
        pos += 4 + 8 * count
        if pos > end:
            break
        n += 1
    return n


class HubMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.probes = Counter("kthena_router_pod_state_hub_probes_total",
                              "Engine health probes made by the pod-state hub, by outcome", ["result"], registry=reg)
        self.scrapes = Counter("kthena_router_pod_state_hub_scrapes_total",
                               "Engine metric scrapes made by the pod-state hub, by outcome", ["result"], registry=reg)
        self.engines = Gauge("kthena_router_pod_state_hub_engines",
                             "Engines the pod-state hub follows (role: probe, scrape, kv_events)", ["role"],
                             multiprocess_mode="livesum", registry=reg)
        self.kv_streams_up = Gauge("kthena_router_pod_state_hub_kv_streams_up",
                                   "KV-event streams the pod-state hub follows that are up",
                                   multiprocess_mode="livesum", registry=reg)
        self.workers = Gauge("kthena_router_pod_state_hub_workers", "Workers connected to the pod-state hub",
                             multiprocess_mode="livesum", registry=reg)
        self.inserts = Counter("kthena_router_pod_state_hub_relayed_inserts_total",
                               "Dispatch-time prefix-index insert records the hub received and relayed",
                               registry=reg)
        self.frames = Counter("kthena_router_pod_state_hub_frames_sent_total",
                              "Frames the pod-state hub wrote to workers, by type", ["type"], registry=reg)
        self.dropped = Counter("kthena_router_pod_state_hub_frames_dropped_total",
                               "Frames not sent to a worker whose socket buffer was full", registry=reg)
        self.replay_bytes = Gauge("kthena_router_pod_state_hub_replay_log_bytes",
                                  "Bytes of inserts kept for workers that (re)connect",
                                  multiprocess_mode="livesum", registry=reg)
        self._frames = {k: self.frames.labels(v) for k, v in FRAME_KINDS.items()}
        self.probe_ok, self.probe_failed = self.probes.labels("ok"), self.probes.labels("failed")
        self.scrape_ok, self.scrape_failed = self.scrapes.labels("ok"), self.scrapes.labels("failed")

    def sent(self, data: bytes) -> None:
        """A frame written to a worker (its type is byte 4 of the header)."""
        child = self._frames.get(data[4]) if len(data) > 4 else None
        if child is not None:
            child.inc()


class HubRestarts:
    """In the supervisor: hubs restarted after they died."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.restarts = Counter("kthena_router_pod_state_hub_restarts_total",
                                "Pod-state hub processes restarted by the supervisor after they died",
                                registry=registry if registry is not None else CollectorRegistry())
