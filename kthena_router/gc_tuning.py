"""Cyclic GC settings for a worker, and its pauses as metrics.

A collection stops the worker's event loop, so every request in flight on the worker
waits for it; docs/overhead.md has the measurements behind these settings.

- `freeze_startup_heap()` after start-up: the modules, config and route state built so
  far move to the permanent generation, which no later collection walks.
- `THRESHOLDS`: collections of the young generation ~14x rarer than Python's default
  (700); a young pass costs about 1 ms per 10,000 objects, so one stays short.
- `GcMonitor`: pause and collected-object counts per generation. gc.callbacks may run
  wherever an allocation triggers a collection, also inside prometheus_client's
  (non-reentrant) multiprocess lock, so the callback only appends to a list;
  `flush()`, called from the event loop, moves the figures into Prometheus.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

THRESHOLDS = (10_000, 10, 10)
PAUSE_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)
_MAX_PENDING = 4096  # collections kept between flushes; more are counted, not timed


def freeze_startup_heap() -> None:
    """Free start-up garbage, then exclude every object alive now from later collections."""
    gc.collect()
    gc.freeze()


class GcMonitor:
    """Collection pauses and collected objects per generation (install once per process)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.pause = Histogram(
            "kthena_router_gc_pause_seconds", "Cyclic GC pauses of the worker, by generation",
            ["generation"], buckets=PAUSE_BUCKETS, registry=registry)
        self.collected = Counter(
            "kthena_router_gc_collected_objects_total",
            "Objects the cyclic GC freed (cyclic garbage), by generation", ["generation"], registry=registry)
        self._pause_children = [self.pause.labels(str(g)) for g in range(3)]
        self._collected_children = [self.collected.labels(str(g)) for g in range(3)]
        self._pending: list[tuple[int, float, int]] = []
        self._t0 = 0.0
        self._old_thresholds: tuple[int, int, int] | None = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif len(self._pending) < _MAX_PENDING:
            self._pending.append((info["generation"], time.perf_counter() - self._t0, info["collected"]))

    def start(self) -> None:
        """Install the callback and the server thresholds."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        if self._old_thresholds is None:
            self._old_thresholds = gc.get_threshold()
            gc.set_threshold(*THRESHOLDS)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        if self._old_thresholds is not None:
            gc.set_threshold(*self._old_thresholds)
            self._old_thresholds = None
        self.flush()

    def flush(self) -> None:
        """Move the pauses recorded since the last flush into the metrics (event loop only)."""
        pending, self._pending = self._pending, []
        for gen, seconds, collected in pending:
            self._pause_children[gen].observe(seconds)
            if collected:
                self._collected_children[gen].inc(collected)
