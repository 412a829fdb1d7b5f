"""Readiness of a starting worker: warm before it takes traffic, within a bound.

Until its first scrape an engine's load is unknown (ranked worst), and until its KV-event
stream is up kvcache-aware matches approximately. A worker that served at once (a new
replica in a rolling update or a scale-out) would send its first burst away from the engines
that hold the prefixes. So a worker reports itself warming up (worker_status `warming`, and
/readyz fails) from the first configuration with endpoints until every one of those
endpoints has been scraped once (answer or error), every engine that answered has its
KV-event stream up and synced, and the shared prefix index has had its first round with
Redis; or until `timeout_s` has passed, so that an engine that never publishes its events
cannot keep the pod unready. The first configuration with endpoints is the one loaded at
start in file mode, the first full sync in Kubernetes mode; endpoints added later do not
gate readiness.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kthena_router import worker_status

if TYPE_CHECKING:
    from kthena_router.router_config_reload import RouterConfigReloader
    from kthena_router.settings import RouterSettings

log = logging.getLogger(__name__)

POLL_S = 0.02


class WarmupGate:
    def __init__(self, settings: RouterSettings, reloader: RouterConfigReloader) -> None:
        self.settings = settings
        self.reloader = reloader
        self.done = False
        self._keys: frozenset[str] = frozenset()
        self._task: asyncio.Task[None] | None = None

    def on_state(self, state: Any) -> None:
        """ConfigApplier.after_swap: start waiting at the first configuration with endpoints
        (synchronously, so the status says "warming" before the worker reports the config)."""
        scraper = self.reloader.scraper
        if self.done or self._task is not None or scraper is None:
            return
        keys = frozenset(scraper.keys())
        if not keys:
            return
        self._keys = keys
        worker_status.report_warming(self.settings, self.pending() or "first scrapes")
        self._task = asyncio.get_running_loop().create_task(self._wait(), name="warmup")

    def pending(self) -> str:
        """What the worker still waits for, "" when nothing."""
        scraper = self.reloader.scraper
        if scraper is None:
            return ""
        known = set(scraper.keys())
        keys = [k for k in sorted(self._keys) if k in known]  # removed since: not waited for
        parts = []
        unscraped = [k for k in keys if scraper.get(k) is None]
        if unscraped:
            parts.append(f"first scrape of {_some(unscraped)}")
        matcher, pd = self.reloader.matcher, self.reloader.pd_pairer
        down = matcher.streams_not_up() if matcher is not None else set()
        if pd is not None:  # the PD sides' matchers (pd/side_kv.py)
            down |= pd.kv_streams_not_up()
        if down:
            waiting = [k for k in keys if k in down and (snap := scraper.get(k)) is not None
                       and snap.consecutive_failures == 0]
            if waiting:
                parts.append(f"KV-event stream of {_some(waiting)}")
        shared = self.reloader.shared_index
        if shared is not None and not shared.first_round_done:
            parts.append("first round of the shared prefix index")
        return "; ".join(parts)

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.warmup_timeout_s
        last = None
        try:
            while reason := self.pending():
                if loop.time() >= deadline:
                    log.warning("ready after %gs without waiting any longer for: %s",
                                self.settings.warmup_timeout_s, reason)
                    break
                if reason != last:
                    worker_status.report_warming(self.settings, reason)
                    last = reason
                await asyncio.sleep(POLL_S)
        finally:
            self.done = True
            worker_status.report_warming(self.settings, "")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _some(keys: list[str], shown: int = 3) -> str:
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more
