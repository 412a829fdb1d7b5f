"""Exact KV-event matching on the PD sides (docs/kv-exact-default.md, "PD sides").

Each side's Scheduler may carry the kvcache-aware matcher (scheduling/kv_matcher.py, the
same class as the scheduler section's): when the side lists `kvcache-aware` (every endpoint
of the side subscribed, labels or the plugin's port defaults), or scores `prefix-cache`
under `kvEvents.exactMatching: auto` with tokenizers configured (only endpoints labelled
`kthena.io/kv-events-port`). A side's matcher follows the streams of that side's own
engines: the prefill side the prefill engines (what a prefix hit saves is their prompt
computation), the decode side the decode engines (the KV they received through the
connector is in their cache and published as theirs). Endpoints without an up stream get
the side's approximate index, as everywhere.

Per worker: with several workers each worker's side matchers subscribe by themselves
(the pod-state hub follows the scheduler section's streams only).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from kthena_router.endpoints.registry import EndpointState
from kthena_router.metrics import RouterMetrics
from kthena_router.scheduling.config import SchedulerSettings
from kthena_router.scheduling.exact_auto import KvEventsSettings, auto_exact_args
from kthena_router.scheduling.kv_matcher import KvAwareMatcher, event_sources, matcher_for
from kthena_router.scheduling.scheduler import Scheduler

log = logging.getLogger(__name__)

__all__ = ["attach", "debug_view", "exact_mode", "follow", "load_tokenizers", "retire"]


def exact_mode(sc: SchedulerSettings, kv_events: KvEventsSettings) -> tuple[str, bool] | None:
    """("listed" or "auto", whether shared prefixes keep the approximate memory), or None:
    what a side with pipeline `sc` gets (a reload rebuilds a side whose pipeline or mode
    changed)."""
    if sc.enabled("kvcache-aware"):
        return "listed", kv_events.shared_memory(False)
    if auto_exact_args(sc, kv_events) is None:
        return None
    return "auto", kv_events.shared_memory(True)


def attach(sched: Scheduler, sc: SchedulerSettings, kv_events: KvEventsSettings, metrics: RouterMetrics) -> None:
    """Give a new side Scheduler its matcher, if its pipeline gets one."""
    matcher = matcher_for(sc, metrics, kv_events)
    if matcher is not None:
        sched.set_kv_matcher(matcher)


def follow(sched: Scheduler, views: Mapping[Hashable, Sequence[EndpointState]]) -> None:
    """After the side's views were synced: subscribe to exactly its endpoints' streams."""
    m = sched.kv_matcher
    if not isinstance(m, KvAwareMatcher):
        return
    eps = ((ep.key, ep.ip, ep.labels) for group in views.values() for ep in group)
    m.set_endpoints(event_sources(eps, sched.endpoint_id, m.args, m.auto))


async def load_tokenizers(sched: Scheduler) -> None:
    m = sched.kv_matcher
    if isinstance(m, KvAwareMatcher):
        for err in await asyncio.to_thread(m.tokenizers.load_all):
            log.warning("kvcache-aware (PD side): %s (prefix-cache matching is used for that model)", err)


def retire(sched: Scheduler, tasks: set[asyncio.Task[None]]) -> None:
    """A replaced side Scheduler: close its subscriptions (in the background when a loop runs)."""
    m = sched.kv_matcher
    if not isinstance(m, KvAwareMatcher):
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop (unit tests): nothing was ever connected
        return
    task = loop.create_task(m.close())
    tasks.add(task)
    task.add_done_callback(tasks.discard)


def debug_view(sched: Scheduler) -> dict[str, Any] | None:
    """/debug/pd: the side's followed streams (state, last sequence, blocks held)."""
    m = sched.kv_matcher
    if not isinstance(m, KvAwareMatcher):
        return None
    status = m.subscribers.status()
    out = {}
    for key, i in sorted(m.ids.items()):
        st = status.get(key)
        out[key] = {"state": st.state.value if st else "none", "last_seq": st.last_seq if st else None,
                    "blocks": len(m.table.endpoint_hashes(i))}
    return {"mode": "auto" if m.auto else "listed", "endpoints": out}
