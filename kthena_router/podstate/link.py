"""Wires a worker to the pod-state hub: what the hub sends lands where the worker's own
scraper and prober would have put it, and the scheduler's inserts go out.

- snapshots: `SharedScraper.inject` (stored as this worker's scrape, then the usual
  on_update chain: scheduler, PD pairer, KV-usage gauge, fairness);
- probe results: `EndpointHealth.probe_result` of the endpoint, as a local probe would;
- inserts of other workers: this worker's live scheduler index (endpoint key -> its id),
  or a PD side's (records named by side, scheduling/insert_scopes.py);
- in-flight changes of other workers: the live scheduler's Scorers, counted in the load
  until the next scrape, and per LoRA adapter in lora-affinity's batch view (PD sides'
  Scorers count their own worker's only).
While connected the worker's own scraper and prober idle (their tasks keep ticking but
send nothing); when the hub is gone they work again, from the state the hub left.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from kthena_router import worker_status
from kthena_router._core import BlockHashes
from kthena_router.endpoints.health import HealthProber
from kthena_router.endpoints.registry import EndpointRegistry
from kthena_router.engine_state.scraper import EngineStateScraper
from kthena_router.engine_state.snapshot import EndpointSnapshot
from kthena_router.settings import RouterSettings
from kthena_router.state import RouterState, StateHolder

from . import wire
from .client import PodStateClient
from kthena_router.scheduling.insert_scopes import InsertTargets

from .kv_relay import SharedKvSubscribers, apply_ops

log = logging.getLogger(__name__)


class SharedScraper(EngineStateScraper):
    """The worker's scraper, idle while the hub scrapes for it (`remote`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.remote = False
        self.on_endpoints: Callable[[tuple[wire.ScrapeSpec, ...]], None] | None = None

    def set_endpoints(self, endpoints: Iterable[tuple[str, str, str]]) -> None:
        eps = list(endpoints)
        super().set_endpoints(eps)
        if self.on_endpoints is not None:
            self.on_endpoints(tuple(wire.ScrapeSpec(k, url.rstrip("/"), fl) for k, url, fl in eps))

    async def _scrape(self, target: Any) -> None:
        if not self.remote:
            await super()._scrape(target)

    def inject(self, snap: EndpointSnapshot) -> None:
        """A snapshot the hub scraped: ours from now on (unknown endpoints are ignored)."""
        tracker = self._trackers.get(snap.key)
        if tracker is None:
            return
        tracker.adopt(snap)
        if self.on_update is not None:
            self.on_update(snap)


def probe_targets(state: RouterState) -> tuple[wire.ProbeTarget, ...]:
    out = []
    for ep in EndpointRegistry.unique(state.targets):
        mode = wire.SSL_NONE if ep.ssl is None else wire.SSL_VERIFY if ep.ssl is True else wire.SSL_INSECURE
        out.append(wire.ProbeTarget(ep.key, ep.base_url, tuple(sorted(ep.probe_headers.items())), mode))
    return tuple(out)


class PodStateLink:
    def __init__(self, settings: RouterSettings, holder: StateHolder, prober: HealthProber,
                 scheduler: Callable[[], Any], pd_pairer: Any = None) -> None:
        self.settings = settings
        self.holder = holder
        self.prober = prober
        self.scraper: SharedScraper | None = None
        self.scheduler = scheduler  # the live Scheduler (a reload may replace it), or None
        self.pd_pairer = pd_pairer  # its side schedulers' inserts are relayed too (scoped)
        self.targets = InsertTargets(scheduler, lambda: self.pd_pairer)
        if pd_pairer is not None:
            pd_pairer.set_insert_listener("pod-state", self._send_insert)
        self._probe: tuple[wire.ProbeTarget, ...] = ()
        self._scrape: tuple[wire.ScrapeSpec, ...] = ()
        self._kv: tuple[wire.KvSpec, ...] = ()
        self._mode_known = False  # set by the first connection attempt's outcome
        self.inserts_applied = 0  # records from other workers put into this worker's index
        self.client = PodStateClient(settings.pod_state_socket, on_snapshot=self._snapshot,
                                     on_probes=self._probes, on_inserts=self._inserts, on_mode=self._mode,
                                     on_kv=self._kv_ops, on_flight=self._flight)

    def relays_inserts(self) -> bool:
        """Whether the hub delivers this pod's other workers' inserts to this worker. Until
        the first connection attempt ends, yes: a worker reading Redis at start must not merge
        its siblings' entries that the hub's replay is about to deliver again."""
        return self.client.connected or not self._mode_known

    def attach_scraper(self, scraper: SharedScraper) -> None:
        """The worker's scraper (created in the lifespan, with a router configuration)."""
        self.scraper = scraper
        scraper.on_endpoints = self._set_scrape
        scraper.remote = self.client.connected

    def debug_view(self) -> dict[str, Any]:
        """GET /debug/pod_state: where this worker's state comes from, and its index."""
        sched = self.scheduler()
        index: dict[str, int] = {}
        flight: dict[str, dict[str, int]] = {}
        if sched is not None:
            for key in sorted({t.key for t in self._probe}):
                ep_id = sched.endpoint_id(key)
                if ep_id is not None:
                    index[key] = sched.index.endpoint_len(ep_id)
                    counts = sched.flight_counts(key)
                    if counts is not None:
                        flight[key] = counts
        c = self.client
        matcher = self._matcher()
        subs = matcher.subscribers if matcher is not None else None
        kv_local = subs.local_streams() if isinstance(subs, SharedKvSubscribers) else None
        return {"mode": "hub" if c.connected else "local", "socket": c.path, "kv_local_streams": kv_local,
                "inserts_sent": c.inserts_sent,
                "inserts_dropped": c.inserts_dropped, "inserts_applied": self.inserts_applied, "index": index,
                "in_flight": flight}

    # --- outgoing ----------------------------------------------------------------------------
    def _targets(self) -> None:
        self.client.set_targets(wire.Targets(self._probe, self._scrape, self._kv))

    def on_state(self, state: RouterState) -> None:
        self._probe = probe_targets(state)
        self._targets()

    def _set_scrape(self, specs: tuple[wire.ScrapeSpec, ...]) -> None:
        self._scrape = specs
        self._targets()

    def _set_kv(self, sources: Any) -> None:
        self._kv = tuple(wire.KvSpec(k, s.pub, s.replay, s.topic) for k, s in sources.items())
        self._targets()

    def bind(self, scheduler: Any) -> None:
        """Send this scheduler's dispatch-time inserts and in-flight changes to the hub; its kvcache-aware matcher
        (if any) follows the hub's KV-event streams instead of subscribing itself. Called
        before the scheduler is synced (nothing subscribed yet)."""
        if scheduler is None:
            return
        scheduler.insert_listeners["pod-state"] = self._send_insert
        scheduler.flight_listener = self.client.send_flight
        matcher = scheduler.kv_matcher
        if matcher is not None and not isinstance(matcher.subscribers, SharedKvSubscribers):
            # before the first connection attempt: assume the hub (no subscription to undo)
            remote = self.relays_inserts()
            matcher.subscribers = SharedKvSubscribers(matcher.subscribers, self._set_kv, remote)

    def _send_insert(self, key: str, hashes: BlockHashes) -> None:
        if self.client.connected:
            self.client.send_insert(key, hashes.to_bytes())

    # --- incoming ----------------------------------------------------------------------------
    def _snapshot(self, snap: EndpointSnapshot) -> None:
        if self.scraper is not None:
            self.scraper.inject(snap)

    def _probes(self, results: list[tuple[str, bool]]) -> None:
        state = self.holder.current
        if state is None:
            return
        eps = {ep.key: ep for ep in EndpointRegistry.unique(state.targets)}
        for key, ok in results:
            ep = eps.get(key)
            if ep is not None:
                ep.health.probe_result(ok)

    def _inserts(self, payload: bytes) -> None:
        insert = self.targets.insert
        for key, chain in wire.decode_inserts(payload):
            if chain and insert(key, BlockHashes.from_bytes(chain)):
                self.inserts_applied += 1

    def _flight(self, deltas: list[tuple[str, int]]) -> None:
        sched = self.scheduler()
        if sched is not None:
            for key, delta in deltas:
                ep_key, lora = wire.split_flight_key(key)
                sched.remote_in_flight(ep_key, delta, lora)

    def _matcher(self) -> Any:
        sched = self.scheduler()
        return sched.kv_matcher if sched is not None else None

    def _kv_ops(self, ops: list[wire.KvOp]) -> None:
        matcher = self._matcher()
        if matcher is not None and isinstance(matcher.subscribers, SharedKvSubscribers):
            apply_ops(ops, matcher.subscribers.real.sink, matcher.metrics, matcher.subscribers.hub_up)

    def _mode(self, connected: bool) -> None:
        self._mode_known = True
        sched = self.scheduler()
        if sched is not None:  # a new hub session: the siblings' adapter counts start again
            sched.clear_remote_loras()
        matcher = self._matcher()
        if matcher is not None and isinstance(matcher.subscribers, SharedKvSubscribers):
            matcher.subscribers.set_remote(connected)
        self.prober.remote = connected
        if self.scraper is not None:
            self.scraper.remote = connected
        worker_status.report_pod_state(self.settings, "hub" if connected else "local")
        log.info("pod state: %s", "from the hub" if connected else "this worker scrapes and probes by itself")
