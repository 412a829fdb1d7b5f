"""Metric collection for one target (a ModelServing, or one role of it): the policy's metric
sources -> an `Observation` for the algorithm.

- Pod sources are grouped by (uri, port, labelSelector) so each pod is scraped once per
  round for all the metrics read from it (as Kthena). A metric without a metricSources entry
  reads the engine default: `/metrics` on port 8100 with the engine names (scrape.py).
- Each group's pods (targets.metric_pods): none selected -> no data; a failed or restarted
  pod -> no data from that group this round (Kthena's rule); pods not Running and Ready
  count as unready; a ready pod is scraped at `http://<podIP>:<port><uri>`. A ready pod
  without an IP, or whose scrape fails, or whose page lacks the metric, counts as a pod that
  did not report (the algorithm's missing_pods: assumed on target when scaling down, idle
  when scaling up).
- Prometheus sources give one external value for the target.
- `router:` metrics come from the routers' pages (router_source.py, router_metrics.py): per
  pod, the target's ready entry pods matched by IP to the routers' endpoints.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .metrics import MetricSample, Observation
from .prometheus import PrometheusError, query
from .router_metrics import router_samples, split_metrics
from .router_source import RouterSnapshot, RouterSource
from .scrape import ScrapeFailed, candidates, fetch_page, read_metrics
from .targets import metric_pods

__all__ = ["Collector", "PodGroup", "PromSource", "plan_sources"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
DEFAULT_URI = "/metrics"
DEFAULT_PORT = 8100


@dataclass
class PodGroup:
    uri: str
    port: int
    selector: Mapping[str, Any] | None
    wanted: dict[str, tuple[str, ...]] = field(default_factory=dict)  # metric key -> sample names


@dataclass(frozen=True)
class PromSource:
    server_url: str
    query: str


def plan_sources(metrics: Iterable[str], sources: Mapping[str, Any] | None
                 ) -> tuple[list[PodGroup], dict[str, PromSource]]:
    groups: dict[str, PodGroup] = {}
    prom: dict[str, PromSource] = {}
    for key in sorted(set(metrics)):
        src = (sources or {}).get(key) or {}
        if src.get("prometheus"):
            p = src["prometheus"]
            prom[key] = PromSource(str(p.get("serverURL") or ""), str(p.get("query") or ""))
            continue
        pod = src.get("pod") or {}
        uri = str(pod.get("uri") or DEFAULT_URI)
        port = int(pod.get("port") or DEFAULT_PORT)
        selector = pod.get("labelSelector") or None
        gkey = f"{uri}|{port}|{json.dumps(selector, sort_keys=True)}"
        group = groups.setdefault(gkey, PodGroup(uri, port, selector))
        group.wanted[key] = candidates(key, pod.get("name") or None)
    return [groups[k] for k in sorted(groups)], prom


def _url(ip: str, port: int, uri: str) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}{uri}"


class Collector:
    def __init__(self, timeout_s: float = 3.0, router: RouterSource | None = None) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(1.0, timeout_s))
        self._session: aiohttp.ClientSession | None = None
        self.router = router  # None: no --router-metrics-url

    @property
    def session(self) -> aiohttp.ClientSession:
        """One session for every scrape (aiohttp sets TCP_NODELAY on its connections)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=30), trust_env=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def router_snapshot(self) -> RouterSnapshot | None:
        """The routers' latest snapshot (shared by the rounds within its interval)."""
        if self.router is None:
            return None
        return await self.router.snapshot(self.session, self.timeout)

    async def observe(self, pods: list[Obj], namespace: str, ms_name: str, role: str | None,
                      metrics: Iterable[str], sources: Mapping[str, Any] | None) -> Observation:
        local, routed = split_metrics(metrics)
        groups, prom = plan_sources(local, sources)
        samples: dict[str, MetricSample] = {}
        unready: set[str] = set()
        if routed:
            podset = metric_pods(pods, namespace, ms_name, role, None)
            unready.update(podset.unready)
            if podset.ready:
                samples.update(router_samples(routed, [ip for _, ip in podset.ready], await self.router_snapshot()))
        results = await asyncio.gather(*(self._group(pods, namespace, ms_name, role, g) for g in groups),
                                       *(self._prom(k, s) for k, s in prom.items()))
        for res in results[:len(groups)]:
            group_samples, group_unready = res  # type: ignore[misc]
            samples.update(group_samples)
            unready.update(group_unready)
        for key, value in zip(prom, results[len(groups):]):
            if value is not None:
                samples[key] = MetricSample(external=value)  # type: ignore[arg-type]
        return Observation(samples, len(unready))

    async def _group(self, pods: list[Obj], namespace: str, ms_name: str, role: str | None,
                     g: PodGroup) -> tuple[dict[str, MetricSample], set[str]]:
        podset = metric_pods(pods, namespace, ms_name, role, g.selector)
        if podset.errored:
            log.info("%s/%s%s: a metric pod failed or restarted: metrics %s skipped this round", namespace, ms_name,
                     f" role {role}" if role else "", ", ".join(g.wanted))
            return {}, set()
        if not podset.ready:
            return {}, set(podset.unready)
        pages = await asyncio.gather(*(self._page(ip, g) for _, ip in podset.ready))
        values: dict[str, list[float]] = {k: [] for k in g.wanted}
        missing: dict[str, int] = {k: 0 for k in g.wanted}
        for page in pages:
            for key in g.wanted:
                if page is not None and key in page:
                    values[key].append(page[key])
                else:
                    missing[key] += 1
        out = {k: MetricSample(pods=tuple(values[k]), missing_pods=missing[k]) for k in g.wanted if values[k]}
        return out, set(podset.unready)

    async def _page(self, ip: str, g: PodGroup) -> dict[str, float] | None:
        if not ip:
            return None
        url = _url(ip, g.port, g.uri)
        try:
            text = await fetch_page(self.session, url, self.timeout)
            return read_metrics(text, g.wanted)
        except ScrapeFailed as exc:
            log.info("metrics scrape failed: %s", exc)
        except ValueError as exc:
            log.info("metrics page of %s does not parse: %s", url, exc)
        return None

    async def _prom(self, key: str, src: PromSource) -> float | None:
        try:
            return await query(self.session, src.server_url, src.query, self.timeout)
        except PrometheusError as exc:
            log.info("prometheus metric %s: %s", key, exc)
            return None
