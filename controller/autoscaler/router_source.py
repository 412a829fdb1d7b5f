"""The routers' own signals for the autoscaler: their /metrics pages (`--router-metrics-url`,
repeatable) -> one typed snapshot per short interval, shared by every policy's round.

The metric contract with the router (its side: kthena_router/metrics.py):
- `kthena_router_endpoint_tokens_total{model_server="<ns>/<name>", endpoint="<ip>:<port>",
  token_type="input|output"}`: a counter;
- `kthena_router_endpoint_kv_cache_usage{model_server, endpoint}`: a gauge 0..1 from the
  router's own engine scrape (absent when unknown);
- `kthena_router_pending_requests{model, model_server}`: a gauge, the requests held because
  the ModelServer has no endpoint (waiting for a scale from zero).

Several router replicas (Kubernetes): every replica's page is read (each must be listed: a
Service URL would land on a different replica each time and its counters would look reset).
- Tokens per second of an endpoint: per router, counter delta / time delta against an
  earlier page of the same router at least `min_rate_s` old, summed over the routers. A
  series that went down or vanished (a restarted router) or a router without an earlier
  page (the first observation) gives no rate this round; so does a router whose scrape
  failed (its share is unknown: a partial sum could read as a drop and scale down). A
  series a router does not export counts as 0 tokens (no traffic went through it).
- KV usage of an endpoint: each router scrapes the engines itself: the largest value any
  answering router reports (the cautious one for a scale-up).
- Pending requests of a model: summed over the routers. With a failed router a sum of 0 is
  unknown (that router may hold requests): missing, so never a scale to zero on it; a sum
  above 0 is a certain wake-up.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .scrape import ScrapeFailed, _prefilter, fetch_page

__all__ = ["KV_USAGE", "PENDING", "TOKENS", "RouterPage", "RouterSnapshot", "RouterSource", "endpoint_host",
           "parse_router_page", "validate_router_url"]

log = logging.getLogger(__name__)

TOKENS = "kthena_router_endpoint_tokens"  # counter: samples ..._total
KV_USAGE = "kthena_router_endpoint_kv_cache_usage"
PENDING = "kthena_router_pending_requests"

TokenKey = tuple[str, str, str]  # (model_server, endpoint, token_type)
EndpointKey = tuple[str, str]  # (model_server, endpoint)
PendingKey = tuple[str, str]  # (model, model_server)


def validate_router_url(url: str) -> str:
    """`http(s)://host[:port]/path`; ValueError naming the flag otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--router-metrics-url {url!r}: expected http(s)://host[:port]/metrics")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError(f"--router-metrics-url {url!r}: bad port") from None
    if parts.query or parts.fragment:
        raise ValueError(f"--router-metrics-url {url!r}: no query or fragment expected")
    return url


def endpoint_host(endpoint: str) -> str:
    """`10.0.0.5:8000` -> `10.0.0.5`, `[fd00::1]:8000` -> `fd00::1`."""
    host = endpoint.rpartition(":")[0] if endpoint.count(":") == 1 or endpoint.startswith("[") else endpoint
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


@dataclass(frozen=True)
class RouterPage:
    """One router's contract families at one instant (`at`: the controller's monotonic clock)."""
    at: float
    tokens: Mapping[TokenKey, float] = field(default_factory=dict)
    kv: Mapping[EndpointKey, float] = field(default_factory=dict)
    pending: Mapping[PendingKey, float] = field(default_factory=dict)
    hosts: Mapping[str, tuple[TokenKey, ...]] = field(default_factory=dict)  # endpoint host -> token series
    kv_hosts: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # endpoint host -> kv values


def parse_router_page(text: str, at: float) -> RouterPage:
    """The contract families of a router page (ValueError on a page the parser refuses).
    Samples lacking a contract label, or with a value that is not finite, are left out."""
    tokens: dict[TokenKey, float] = {}
    kv: dict[EndpointKey, float] = {}
    pending: dict[PendingKey, float] = {}
    for fam in text_string_to_metric_families(_prefilter(text, (TOKENS, KV_USAGE, PENDING))):
        for s in fam.samples:
            value, lb = float(s.value), s.labels
            if not math.isfinite(value):
                continue
            if s.name in (TOKENS, TOKENS + "_total"):
                if lb.get("model_server") and lb.get("endpoint") and lb.get("token_type"):
                    key = (lb["model_server"], lb["endpoint"], lb["token_type"])
                    tokens[key] = tokens.get(key, 0.0) + value
            elif s.name == KV_USAGE:
                if lb.get("model_server") and lb.get("endpoint"):
                    kv[(lb["model_server"], lb["endpoint"])] = value
            elif s.name == PENDING:
                if lb.get("model_server"):
                    pk = (lb.get("model", ""), lb["model_server"])
                    pending[pk] = pending.get(pk, 0.0) + value
    hosts: dict[str, list[TokenKey]] = {}
    for key in tokens:
        hosts.setdefault(endpoint_host(key[1]), []).append(key)
    kv_hosts: dict[str, list[float]] = {}
    for (_, ep), value in kv.items():
        kv_hosts.setdefault(endpoint_host(ep), []).append(value)
    return RouterPage(at, tokens, kv, pending, {h: tuple(k) for h, k in hosts.items()},
                      {h: tuple(v) for h, v in kv_hosts.items()})


def _router_rate(page: RouterPage, base: RouterPage, host: str, types: frozenset[str]) -> float | None:
    """Tokens per second through one router to one endpoint host, or None (reset, vanished)."""
    dt = page.at - base.at
    if dt <= 0:
        return None
    total = 0.0
    for key in set(page.hosts.get(host, ())) | set(base.hosts.get(host, ())):
        if key[2] not in types:
            continue
        now = page.tokens.get(key)
        before = base.tokens.get(key, 0.0)
        if now is None or now < before:
            return None  # the series went away or down: a restarted router, no rate this round
        total += now - before
    return total / dt


@dataclass(frozen=True)
class RouterSnapshot:
    """Every configured router's latest page (None: its scrape failed this time) and the
    earlier page its rates are computed against (None: none old enough yet)."""
    pages: tuple[RouterPage | None, ...]
    bases: tuple[RouterPage | None, ...]

    @property
    def complete(self) -> bool:
        return all(p is not None for p in self.pages)

    @property
    def any(self) -> bool:
        return any(p is not None for p in self.pages)

    def token_rate(self, host: str, types: Iterable[str]) -> float | None:
        """Tokens per second (of those token types) to the endpoints on `host`, summed over
        the routers and the endpoints (any ModelServer, any port); None when unknown."""
        if not self.pages:
            return None
        wanted = frozenset(types)
        total = 0.0
        for page, base in zip(self.pages, self.bases):
            if page is None or base is None:
                return None
            rate = _router_rate(page, base, host, wanted)
            if rate is None:
                return None
            total += rate
        return total

    def kv_usage(self, host: str) -> float | None:
        values = [v for p in self.pages if p is not None for v in p.kv_hosts.get(host, ())]
        return max(values) if values else None

    def pending(self, model_servers: Iterable[str]) -> float | None:
        """Requests held for those ModelServers (`<ns>/<name>`), summed over the routers;
        None when nothing is known (no router answered, or a sum of 0 with a router failed)."""
        names = set(model_servers)
        total = sum(v for p in self.pages if p is not None for (_, ms), v in p.pending.items() if ms in names)
        if total > 0:
            return total
        return 0.0 if self.pages and self.complete else None


class RouterSource:
    """Fetches every router page concurrently, at most once per `min_interval_s` (the rounds
    of all policies within it share one snapshot), and keeps each router's recent pages for
    the rates."""

    def __init__(self, urls: Sequence[str], *, min_interval_s: float = 1.0, min_rate_s: float = 5.0,
                 max_age_s: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.urls = tuple(urls)
        self.min_interval = min_interval_s
        self.min_rate = min_rate_s
        self.max_age = max_age_s
        self.clock = clock
        self._history: list[list[RouterPage]] = [[] for _ in self.urls]
        self._snapshot: RouterSnapshot | None = None
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()

    async def snapshot(self, session: aiohttp.ClientSession, timeout: aiohttp.ClientTimeout) -> RouterSnapshot:
        async with self._lock:
            now = self.clock()
            if self._snapshot is not None and self._fetched_at is not None and \
                    now - self._fetched_at < self.min_interval:
                return self._snapshot
            pages = await asyncio.gather(*(self._fetch(session, url, timeout) for url in self.urls))
            self._fetched_at = self.clock()
            self._snapshot = self.record(pages)
            return self._snapshot

    def record(self, pages: Sequence[RouterPage | None]) -> RouterSnapshot:
        """Add one fetch's pages (None: failed) to the histories; the snapshot with each
        page's base (the newest earlier page at least min_rate_s older)."""
        bases: list[RouterPage | None] = []
        for hist, page in zip(self._history, pages):
            if page is None:
                bases.append(None)
                continue
            base = None
            for old in reversed(hist):
                if old.at <= page.at - self.min_rate:
                    base = old
                    break
            bases.append(base)
            hist.append(page)
            keep_from = page.at - self.max_age
            while hist and (hist[0].at < keep_from or len(hist) > 64):
                hist.pop(0)
            # the base must stay: everything older than it is never a base again
            if base is not None:
                while hist[0] is not base and hist[0].at < base.at:
                    hist.pop(0)
        return RouterSnapshot(tuple(pages), tuple(bases))

    async def _fetch(self, session: aiohttp.ClientSession, url: str,
                     timeout: aiohttp.ClientTimeout) -> RouterPage | None:
        try:
            text = await fetch_page(session, url, timeout)
            return parse_router_page(text, self.clock())
        except ScrapeFailed as exc:
            log.info("router metrics scrape failed: %s", exc)
        except ValueError as exc:
            log.info("router metrics page of %s does not parse: %s", url, exc)
        return None
