"""Kubernetes-mode metrics of the parent process (the watcher runs there).

Import only after PROMETHEUS_MULTIPROC_DIR is set (the supervisor does that): the admin
server's /metrics aggregates the parent's and the workers' files.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

WATCH_ERRORS = Counter(
    "kthena_router_kube_watch_errors_total",
    "Failed lists/watches by resource and reason (forbidden, not_found, gone, unavailable, error); "
    "the last state is kept",
    ["resource", "reason"],
)
SYNCS = Counter(
    "kthena_router_kube_syncs_total",
    "Config builds from the watched objects: applied (a new config was rendered), unchanged, failed",
    ["result"],
)
INVALID_OBJECTS = Gauge(
    "kthena_router_kube_invalid_objects",
    "Watched objects refused by validation (left out, or served at their last good version)",
    ["kind"], multiprocess_mode="livemax",
)
SYNCED = Gauge(
    "kthena_router_kube_synced",
    "1 once every watched resource was listed (the first full sync), else 0",
    multiprocess_mode="livemax",
)
WATCH_HEALTHY = Gauge(
    "kthena_router_kube_watch_up",
    "1 while the list/watch of the resource works, 0 while it fails (the last state is served)",
    ["resource"], multiprocess_mode="livemax",
)
STATUS_LEADER = Gauge(
    "kthena_router_kube_status_leader",
    "1 while this replica holds the status Lease (and is the one writing status), else 0",
    multiprocess_mode="livemax",
)
STATUS_WRITES = Counter(
    "kthena_router_kube_status_writes_total",
    "Status subresource writes by the Lease holder: written, conflict (409, re-read and merged), error",
    ["result"],
)
