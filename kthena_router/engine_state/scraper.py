"""Engine state scraping (/metrics + /v1/models per endpoint) and the router's own signals.

EngineStateScraper runs one small task per endpoint: a first scrape at once, then each on its
own random phase within the interval (plus +-10 % jitter per period), so that hundreds of
endpoints are scraped spread over the interval rather than in bursts; a semaphore bounds the scrapes in flight,
and each scrape (both requests) has one deadline. Parsing happens on the event loop: it
costs ~0.2 ms for a 73 KiB vLLM page (see metrics_parse.py).

ObservedLoad is the router's own view, updated on every request of this worker process:
in-flight count and EWMAs of observed TTFT and TPOT per endpoint. Combined with a
snapshot (`queue_estimate`), the engine's queue seen at the last scrape is corrected by
what this worker dispatched and saw finish since, so decisions react within one request.
It is per worker: with several granian workers each one sees only its own requests.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp
import orjson

from .metrics_parse import normalize_flavour, parse_metrics
from .snapshot import STALE_AFTER_INTERVALS, EndpointSnapshot, ModelsInfo, SnapshotTracker, parse_models

log = logging.getLogger(__name__)

METRICS_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"  # not OpenMetrics / protobuf
MAX_BODY_BYTES = 16 * 1024 * 1024


class ScrapeError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    key: str
    base_url: str  # http://host:port, no trailing slash
    flavour: str  # "vllm" | "sglang" (ModelServer.inference_engine, any case)


class EngineStateScraper:
    def __init__(self, session: aiohttp.ClientSession, interval_s: float = 1.0,
                 timeout_s: float | None = None, max_concurrency: int = 64, *,
                 jitter: float = 0.1, stale_after: int = STALE_AFTER_INTERVALS,
                 scrape_models: bool = True, observed: ObservedLoad | None = None,
                 rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_update: Callable[[EndpointSnapshot], None] | None = None) -> None:
        if interval_s <= 0 or max_concurrency < 1:
            raise ValueError("interval_s must be > 0 and max_concurrency >= 1")
        self.session = session
        self.interval_s = interval_s
        # a scrape that takes longer than most of an interval is as good as failed
        self.timeout_s = timeout_s if timeout_s is not None else max(0.05, 0.8 * interval_s)
        self.jitter = jitter
        self.stale_after = stale_after
        self.scrape_models = scrape_models
        self.observed = observed
        self._rng = rng or random.Random()
        self._clock = clock
        self.on_update = on_update  # called with every new snapshot (good or failed scrape)
        self._sem = asyncio.Semaphore(max_concurrency)
        self._targets: dict[str, ScrapeTarget] = {}
        self._trackers: dict[str, SnapshotTracker] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stop: asyncio.Event | None = None

    # --- endpoints ---------------------------------------------------------------------
    def set_endpoints(self, endpoints: Iterable[tuple[str, str, str]]) -> None:
        """Replace the endpoint set: (key, base_url, engine flavour). New ones start being
        scraped, removed ones are purged, changed URL/flavour restart from scratch."""
        new = {k: ScrapeTarget(k, url.rstrip("/"), normalize_flavour(fl)) for k, url, fl in endpoints}
        for key in [k for k in self._targets if new.get(k) != self._targets[k]]:
            self._drop(key)
        for key, target in new.items():
            if key not in self._targets:
                self._targets[key] = target
                self._trackers[key] = SnapshotTracker(key, target.flavour)
                if self._stop is not None:
                    self._spawn(target)

    def _drop(self, key: str) -> None:
        self._targets.pop(key, None)
        self._trackers.pop(key, None)
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()
        if self.observed is not None:
            self.observed.remove(key)

    # --- reading -----------------------------------------------------------------------
    def keys(self) -> list[str]:
        """The endpoints scraped now."""
        return list(self._targets)

    def get(self, key: str) -> EndpointSnapshot | None:
        """The endpoint's snapshot (aged: stale if too old), None before its first scrape."""
        tracker = self._trackers.get(key)
        snap = tracker.snapshot if tracker is not None else None
        if snap is None:
            return None
        return snap.aged(self._clock(), self.interval_s, self.stale_after)

    def all(self) -> dict[str, EndpointSnapshot]:
        now = self._clock()
        out = {}
        for key, tracker in self._trackers.items():
            snap = tracker.snapshot
            if snap is not None:
                out[key] = snap.aged(now, self.interval_s, self.stale_after)
        return out

    # --- running -----------------------------------------------------------------------
    async def run(self) -> None:
        """Scrape every endpoint until stop() or cancellation."""
        if self._stop is not None:
            raise RuntimeError("EngineStateScraper.run() is already running")
        self._stop = asyncio.Event()
        try:
            for target in self._targets.values():
                self._spawn(target)
            await self._stop.wait()
        finally:
            self._stop = None
            tasks = list(self._tasks.values())
            self._tasks.clear()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def scrape_once(self, keys: Iterable[str] | None = None) -> None:
        """Scrape now (all endpoints, or `keys`), concurrently within the bound."""
        targets = [self._targets[k] for k in (keys if keys is not None else list(self._targets))
                   if k in self._targets]
        await asyncio.gather(*(self._scrape(t) for t in targets))

    def _spawn(self, target: ScrapeTarget) -> None:
        self._tasks[target.key] = asyncio.create_task(self._loop(target),
                                                      name=f"engine-scrape {target.key}")

    async def _loop(self, target: ScrapeTarget) -> None:
        loop = asyncio.get_running_loop()
        # The first scrape at once: until then the endpoint's load is unknown, which ranks it
        # worst, so a router that just started would keep traffic (and prefixes) off it. The
        # random phase spreads the later scrapes.
        await self._scrape(target)
        await asyncio.sleep(self._rng.uniform(0.0, self.interval_s))
        due = loop.time()
        while True:
            await self._scrape(target)
            due += self.interval_s * (1.0 + self._rng.uniform(-self.jitter, self.jitter))
            delay = due - loop.time()
            if delay < 0:  # fell behind (slow engine, busy loop): do not burst to catch up
                due = loop.time()
                delay = 0.0
            await asyncio.sleep(delay)

    async def _scrape(self, target: ScrapeTarget) -> None:
        mark = self.observed.mark(target.key) if self.observed is not None else None
        error: str | None = None
        models: ModelsInfo | None = None
        parsed = None
        try:
            async with self._sem:
                async with asyncio.timeout(self.timeout_s):
                    if self.scrape_models:
                        text, models_res = await asyncio.gather(
                            self._get(target.base_url + "/metrics", METRICS_ACCEPT),
                            self._get(target.base_url + "/v1/models", "application/json"),
                            return_exceptions=True)
                    else:
                        text, models_res = await self._get(target.base_url + "/metrics",
                                                           METRICS_ACCEPT), None
            if isinstance(text, BaseException):
                raise text
            parsed = parse_metrics(text, target.flavour)
            if parsed.samples == 0:
                raise ScrapeError("no known engine metric family on /metrics")
            if isinstance(models_res, str):
                try:
                    models = parse_models(orjson.loads(models_res))
                except ValueError as e:  # orjson.JSONDecodeError is a ValueError
                    log.debug("engine %s: bad /v1/models: %s", target.key, e)
            elif isinstance(models_res, BaseException):
                log.debug("engine %s: /v1/models failed: %r", target.key, models_res)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            error = f"timeout after {self.timeout_s:g}s"
        except (aiohttp.ClientError, OSError, ScrapeError, ValueError) as e:
            error = f"{type(e).__name__}: {e}"
        except Exception as e:  # a bug must not end this endpoint's scraping for good
            log.warning("engine %s: unexpected scrape error", target.key, exc_info=True)
            error = f"{type(e).__name__}: {e}"
        tracker = self._trackers.get(target.key)
        if tracker is None or self._targets.get(target.key) != target:
            return  # removed or replaced while scraping
        prev = tracker.snapshot
        now = self._clock()
        if error is None and parsed is not None:
            snap = tracker.on_success(parsed, models, now, mark)
            if prev is not None and prev.consecutive_failures > 0:
                log.info("engine %s: metrics scrape recovered after %d failures", target.key,
                         prev.consecutive_failures)
        else:
            snap = tracker.on_failure(now, error or "unknown error")
            if snap.consecutive_failures == 1:
                log.warning("engine %s: metrics scrape failed, state is stale: %s", target.key, error)
            else:
                log.debug("engine %s: scrape failed again (%d): %s", target.key,
                          snap.consecutive_failures, error)
        if self.on_update is not None:
            try:
                self.on_update(snap)
            except Exception:  # a consumer bug must not stop this endpoint's scraping
                log.exception("engine %s: snapshot consumer failed", target.key)

    async def _get(self, url: str, accept: str) -> str:
        async with self.session.get(url, headers={"Accept": accept}, allow_redirects=False) as resp:
            if resp.status != 200:
                raise ScrapeError(f"GET {url}: HTTP {resp.status}")
            if resp.content_length is not None and resp.content_length > MAX_BODY_BYTES:
                raise ScrapeError(f"GET {url}: body of {resp.content_length} bytes is too large")
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise ScrapeError(f"GET {url}: body larger than {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
            return b"".join(chunks).decode("utf-8", "replace")


class _Observed:
    __slots__ = ("in_flight", "started", "finished", "ttft", "tpot")

    def __init__(self) -> None:
        self.in_flight = 0
        self.started = 0
        self.finished = 0
        self.ttft: float | None = None
        self.tpot: float | None = None


class ObservedLoad:
    """The router's own per-endpoint signals (this worker process only). Fed by the proxy:
    start() when a request is dispatched, finish() when it ends (any outcome), and the
    TTFT / TPOT it measured when there were tokens."""

    def __init__(self, alpha: float = 0.3) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self._eps: dict[str, _Observed] = {}

    def _ep(self, key: str) -> _Observed:
        ep = self._eps.get(key)
        if ep is None:
            ep = self._eps[key] = _Observed()
        return ep

    def start(self, key: str) -> None:
        ep = self._ep(key)
        ep.in_flight += 1
        ep.started += 1

    def finish(self, key: str, ttft_s: float | None = None, tpot_s: float | None = None) -> None:
        ep = self._eps.get(key)
        if ep is None:  # purged while the request ran
            return
        if ep.in_flight > 0:
            ep.in_flight -= 1
            ep.finished += 1
        if ttft_s is not None:
            self.observe_ttft(key, ttft_s)
        if tpot_s is not None:
            self.observe_tpot(key, tpot_s)

    def observe_ttft(self, key: str, seconds: float) -> None:
        ep = self._ep(key)
        ep.ttft = seconds if ep.ttft is None else ep.ttft + self.alpha * (seconds - ep.ttft)

    def observe_tpot(self, key: str, seconds: float) -> None:
        ep = self._ep(key)
        ep.tpot = seconds if ep.tpot is None else ep.tpot + self.alpha * (seconds - ep.tpot)

    def in_flight(self, key: str) -> int:
        ep = self._eps.get(key)
        return ep.in_flight if ep is not None else 0

    def ttft_s(self, key: str) -> float | None:
        ep = self._eps.get(key)
        return ep.ttft if ep is not None else None

    def tpot_s(self, key: str) -> float | None:
        ep = self._eps.get(key)
        return ep.tpot if ep is not None else None

    def mark(self, key: str) -> tuple[int, int]:
        """(started, finished) totals now; the scraper stores it in the snapshot."""
        ep = self._eps.get(key)
        return (ep.started, ep.finished) if ep is not None else (0, 0)

    def queue_estimate(self, key: str, snap: EndpointSnapshot | None) -> int | None:
        """Engine running + waiting at the last scrape, plus what this worker dispatched
        since, minus what it saw finish since; never below this worker's own in-flight.
        None when the engine's queue is unknown (no scrape yet, stale, not exported): the
        scorer treats that as worst case and may order such endpoints by in_flight()."""
        if snap is None:
            return None
        queue = snap.queue
        if queue is None:
            return None
        ep = self._eps.get(key)
        if ep is None:
            return queue
        m_started, m_finished = snap.observed_mark or (ep.started, ep.finished)
        est = queue + (ep.started - m_started) - (ep.finished - m_finished)
        return max(est, ep.in_flight)

    def remove(self, key: str) -> None:
        self._eps.pop(key, None)

    def retain(self, keys: Iterable[str]) -> None:
        """Purge every endpoint not in `keys`."""
        keep = set(keys)
        for key in [k for k in self._eps if k not in keep]:
            del self._eps[key]
