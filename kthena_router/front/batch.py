"""Prometheus writes of the Rust front's bookkeeping, merged per event-loop iteration.

With prometheus multiprocess mode every `inc` and `observe` is a pid check and an mmap
write (a histogram observation is two: its sum and its bucket). The fast path's decisions,
reports and the scheduler's plugin timings add up to about a dozen per request. Here they
are summed per child (counters and gauges) or collected (histograms) and written once per
child when the loop runs the flush it schedules with `call_soon`, i.e. right after the
callbacks of the current iteration: a scrape sees them microseconds later, never a
different name, label or value.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from typing import Any

from kthena_router.front.mpvalues import write_values


class MetricBatch:
    """Counter/gauge deltas and histogram observations, written by `flush`."""

    __slots__ = ("deltas", "observed", "scheduled")

    def __init__(self) -> None:
        self.deltas: dict[Any, float] = {}
        self.observed: dict[Any, list[float]] = {}
        self.scheduled = False

    def _schedule(self) -> None:
        if not self.scheduled:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop (tests, shutdown): write now
                self.flush()
                return
            self.scheduled = True

    def add(self, child: Any, value: float) -> None:
        """`child.inc(value)`, merged (a counter's or a gauge's child)."""
        deltas = self.deltas
        deltas[child] = deltas.get(child, 0.0) + value
        if not self.scheduled:
            self._schedule()

    def observe(self, child: Any, value: float) -> None:
        """`child.observe(value)`, merged (a histogram's child)."""
        values = self.observed.get(child)
        if values is None:
            self.observed[child] = [value]
        else:
            values.append(value)
        if not self.scheduled:
            self._schedule()

    def flush(self) -> None:
        """Writes everything pending: one inc per counter/gauge child; per histogram child
        one inc of its sum and one per bucket hit (what `observe` writes, merged)."""
        self.scheduled = False
        deltas, observed = self.deltas, self.observed
        todo: list[tuple[Any, float]] = []
        if deltas:
            self.deltas = {}
            todo = [(child._value, value) for child, value in deltas.items() if value]
        if observed:
            self.observed = {}
            for child, values in observed.items():
                _observe_all(child, values, todo)
        if todo:
            write_values(todo)


def _observe_all(child: Any, values: list[float], todo: list[tuple[Any, float]]) -> None:
    """A histogram child's observations as value increments (Histogram.observe, merged)."""
    bounds = child._upper_bounds  # prometheus_client Histogram: sorted, ends with +Inf
    buckets = child._buckets
    if len(values) == 1:
        v = values[0]
        todo.append((child._sum, v))
        if v == v:  # NaN lands in no bucket (Histogram.observe's `amount <= bound`)
            todo.append((buckets[bisect_left(bounds, v)], 1.0))
        return
    hits: dict[int, int] = {}
    total = 0.0
    for v in values:
        total += v
        if v == v:
            i = bisect_left(bounds, v)
            hits[i] = hits.get(i, 0) + 1
    todo.append((child._sum, total))
    for i, n in hits.items():
        todo.append((buckets[i], float(n)))
