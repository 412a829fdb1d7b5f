"""Policy metrics read from the routers (`router:` names) and the wake signal (pure).

- `router:tokens_per_second` (input + output), `router:output_tokens_per_second`,
  `router:kv_cache_usage`: per-pod samples for the target's ready entry pods, each pod
  matched to the router endpoints whose host is the pod's IP (any ModelServer, any port:
  tokens summed, KV usage the largest). A ready pod without an IP or without data counts as
  a pod that did not report (the algorithm's missing pods); pods not Running and Ready as
  unready. No pod scrape, no `metricSources` entry: an entry for a `router:` name is a policy
  error (status Ready False, InvalidPolicy), as is an unknown `router:` name or a `router:`
  metric on a controller started without `--router-metrics-url`.
- The wake signal `router:pending_requests`: the requests the routers hold for the
  ModelServers that select the target's pods (their spec.workloadSelector.matchLabels all
  among the labels the ModelServing's entry pods get, see `entry_labels`), one external
  value for the unit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from controller import naming as n

from .metrics import MetricSample, Observation
from .router_source import RouterSnapshot

__all__ = ["PREFIX", "ROUTER_METRICS", "WAKE_METRIC", "entry_labels", "router_metric_error", "router_samples",
           "selecting_servers", "split_metrics", "woken"]

Obj = dict[str, Any]

PREFIX = "router:"
TOKENS_PER_SECOND = "router:tokens_per_second"
OUTPUT_TOKENS_PER_SECOND = "router:output_tokens_per_second"
KV_CACHE_USAGE = "router:kv_cache_usage"
WAKE_METRIC = "router:pending_requests"
ROUTER_METRICS = (TOKENS_PER_SECOND, OUTPUT_TOKENS_PER_SECOND, KV_CACHE_USAGE)
_TOKEN_TYPES = {TOKENS_PER_SECOND: ("input", "output"), OUTPUT_TOKENS_PER_SECOND: ("output",)}


def split_metrics(metrics: Iterable[str]) -> tuple[list[str], list[str]]:
    """(pod/Prometheus metrics, router metrics)."""
    names = sorted(set(metrics))
    return [m for m in names if not m.startswith(PREFIX)], [m for m in names if m.startswith(PREFIX)]


def router_metric_error(metrics: Iterable[str], sources: Mapping[str, Any] | None, where: str,
                        configured: bool) -> str | None:
    """Why a policy's router metrics cannot be read (None: they can). `where` names the
    spec path of the metric list, e.g. `spec.metrics` or `spec.disaggregatedTarget.roles.prefill`."""
    _, router = split_metrics(metrics)
    for key in sorted(sources or {}):
        if key.startswith(PREFIX):
            return (f"{where}: metricSources[{key!r}]: {PREFIX} metrics are read from the routers "
                    "(--router-metrics-url), not from a metric source; remove the entry")
    unknown = [m for m in router if m not in ROUTER_METRICS]
    if unknown:
        return (f"{where}: unknown router metric {', '.join(unknown)} (known: {', '.join(ROUTER_METRICS)})")
    if router and not configured:
        return (f"{where}: metric {', '.join(router)} needs the controller's --router-metrics-url "
                "(none configured)")
    return None


def router_samples(names: Iterable[str], ready_ips: Iterable[str], snapshot: RouterSnapshot | None
                   ) -> dict[str, MetricSample]:
    """Per-pod samples of the router metrics for the target's ready pods (their IPs; "" for
    a pod without one). A metric no pod has data for is absent (missing)."""
    ips = list(ready_ips)
    out: dict[str, MetricSample] = {}
    for name in names:
        values: list[float] = []
        missing = 0
        for ip in ips:
            value: float | None = None
            if ip and snapshot is not None:
                value = (snapshot.kv_usage(ip) if name == KV_CACHE_USAGE
                         else snapshot.token_rate(ip, _TOKEN_TYPES[name]))
            if value is None:
                missing += 1
            else:
                values.append(value)
        if values:
            out[name] = MetricSample(pods=tuple(values), missing_pods=missing)
    return out


# --- the wake signal: which ModelServers route to a ModelServing ----------------------------------

def entry_labels(ms: Obj) -> list[dict[str, str]]:
    """Per role, the labels every entry pod of it carries whatever its replica, group or
    revision (controller/render.py: name, role, entry, then the entry template's labels win)."""
    name = str((ms.get("metadata") or {}).get("name") or "")
    out: list[dict[str, str]] = []
    for role in ((ms.get("spec") or {}).get("template") or {}).get("roles") or []:
        labels = {n.LABEL_NAME: name, n.LABEL_ROLE: str(role.get("name") or ""), n.LABEL_ENTRY: n.ENTRY}
        tmeta = (role.get("entryTemplate") or {}).get("metadata") or {}
        labels.update({str(k): str(v) for k, v in (tmeta.get("labels") or {}).items()})
        out.append(labels)
    return out


def selecting_servers(servers: Iterable[Obj], namespace: str, ms: Obj, pods: Iterable[Obj] = ()) -> list[str]:
    """`<ns>/<name>` of the ModelServers in `namespace` whose workloadSelector.matchLabels
    select the ModelServing's entry pods: as rendered (at zero replicas there are none), or
    as they exist (a label added to a pod by someone else)."""
    candidates = entry_labels(ms)
    candidates += [dict((p.get("metadata") or {}).get("labels") or {}) for p in pods]
    out: list[str] = []
    for server in servers:
        meta = server.get("metadata") or {}
        if meta.get("namespace") != namespace:
            continue
        ws = (server.get("spec") or {}).get("workloadSelector") or {}
        want = {str(k): str(v) for k, v in (ws.get("matchLabels") or {}).items()}
        if any(all(labels.get(k) == v for k, v in want.items()) for labels in candidates):
            out.append(f"{namespace}/{meta.get('name')}")
    return sorted(out)


def woken(obs: Observation, snapshot: RouterSnapshot | None, servers: Iterable[str]) -> Observation:
    """`obs` with the wake signal: the requests held for those ModelServers (left out when
    unknown: the algorithm then never goes down to zero)."""
    value = snapshot.pending(servers) if snapshot is not None else None
    if value is None:
        return obs
    return Observation({**obs.metrics, WAKE_METRIC: MetricSample(external=value)}, obs.unready_pods)
