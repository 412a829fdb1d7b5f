"""Event-loop lag of a worker: how late a periodic timer fires.

Anything that holds the loop (a GC pause, a slow callback, blocking I/O) delays every
request on the worker by as much; this histogram shows it without a profiler. One
timer every `interval_s`, no per-request cost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Histogram

LAG_BUCKETS = (5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0)
INTERVAL_S = 0.25


class LoopLagSampler:
    def __init__(self, registry: CollectorRegistry, interval_s: float = INTERVAL_S,
                 on_tick: Sequence[Callable[[], None]] = ()) -> None:
        self.interval_s = interval_s
        self.on_tick = tuple(on_tick)  # cheap periodic work that must run on the loop
        self.lag = Histogram(
            "kthena_router_event_loop_lag_seconds",
            "How late a periodic timer fired on the worker's event loop", buckets=LAG_BUCKETS, registry=registry)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.interval_s)
            self.lag.observe(max(0.0, loop.time() - t0 - self.interval_s))
            for tick in self.on_tick:
                tick()
